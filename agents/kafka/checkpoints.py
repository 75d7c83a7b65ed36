"""Chunked checkpoints in a compacted Kafka topic, one topic partition per stage partition.

A checkpoint is an opaque byte string with a sequence number ``seq`` (1, 2, 3, … per stage
partition). It is split into messages of at most ``chunk_bytes`` bytes, keyed ``"c<i>"`` (so that compaction
keeps the newest copy of every chunk slot), with headers ``seq``, ``i``, ``n``. Chunks are written *inside the same Kafka transaction* as the outputs and
the input offsets they describe, so a ``read_committed`` reader sees all chunks of a checkpoint
or none.

:func:`read_latest` scans the partition backwards from its end in growing windows and returns
the newest checkpoint whose ``n`` chunks are all present (cost: about one checkpoint's bytes,
not the topic's history).

A **progress record** (key ``"p"``, header ``progress`` = the ``seq`` of the full checkpoint it
builds on) is a small payload committed in the transactions between two full checkpoints (setting
``release_checkpoint_every``); :func:`read_latest_with_progress` returns the newest one that builds
on the checkpoint it found. Readers without the notion skip it (it has no ``seq`` header).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Checkpoint", "Progress", "chunk_messages", "progress_message", "read_all", "read_latest",
           "read_latest_with_progress"]


@dataclass(frozen=True)
class Checkpoint:
    """A restored checkpoint: its sequence number and payload bytes."""

    seq: int
    payload: bytes


@dataclass(frozen=True)
class Progress:
    """A progress record: the ``seq`` of the full checkpoint it builds on and its payload."""

    base: int
    payload: bytes


def progress_message(base: int, payload: bytes) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """``(key, value, headers)`` of a progress record building on checkpoint ``base``."""
    return b"p", payload, [("progress", str(base).encode())]


def _progress_of(records: list[Any], base: int) -> Progress | None:
    """The newest progress record among ``records`` (offset order) building on ``base``."""
    for r in reversed(records):
        h = {k: v for k, v in (r.headers or ())}
        if "progress" not in h:
            continue
        try:
            got = int(h["progress"])
        except ValueError:
            continue
        # only the newest one counts: an older base means a newer full checkpoint followed it
        return Progress(got, r.value or b"") if got == base else None
    return None


def chunk_messages(
    seq: int, payload: bytes, chunk_bytes: int
) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """``(key, value, headers)`` of the messages holding ``payload`` as checkpoint ``seq``."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    n = max(1, -(-len(payload) // chunk_bytes))
    out = []
    for i in range(n):
        part = payload[i * chunk_bytes : (i + 1) * chunk_bytes]
        headers = [("seq", str(seq).encode()), ("i", str(i).encode()), ("n", str(n).encode())]
        out.append((f"c{i}".encode(), part, headers))
    return out


def _assemble(records: list[Any]) -> tuple[Checkpoint | None, bool]:
    """The newest complete checkpoint among ``records``, and whether the newest was incomplete."""
    by_seq: dict[int, dict[int, bytes]] = {}
    total: dict[int, int] = {}
    for r in records:
        h = {k: v for k, v in (r.headers or ())}
        try:
            seq, i, n = int(h["seq"]), int(h["i"]), int(h["n"])
        except (KeyError, ValueError):
            continue
        by_seq.setdefault(seq, {})[i] = r.value or b""
        total[seq] = n
    for seq in sorted(by_seq, reverse=True):
        parts = by_seq[seq]
        if len(parts) == total[seq] and all(i in parts for i in range(total[seq])):
            return Checkpoint(seq, b"".join(parts[i] for i in range(total[seq]))), False
        # an incomplete newest checkpoint means the window is too small; the caller widens it
        return None, True
    return None, False


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
