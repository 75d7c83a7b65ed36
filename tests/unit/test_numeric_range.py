"""Numeric range of every registered strategy (issue #26): ``Mechanism.max_count()`` ≥ 10^6 × cap
per stream and tick at the default horizon (65,535) and at 2^20 − 1, for every p in a grid that
includes 0.9, 0.99, 0.999 and 1, under every privacy model the strategy accepts.

The strategies are enumerated from the registry, so a strategy registered later is covered
without editing this file. Two caps: 1 (a power of two, the grids' best case) and 1.9 (just below
the next power of two: the power-of-two grids are then relatively finest, the worst case).

A range is only worth something if the strategy *releases* counts up to it: for each strategy a
stream fed ``max_count()`` on every tick (and a neighbour stream fed 0) is stepped through a
whole top block / node sequence at a short horizon without a refusal.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.counters import CounterBank
from stream_dp.planner import make_mechanism
from stream_dp.strategies.registry import available, get

DEFAULT_HORIZON = 65_535
LONG_HORIZON = (1 << 20) - 1
P_GRID = (0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0)
REQUIRED = 1e6
PRIVACY: dict[str, Privacy] = {"pure": PureDP(1.0), "zcdp": ZCDP(0.5)}


def _cases() -> list[tuple[str, str]]:
    return [
        (model, name)
        for model in ("pure", "zcdp")
        for name in available(model, integer_counts=True)
    ]


def test_every_registered_strategy_is_enumerated() -> None:
    """The enumeration is not empty and covers both privacy models and the Fenwick family."""
    cases = _cases()
    names = {n for _, n in cases}
    assert {"naive", "dm", "dmfda", "fenwick-opt", "tree", "binary-tree"} <= names
    assert {m for m, _ in cases} == {"pure", "zcdp"}


def _caps(name: str) -> tuple[float, ...]:
    return (1.0, 3.0) if get(name).integer_only else (1.0, 1.9)


@pytest.mark.parametrize(
    "horizon",
    [DEFAULT_HORIZON, pytest.param(LONG_HORIZON, marks=pytest.mark.slow)],
)
@pytest.mark.parametrize(("model", "name"), _cases())
def test_range_at_least_a_million_events_per_tick(model: str, name: str, horizon: int) -> None:
    short: list[str] = []
    for p in P_GRID:
        for cap in _caps(name):
            mech = make_mechanism(name, p, horizon, PRIVACY[model], cap)
            got = mech.max_count()
            if not (not math.isnan(got) and got >= REQUIRED * cap):
                short.append(f"p={p} cap={cap}: {got:.3g} < {REQUIRED * cap:.3g}")
    assert not short, f"{name} ({model}, horizon {horizon}): " + "; ".join(short)


@pytest.mark.parametrize("p", [0.9, 0.999, 1.0])
@pytest.mark.parametrize(("model", "name"), _cases())
def test_counts_at_max_count_are_released(model: str, name: str, p: float) -> None:
    """``max_count()`` is not an empty promise: counts at it on every tick are released (a short
    horizon, so that whole nodes and blocks — and at p = 1 an epoch roll — are exercised)."""
    mech = make_mechanism(name, p, 63, PRIVACY[model], 1.0)
    top = mech.max_count()
    if math.isinf(top):
        top = 1e15
    bank = CounterBank(mech, ["busy", "idle"], key=b"k" * 32)
    counts = np.array([math.floor(top) if get(name).integer_only else top, 0.0])
    for _ in range(200):
        out = bank.step(counts)
        assert np.all(np.isfinite(out))


@pytest.mark.parametrize("p", [0.99, 1.0])
@pytest.mark.parametrize(("model", "name"), _cases())
def test_claimed_error_holds_at_large_counts(model: str, name: str, p: float) -> None:
    """Claimed vs released MSE (Monte Carlo over 10 000 keyed streams, 40 ticks across epoch
    boundaries) with every count between 1/2 and 1 of ``min(max_count(), 10^12)``: the wide
    arithmetic changes nothing in the error a release carries (``tests/unit/test_accuracy_all.py``
    does the same at counts ≤ 1)."""
    from stream_dp.figures import error_curve, rounding_bias
    from tests.unit._montecarlo import empirical_mse_curve

    streams, ticks, z = 10_000, 40, 4.9
    mech = make_mechanism(name, p, 15, PRIVACY[model], 1.0)
    top = min(mech.max_count(), 1e12)
    rng = np.random.default_rng(26)

    def draw(t: int) -> np.ndarray:
        d = rng.uniform(0.5 * top, top, streams)
        return np.floor(d) if get(name).integer_only else d

    sq, _ = empirical_mse_curve(mech, b"numeric-range-large-counts-key-0", streams, ticks, draw)
    exact = error_curve(mech, ticks)
    noise = mech.mse_curve(ticks)
    b = rounding_bias(mech, ticks)
    # the float64 rounding of the released value and of the test's own decayed sum (≤ 40·top)
    fl = 4.0 * ticks * top * 2.0**-52
    slack = z * noise * math.sqrt(5.0 / streams) + 2.0 * (b + fl) * np.sqrt(noise) + (b + fl) ** 2
    for t in (1, 2, 15, 16, 33, ticks):
        assert abs(sq[t - 1] - exact[t - 1]) <= slack[t - 1], (t, sq[t - 1], exact[t - 1])


class _ZeroNoise:
    """Noise that is always 0 (the release is then the rounded measurements' estimate)."""

    def discrete_laplace(self, node: int, scale: float) -> np.ndarray:
        return np.zeros(2, dtype=np.int64)

    def discrete_gaussian(self, node: int, sigma: float) -> np.ndarray:
        return np.zeros(2, dtype=np.int64)


@pytest.mark.parametrize("p", [0.999, 1.0])
@pytest.mark.parametrize("name", ["tree", "binary-tree", "dm", "dmfda"])
def test_wide_releases_equal_the_exact_decayed_sum_without_noise(name: str, p: float) -> None:
    """With zero noise, 10^12–2·10^12 events per tick for 200 ticks (three top blocks or
    epochs at horizon 63) come out as the exact decayed sum (rational oracle) within the rounding
    bound and the float64 rounding of the release: the double-double sums and the lazy folds
    measure what they claim, far beyond the old float64 range."""
    from fractions import Fraction

    mech = make_mechanism(name, p, 63, PureDP(1.0), 1.0)
    state = mech.new_state(2)
    rng = np.random.default_rng(7)
    truth = [Fraction(0), Fraction(0)]
    bound = Fraction(mech.rounding_bound(200) if name.startswith("d") else mech.rounding_bound())  # type: ignore[call-arg]
    for _ in range(200):
        d = rng.uniform(1e12, 2e12, 2)
        rel = mech.step(state, d, _ZeroNoise())
        truth = [Fraction(p) * x + Fraction(float(v)) for x, v in zip(truth, d, strict=True)]
        for s in range(2):
            err = abs(Fraction(float(rel[s])) - truth[s])
            assert err <= bound * (1 + Fraction(1, 10**9)) + truth[s] * Fraction(1, 2**46)
