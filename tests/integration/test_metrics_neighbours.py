"""The default /metrics exposition does not move with a raw count (DESIGN.md §2, rules 6 and 7).

Two real ``stream-dp worker`` processes (each with its web server, dashboard and reconcile side
agent, default settings apart from the deployment's names) read two neighbouring logs: the second
holds one event more, the nastiest one — it lifts one stream (and its ancestors) in one tick to
exactly ``cap × max_events_per_tick``, the clip limit, so every threshold the worker has is
crossed by that one event. Once both released every tick and published every histogram, their
``/metrics`` expositions must be equal apart from:

* time-based series: ``_created`` timestamps, the buckets and sums of ``*_seconds`` histograms
  (their ``_count`` stays compared), and the ``process_*`` collectors (CPU, memory, file
  descriptors: load, docs/privacy.md "Timing");
* the reconcile diagnostics computed from the *noisy* releases alone
  (``stream_dp_reconcile_residual``, ``stream_dp_reconcile_iterations``): post-processing of what
  is published anyway, and different between two deployments because their noise is.

Everything else — every name, label, HELP/TYPE line and value — must be identical. The test is
kept small (1 events partition, 1 shard, 4 streams, 3 ticks) so that it runs in the default suite.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from agents.config.settings import Settings
from agents.kafka.embedded_broker import free_port
from agents.kafka.processes import dying_with_parent
from tests.integration.pipeline_support import (
    ROOT,
    close_ticks,
    create_topics,
    event_bytes,
    make_settings,
    produce,
    settings_env,
)

pytestmark = pytest.mark.integration

LEAVES = ["a/x", "a/y"]  # streams: all, a, a/x, a/y
N_STREAMS = 4
LAST_TICK = 3
#: cap × max_events_per_tick = 2 events: the added event makes a/x (and a, all) reach it
CLIP_EVENTS = 2

#: series that are time-based, or computed from the noisy releases alone (see the module note)
_IGNORED = re.compile(
    r"^(process_\w+|\w+_created|\w+_seconds_(bucket|sum)|stream_dp_reconcile_(residual|"
    r"iterations))(\{.*\})? "
)


def _log(s: Settings, extra: bool) -> list[tuple[bytes, bytes]]:
    """Tick 1: one a/x event (plus the added one), one a/y event in tick 2; tick 3 empty."""
    t1 = s.tick_bounds(1)[0]
    t2 = s.tick_bounds(2)[0]
    events = [event_bytes("a/x", t1 + 0.1), event_bytes("a/y", t2 + 0.1)]
    if extra:
        events.insert(1, event_bytes("a/x", t1 + 0.2))
    return events


def _http(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def _normalised(exposition: str) -> list[str]:
    return [line for line in exposition.splitlines() if not _IGNORED.match(line)]


def _done(exposition: str) -> bool:
    return (f"stream_dp_releases_total {float(N_STREAMS * LAST_TICK)}" in exposition
            and f"stream_dp_reconcile_last_tick {float(LAST_TICK)}" in exposition)


@pytest.mark.parametrize("pipeline_processes", [0, 2])
def test_default_metrics_are_the_same_for_neighbouring_logs(
        kafka_broker: str, tmp_path: Path, unique_name: str, pipeline_processes: int) -> None:
    """``pipeline_processes = 2``: the pipeline runs in child processes whose metrics the
    worker relays to its own /metrics (issue #32 review: the relay is compared too)."""
    runs: dict[bool, tuple[Settings, int]] = {}
    for extra in (False, True):
        name = f"{unique_name}-{int(extra)}"
        (tmp_path / name).mkdir()
        s = make_settings(kafka_broker, tmp_path / name, name, LEAVES, events_partitions=1,
                          shards=1, counts_partitions=1, cap=1.0,
                          max_events_per_tick=CLIP_EVENTS, web_port=free_port(),
                          pipeline_processes=pipeline_processes)
        asyncio.run(create_topics(s))
        asyncio.run(produce(s, _log(s, extra)))
        asyncio.run(close_ticks(s, LAST_TICK))
        runs[extra] = (s, s.web_port)
    procs: dict[bool, subprocess.Popen[bytes]] = {}
    logs = {extra: tmp_path / f"worker-{int(extra)}.log" for extra in runs}
    try:
        for extra, (s, _) in runs.items():
            with open(logs[extra], "wb") as out:
                procs[extra] = subprocess.Popen(
                    dying_with_parent([sys.executable, "-m", "agents.cli", "worker"]),
                    env=settings_env(s), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        scraped: dict[bool, str] = {}
        deadline = time.monotonic() + 120
        while len(scraped) < 2:
            for extra, (_, port) in runs.items():
                assert procs[extra].poll() is None, logs[extra].read_text()[-3000:]
                text = _http(f"http://127.0.0.1:{port}/metrics")
                if extra not in scraped and _done(text):
                    scraped[extra] = text
            assert time.monotonic() < deadline, {e: _http(f"http://127.0.0.1:{p}/metrics")[-2000:]
                                                 for e, (_, p) in runs.items()}
            time.sleep(0.3)
        # both finished: scrape again, together, so that nothing still on its way differs
        time.sleep(1.0)
        final = {extra: _http(f"http://127.0.0.1:{port}/metrics")
                 for extra, (_, port) in runs.items()}
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    base, neighbour = _normalised(final[False]), _normalised(final[True])
    assert any(line.startswith("stream_dp_ticks_released_total ") for line in base)
    assert base == neighbour, "\n".join(
        sorted(set(base).symmetric_difference(neighbour)))
