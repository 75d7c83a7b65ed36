"""``tree`` / ``binary-tree`` against dense oracles: releases, variances, sensitivity, BLUE, MC."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.counters import CounterBank
from stream_dp.mechanism import Int64Array
from stream_dp.planner import make_mechanism
from stream_dp.strategies.tree._oracle import measurement_matrix
from stream_dp.strategies.tree.mechanism import SLACK_UNITS, BinaryTreeMechanism, TreeMechanism
from stream_dp.strategies.tree.plan import (
    TreePlan,
    best_plan,
    binary_plan,
    cache_dir,
    mean_variance,
    variance_curve,
)

PLANS = [
    (TreePlan((0,), (1.0,)), 0.7),
    (TreePlan((0, 2, 3), (0.3, 0.5, 0.2)), 0.9),
    (TreePlan((0, 1, 2, 3), (1.0, 1.0, 1.0, 1.0)), 1.0),
    (TreePlan((0, 3), (0.476, 0.524)), 0.99),
]
PRIVACIES: list[Privacy] = [PureDP(1.0), ZCDP(0.5)]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))
    best_plan.cache_clear()


class NodeNoise:
    """``BoundNoise`` returning known noise per node id (an oracle input, not the system)."""

    def __init__(self, z: dict[int, Int64Array]) -> None:
        self.z = z

    def discrete_laplace(self, node: int, scale: float) -> Int64Array:
        return self.z[node].copy()

    def discrete_gaussian(self, node: int, sigma: float) -> Int64Array:
        return self.z[node].copy()


def _rows(mech: TreeMechanism, n: int) -> list[tuple[int, int]]:
    blocks = [1 << lv for lv in mech.levels]
    return [(i, t) for t in range(1, n + 1) for i, b in enumerate(blocks) if t % b == 0]


@pytest.mark.parametrize(("plan", "p"), PLANS)
@pytest.mark.parametrize("privacy", PRIVACIES)
def test_structured_release_equals_dense(plan: TreePlan, p: float, privacy: Privacy) -> None:
    n, s = 48, 3
    mech = TreeMechanism(p, 63, privacy, 2.0, plan)
    big_l, big_b = mech.dense_matrices(n)
    assert np.allclose(big_l, measurement_matrix(mech, n), rtol=0, atol=1e-15)
    # W = B·L: the estimator is unbiased for the decayed sums
    w = np.tril(p ** np.clip(np.subtract.outer(np.arange(n), np.arange(n)), 0, None))
    assert np.allclose(big_b @ big_l, w, atol=1e-12)
    rng = np.random.default_rng(7)
    d = rng.uniform(0.0, 2.0, size=(n, s))
    rows = _rows(mech, n)
    z = rng.integers(-(10**6), 10**6, size=(len(rows), s))
    noise = NodeNoise({(i << 40) | (e >> mech.levels[i]): z[k] for k, (i, e) in enumerate(rows)})
    state = mech.new_state(s)
    got = np.array([mech.step(state, d[t], noise) for t in range(n)])
    want = big_b @ (big_l @ d + mech.grid * z)
    assert np.max(np.abs(got - want)) <= mech.rounding_bound() + 1e-9


@pytest.mark.parametrize(("plan", "p"), PLANS)
@pytest.mark.parametrize("privacy", PRIVACIES)
def test_variance_and_sensitivity_match_dense(plan: TreePlan, p: float, privacy: Privacy) -> None:
    n, cap = 64, 2.0
    mech = TreeMechanism(p, 63, privacy, cap, plan)
    big_l, big_b = mech.dense_matrices(n)
    dense_var = mech.unit_variance * np.sum(big_b * big_b, axis=1)
    assert np.allclose(mech.mse_curve(n), dense_var, rtol=1e-12, atol=0)
    for t in (1, 7, 8, 33, 64):
        assert mech.variance(t) == pytest.approx(dense_var[t - 1], rel=1e-12)
    m = len(mech.levels)
    if isinstance(privacy, PureDP):
        col = np.abs(big_l).sum(axis=0).max()
        assert mech.sensitivity() == pytest.approx(
            cap * col + SLACK_UNITS * m * mech.grid, rel=1e-14
        )
        assert mech.scale_units == pytest.approx(mech.sensitivity() / (1.0 * mech.grid))
    else:
        col = np.sqrt((big_l * big_l).sum(axis=0)).max()
        assert mech.sensitivity() == pytest.approx(
            cap * col + SLACK_UNITS * math.sqrt(m) * mech.grid, rel=1e-14
        )
        assert mech.scale_units == pytest.approx(mech.sensitivity() / (1.0 * mech.grid))
    assert col == pytest.approx(1.0)  # normalised weights: unit L1 / L2 column norm


@pytest.mark.parametrize(("plan", "p"), PLANS[1:])
def test_causal_honaker_is_the_best_linear_unbiased_causal_estimate(
    plan: TreePlan, p: float
) -> None:
    """At every t, the release variance equals the GLS (BLUE) variance from all completed nodes."""
    n = 40
    mech = TreeMechanism(p, 63, PureDP(1.0), 1.0, plan)
    big_l = measurement_matrix(mech, n)
    rows = _rows(mech, n)
    for t in (5, 8, 17, 31, 40):
        done = [k for k, (_, e) in enumerate(rows) if e <= t]
        lt = big_l[done][:, :t]
        info = lt.T @ lt / mech.unit_variance
        c = p ** (t - np.arange(1, t + 1))
        blue = float(c @ np.linalg.solve(info, c))
        assert mech.variance(t) == pytest.approx(blue, rel=1e-9)


def test_plan_search_beats_naive_and_binary_and_is_cached(tmp_path: Path) -> None:
    for p in (0.5, 0.99, 0.999):
        for model in ("pure", "zcdp"):
            plan = best_plan(p, 4095, model)
            mine = mean_variance(plan, p, 4095, 1.0)
            assert mine <= mean_variance(TreePlan((0,), (1.0,)), p, 4095, 1.0) * (1 + 1e-12)
            assert mine < mean_variance(binary_plan(4095, model), p, 4095, 1.0)
            curve = variance_curve(plan, p, 4095, 1.0)
            assert curve.mean() == pytest.approx(mine, rel=1e-12)
    assert cache_dir() == tmp_path
    files = sorted(x.name for x in tmp_path.glob("tree-plan-*.json"))
    assert len(files) == 6
    first = best_plan(0.99, 4095, "pure")
    best_plan.cache_clear()
    assert best_plan(0.99, 4095, "pure") == first  # read back from disk


def test_plan_at_high_decay_uses_sparse_levels() -> None:
    plan = best_plan(0.99, 32767, "pure")
    assert plan.levels[0] == 0 and len(plan.levels) >= 2
    assert sum(plan.weights) == pytest.approx(1.0)


def test_release_of_a_stream_does_not_depend_on_its_bank() -> None:
    mech = make_mechanism("tree", 0.99, 4095, PureDP(1.0))
    key = b"k" * 32
    a = CounterBank(mech, ["x", "y", "z"], key)
    b = CounterBank(mech, ["y"], key)
    for t in range(20):
        ra = a.step([t, 2 * t, 1])
        rb = b.step([2 * t])
        assert ra[1] == rb[0]


def test_bad_input_raises_and_keeps_state() -> None:
    with pytest.raises(ValueError, match="levels"):
        TreePlan((1, 2), (1.0, 1.0))
    with pytest.raises(ValueError, match="weights"):
        TreePlan((0, 2), (1.0, -1.0))
    with pytest.raises(ValueError, match="privacy"):
        TreeMechanism(0.9, 63, object(), 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="p must be"):
        TreeMechanism(1.5, 63, PureDP(1.0))
    mech = TreeMechanism(0.9, 63, PureDP(1.0), 1.0, TreePlan((0, 2), (0.5, 0.5)))
    state = mech.new_state(2)
    noise = NodeNoise({})
    with pytest.raises(ValueError, match="state unchanged"):
        mech.step(state, np.array([1e30, 0.0]), noise)
    assert int(state["tick"]) == 0 and not state["raw"].any()


def test_binary_tree_keeps_every_level() -> None:
    mech = make_mechanism("binary-tree", 0.9, 32767, PureDP(1.0))
    assert isinstance(mech, BinaryTreeMechanism)
    assert mech.levels == tuple(range(15))
    assert np.allclose(mech.weights, 1.0 / 15)


@pytest.mark.parametrize(("strategy", "privacy"), [("tree", PureDP(1.0)), ("sqrt", ZCDP(0.5))])
def test_checkpoint_restore_replays_bit_identically(strategy: str, privacy: Privacy) -> None:
    mech = make_mechanism(strategy, 0.99, 4095, privacy)
    key = b"checkpoint-key-0123456789abcdef!"
    bank = CounterBank(mech, ["a", "b", "c"], key)
    rng = np.random.default_rng(1)
    data = rng.integers(0, 5, size=(40, 3)).astype(np.float64)
    for t in range(20):
        bank.step(data[t])
    blob = bank.to_bytes()
    first = [bank.step(data[t]) for t in range(20, 40)]
    best_plan.cache_clear()
    restored = CounterBank.from_bytes(blob, key)
    again = [restored.step(data[t]) for t in range(20, 40)]
    assert all(np.array_equal(x, y) for x, y in zip(first, again, strict=True))
