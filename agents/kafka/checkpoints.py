"""Chunked checkpoints in a compacted Kafka topic, one topic partition per stage partition.

A checkpoint is an opaque byte string with a sequence number ``seq`` (1, 2, 3, … per stage
partition). It is split into messages of at most ``chunk_bytes`` bytes, keyed ``"c<i>"`` (so that compaction
keeps the newest copy of every chunk slot), with headers ``seq``, ``i``, ``n``. Chunks are written *inside the same Kafka transaction* as the outputs and
the input offsets they describe, so a ``read_committed`` reader sees all chunks of a checkpoint
or none.

:func:`~agents.kafka.checkpoint_reader.read_latest` scans the partition backwards from its end in growing windows and returns
the newest checkpoint whose ``n`` chunks are all present (cost: about one checkpoint's bytes,
not the topic's history).

A **progress record** (key ``"p"``, header ``progress`` = the ``seq`` of the full checkpoint it
builds on) is a small payload committed in the transactions between two full checkpoints (setting
``release_checkpoint_every``); :func:`~agents.kafka.checkpoint_reader.read_latest_with_progress` returns the newest one that builds
on the checkpoint it found. Readers without the notion skip it (it has no ``seq`` header).

This module is the format (pure: no I/O, no Kafka client); reading checkpoints back from their
topic is :mod:`agents.kafka.checkpoint_reader`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Checkpoint", "CheckpointRefused", "Progress", "chunk_messages", "progress_message"]


class CheckpointRefused(ValueError):
    """A checkpoint that must not be used: tampered, written under another key, or under
    another configuration (ε, strategy, weights, domain, epoch, shards, …), or a state ahead of
    the log it was read from. Fatal: the worker stops (exit status 4)."""


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

