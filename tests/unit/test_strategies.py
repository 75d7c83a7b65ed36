"""Strategies vs independent dense oracles: releases, variances, sensitivities, epochs, registry."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from stream_dp.budget import ZCDP, PureDP
from stream_dp.mechanism import Int64Array, Mechanism
from stream_dp.planner import make_mechanism, pick
from stream_dp.strategies.fenwick import _oracle as fenwick_oracle
from stream_dp.strategies.fenwick.base import FenwickMechanism
from stream_dp.strategies.fenwick.plan import strategy_matrix
from stream_dp.strategies.naive import _oracle as naive_oracle
from stream_dp.strategies.registry import available, get, register

STRATEGIES = ("naive", "dm", "dmfda", "fenwick-opt")


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))


class FixedNoise:
    """A ``BoundNoise`` returning a known noise matrix: ``z[node − 1]`` (an oracle input)."""

    def __init__(self, z: Int64Array) -> None:
        self.z = z
        self.calls: list[tuple[int, float]] = []

    def discrete_laplace(self, node: int, scale: float) -> Int64Array:
        self.calls.append((node, scale))
        return self.z[node - 1].copy()

    def discrete_gaussian(self, node: int, sigma: float) -> Int64Array:  # pragma: no cover
        raise AssertionError("pure-DP strategies must not draw Gaussian noise")


def run(mech: Mechanism, D: np.ndarray, z: np.ndarray) -> np.ndarray:
    state = mech.new_state(D.shape[1])
    noise = FixedNoise(z)
    out = np.array([mech.step(state, D[t], noise) for t in range(D.shape[0])])
    assert [c[0] for c in noise.calls] == list(range(1, D.shape[0] + 1))  # node ids = ticks
    return out


def dense_oracle(mech: Mechanism, D: np.ndarray, z: np.ndarray, rounded: bool) -> np.ndarray:
    """The family's dense release oracle (``stream_dp/strategies/<family>/_oracle.py``)."""
    if isinstance(mech, FenwickMechanism):
        return fenwick_oracle.release(mech, D, z, rounded)
    return naive_oracle.release(mech, D, z, rounded)


CASES = [
    (0.3, 255, 255),
    (0.9, 255, 255),
    (1.0, 255, 255),
    (0.7, 7, 40),
    (0.95, 10, 45),
    (1.0, 4, 60),
]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("p", "horizon", "ticks"), CASES)
def test_structured_release_equals_dense_oracle(
    strategy: str, p: float, horizon: int, ticks: int
) -> None:
    mech = make_mechanism(strategy, p, horizon, PureDP(0.8), cap=1.0)
    rng = np.random.default_rng(7)
    S = 3
    D = rng.uniform(0, 6, (ticks, S))
    D[:, 0] = rng.integers(0, 4, ticks)  # integer counts too
    z = rng.integers(-(10**7), 10**7, (ticks, S))
    got = run(mech, D, z)
    np.testing.assert_allclose(got, dense_oracle(mech, D, z, rounded=True), rtol=1e-9, atol=1e-9)
    # Against the unrounded oracle B Λ⁻¹(ΛLD + g z) the difference is the documented rounding.
    diff = np.abs(got - dense_oracle(mech, D, z, rounded=False))
    assert float(diff.max()) <= mech.rounding_bound(ticks) * (1 + 1e-9) + 1e-9  # type: ignore[call-arg]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("p", "horizon", "ticks"), CASES)
def test_variance_curve_equals_linear_map_of_the_noise(
    strategy: str, p: float, horizon: int, ticks: int
) -> None:
    """Feed unit noise on node s to stream s: release[t, s] = ∂release_t/∂z_s; Var = Σ σ_s² r²."""
    mech = make_mechanism(strategy, p, horizon, PureDP(0.5), cap=2.0)
    D = np.zeros((ticks, ticks))
    basis = np.eye(ticks, dtype=np.int64)
    rel = run(mech, D, basis)
    if isinstance(mech, FenwickMechanism):
        unit_var = np.array(
            [mech.plan(mech.epoch_of(s)[2]).unit_variance for s in range(1, ticks + 1)]
        )
    else:
        unit_var = np.full(ticks, mech.measurement_variance / mech.grid**2)  # type: ignore[attr-defined]
    expected = (rel**2 * unit_var[None, :]).sum(axis=1)
    np.testing.assert_allclose(mech.mse_curve(ticks), expected, rtol=1e-9)
    for t in (1, ticks // 2, ticks):
        assert mech.variance(t) == pytest.approx(expected[t - 1], rel=1e-9)


@pytest.mark.parametrize("strategy", ("dm", "dmfda", "fenwick-opt"))
@pytest.mark.parametrize(("p", "n"), [(0.3, 7), (0.9, 100), (1.0, 64), (0.99, 255)])
def test_sensitivity_matches_dense_with_grid_slack(strategy: str, p: float, n: int) -> None:
    cap = 2.5
    mech = make_mechanism(strategy, p, n, PureDP(1.0), cap=cap)
    assert isinstance(mech, FenwickMechanism)
    n_epoch = mech.epoch_of(1)[2]
    plan = mech.plan(n_epoch)
    AL = mech.weights(n_epoch)[:, None] * strategy_matrix(n_epoch, p)
    cap_eff = cap + plan.grid if p == 1.0 else cap  # p = 1 rounds counts to the grid first
    dense = np.max(cap_eff * np.abs(AL).sum(axis=0) + 2 * plan.grid * (AL != 0).sum(axis=0))
    assert mech.sensitivity() == pytest.approx(dense, rel=1e-12)
    # weights have column sums ≤ 1 and the slack is ≤ 2**-16 relative
    assert mech.sensitivity() <= cap * (1 + 2**-16) * (1 + 1e-12)
    assert plan.scale_units == pytest.approx(mech.sensitivity() / (1.0 * plan.grid))


def test_naive_sensitivity_and_limit() -> None:
    mech = make_mechanism("naive", 0.9, 100, PureDP(1.0), cap=3.0)
    assert mech.sensitivity() == 3.0 + mech.grid  # type: ignore[attr-defined]
    assert mech.variance(10**6) == pytest.approx(2 * 3.0**2 / (1 - 0.81), rel=1e-4)


def test_paper_example_dm_total_error() -> None:
    mech = make_mechanism("dm", 0.3, 7, PureDP(1.0))
    assert round(float(mech.mse_curve(7).sum()), 3) == 25.635
    assert (
        round(float(make_mechanism("dm", 0.3, 7, PureDP(0.1)).mse_curve(7).sum()) / 100, 3)
        == 25.635
    )


@pytest.mark.parametrize("strategy", ("dm", "dmfda", "fenwick-opt"))
def test_p_one_error_is_polylogarithmic_in_t(strategy: str) -> None:
    mech = make_mechanism(strategy, 1.0, 64, PureDP(1.0))
    v = {k: mech.variance(2**k) for k in (7, 10, 13, 16)}
    # polylog: var(t) / log2(t)^4 does not grow; linear growth would multiply it by 2**4 per step
    ratios = [v[k] / k**4 for k in sorted(v)]
    assert all(b <= a * 1.5 for a, b in itertools.pairwise(ratios))
    assert v[16] < 30 * v[7]
    naive = make_mechanism("naive", 1.0, 64, PureDP(1.0))
    assert naive.variance(2**16) == pytest.approx(2**9 * naive.variance(2**7))  # linear


def test_epoch_layout() -> None:
    m = make_mechanism("dm", 0.9, 7, PureDP(1.0))
    assert isinstance(m, FenwickMechanism)
    assert [m.epoch_of(t) for t in (1, 7, 8, 15)] == [(0, 0, 7), (0, 0, 7), (1, 7, 7), (2, 14, 7)]
    m1 = make_mechanism("dm", 1.0, 5, PureDP(1.0))
    assert isinstance(m1, FenwickMechanism)
    assert [m1.epoch_of(t) for t in (1, 8, 9, 24, 25, 56, 57)] == [
        (0, 0, 8),
        (0, 0, 8),
        (1, 8, 16),
        (1, 8, 16),
        (2, 24, 32),
        (2, 24, 32),
        (3, 56, 64),
    ]


def test_zero_counts_zero_noise_release_zero_and_rounding_exact_for_integers() -> None:
    for s in STRATEGIES:
        mech = make_mechanism(s, 0.9, 31, PureDP(1.0))
        D = np.zeros((40, 2))
        D[:, 1] = np.arange(40) % 5
        got = run(mech, D, np.zeros((40, 2), dtype=np.int64))
        assert np.all(got[:, 0] == 0.0)
        true = np.zeros(40)
        acc = 0.0
        for t in range(40):
            acc = 0.9 * acc + D[t, 1]
            true[t] = acc
        assert float(np.max(np.abs(got[:, 1] - true))) <= mech.rounding_bound(40) + 1e-9  # type: ignore[call-arg]


def test_registry_and_auto() -> None:
    assert set(STRATEGIES) <= set(available("pure"))
    assert set(available()) >= set(available("pure"))
    assert get("dmfda").models == ("pure",)
    for p, T in ((0.3, 1023), (0.999, 4095), (1.0, 4095)):
        chosen = pick(p, T, PureDP(1.0))
        assert make_mechanism("auto", p, T, PureDP(1.0)).name == chosen
        mechs = [make_mechanism(s, p, T, PureDP(1.0)) for s in available("pure")]
        # the service runs streams forever: only strategies whose error stays bounded qualify
        best = min(m.mse_curve(T).mean() for m in mechs if m.error_stays_bounded())
        assert make_mechanism(chosen, p, T, PureDP(1.0)).mse_curve(T).mean() == best
    assert pick(0.3, 1023, PureDP(1.0)) == "naive"
    assert pick(1.0, 4095, PureDP(1.0)) != "naive"


def test_register_validation() -> None:
    with pytest.raises(ValueError, match="name must"):
        register("auto", get("dm").factory)
    with pytest.raises(ValueError, match="models must"):
        register("x-test", get("dm").factory, models=("approx",))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"p": 0.0}, "p must"),
        ({"p": 1.5}, "p must"),
        ({"p": math.nan}, "p must"),
        ({"horizon": 0}, "horizon must"),
        ({"horizon": 2.5}, "horizon must"),
        ({"cap": 0.0}, "cap must"),
        ({"cap": math.inf}, "cap must"),
        ({"strategy": "nope"}, "strategy must"),
        ({"privacy": ZCDP(0.5)}, "supports privacy models|privacy for strategy"),
        ({"privacy": 1.0}, "privacy must"),
    ],
)
def test_bad_parameters(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "strategy": "dmfda",
        "p": 0.9,
        "horizon": 63,
        "privacy": PureDP(1.0),
        "cap": 1.0,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_mechanism(**args)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epsilon"):
        PureDP(-1.0)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_overflowing_counts_raise_and_leave_state_unchanged(strategy: str) -> None:
    mech = make_mechanism(strategy, 0.9, 15, PureDP(1.0))
    state = mech.new_state(2)
    noise = FixedNoise(np.zeros((10, 2), dtype=np.int64))
    mech.step(state, np.array([1.0, 2.0]), noise)
    before = {k: v.copy() for k, v in state.items()}
    with pytest.raises(ValueError, match="counts"):
        mech.step(state, np.array([1e30, 0.0]), noise)
    assert state.keys() == before.keys()
    for k in state:
        np.testing.assert_array_equal(state[k], before[k])


def test_numeric_range_documented_per_p() -> None:
    """Node values up to 2**100/(2(L+2)²) grid units (double-double), for every p: 10^12 events
    per tick for 64 ticks at horizon 2^20 − 1 come out as the exact decayed sum (zero noise,
    rational oracle) within the rounding bound and the float64 rounding of the release; counts beyond ``max_count()`` are refused with
    the state unchanged."""
    from fractions import Fraction

    for p in (0.9, 0.9999, 1.0):
        mech = make_mechanism("dm", p, 2**20 - 1, PureDP(1.0))
        assert isinstance(mech, FenwickMechanism)
        plan = mech.plan(mech.epoch_of(1)[2])
        assert plan.levels in (20, 21) and plan.max_units == (2.0**90 if plan.levels == 20 else 2.0**89)
        assert mech.max_count() >= 1e12
        big = np.array([10**12 + 0.3, 7.0])
        noise = FixedNoise(np.zeros((256, 2), dtype=np.int64))
        state = mech.new_state(2)
        exact = [Fraction(0), Fraction(0)]
        for _ in range(64):
            rel = mech.step(state, big, noise)
            exact = [Fraction(p) * e + Fraction(float(b)) for e, b in zip(exact, big, strict=True)]
        bound = mech.rounding_bound(64)  # type: ignore[call-arg]
        for s in range(2):
            # grid rounding, plus the float64 rounding of the release itself (post-processing)
            slack = Fraction(bound) * (1 + Fraction(1, 10**9)) + exact[s] * Fraction(1, 2**48)
            assert abs(Fraction(float(rel[s])) - exact[s]) <= slack
        with pytest.raises(ValueError, match="range"):
            for _ in range(128):
                before = {k: v.copy() for k, v in state.items()}
                mech.step(state, np.full(2, 4 * plan.max_units * plan.grid / float(np.min(mech.weights(plan.n)))), noise)
        assert set(state) == set(before)
        for k, v in before.items():
            np.testing.assert_array_equal(state[k], v)  # state unchanged by the refused tick
