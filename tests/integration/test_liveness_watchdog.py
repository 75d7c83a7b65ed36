"""The liveness watchdog names a partition that stops progressing while records keep arriving
(issue #24: an events partition once made no progress after a restart — no checkpoint, no error
— while the others went on)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from agents.worker.pipeline import Worker
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_a_stalled_partition_is_named_while_the_others_go_on(
    kafka_broker: str, unique_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, ["a", "b", "c", "d"],
                         events_partitions=2, shards=1, stall_timeout_s=2.0)
    await ps.create_topics(s)
    caplog.set_level(logging.WARNING, logger="stream_dp.pipeline")
    worker = Worker(s)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        deadline = time.monotonic() + 60
        while not worker.ready or sorted(worker.ingest.states) != [0, 1]:
            assert not task.done() and time.monotonic() < deadline
            await asyncio.sleep(0.2)
        from aiokafka import AIOKafkaProducer, TopicPartition

        # the stall: partition 1 of the events stops being fetched (what a lost fetch
        # position, a stuck restore or a broker quirk looks like from outside)
        worker.ingest.consumer.pause(TopicPartition(s.events_topic, 1))
        prod = AIOKafkaProducer(bootstrap_servers=kafka_broker)
        await prod.start()
        try:
            while "makes no progress" not in caplog.text:
                assert not task.done() and time.monotonic() < deadline + 60, caplog.text[-2000:]
                for p in (0, 1):  # records keep arriving in both partitions
                    _, value = ps.event_bytes("a", s.origin + 1.0)
                    await prod.send_and_wait(s.events_topic, value, partition=p)
                await asyncio.sleep(0.3)
        finally:
            await prod.stop()
    finally:
        stop.set()
        await task
    named = [r.getMessage() for r in caplog.records if "makes no progress" in r.getMessage()]
    assert named and all(m.startswith("ingest partition 1 makes no progress") for m in named)
    assert worker.stats["stalled_partitions"] >= 1
