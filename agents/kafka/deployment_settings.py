"""The settings a deployment was created with, kept on its schedule topic, so that a worker
started with another value of a bound setting is refused **before it starts anything**, naming
the setting: ``epsilon: 1 (stored) vs 2 (configured)``.

Every setting in :data:`agents.config.deployment.BINDING` and the domain's content are part of the
deployment's identity (its noise and checkpoints are bound to them), so a change of any of them
on a running deployment is refused. Before this record existed the refusal came late — after
"worker started" and after the reconcile agent took leadership — from the checkpoints, whose
seal cannot say which setting changed (it named the domain and showed two hashes).

The first worker of a deployment writes one record, key ``deployment-settings``, to partition 0
of the schedule topic *before* the deployment's nonce (:mod:`agents.kafka.nonce`): the bound settings
in clear (they are configuration, not data) and the domain digest, sealed with a MAC under a key
derived from the noise key (:func:`stream_dp.integrity.seal`) and bound to the app id and the
schedule topic. The first authentic record wins (two workers starting at once compare against
the same one). Records that do not verify (forged, another key) decide nothing: the checkpoints'
own refusal still stands behind this check. A deployment created by an older version has its
nonce first and no record before it: it is left to that later refusal, and nothing is written.
"""

from __future__ import annotations

import json
import math
from typing import Any

from agents.config.deployment import BINDING, USER_BINDING, bound_names
from agents.config.settings import Settings

__all__ = ["SETTINGS_KEY", "SettingsChanged", "check_deployment_settings", "differences",
           "parse_settings_record", "settings_record"]

#: Kafka record key of the settings record on the schedule topic (partition 0)
SETTINGS_KEY = b"deployment-settings"
#: :func:`stream_dp.integrity.seal` purpose of the settings record
PURPOSE = "deployment settings"


class SettingsChanged(RuntimeError):
    """A bound setting differs from the one the deployment was created with (exit status 4)."""


def _context(settings: Settings) -> bytes:
    from stream_dp.mechanism import canonical_json

    return canonical_json({"settings of": {"app_id": settings.app_id,
                                           "schedule_topic": settings.schedule_topic}})


#: bound settings this check leaves to another guard: another events topic under the same
#: schedule topic is a question of the log, answered by the persisted closing points (their
#: digests refuse a log that differs from the released one: exit status 3, docs/operations.md)
LEFT_TO_THE_SCHEDULE = frozenset({"events_topic"})


def _bound(settings: Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in bound_names(settings)
            if name not in LEFT_TO_THE_SCHEDULE}


def settings_record(settings: Settings, domain_digest: str, key: bytes) -> bytes:
    """The sealed value of the settings record of ``settings`` and the domain's digest."""
    from stream_dp.integrity import seal
    from stream_dp.mechanism import canonical_json

    body = canonical_json({"v": 1, "domain": domain_digest, "settings": _bound(settings)})
    return seal(key, PURPOSE, _context(settings), body)


def parse_settings_record(settings: Settings, key: bytes, value: bytes | None
                          ) -> dict[str, Any] | None:
    """``{"domain": digest, "settings": {...}}`` of an authentic record, else ``None``."""
    from stream_dp.integrity import IntegrityError, unseal

    if value is None:
        return None
    try:
        body = json.loads(unseal(key, PURPOSE, _context(settings), value))
    except (IntegrityError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("v") != 1 or not isinstance(
            body.get("settings"), dict) or not isinstance(body.get("domain"), str):
        return None
    return body


def _show(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value) and value == int(value) \
            and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return float(a).hex() == float(b).hex()  # exact: 1.0 and 1.0000000001 differ
    return bool(a == b)


def _decoded(value: Any) -> Any:
    """A value as :func:`stream_dp.mechanism.canonical_json` wrote it (floats as ``{"f": hex}``,
    exact) back to Python."""
    if isinstance(value, dict) and set(value) == {"f"} and isinstance(value["f"], str):
        return float.fromhex(value["f"])
    return value


def differences(stored: dict[str, Any], settings: Settings, domain_digest: str) -> list[str]:
    """``"epsilon: 1 (stored) vs 2 (configured)"`` for every bound setting that differs (and
    the domain), in the order of :data:`agents.config.deployment.BINDING`; settings the record does
    not hold (added by a later version) are not compared."""
    out = []
    values = {name: _decoded(v) for name, v in stored["settings"].items()}
    # an event-level deployment's record (and every record older than the person as a unit)
    # holds no privacy_unit: it is "event"; the person's bounds are compared whenever the
    # record holds them, so a switch either way is refused naming the unit (and the bounds)
    values.setdefault("privacy_unit", "event")
    now_values = {name: getattr(settings, name) for name in BINDING + USER_BINDING
                  if name not in LEFT_TO_THE_SCHEDULE}
    for name, now in now_values.items():
        if name in values and not _same(values[name], now):
            out.append(f"{name}: {_show(values[name])} (stored) vs {_show(now)} (configured)")
    if stored["domain"] != domain_digest:
        out.append(f"the domain file's content: digest {stored['domain'][:12]} (stored) vs "
                   f"{domain_digest[:12]} (configured)")
    return out


def refusal(settings: Settings, changed: list[str]) -> str:
    """The one-line refusal for ``changed`` (see :func:`differences`)."""
    return (f"refusing to start: deployment {settings.app_id!r} (schedule topic "
            f"{settings.schedule_topic!r}) was created with other settings: "
            f"{'; '.join(changed)}. Settings bound into a deployment never change: restore "
            "them, or start a new deployment with its own topics and budget (stream-dp "
            "deployment new; docs/runbooks.md)")


async def check_deployment_settings(settings: Settings, domain_digest: str, key: bytes,
                                    kafka_kwargs: dict[str, Any]) -> None:
    """Raise :class:`SettingsChanged` if the deployment's stored settings differ from
    ``settings``; a new deployment (no nonce yet) gets its record written here."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from agents.kafka.checkpoint_reader import read_all
    from agents.kafka.clients import start_client
    from agents.kafka.nonce import NONCE_KEY

    reader = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, **kafka_kwargs,
                              isolation_level="read_committed", enable_auto_commit=False,
                              group_id=None,
                              client_id=f"{settings.app_id}-settings-{settings.worker_id}")

    def authentic(r: Any) -> bool:
        return r.key == SETTINGS_KEY and parse_settings_record(settings, key, r.value) is not None

    async def first() -> tuple[dict[str, Any] | None, bool]:
        """(the first authentic settings record, whether a nonce record came before it)."""
        found = await read_all(reader, settings.schedule_topic, 0,
                               until=lambda r: r.key == NONCE_KEY or authentic(r))
        if found and authentic(found[-1]):
            return parse_settings_record(settings, key, found[-1].value), False
        return None, bool(found) and found[-1].key == NONCE_KEY

    await start_client(reader)
    try:
        stored, legacy = await first()
        if stored is None and not legacy:
            producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, **kafka_kwargs,
                                        acks="all", enable_idempotence=True)
            await start_client(producer)
            try:
                await producer.send_and_wait(settings.schedule_topic,
                                             settings_record(settings, domain_digest, key),
                                             key=SETTINGS_KEY, partition=0)
            finally:
                await producer.stop()
            stored, legacy = await first()  # another worker's record may have come first
        if stored is None:
            return  # created by an older version: the checkpoints' refusal stands behind it
        changed = differences(stored, settings, domain_digest)
        if changed:
            raise SettingsChanged(refusal(settings, changed))
    finally:
        await reader.stop()
