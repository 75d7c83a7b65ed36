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
    await start_client(producer)
    partitions = sorted(await producer.partitions_for(topic)) if markers else []
    loop = asyncio.get_running_loop()
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
            pending.append((None, await producer.send(  # type: ignore[arg-type]
                topic, value=value, partition=part, headers=headers)))

    async def settle(last: LogRecord | None) -> None:
        """Await every outstanding send; everything processed up to ``last`` is then done."""
        nonlocal sent, last_checkpoint, checkpointed
        for _record, fut in pending:
            meta = await fut
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
            fut = await producer.send(
                topic,
                value=encode_event(event),
                key=event.partition_key.encode(),
                headers=headers,
            )
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
        await settle(processed)
    except LogFormatError:
        await settle(processed)  # what came before the bad line is delivered and recorded
        raise
    finally:
        await producer.stop()
    return SendReport(sent, skipped, interrupted, loop.time() - t_start)


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
                        Event(e.key, round((e.ts + offset) * 1000) / 1000.0, e.value, e.attrs))
