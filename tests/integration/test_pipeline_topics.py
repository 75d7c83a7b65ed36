"""Topic creation with explicit partitions, and checkpoints read back from a real broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.kafka.checkpoint_reader import read_latest, read_latest_with_progress
from agents.kafka.checkpoints import chunk_messages, progress_message
from agents.kafka.topics import ensure_topics, topic_specs
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_ensure_topics_is_idempotent_and_checks_partitions(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, ["a/b/c"])
    created = await ensure_topics(kafka_broker, s)
    assert sorted(created) == sorted(t.name for t in topic_specs(s))
    assert await ensure_topics(kafka_broker, s) == []
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(bootstrap_servers=kafka_broker)
    await c.start()
    try:
        await c.topics()
        assert len(c.partitions_for_topic(s.events_topic) or ()) == s.events_partitions
        assert len(c.partitions_for_topic(s.partials_topic) or ()) == s.shards
    finally:
        await c.stop()
    with pytest.raises(ValueError, match="partitions"):
        await ensure_topics(kafka_broker, s.replace(shards=s.shards + 1))


async def test_read_latest_checkpoint_across_windows(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    s = ps.make_settings(kafka_broker, tmp_path, unique_name, ["a/b/c"])
    await ensure_topics(kafka_broker, s)
    topic = s.release_checkpoints_topic
    reader = AIOKafkaConsumer(bootstrap_servers=kafka_broker, isolation_level="read_committed",
                              enable_auto_commit=False)
    await reader.start()
    prod = AIOKafkaProducer(bootstrap_servers=kafka_broker, transactional_id=unique_name)
    await prod.start()
    try:
        assert await read_latest(reader, topic, 1) is None
        payloads = {}
        for seq in range(1, 40):
            payload = bytes([seq]) * (seq * 37)  # up to 72 chunks of 20 bytes
            payloads[seq] = payload
            await prod.begin_transaction()
            for key, value, headers in chunk_messages(seq, payload, 20):
                await prod.send(topic, value, key=key, partition=1, headers=headers)
            await prod.commit_transaction()
        # an aborted, newer checkpoint is invisible to read_committed readers
        await prod.begin_transaction()
        for key, value, headers in chunk_messages(99, b"zombie" * 50, 20):
            await prod.send(topic, value, key=key, partition=1, headers=headers)
        await prod.flush()
        await prod.abort_transaction()
        got = await read_latest(reader, topic, 1)
        assert got is not None and got.seq == 39 and got.payload == payloads[39]
        assert await read_latest(reader, topic, 0) is None
        # progress records: the newest one counts, and only if it builds on that checkpoint
        assert (await read_latest_with_progress(reader, topic, 1))[1] is None
        for base, value in ((39, b"first"), (39, b"second")):
            await prod.begin_transaction()
            key, value, headers = progress_message(base, value)
            await prod.send(topic, value, key=key, partition=1, headers=headers)
            await prod.commit_transaction()
        ck, progress = await read_latest_with_progress(reader, topic, 1)
        assert ck == got and progress is not None and (progress.base, progress.payload) == (
            39, b"second")
        await prod.begin_transaction()  # a newer full checkpoint supersedes the progress
        for key, value, headers in chunk_messages(40, b"full", 20):
            await prod.send(topic, value, key=key, partition=1, headers=headers)
        await prod.commit_transaction()
        ck, progress = await read_latest_with_progress(reader, topic, 1)
        assert ck is not None and ck.seq == 40 and progress is None
        await prod.begin_transaction()  # a stale progress record after it is not applied
        key, value, headers = progress_message(39, b"stale")
        await prod.send(topic, value, key=key, partition=1, headers=headers)
        await prod.commit_transaction()
        assert (await read_latest_with_progress(reader, topic, 1))[1] is None
    finally:
        await prod.stop()
        await reader.stop()


async def test_worker_refuses_mismatched_partition_counts(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    from agents.worker.pipeline import Worker

    s = ps.make_settings(kafka_broker, tmp_path, unique_name, ["a/b/c"])
    with pytest.raises(RuntimeError, match="does not exist"):
        await Worker(s).run()
    await ensure_topics(kafka_broker, s)
    with pytest.raises(ValueError, match="partitions"):
        await Worker(s.replace(shards=s.shards + 2)).run()
