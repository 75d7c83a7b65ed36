"""A writer's record that fits the events topic never makes a dead letter that the dead-letter
topic refuses (DESIGN.md §2 rule 7: nothing a writer can forge may stop releases).

Found by the issue #32 review: a dead letter is keyed by the rejected record's Kafka key, which
was copied whole, and its value holds the record's first 4 KiB as JSON text (an invalid UTF-8
byte becomes ``\\ufffd``: 6 bytes). A record with a key of nearly the topic's
``max.message.bytes`` (both topics have the broker's default, 1 MiB) and 4 KiB of invalid UTF-8
fits the events topic, but its dead letter does not fit the dead-letter topic: the broker
refused the ingest transaction (``record_too_large``) and the worker stopped, for good, at every
restart — one record from any writer ended every release. Dead letters now keep at most the
first :data:`agents.kafka.codec.DLQ_KEY_LIMIT` bytes of the key.

A real worker process against the real (embedded) broker, which enforces ``max.message.bytes``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.kafka.embedded_broker import free_port
from agents.kafka.processes import dying_with_parent
from tests.integration.pipeline_support import (
    ROOT,
    close_ticks,
    create_topics,
    event_bytes,
    make_settings,
    produce,
    read_topic,
    settings_env,
)
from tests.integration.test_metrics_neighbours import (
    LAST_TICK,
    LEAVES,
    _done,
    _http,
)

pytestmark = pytest.mark.integration

#: the broker's default max.message.bytes (Kafka's and the embedded broker's)
_LIMIT = 1_048_588


async def _biggest_record_that_fits(bootstrap: str, topic: str) -> int:
    """Write one record of a near-limit key and 4 KiB of invalid UTF-8; its key length."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import MessageSizeTooLargeError

    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=16 << 20)
    await prod.start()
    try:
        for slack in range(200, 20_000, 200):
            key_len = _LIMIT - 4096 - slack
            try:
                await prod.send_and_wait(topic, b"\xff" * 4096, key=b"k" * key_len, partition=0)
                return key_len
            except MessageSizeTooLargeError:
                continue
    finally:
        await prod.stop()
    raise AssertionError("no near-limit record fits the events topic")


def test_a_near_limit_record_is_dead_lettered_and_releases_go_on(
        kafka_broker: str, tmp_path: Path, unique_name: str) -> None:
    s = make_settings(kafka_broker, tmp_path, unique_name, LEAVES, events_partitions=1, shards=1,
                      counts_partitions=1, web_port=free_port())
    asyncio.run(create_topics(s))
    t1, t2 = s.tick_bounds(1)[0], s.tick_bounds(2)[0]
    asyncio.run(produce(s, [event_bytes("a/x", t1 + 0.1)]))
    key_len = asyncio.run(_biggest_record_that_fits(kafka_broker, s.events_topic))
    asyncio.run(produce(s, [event_bytes("a/y", t2 + 0.1)]))
    asyncio.run(close_ticks(s, LAST_TICK))
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(dying_with_parent([sys.executable, "-m", "agents.cli", "worker"]),
                                env=settings_env(s), cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not _done(_http(f"http://127.0.0.1:{s.web_port}/metrics")):
            assert proc.poll() is None, f"the worker stopped ({proc.returncode}): " + \
                log.read_text()[-2000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    dead = asyncio.run(read_topic(kafka_broker, s.dlq_topic))
    assert len(dead) == 1, dead
    doc = json.loads(dead[0].value)
    assert doc["reason"] == "malformed_json" and doc["offset"] == 1
    # the key is kept as far as it can be (its start), never whole at this size
    assert dead[0].key is not None and 0 < len(dead[0].key) < key_len
    assert key_len > 1_000_000
