"""What ``stream-dp replay`` finds in the events topic before it sends anything.

A markers deployment closes its ticks at the close markers a replay writes; the final one
closes every tick up to the one containing ``--until``. A topic whose partitions already hold
such a final marker has been replayed into before: a worker reading it dead-letters every
event of the closed ticks (``tick_closed``: their releases are out) and ignores markers that
close nothing, so a second copy of a log releases nothing new — and the events of a copy that
fall after the earlier ``--until`` would be counted twice. Replay looks at the last
every record of every partition (from the log start to the end offsets read when it starts)
and refuses such a target up front (issue #24: replay used to say "budget spent again" while the
worker ignored every event); records a writer appends after the genuine final marker do not
hide it, however many (issue #32: a look at the last 1000 records, given up silently after
10 s, was hidden by 1001 appended records). A broker that stops answering while replay reads
is an error (nothing is sent), never a topic without a marker.

Only a marker that verifies under this replay's key may refuse (DESIGN.md §2 rule 7): any writer
of the events topic can append a record that looks like a final marker, and the worker
dead-letters it (``forged_marker``) — it must not stop a genuine replay either (issue #32). A
final marker that does not verify (another key's, or a forgery: the two look the same) decides
nothing; replay only says, in a note, that it found one.

The deployment a replay goes to, as the replay history tells deployments apart (the cluster's
id and the events topic), is found here too (:func:`_deployment`).
"""

from __future__ import annotations

import hmac
import json
import math
import time
from dataclasses import dataclass

from agents.commands._replay_state import ReplayState, _imported
from agents.commands.replay_history import ANY, Content, Deployment, ReplayHistory
from agents.kafka.codec import CLOSE_HEADER, CLOSE_SCHEMA, parse_close_marker

__all__ = ["EarlierFinal", "cluster_id", "earlier_final_marker", "refusal", "unverified_note"]


async def cluster_id(bootstrap: str) -> str:
    """The Kafka cluster's id as its brokers report it (Metadata), ``""`` if they report none:
    the same cluster whatever address reaches it. Part of the deployment a replay goes to in
    the replay history (:class:`agents.commands.replay_history.Deployment`)."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.protocol.metadata import MetadataRequest

    from agents.config.security import client_kwargs

    client = AIOKafkaClient(bootstrap_servers=bootstrap, **client_kwargs())
    try:
        await client.bootstrap()
        node = client.get_random_node()
        if node is None:
            return ""
        response = await client.send(node, MetadataRequest([]))
    finally:
        await client.close()
    return str(getattr(response, "cluster_id", None) or "")


async def _deployment(bootstrap: str, topic: str, history: ReplayHistory, fingerprint: str,
                      content: Content, previous: ReplayState | None) -> Deployment:
    """The deployment this replay goes to, as the replay history tells deployments apart: the
    cluster's id (whatever address reaches it) and the events topic. If the cluster cannot be
    reached and the key already replayed another log into this topic name on any cluster, the
    cluster is taken as that one (:data:`ANY`): the refusal comes first, without a broker, and
    never lets a second log into the same deployment. Otherwise the connection error goes on
    to the caller (nothing can be sent)."""
    from agents.kafka.clients import is_kafka_error

    anywhere = Deployment(ANY, topic)
    conflict = history.lookup(fingerprint, content, anywhere).refused or any(
        hmac.compare_digest(fp, fingerprint) and c != content for fp, c in _imported(previous))
    try:
        return Deployment(await cluster_id(bootstrap), topic)
    except Exception as exc:
        if conflict and is_kafka_error(exc):
            return anywhere
        raise


@dataclass(frozen=True)
class EarlierFinal:
    """The latest final close marker found in a partition of the events topic."""

    #: the marker's time (Unix seconds): ticks up to the one containing it are closed
    time: float
    #: True if its MAC verifies under this replay's key (the same deployment key)
    authentic: bool
    #: how many partitions hold such a final marker
    partitions: int


#: seconds without progress after which the look at the topic is given up (an error: nothing
#: is sent), never taken as "no final marker there"
STALL_SECONDS = 30.0


async def earlier_final_marker(bootstrap: str, topic: str, mac_key: bytes,
                               stall_s: float = STALL_SECONDS) -> EarlierFinal | None:
    """The latest final close marker among every record of each partition of ``topic``
    (from its log start to the end offsets read first), or ``None`` (an empty topic, or none
    there). ``mac_key`` is this replay's marker key (:func:`agents.kafka.codec.marker_key`): a
    marker that verifies under it wins over any that does not (``authentic=False``: another
    noise key's, or a forgery; it decides nothing, see :func:`refusal`). Records after a
    genuine final marker (a writer's, forged or not, any number of them) do not hide it: the
    partitions are read whole, since a bounded look at their ends lets a writer push the
    marker out of it. Raises ``RuntimeError`` if no record arrives for ``stall_s`` seconds
    before every partition is read (failing open would let a second copy of a log in)."""
    from aiokafka import AIOKafkaConsumer

    from agents.config.security import client_kwargs
    from agents.kafka.clients import start_client, topic_partitions

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                group_id=None, **client_kwargs())
    await start_client(consumer)
    found: list[tuple[float, bool, int]] = []
    try:
        tps = await topic_partitions(consumer, topic)
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
        todo = {tp: int(ends[tp]) for tp in tps
                if int(ends.get(tp, 0)) > int(starts.get(tp, 0))}
        if not todo:
            return None
        consumer.assign(list(todo))
        for tp in todo:
            consumer.seek(tp, int(starts.get(tp, 0)))
        progress = time.monotonic()
        while todo:
            if time.monotonic() - progress > stall_s:
                raise RuntimeError(
                    f"the broker sent no record of {topic} for {stall_s:.0f} s while replay "
                    "looked for an earlier final close marker (partitions "
                    f"{sorted(tp.partition for tp in todo)} not read to their end); nothing "
                    "was sent: run the replay again")
            batch = await consumer.getmany(timeout_ms=500)
            for tp, records in batch.items():
                stop = todo.get(tp)
                if records:
                    progress = time.monotonic()
                for r in records:
                    if stop is None or r.offset >= stop:
                        continue
                    got = _final(r.value, dict(r.headers or ()), mac_key, topic, tp.partition)
                    if got is not None:
                        found.append((*got, tp.partition))
            # done with a partition once everything fetched is past its end (the last offset
            # may be a transaction marker, which yields no record)
            for tp in list(todo):
                if await consumer.position(tp) >= todo[tp]:
                    del todo[tp]
                    progress = time.monotonic()
    finally:
        await consumer.stop()
    # an authentic final marker decides; an unverifiable one is only reported (it may be forged)
    for authentic in (True, False):
        mine = [(t, p) for t, a, p in found if a is authentic]
        if mine:
            return EarlierFinal(max(t for t, _ in mine), authentic, len({p for _, p in mine}))
    return None


def _final(value: bytes | None, headers: dict[str, bytes], mac_key: bytes, topic: str,
           partition: int) -> tuple[float, bool] | None:
    """``(time, authentic)`` of a final close marker, else ``None``."""
    if CLOSE_HEADER not in headers:
        return None
    got = parse_close_marker(value, mac_key=mac_key, topic=topic, partition=partition)
    if isinstance(got, tuple):
        at, final = got
        return (at, True) if final else None
    try:  # not under this key: is it another key's final marker?
        doc = json.loads(value or b"")
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("schema") != CLOSE_SCHEMA or doc.get("final") is not True:
        return None
    t = doc.get("time")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
        return None
    if t > time.time():
        # no replay writes a final marker in the future (--until in the future is refused): an
        # unverifiable one is a hostile writer's, which must not block every replay into the
        # topic (any writer of the events topic can append it; the worker dead-letters it)
        return None
    return float(t), False


def refusal(found: EarlierFinal, topic: str, first_event: float) -> str | None:
    """The one-line reason to refuse replaying a log whose first event is at ``first_event``
    (Unix seconds, after any --retime shift) into ``topic``, or ``None`` if its events lie
    after the earlier final marker, or if that marker does not verify under this replay's key
    (it may be forged: it decides nothing, see :func:`unverified_note`)."""
    if first_event > found.time or not found.authentic:
        return None
    return (f"{topic} already holds the final close marker of an earlier replay "
            f"({_when(found.time)}, signed with this key): a markers deployment reading it has "
            "closed those ticks, so it would dead-letter these events (tick_closed) and release "
            "nothing new. To reproduce the releases replay into a fresh deployment (new "
            "app_id and topics; same key and settings: bit-identical, no new budget); "
            "nothing was sent")


def unverified_note(found: EarlierFinal, topic: str, first_event: float) -> str | None:
    """A one-line note (never a refusal) when ``topic`` ends with a final close marker that does
    not verify under this replay's key and would close this log's first event, else ``None``.
    Such a record is another key's marker or a forgery, and the two look the same."""
    if found.authentic or first_event > found.time:
        return None
    return (f"note: {topic} holds a record that looks like a final close marker "
            f"({_when(found.time)}) but does not verify under this key: a forgery, which the "
            "worker dead-letters (forged_marker), or another noise key's marker. It decides "
            "nothing; the replay goes on. If the deployment reading this topic runs with "
            "another key, its worker dead-letters this replay's markers too: replay with that "
            "deployment's key")


def _when(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
