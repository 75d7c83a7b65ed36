"""Reading checkpoints (:mod:`agents.kafka.checkpoints`) and whole partitions back from their
topics: :func:`read_latest`, :func:`read_latest_with_progress`, :func:`read_all`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from agents.kafka.checkpoints import Checkpoint, Progress, _assemble, _progress_of

__all__ = ["read_all", "read_latest", "read_latest_with_progress", "read_range"]


async def read_latest(
    consumer: Any, topic: str, partition: int, timeout_s: float = 60.0
) -> Checkpoint | None:
    """The newest complete checkpoint in ``topic``/``partition``, or ``None`` if there is none.

    ``consumer`` is a started ``AIOKafkaConsumer`` without a group, with
    ``isolation_level="read_committed"``; this call (re)assigns it to the one partition.
    """
    return (await read_latest_with_progress(consumer, topic, partition, timeout_s))[0]


async def read_latest_with_progress(
    consumer: Any, topic: str, partition: int, timeout_s: float = 60.0
) -> tuple[Checkpoint | None, Progress | None]:
    """:func:`read_latest`, and the newest progress record written after that checkpoint and
    building on it (``None`` if there is none, or if it builds on another checkpoint)."""
    from aiokafka import TopicPartition

    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    try:
        return await _read_latest(consumer, tp, topic, partition, timeout_s)
    finally:
        consumer.unsubscribe()  # stop background fetching of the checkpoint partition


async def _read_latest(
    consumer: Any, tp: Any, topic: str, partition: int, timeout_s: float
) -> tuple[Checkpoint | None, Progress | None]:
    begin = (await consumer.beginning_offsets([tp]))[tp]
    end = (await consumer.end_offsets([tp]))[tp]
    if end <= begin:
        return None, None
    window = 64
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        start = max(begin, end - window)
        consumer.seek(tp, start)
        records: list[Any] = []
        while await consumer.position(tp) < end:
            if loop.time() > deadline:
                raise TimeoutError(f"reading checkpoint {topic}/{partition} took > {timeout_s} s")
            batch = await consumer.getmany(tp, timeout_ms=500)
            for r in batch.get(tp, ()):
                if r.offset < end:
                    records.append(r)
        found, incomplete = _assemble(records)
        if found is not None:
            return found, _progress_of(records, found.seq)
        if start == begin:
            if incomplete:
                raise RuntimeError(
                    f"checkpoint topic {topic}/{partition} holds an incomplete checkpoint; "
                    "refusing to start from scratch (that could count events twice)"
                )
            return None, None
        window *= 4


async def read_all(
    consumer: Any, topic: str, partition: int, timeout_s: float = 120.0, start: int = 0,
    until: Callable[[Any], bool] | None = None,
) -> list[Any]:
    """Every committed record of ``topic``/``partition`` from offset ``start`` (or its
    beginning, whichever is later), in offset order; with ``until``, stop after the first
    record for which it is true.

    ``consumer`` as for :func:`read_latest` (no group, ``read_committed``); used for the
    schedule topic: a restarted ingest partition reads it back from the offset its checkpoint
    names, so restore time does not grow with the deployment's age.
    """
    from aiokafka import TopicPartition

    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    try:
        begin = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[Any] = []
        begin = max(begin, start)
        if end <= begin:
            return out
        consumer.seek(tp, begin)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while await consumer.position(tp) < end:
            if loop.time() > deadline:
                raise TimeoutError(f"reading {topic}/{partition} took > {timeout_s} s")
            batch = await consumer.getmany(tp, timeout_ms=500)
            for r in batch.get(tp, ()):
                if r.offset >= end:
                    break
                out.append(r)
                if until is not None and until(r):
                    return out
        return out
    finally:
        consumer.unsubscribe()


async def read_range(
    consumer: Any, topic: str, partition: int, start: int, stop: int,
    on_batch: Callable[[list[Any]], None], idle_timeout_s: float = 120.0,
) -> int:
    """Hand ``on_batch`` every committed record of ``topic``/``partition`` with ``start <=
    offset < stop``, in offset order, one fetched batch at a time (never the whole range in
    memory); return how many. ``consumer`` as for :func:`read_all`. Raises
    :class:`LookupError` when the partition now begins after ``start`` (retention deleted
    records of the range), :class:`EOFError` (its ``args[0]`` the end offset) when it ends
    before ``stop`` (the broker lost records, or the topic was re-created), and
    :class:`TimeoutError` when no record comes for ``idle_timeout_s`` seconds."""
    from aiokafka import TopicPartition

    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    try:
        begin = (await consumer.beginning_offsets([tp]))[tp]
        if begin > start:
            raise LookupError(f"{topic}/{partition} begins at offset {begin}, after {start}")
        end = (await consumer.end_offsets([tp]))[tp]
        if end < stop:
            raise EOFError(end)
        consumer.seek(tp, start)
        loop = asyncio.get_running_loop()
        last = loop.time()
        n = 0
        while await consumer.position(tp) < stop:
            batch = await consumer.getmany(tp, timeout_ms=500)
            got = [r for r in batch.get(tp, ()) if r.offset < stop]
            if got:
                on_batch(got)
                n += len(got)
                last = loop.time()
            elif loop.time() - last > idle_timeout_s:
                raise TimeoutError(f"reading {topic}/{partition} up to offset {stop}: nothing "
                                   f"for {idle_timeout_s} s")
        return n
    finally:
        consumer.unsubscribe()
