"""``release_checkpoint_every``: full counter state with every K-th tick, sealed progress records
in between, and a silent re-step from the retained partials after a crash.

A deployment with K = 7, fed tick by tick and killed with SIGKILL five times, must publish every
(stream, tick) exactly once (``read_committed``), and every copy of it — aborted transactions
included — bit-identical to an uninterrupted deployment with K = 1 and the same key, at ε = 1:
the noise is visible there, so a re-step that drew other noise, lost or double-counted a tick's
partials, or published a re-stepped tick again shows up.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest

from agents.config.domain import load_domain
from agents.config.settings import Settings
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]

N_TICKS = 40


async def feed(s: Settings, leaves: list[str], stop_after: int, pace_s: float) -> None:
    """Events of tick t, then the close marker through t, for t = 1..stop_after (one tick per
    ``pace_s``): the worker sees live-like ticks, one or two per transaction."""
    rng = np.random.default_rng(5)
    for tick in range(1, stop_after + 1):
        start, end = s.tick_bounds(tick)
        n = int(rng.integers(0, 60))
        ts = rng.uniform(start, end, n)
        keys = rng.integers(0, len(leaves), n)
        await ps.produce(s, (ps.event_bytes(leaves[k], float(t), 1.0) for k, t in zip(keys, ts,
                                                                                     strict=True)))
        await ps.close_ticks(s, tick)
        await asyncio.sleep(pace_s)


async def test_kill9_between_full_checkpoints_republishes_nothing_and_loses_nothing(
        kafka_broker: str, unique_name: str, tmp_path: Path) -> None:
    leaves = ps.hierarchy_paths(3, 3, 4)  # 36 leaves + 9 + 3 + 1 = 49 nodes
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves, epsilon=1.0,
                         tick_seconds=1.0, release_checkpoint_every=7, shards=2)
    # the reference: the same deployment (app id, events and schedule topics: the same noise,
    # docs/privacy.md "Threat model") from scratch with K = 1, run after it; fresh state topics
    ref = s.replace(
        release_checkpoint_every=1,
        counts_topic=f"{unique_name}.counts-ref", dlq_topic=f"{unique_name}.dlq-ref",
        partials_topic=f"{unique_name}.partials-ref",
        ingest_checkpoints_topic=f"{unique_name}.ckpt-ref.ingest",
        release_checkpoints_topic=f"{unique_name}.ckpt-ref.release",
    )
    await ps.create_topics(s)
    await ps.create_topics(ref)
    domain = load_domain(s.domain_file)
    feeding = asyncio.create_task(feed(s, leaves, N_TICKS, pace_s=0.6))
    rng = random.Random(3)
    worker = ps.WorkerProcess(s, "w0", tmp_path)
    try:
        for k in range(5):
            worker.start()
            await worker.wait_log("release: assigned", count=k + 1)
            await asyncio.sleep(rng.uniform(1.5, 3.0))
            assert worker.alive(), worker.log_path.read_text()[-3000:]
            worker.kill9()
        worker.start()
        await worker.wait_log("release: assigned", count=6)
        await feeding
        got = await ps.wait_for_ticks(s, domain.size, N_TICKS, timeout_s=120)
    finally:
        feeding.cancel()
        code = worker.terminate()
    log = worker.log_path.read_text(errors="replace")
    assert code == 0, log[-3000:]
    # the path under test ran: some restart re-stepped ticks it had released before the kill
    assert "re-stepping ticks" in log, log[-3000:]

    want, _ = await ps.run_worker_until(ref, domain.size, N_TICKS, timeout_s=120)
    uncommitted = await ps.released(s, committed=False)
    for t in range(1, N_TICKS + 1):
        for name in domain.names:
            key = (name, t)
            assert len(got[key]) == 1, f"{key}: published {len(got[key])} times"
            assert set(uncommitted[key]) == set(want[key]), f"{key}: differs from K = 1"
