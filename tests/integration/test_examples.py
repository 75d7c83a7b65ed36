"""The subscriber examples run as a user runs them (issue #24, "What users see"):
``examples/subscribe.py --ticks 3`` prints 3 ticks of every stream; ``--from-beginning`` shows
every stream; ``examples/subscribe_compact.py --from-beginning`` keeps every tick of a long
retained topic (it kept only the last 64) and Ctrl-C ends it without a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from agents.config.domain import load_domain
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
N_TICKS = 100


@pytest.fixture()
async def deployment(kafka_broker: str, unique_name: str, tmp_path: Path) -> object:
    """A deployment with per-stream JSON and compact output, N_TICKS ticks released."""
    leaves = ps.hierarchy_paths(2, 2, 2)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves,
                         compact_topic=f"{unique_name}.compact", shards=3, counts_partitions=3)
    await ps.create_topics(s)
    events = [(leaves[i % len(leaves)], s.origin + 0.37 * i, 1.0)
              for i in range(int(N_TICKS * s.tick_seconds / 0.37))]
    await ps.produce(s, (ps.event_bytes(k, t, v) for k, t, v in events))
    await ps.close_ticks(s, N_TICKS)
    domain = load_domain(s.domain_file)
    await ps.run_worker_until(s, domain.size, N_TICKS, timeout_s=180)
    return s, domain


async def _run(args: list[str], s: object, cwd: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=str(cwd), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "STREAM_DP_BOOTSTRAP": s.bootstrap,  # type: ignore[attr-defined]
             "STREAM_DP_COUNTS_TOPIC": s.counts_topic})  # type: ignore[attr-defined]
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_subscribe_ticks_3_from_the_beginning_prints_3_ticks_of_every_stream(
    deployment: tuple[object, object]
) -> None:
    s, domain = deployment
    rc, out, err = await _run([str(ROOT / "examples" / "subscribe.py"), "--ticks", "3",
                               "--from-beginning"], s, ROOT)
    assert rc == 0, err[-2000:]
    rows = [line.split() for line in out.splitlines()]
    got = {(row[2], int(row[1])) for row in rows}
    assert got == {(n, t) for n in domain.names for t in (1, 2, 3)}  # type: ignore[attr-defined]
    assert len(rows) == len(got)  # each once


async def test_subscribe_compact_from_the_beginning_keeps_every_tick(
    deployment: tuple[object, object], tmp_path: Path
) -> None:
    s, domain = deployment
    rc, out, err = await _run([str(ROOT / "examples" / "subscribe_compact.py"), "--topic",
                               s.compact_topic, "--from-beginning", "--json",  # type: ignore[attr-defined]
                               "--ticks", str(N_TICKS)], s, tmp_path)
    assert rc == 0, err[-2000:]
    printed = [json.loads(line) for line in out.splitlines()]
    assert sorted(m["tick"] for m in printed) == list(range(1, N_TICKS + 1))
    assert all(m["streams"] == domain.size for m in printed)  # type: ignore[attr-defined]


async def test_subscribe_compact_stops_on_ctrl_c_without_a_traceback(
    deployment: tuple[object, object], tmp_path: Path
) -> None:
    s, _ = deployment
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "examples" / "subscribe_compact.py"), "--topic",
        s.compact_topic, cwd=str(tmp_path), stdout=asyncio.subprocess.PIPE,  # type: ignore[attr-defined]
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "STREAM_DP_BOOTSTRAP": s.bootstrap})  # type: ignore[attr-defined]
    await asyncio.sleep(3.0)  # let it connect and wait for new ticks
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "Traceback" not in err.decode()
