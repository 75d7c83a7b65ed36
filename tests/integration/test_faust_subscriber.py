"""examples/faust_subscriber.py against the real broker: what it keeps is what was released."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.config.domain import load_domain
from agents.kafka.embedded_broker import free_port
from stream_dp.releases import LatestReleases, decode_count
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]


async def test_faust_subscriber_keeps_the_latest_release_of_every_stream(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    leaves = ps.hierarchy_paths(2, 2, 2)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves, epsilon=1.0,
                         tick_seconds=1.0, events_partitions=2, shards=2, counts_partitions=2)
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    log = [(leaves[i % 8], s.origin + 0.03 * i, 1.0) for i in range(200)]  # ticks 1..6
    await ps.produce(s, (ps.event_bytes(*e) for e in log))
    await ps.close_ticks(s, 6)
    got, _ = await ps.run_worker_until(s, domain.size, 6, timeout_s=60)
    want = LatestReleases()
    for values in got.values():
        for raw in values:
            want.add(decode_count(raw))
    assert len(want) == domain.size and {r.tick for r in want.values()} == {6}

    out = tmp_path / "faust-latest.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    env.update(STREAM_DP_BOOTSTRAP=kafka_broker, STREAM_DP_COUNTS_TOPIC=s.counts_topic,
               STREAM_DP_COUNTS_PARTITIONS=str(s.counts_partitions),
               FAUST_SUBSCRIBER_ID=f"{unique_name}-faust", FAUST_SUBSCRIBER_OUT=str(out),
               FAUST_SUBSCRIBER_DATADIR=str(tmp_path / "faust-data"),
               FAUST_SUBSCRIBER_WEB_PORT=str(free_port()), PYTHONUNBUFFERED="1")
    with open(tmp_path / "faust.log", "w") as flog:
        proc = subprocess.Popen(
            [sys.executable, "-m", "faust", "-A", "examples.faust_subscriber", "worker",
             "-l", "info", "--without-web"],
            env=env, cwd=ROOT, stdout=flog, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        seen: dict[str, dict[str, float]] = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "faust.log").read_text()[-3000:]
            if out.exists():
                seen = json.loads(out.read_text())
                if len(seen) == domain.size and all(v["tick"] == 6 for v in seen.values()):
                    break
            await asyncio.sleep(0.5)
        assert len(seen) == domain.size, (tmp_path / "faust.log").read_text()[-3000:]
        for stream, r in want.items():
            assert seen[stream] == {"tick": r.tick, "value": r.value, "stderr": r.stderr,
                                    "tick_end": r.tick_end}, stream
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
