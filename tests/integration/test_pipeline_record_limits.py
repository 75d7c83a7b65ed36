"""A record the broker refuses must never be silently missing from a committed transaction.

aiokafka commits a transaction even if one of its records failed (e.g. above the topic's
``max.message.bytes``). The pipeline awaits every record before committing: a checkpoint chunk
too large for its topic stops the worker with a clear error and commits nothing of the tick.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from agents.pipeline import Worker
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_a_record_too_large_stops_the_worker_and_commits_nothing(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    leaves = ps.hierarchy_paths(2, 2, 2)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves, shards=1,
                         checkpoint_chunk_bytes=64 * 1024)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:  # the release checkpoints topic made by hand, too small for one checkpoint chunk
        await admin.create_topics([NewTopic(s.release_checkpoints_topic, s.shards, 1,
                                            topic_configs={"max.message.bytes": "300",
                                                           "cleanup.policy": "compact"})])
    finally:
        await admin.close()
    await ps.create_topics(s)  # the others, as usual
    await ps.produce(s, [ps.event_bytes(leaves[0], s.origin + 0.5)])
    await ps.close_ticks(s, 2)
    worker = Worker(s)
    with pytest.raises(RuntimeError, match=r"max\.message\.bytes"):
        await asyncio.wait_for(worker.run(asyncio.Event()), 90)
    assert await ps.read_topic(s.bootstrap, s.counts_topic) == []  # nothing committed
