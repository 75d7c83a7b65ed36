"""The second-generation strategies through a real worker and broker (issue #12).

``tree-ls`` (pure DP) and ``blt`` (zCDP) at p = 1 with a short horizon, so the run crosses top
blocks, epochs and super levels, and ``blt-horizon`` at p = 0.9 across its restart (issue #36): with an enormous budget every released (stream, tick) equals the
offline exact running total within the mechanism's rounding bound plus a few standard errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agents.config.domain import load_domain
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

N_TICKS = 30


@pytest.mark.parametrize(("strategy", "p", "horizon", "budget"), [
    ("tree-ls", 1.0, 4, {"epsilon": 1e4}),
    ("blt", 1.0, 4, {"privacy_model": "zcdp", "rho": 1e8}),
    # issue #36: the planned first horizon (7 ticks) and the filter's restart after it
    ("blt-horizon", 0.9, 7, {"privacy_model": "zcdp", "rho": 1e8}),
])
async def test_exact_running_totals_across_epochs(
    kafka_broker: str, unique_name: str, tmp_path: Path, strategy: str, p: float, horizon: int,
    budget: dict[str, object]
) -> None:
    leaves = ps.hierarchy_paths(2, 2, 2)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves, p=p, horizon=horizon,
                         strategy=strategy, **budget)
    await ps.create_topics(s)
    rng = np.random.default_rng(7)
    log = sorted(((leaves[int(rng.integers(len(leaves)))],
                   s.origin + float(rng.uniform(0, N_TICKS * s.tick_seconds)),
                   float(rng.choice([1.0, 0.5, 2.0]))) for _ in range(400)), key=lambda e: e[1])
    await ps.produce(s, (ps.event_bytes(k, t, v) for k, t, v in log))
    await ps.close_ticks(s, N_TICKS)
    domain = load_domain(s.domain_file)
    got, worker = await ps.run_worker_until(s, domain.size, N_TICKS, timeout_s=150)
    mech = worker.mechanism()
    assert mech.name == strategy and mech.error_stays_bounded()
    assert getattr(mech, "first", False) == (strategy == "blt-horizon")
    bound = mech.rounding_bound(N_TICKS)
    for key, want in ps.exact_decayed(domain, log, s, N_TICKS).items():
        copies = got[key]
        assert len(set(copies)) == 1, key
        msg = json.loads(copies[0])
        assert msg["strategy"] == strategy
        assert abs(msg["value"] - want) <= bound + 12 * msg["stderr"] + 1e-9, (key, msg, want)
