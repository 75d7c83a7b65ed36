"""Sending a log's events for ``stream-dp replay``: :func:`send_events` (transactional, with
close markers), finding what an interrupted replay left unacknowledged, end offsets, and
retiming event times.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.kafka.clients import start_client, topic_partitions
from simulators.logfile import Event, LogFormat, LogFormatError, LogRecord, parse_ts, read_log

HEADER = "stream-dp-replay"


# ---------------------------------------------------------------------------------- sending
@dataclass(frozen=True)
class SendReport:
    """What a send loop did: ``sent`` records acknowledged, ``skipped`` already present,
    ``interrupted`` if stopped before the end."""

    sent: int
    skipped: int
    interrupted: bool
    seconds: float


class BrokerLost(RuntimeError):
    """The broker acknowledged nothing for ``ack_timeout`` seconds while sends were pending.

    What was acknowledged before is checkpointed; a later run resumes after it (records sent but
    not acknowledged are found again by their run header, never sent twice)."""


class _Stopped(Exception):
    """``stop`` was set while waiting for the broker."""


#: seconds a stopped (interrupted) replay still waits for the acknowledgement of what it sent,
#: so that a later run need not look for it; a broker that has gone away is not waited for longer
STOP_GRACE_S = 5.0


def encode_event(event: Event) -> bytes:
    """The ``dp.events.v1`` message value (compact JSON)."""
    return json.dumps(event.to_message(), separators=(",", ":")).encode()


async def send_events(
    records: Iterable[LogRecord],
    *,
    bootstrap: str,
    topic: str,
    speed: float | None = None,
    run_id: str | None = None,
    skip: frozenset[int] = frozenset(),
    chunk: int = 2000,
    on_checkpoint: Callable[[LogRecord, dict[int, int]], None] | None = None,
    on_progress: Callable[[LogRecord], None] | None = None,
    stop: asyncio.Event | None = None,
    markers: bool = False,
    final_marker: Callable[[], float | None] | None = None,
    mac_key: bytes | None = None,
    clock: Callable[[], float] = time.time,
    marker_every: float = 10.0,
    ack_timeout: float = 30.0,
) -> SendReport:
    """Produce ``records`` to ``topic`` with an idempotent producer, in order.

    ``speed``: event-time seconds per wall second (None = as fast as possible). Record numbers in
    ``skip`` are not sent. After every ``chunk`` records (or 0.5 s) all outstanding sends are
    awaited and ``on_checkpoint(last acknowledged record, {partition: last offset})`` is called.
    Setting ``stop`` ends the loop after acknowledging what was sent.

    ``markers``: progress close markers at positions fixed by the log alone, the same whether
    paced or not and however fast the sender keeps up: before the first record whose event time
    reaches a multiple ``B`` of ``marker_every`` seconds (event time) beyond the last marker, a
    marker at ``B`` (never past ``final_marker()``) into every partition; after the last record,
    a final one at ``final_marker()`` (skipped if it returns None). Each
    marker is authenticated with ``mac_key`` (:func:`agents.kafka.codec.marker_key` of the deployment's
    noise key; required with ``markers``) for its topic and partition.

    Every wait for the broker is bounded: with sends outstanding and nothing acknowledged for
    ``ack_timeout`` seconds (the broker stopped or became unreachable; the client would retry
    for ever) :class:`BrokerLost` is raised, and ``stop`` ends any wait at once (the report is
    then ``interrupted``; what is acknowledged within :data:`STOP_GRACE_S` is checkpointed).
    """
    from aiokafka import AIOKafkaProducer

    from agents.kafka.codec import close_marker

    if chunk < 1:
        raise ValueError(f"chunk must be ≥ 1, got {chunk}")
    if speed is not None and not speed > 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    if markers and mac_key is None:
        raise ValueError("close markers need mac_key (agents.kafka.codec.marker_key of the noise key)")
    from agents.config.security import client_kwargs

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **client_kwargs(),
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        max_batch_size=262_144,
        request_timeout_ms=30_000,
    )
    if not ack_timeout > 0:
        raise ValueError(f"ack_timeout must be > 0 seconds, got {ack_timeout}")
    await start_client(producer)
    loop = asyncio.get_running_loop()
    stopping = False  # set once stop was seen: the waits then ignore it and use STOP_GRACE_S

    async def bounded(aw: Any, what: str) -> Any:
        """``await aw``, unless ``stop`` is set first (:class:`_Stopped`) or the broker answers
        nothing for ``ack_timeout`` s (:class:`BrokerLost`)."""
        task = asyncio.ensure_future(aw)
        waiters: set[asyncio.Future[Any]] = {task}
        stopper = None
        if stop is not None and not stopping:
            stopper = asyncio.ensure_future(stop.wait())
            waiters.add(stopper)
        limit = min(ack_timeout, STOP_GRACE_S) if stopping else ack_timeout
        try:
            done, _ = await asyncio.wait(waiters, timeout=limit,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if stopper is not None:
                stopper.cancel()
        if task in done:
            return task.result()
        if task is not aw:  # our own wrapper of a coroutine: end it (a delivery future
            task.cancel()   # belongs to the producer, which settles it)
        if stopper is not None and stopper in done:
            raise _Stopped
        raise BrokerLost(
            f"the broker at {bootstrap} acknowledged nothing for {limit:.0f} s while {what} "
            "(it stopped or is unreachable); everything acknowledged before is recorded: start "
            "the broker again and run the same command to resume")

    try:
        partitions = (sorted(await bounded(producer.partitions_for(topic), "reading partitions"))
                      if markers else [])
    except BaseException:
        await _stop_producer(producer)
        raise
    t_start = loop.time()
    pending: list[tuple[LogRecord, asyncio.Future[Any]]] = []
    offsets: dict[int, int] = {}
    sent = skipped = 0
    last_checkpoint = loop.time()
    ts0: float | None = None
    interrupted = False

    checkpointed = 0
    last_boundary: float | None = None

    async def mark(at: float, final: bool) -> None:
        assert mac_key is not None
        for part in partitions:
            headers, value = close_marker(at, final, mac_key=mac_key, topic=topic, partition=part)
            pending.append((None, await bounded(producer.send(  # type: ignore[arg-type]
                topic, value=value, partition=part, headers=headers), "sending")))

    async def settle(last: LogRecord | None) -> None:
        """Await every outstanding send; everything processed up to ``last`` is then done."""
        nonlocal sent, last_checkpoint, checkpointed
        for _record, fut in pending:
            meta = await bounded(fut, "waiting for acknowledgements")
            offsets[meta.partition] = max(offsets.get(meta.partition, -1), meta.offset)
        sent += sum(1 for record, _ in pending if record is not None)  # events, not markers
        pending.clear()
        last_checkpoint = loop.time()
        if last is not None and last.number > checkpointed and on_checkpoint is not None:
            checkpointed = last.number
            on_checkpoint(last, dict(offsets))

    processed: LogRecord | None = None
    try:
        for record in records:
            if stop is not None and stop.is_set():
                interrupted = True
                break
            if record.number in skip:
                skipped += 1
                processed = record
                if on_progress is not None:
                    on_progress(record)
                continue
            event = record.event
            if markers and marker_every > 0 and math.isfinite(event.ts):
                # a boundary of event time fixed by the log, not by the wall clock: the same
                # marker positions at any speed (docs/privacy.md, "The release schedule")
                boundary = math.floor(event.ts / marker_every) * marker_every
                if last_boundary is None:
                    last_boundary = boundary
                elif boundary > last_boundary:
                    last_boundary = boundary
                    end = final_marker() if final_marker is not None else None
                    await mark(boundary if end is None else min(boundary, end), False)
            if speed is not None:
                if ts0 is None:
                    ts0 = event.ts
                    t_start = loop.time()
                delay = t_start + (event.ts - ts0) / speed - loop.time()
                if delay > 0:
                    await settle(processed)
                    if stop is None:
                        await asyncio.sleep(delay)
                    else:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), timeout=delay)
                        if stop.is_set():
                            interrupted = True
                            break
            headers = [] if run_id is None else [(HEADER, f"{run_id}:{record.number}".encode())]
            fut = await bounded(producer.send(
                topic,
                value=encode_event(event),
                key=event.partition_key.encode(),
                headers=headers,
            ), "sending")
            pending.append((record, fut))
            processed = record
            if len(pending) >= chunk or loop.time() - last_checkpoint > 0.5:
                await settle(processed)
            if on_progress is not None:
                on_progress(record)
        if markers and not interrupted and final_marker is not None:
            final_at = final_marker()
            if final_at is not None:
                await mark(final_at, True)
        if interrupted:
            stopping = True
            with contextlib.suppress(BrokerLost):  # see below
                await settle(processed)
        else:
            await settle(processed)
    except _Stopped:
        interrupted = stopping = True
        # what the broker acknowledges within STOP_GRACE_S is recorded; the rest is found again
        # by its run header when the same command runs again
        with contextlib.suppress(BrokerLost):
            await settle(processed)
    except LogFormatError:
        await settle(processed)  # what came before the bad line is delivered and recorded
        raise
    finally:
        await _stop_producer(producer)
    return SendReport(sent, skipped, interrupted, loop.time() - t_start)


async def _stop_producer(producer: Any) -> None:
    """Stop ``producer``, waiting at most :data:`STOP_GRACE_S`: with the broker gone its flush
    would retry for ever, and everything that matters is already checkpointed."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(producer.stop(), timeout=STOP_GRACE_S)


async def find_unacknowledged(
    bootstrap: str, topic: str, run_id: str, scan_from: dict[str, int], after: int
) -> frozenset[int]:
    """Record numbers > ``after`` of run ``run_id`` already in ``topic`` (sent, not checkpointed).

    Reads each partition from ``scan_from[partition]`` (missing: from the beginning) to its end.
    """
    from aiokafka import AIOKafkaConsumer

    from agents.config.security import client_kwargs

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
        auto_offset_reset="earliest", **client_kwargs(),
    )
    await start_client(consumer)
    found: set[int] = set()
    prefix = f"{run_id}:".encode()
    try:
        tps = await topic_partitions(consumer, topic)
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        todo = {}
        for tp in tps:
            start = scan_from.get(str(tp.partition))
            if start is None:
                await consumer.seek_to_beginning(tp)
                start = await consumer.position(tp)
            else:
                consumer.seek(tp, start)
            if start < ends[tp]:
                todo[tp] = ends[tp]
            else:
                consumer.pause(tp)
        while todo:
            batch = await consumer.getmany(*todo.keys(), timeout_ms=1000)
            for tp, messages in batch.items():
                for msg in messages:
                    for name, value in msg.headers or ():
                        if name == HEADER and value.startswith(prefix):
                            number = int(value[len(prefix):])
                            if number > after:
                                found.add(number)
                    if msg.offset + 1 >= todo.get(tp, 0):
                        todo.pop(tp, None)
                        consumer.pause(tp)
            if not batch:
                # offsets past the last record (e.g. transaction markers) may never be returned
                for tp in list(todo):
                    if await consumer.position(tp) >= todo[tp]:
                        todo.pop(tp)
    finally:
        await consumer.stop()
    return frozenset(found)


async def end_offsets(bootstrap: str, topic: str) -> dict[str, int]:
    """Current end offset of every partition of ``topic`` (keys are partition numbers as text)."""
    from aiokafka import AIOKafkaConsumer

    from agents.config.security import client_kwargs

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                                **client_kwargs())
    await start_client(consumer)
    try:
        tps = await topic_partitions(consumer, topic)
        ends = await consumer.end_offsets(tps)
        return {str(tp.partition): int(off) for tp, off in ends.items()}
    finally:
        await consumer.stop()


def _retime_offset(log: Path, fmt: LogFormat, retime: str | None) -> float:
    """Seconds to add to every event time so the first record is at ``retime`` (0 if None)."""
    if retime is None:
        return 0.0
    target = time.time() if retime == "now" else parse_ts(retime)
    first = next(iter(read_log(log, fmt)), None)
    if first is None:
        return 0.0
    return round((target - first.event.ts) * 1000) / 1000.0


def _shifted(records: Iterable[LogRecord], offset: float) -> Iterator[LogRecord]:
    for r in records:
        e = r.event
        yield LogRecord(r.number, r.end_offset,
                        Event(e.key, round((e.ts + offset) * 1000) / 1000.0, e.value, e.attrs,
                              e.user, e.user_field))
