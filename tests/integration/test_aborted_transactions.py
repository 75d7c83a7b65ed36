"""Committed reads on the real broker past an aborted transaction of the same producer
(agents.kafka.aborted_transactions): a producer aborts, is fenced by its successor (same
transactional id: the same producer id, a new epoch), which commits; a ``read_committed``
consumer started at any offset gets exactly the committed records. noida-db 0.2.3 lists the
aborted transaction for fetches that start past its marker too; aiokafka alone then skipped
every later batch of the producer (the release shard's stall in the kill -9 test)."""

from __future__ import annotations

import pytest

from tests.integration import pipeline_support as ps

pytestmark = pytest.mark.integration


async def _read_from(bootstrap: str, topic: str, start: int) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         isolation_level="read_committed")
    await c.start()
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, start)
        end = (await c.end_offsets([tp]))[tp]
        out: list[bytes] = []
        for _ in range(200):
            if await c.position(tp) >= end:
                return out
            batch = await c.getmany(tp, timeout_ms=500)
            out.extend(r.value for r in batch.get(tp, []))
        raise AssertionError(f"the reader did not reach offset {end}")
    finally:
        await c.stop()


async def test_committed_records_after_a_fenced_abort_from_every_offset(
        kafka_broker: str, unique_name: str) -> None:
    from aiokafka import AIOKafkaProducer

    await ps.create_topic(kafka_broker, unique_name)

    def producer() -> AIOKafkaProducer:
        return AIOKafkaProducer(bootstrap_servers=kafka_broker, transactional_id=unique_name)

    committed: list[bytes] = []
    first = producer()
    await first.start()
    await first.begin_transaction()
    for i in range(5):
        await first.send_and_wait(unique_name, b"aborted-%d" % i, partition=0)
    await first.abort_transaction()  # the same epoch: its marker, then more of the producer
    await first.begin_transaction()
    for i in range(3):
        await first.send_and_wait(unique_name, b"a-%d" % i, partition=0)
        committed.append(b"a-%d" % i)
    await first.commit_transaction()
    await first.begin_transaction()
    for i in range(4):  # left open: the successor's start aborts it (fencing)
        await first.send_and_wait(unique_name, b"fenced-%d" % i, partition=0)
    second = producer()
    await second.start()
    try:
        await second.begin_transaction()
        for i in range(3):
            await second.send_and_wait(unique_name, b"b-%d" % i, partition=0)
            committed.append(b"b-%d" % i)
        await second.commit_transaction()
    finally:
        await second.stop()
        await first.stop()

    whole = await _read_from(kafka_broker, unique_name, 0)
    assert whole == committed
    where = await _offsets(kafka_broker, unique_name)  # value -> offset, aborted ones too
    assert len(where) == 5 + 3 + 4 + 3
    end = max(where.values()) + 2  # the last marker's offset + 1
    for start in range(end + 1):
        got = await _read_from(kafka_broker, unique_name, start)
        assert got == [v for v in committed if where[v] >= start], (start, got)


async def _offsets(bootstrap: str, topic: str) -> dict[bytes, int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         isolation_level="read_uncommitted", auto_offset_reset="earliest")
    await c.start()
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        await c.seek_to_beginning(tp)
        end = (await c.end_offsets([tp]))[tp]
        out: dict[bytes, int] = {}
        while await c.position(tp) < end:
            for r in (await c.getmany(tp, timeout_ms=500)).get(tp, []):
                out[r.value] = r.offset
        return out
    finally:
        await c.stop()
