"""The reconcile agent's hand-over rules (issue #25), against a fake consumer.

A committed compact record handed over by the release stage is taken only when the leading
consumer stands exactly at its offset (every earlier record returned): then the consumer is
moved past it. Anything else — not leading, behind (other workers' shards, a backlog), already
past it, another topic — leaves it to the topic. Offsets are committed no further than a taken
record not yet added, and the leading loop adds fetched and taken records in offset order.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition

from agents.reconcile.agent import Reconciler
from agents.reconcile.config import ReconcilerConfig

TOPIC = "t.compact"


class FakeConsumer:
    """Positions per partition; ``seek`` moves them (what the hand-over uses of aiokafka)."""

    def __init__(self, positions: dict[int, int]) -> None:
        self.positions = dict(positions)
        self.seeks: list[tuple[int, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(TOPIC, p) for p in self.positions}

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp.partition]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp.partition, offset))
        self.positions[tp.partition] = offset


def _reconciler(consumer: FakeConsumer | None) -> Reconciler:
    cfg = ReconcilerConfig(bootstrap="localhost:1", compact_topic=TOPIC, shards=2,
                           domain_name="d")
    rec = Reconciler(cfg, SimpleNamespace(names=("a", "b")))
    rec._lead_consumer = consumer  # type: ignore[assignment]
    return rec


def test_taken_only_at_the_exact_position() -> None:
    consumer = FakeConsumer({0: 10, 1: 7})
    rec = _reconciler(consumer)
    asyncio.run(rec.hand_over(TOPIC, 0, 10, b"x"))  # at the position: taken, moved past
    assert consumer.positions == {0: 11, 1: 7} and consumer.seeks == [(0, 11)]
    assert [(p, r.offset, r.value) for p, r in rec._handed] == [(0, 10, b"x")]
    asyncio.run(rec.hand_over(TOPIC, 0, 11, b"y"))  # the next one of the same partition
    assert consumer.positions[0] == 12 and rec.handed_over == 2
    # behind (earlier records, e.g. another worker's, still to be read): left to the topic
    asyncio.run(rec.hand_over(TOPIC, 1, 9, b"z"))
    # already read from the topic
    asyncio.run(rec.hand_over(TOPIC, 1, 6, b"w"))
    # another topic, an unassigned partition
    asyncio.run(rec.hand_over("other", 1, 7, b"v"))
    asyncio.run(rec.hand_over(TOPIC, 5, 0, b"u"))
    assert consumer.positions == {0: 12, 1: 7} and len(consumer.seeks) == 2
    assert rec.handed_over == 2 and rec.handed_missed == 4
    assert [r.offset for _, r in rec._handed] == [10, 11]


def test_the_commit_marker_after_a_taken_record_is_skipped_and_nothing_else() -> None:
    consumer = FakeConsumer({0: 10, 1: 3})
    rec = _reconciler(consumer)
    asyncio.run(rec.hand_over(TOPIC, 0, 10, b"x"))  # taken: sought to 11, the marker
    # the next transaction's record: offset 11 can only be the first one's commit marker
    asyncio.run(rec.hand_over(TOPIC, 0, 12, b"y"))
    assert consumer.positions[0] == 13 and rec.handed_over == 2
    # two offsets in between: something else may be there (another producer's records)
    asyncio.run(rec.hand_over(TOPIC, 0, 15, b"z"))
    # one offset in between, but no record was taken in this partition: anything may be there
    asyncio.run(rec.hand_over(TOPIC, 1, 4, b"w"))
    assert consumer.positions == {0: 13, 1: 3} and rec.handed_missed == 2
    # the consumer moved on from where the hand-over left it (read the marker and more)
    consumer.positions[0] = 14
    asyncio.run(rec.hand_over(TOPIC, 0, 15, b"v"))
    assert consumer.positions[0] == 14 and rec.handed_missed == 3
    assert [r.offset for _, r in rec._handed] == [10, 12]


def test_not_leading_takes_nothing() -> None:
    rec = _reconciler(None)
    asyncio.run(rec.hand_over(TOPIC, 0, 0, b"x"))
    assert rec._handed == [] and rec.handed_over == 0 and rec.handed_missed == 1


def test_offsets_are_committed_no_further_than_a_taken_record_not_yet_added() -> None:
    consumer = FakeConsumer({0: 10, 1: 4})
    rec = _reconciler(consumer)
    asyncio.run(rec.hand_over(TOPIC, 0, 10, b"x"))
    asyncio.run(rec.hand_over(TOPIC, 0, 11, b"y"))
    # the consumer is past both, but a successor must read them from the topic
    assert rec._commit_positions({0: 12, 1: 4}) == {0: 10, 1: 4}
    rec._handed = []  # added to the assembler by the leading loop
    assert rec._commit_positions({0: 12, 1: 4}) == {0: 12, 1: 4}


def test_fetched_and_taken_records_are_added_in_offset_order() -> None:
    rec = _reconciler(FakeConsumer({0: 0, 1: 0}))
    added: list[tuple[int, int]] = []

    def add(assembler: Any, partition: int, r: Any) -> None:
        added.append((partition, r.offset))

    rec._add = add  # type: ignore[method-assign]
    assembler = SimpleNamespace(conflicts=0, dropped=0, pop_complete=lambda: [])
    fetched = {TopicPartition(TOPIC, 0): [SimpleNamespace(offset=3, value=b"")],
               TopicPartition(TOPIC, 1): [SimpleNamespace(offset=8, value=b"")]}
    from agents.reconcile.agent import _HandedRecord

    handed = [(0, _HandedRecord(5, b"")), (1, _HandedRecord(2, b"")), (2, _HandedRecord(1, b""))]
    rec._ingest(assembler, fetched, handed)  # type: ignore[arg-type]
    assert sorted(added) == [(0, 3), (0, 5), (1, 2), (1, 8), (2, 1)]
    for part in (0, 1, 2):
        offsets = [o for p, o in added if p == part]
        assert offsets == sorted(offsets), part
