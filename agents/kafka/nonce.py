"""The deployment nonce: a random value created once per deployment, bound into all its noise.

Settings and topic names do not tell two incarnations of a deployment apart: the same
configuration on another cluster, or on topics deleted and created anew, would otherwise draw
the very same noise under the same key — and the difference of their releases would be the
exact difference of their data (docs/privacy.md, "Threat model"). So the first worker of a
deployment writes a random 32-byte nonce to partition 0 of its schedule topic (the topic that
also holds the persisted closing points, retained forever), sealed with a MAC under a key
derived from the noise key and bound to the deployment's context; every worker adopts the
*first* authentic nonce record of that partition (two workers starting at once write two, and
both adopt the earlier one). :func:`agents.config.deployment.deployment_id` includes it.

The record also carries the **fits** the first worker's mechanism was built with
(:func:`stream_dp.strategies.blt.plan.fits_used`: `blt`'s filter parameters, made on the host
where the package does not ship them, through its BLAS, so another CPU can land on another
optimum): every worker pins the adopted record's fits before it builds any state, so a worker
moved to another machine builds the same mechanism and opens the same checkpoints
(docs/operations.md). A record written before fits were recorded has none: its deployment's
workers use their host's fits, as before.

A restart, a rebalance, or a fresh worker of the same deployment (its schedule topic kept)
therefore reproduces every release bit for bit; a new cluster or re-created topics is a new
incarnation with fresh noise (its budget counts again). To reproduce a deployment elsewhere, copy
its schedule topic: it holds the nonce and the closing points, which refuse any other log.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from agents.config.settings import Settings

__all__ = ["NONCE_KEY", "NONCE_PURPOSE", "adopt_deployment_record", "adopt_nonce", "nonce_record",
           "parse_nonce", "parse_nonce_record"]

#: Kafka record key of the nonce record on the schedule topic (partition 0)
NONCE_KEY = b"deployment-nonce"
#: :func:`stream_dp.integrity.seal` purpose of the nonce record
NONCE_PURPOSE = "deployment nonce"


def _context(settings: Settings, domain_digest: str) -> bytes:
    from agents.config.deployment import deployment_context
    from stream_dp.mechanism import canonical_json

    return canonical_json({"nonce of": deployment_context(settings, domain_digest)})


def nonce_record(settings: Settings, domain_digest: str, key: bytes, nonce: str,
                 fits: list[dict[str, Any]] | None = None) -> bytes:
    """The sealed value of a nonce record (``nonce``: 64 hex digits; ``fits``: the mechanism's
    fits, :func:`stream_dp.strategies.blt.plan.fits_used`, left out when there are none)."""
    from stream_dp.integrity import seal

    doc: dict[str, Any] = {"v": 1, "nonce": nonce}
    if fits:
        doc["fits"] = fits
    body = json.dumps(doc).encode()
    return seal(key, NONCE_PURPOSE, _context(settings, domain_digest), body)


def parse_nonce_record(settings: Settings, domain_digest: str, key: bytes, value: bytes | None
                       ) -> tuple[str, list[dict[str, Any]]] | None:
    """``(nonce, fits)`` of an authentic record of this deployment (``fits``: ``[]`` in a record
    written before fits were recorded), else ``None`` (forged, another key or another
    deployment's record: ignored, never adopted)."""
    from stream_dp.integrity import IntegrityError, unseal

    if value is None:
        return None
    try:
        body = json.loads(unseal(key, NONCE_PURPOSE, _context(settings, domain_digest), value))
    except (IntegrityError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    nonce = body.get("nonce")
    if body.get("v") != 1 or not isinstance(nonce, str) or len(nonce) != 64:
        return None
    try:
        bytes.fromhex(nonce)
    except ValueError:
        return None
    fits = body.get("fits", [])
    if not isinstance(fits, list) or not all(isinstance(f, dict) for f in fits):
        return None
    return nonce, fits


def parse_nonce(settings: Settings, domain_digest: str, key: bytes, value: bytes | None
                ) -> str | None:
    """The nonce of an authentic record of this deployment, else ``None``
    (:func:`parse_nonce_record` without the fits)."""
    found = parse_nonce_record(settings, domain_digest, key, value)
    return None if found is None else found[0]


async def adopt_nonce(settings: Settings, domain_digest: str, key: bytes, kafka_kwargs: Any
                      ) -> str:
    """The deployment's nonce: the first authentic nonce record on partition 0 of the schedule
    topic; if there is none, write one and read again (the earliest record wins)."""
    return (await adopt_deployment_record(settings, domain_digest, key, kafka_kwargs))[0]


async def adopt_deployment_record(settings: Settings, domain_digest: str, key: bytes,
                                  kafka_kwargs: Any, fits: list[dict[str, Any]] | None = None
                                  ) -> tuple[str, list[dict[str, Any]]]:
    """``(nonce, fits)`` of the first authentic nonce record on partition 0 of the schedule
    topic; if there is none, write one (a fresh nonce and ``fits``, this worker's) and read
    again: the earliest record wins, its fits with its nonce."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from agents.kafka.aborted_transactions import install
    from agents.kafka.checkpoint_reader import read_all

    install()

    topic = settings.schedule_topic
    reader = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, **kafka_kwargs,
                              isolation_level="read_committed", enable_auto_commit=False,
                              client_id=f"{settings.app_id}-nonce-{settings.worker_id}")
    try:  # started inside: a stop signal during start() must close it too
        await reader.start()
        await reader.topics()
        if not reader.partitions_for_topic(topic):
            raise RuntimeError(
                f"topic {topic!r} does not exist; create the topics first (stream-dp topics)")

        def authentic(r: Any) -> bool:
            return r.key == NONCE_KEY and parse_nonce_record(settings, domain_digest, key,
                                                             r.value) is not None

        async def first() -> tuple[str, list[dict[str, Any]]] | None:
            # the nonce is among the partition's first records: stop at the first authentic one
            found = await read_all(reader, topic, 0, until=authentic)
            if found and authentic(found[-1]):
                return parse_nonce_record(settings, domain_digest, key, found[-1].value)
            return None

        found = await first()
        if found is not None:
            return found
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, **kafka_kwargs,
                                    acks="all", enable_idempotence=True)
        try:
            await producer.start()
            value = nonce_record(settings, domain_digest, key, secrets.token_hex(32), fits)
            await producer.send_and_wait(topic, value, key=NONCE_KEY, partition=0)
        finally:
            await producer.stop()
        found = await first()
        if found is None:  # pragma: no cover - our own record is there after acks=all
            raise RuntimeError(f"the deployment nonce written to {topic!r} cannot be read back")
        return found
    finally:
        await reader.stop()
