"""Crashes and scale-out: worker subprocesses killed with SIGKILL, restarted, joined, stopped.

After every run: each (stream, tick) is released; every copy of a (stream, tick) — including
copies from aborted transactions that a ``read_uncommitted`` reader sees — is bit-identical;
``read_committed`` readers see each exactly once; values equal the offline exact decayed
counts (enormous ε).
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agents.config import Settings, load_domain
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

N_TICKS = 60


def make_log(s: Settings, leaves: list[str], n: int) -> list[tuple[str, float, float]]:
    rng = np.random.default_rng(7)
    ts = np.sort(rng.uniform(s.origin, s.origin + N_TICKS * s.tick_seconds, n))
    keys = rng.integers(0, len(leaves), n)
    values = rng.choice([1.0, 0.5, 2.0], n, p=[0.8, 0.1, 0.1])
    return [(leaves[k], float(t), float(v)) for k, t, v in zip(keys, ts, values, strict=True)]


async def check_run(s: Settings, domain: Any, log: list[tuple[str, float, float]],
                    mechanism_bound: float) -> dict[str, int]:
    committed = await ps.released(s, committed=True)
    uncommitted = await ps.released(s, committed=False)
    exact = ps.exact_decayed(domain, log, s, N_TICKS)
    dup_committed = sum(len(v) - 1 for v in committed.values())
    dup_uncommitted = 0
    for key, want in exact.items():
        assert key in committed, f"{key} never released"
        copies = set(committed[key]) | set(uncommitted.get(key, []))
        assert len(copies) == 1, f"{key}: {len(copies)} different copies"
        dup_uncommitted += len(uncommitted.get(key, [])) - 1
        msg = json.loads(committed[key][0])
        assert abs(msg["value"] - want) <= mechanism_bound + 12 * msg["stderr"], (key, msg, want)
    assert dup_committed == 0
    return {"releases": len(exact), "uncommitted_duplicates": dup_uncommitted}


def bound_of(s: Settings) -> float:
    from stream_dp.strategies import make_mechanism

    return float(make_mechanism(s.strategy, s.p, s.horizon, s.privacy, s.cap).rounding_bound())


async def test_ten_kill9_and_restarts(kafka_broker: str, unique_name: str, tmp_path: Path) -> None:
    leaves = ps.hierarchy_paths(4, 4, 8)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves, epsilon=1e4,
                         tick_seconds=1.0, transaction_timeout_s=10.0)
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    log = make_log(s, leaves, 100_000)
    await ps.produce(s, (ps.event_bytes(k, t, v) for k, t, v in log))
    await ps.close_ticks(s, N_TICKS)

    rng = random.Random(11)
    worker = ps.WorkerProcess(s, "w0", tmp_path)
    try:
        for _ in range(10):
            worker.start()
            await asyncio.sleep(rng.uniform(1.5, 5.0))
            assert worker.alive(), worker.log_path.read_text()[-3000:]
            worker.kill9()
        before = worker.starts()
        worker.start()
        await worker.wait_log("release: assigned", count=before + 1)
        await ps.wait_for_ticks(s, domain.size, N_TICKS, timeout_s=240)
        assert worker.alive()
    finally:
        code = worker.terminate()
    assert code == 0, worker.log_path.read_text()[-3000:]
    stats = await check_run(s, domain, log, bound_of(s))
    print("kill -9 run:", stats)


async def test_three_workers_join_and_leave(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    leaves = ps.hierarchy_paths(4, 4, 8)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves, epsilon=1e4,
                         tick_seconds=1.0, events_partitions=6, shards=6)
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    log = make_log(s, leaves, 60_000)
    await ps.produce(s, (ps.event_bytes(k, t, v) for k, t, v in log))
    await ps.close_ticks(s, N_TICKS)

    workers = {w: ps.WorkerProcess(s, w, tmp_path) for w in ("a", "b", "c")}
    try:
        workers["a"].start()
        await asyncio.sleep(2.5)
        workers["b"].start()
        await asyncio.sleep(2.5)
        workers["c"].start()
        await asyncio.sleep(3.0)
        assert workers["a"].terminate() == 0  # graceful: leaves the group, others take over
        await asyncio.sleep(2.5)
        workers["a"].start()
        await asyncio.sleep(2.0)
        workers["b"].kill9()
        await asyncio.sleep(2.0)
        workers["b"].start()
        await asyncio.sleep(2.0)
        assert workers["c"].terminate() == 0
        await ps.wait_for_ticks(s, domain.size, N_TICKS, timeout_s=240)
    finally:
        for w in workers.values():
            w.stop()
    for w in workers.values():
        assert w.proc is not None and w.proc.returncode in (0, -9), w.log_path.read_text()[-2000:]
    # the work really was shared: some worker held a proper, non-empty subset of the partitions
    import re

    shares = [
        set(map(int, re.findall(r"\d+", m)))
        for w in workers.values()
        for m in re.findall(r"ingest: assigned partitions \[([\d, ]*)\]", w.log_path.read_text())
    ]
    assert any(0 < len(p) < s.events_partitions for p in shares), shares
    stats = await check_run(s, domain, log, bound_of(s))
    print("scale-out run:", stats)
