"""Checkpoint chunking and assembly (the Kafka read loop is covered by the integration tests)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agents.kafka.checkpoints import Checkpoint, _assemble, chunk_messages


@dataclass
class Rec:
    value: bytes
    headers: list[tuple[str, bytes]]


def recs(seq: int, payload: bytes, size: int) -> list[Rec]:
    return [Rec(v, h) for _, v, h in chunk_messages(seq, payload, size)]


def test_chunks_round_trip_and_keys_are_slots() -> None:
    payload = bytes(range(256)) * 10
    msgs = chunk_messages(3, payload, 1000)
    assert [k for k, _, _ in msgs] == [b"c0", b"c1", b"c2"]
    assert _assemble(recs(3, payload, 1000)) == (Checkpoint(3, payload), False)
    assert _assemble(recs(1, b"", 10)) == (Checkpoint(1, b""), False)


def test_newest_complete_checkpoint_wins() -> None:
    old, new = b"a" * 50, b"b" * 30
    assert _assemble(recs(1, old, 20) + recs(2, new, 20)) == (Checkpoint(2, new), False)


def test_incomplete_newest_is_reported_not_skipped() -> None:
    # a window that cut the newest checkpoint's first chunk must not fall back to an older one
    newest = recs(2, b"b" * 30, 20)[1:]
    found, incomplete = _assemble(recs(1, b"a" * 50, 20) + newest)
    assert found is None and incomplete


def test_chunk_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        chunk_messages(1, b"x", 0)
