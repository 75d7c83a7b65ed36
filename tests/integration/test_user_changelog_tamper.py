"""A writer of the per-person changelog topic against a real worker (issue #34, review of the
user-level preview; :mod:`agents.ingest.user_digest`): a real broker, a worker subprocess
that writes a person's records over several commits, then a copy of the person's *older*
genuine record appended to ``ingest_users_topic`` after the newest — the person's count rolled
back, so more than K of their events would count. ``stream-dp worker`` started again refuses
the table in one line naming the topic, exit status 3, and publishes nothing more.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agents.config.settings import Settings
from tests.integration import pipeline_support as ps
from tests.integration.test_user_level_crashes import _message, _user_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def _records_of(s: Settings, topic: str) -> list[Any]:
    """Every committed record of ``topic``."""
    return await ps.read_topic(s.bootstrap, topic)


async def test_an_older_record_appended_to_the_changelog_stops_the_worker_in_one_line(
        kafka_broker: str, unique_name: str, tmp_path: Path) -> None:
    from aiokafka import AIOKafkaProducer

    # the table written with every commit (user_flush_interval_s = 0): one record of u0 per
    # commit, the genuine old records the attack replays
    s = _user_settings(kafka_broker, tmp_path, unique_name, events_partitions=1, shards=1,
                       user_flush_interval_s=0.0)
    await ps.create_topics(s)
    leaves = ps.hierarchy_paths(2, 3, 4)
    worker = ps.WorkerProcess(s, "w0", tmp_path).start()
    try:
        # three of u0's events, each committed before the next arrives: three records of u0
        for i in range(3):
            await ps.produce(s, [_message("u0", leaves[i], s.origin + 0.25, 1.0)])
            deadline = time.monotonic() + 90
            while len(await _records_of(s, s.ingest_users_topic)) < i + 1:
                assert worker.alive(), worker.log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, worker.log_path.read_text()[-3000:]
                await asyncio.sleep(0.3)
    finally:
        assert worker.terminate() == 0, worker.log_path.read_text()[-3000:]
    written = await _records_of(s, s.ingest_users_topic)
    assert len(written) == 3 and len({r.key for r in written}) == 1
    first = written[0]

    # the writer of the topic: u0's first record again, after the newest
    prod = AIOKafkaProducer(bootstrap_servers=s.bootstrap)
    await prod.start()
    try:
        await prod.send_and_wait(s.ingest_users_topic, first.value, key=first.key,
                                 partition=first.partition)
    finally:
        await prod.stop()
    counts_before = len(await _records_of(s, s.counts_topic))

    env = ps.settings_env(s.replace(worker_id="w0"))
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "agents.cli", "worker"], env=env,
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    refusals = [line for line in proc.stderr.splitlines()
                if "does not hold the table the checkpoint sealed" in line]
    assert len(refusals) == 1, proc.stderr[-3000:]
    assert repr(s.ingest_users_topic) in refusals[0]
    assert "stream-dp deployment new" in refusals[0]
    assert len(await _records_of(s, s.counts_topic)) == counts_before
