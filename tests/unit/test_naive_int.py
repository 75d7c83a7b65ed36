"""``naive-int``: input perturbation on the integer grid for whole-number counts (paper 001)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_dp import CounterBank, DecayedCounter
from stream_dp.budget import PureDP
from stream_dp.planner import compare, make_mechanism, pick
from stream_dp.strategies.naive.integer import NaiveIntegerMechanism
from stream_dp.strategies.registry import available
from tests.unit.test_strategies import FixedNoise

KEY = bytes(range(32))


def test_release_equals_dense_decayed_sum_of_counts_plus_known_noise() -> None:
    rng = np.random.default_rng(5)
    T, S, p = 40, 6, 0.85
    D = rng.integers(0, 4, size=(T, S)).astype(np.float64)
    z = rng.integers(-9, 10, size=(T, S)).astype(np.int64)
    mech = make_mechanism("naive-int", p, 63, PureDP(0.5), cap=3)
    state = mech.new_state(S)
    noise = FixedNoise(z)
    got = np.array([mech.step(state, D[t], noise) for t in range(T)])
    idx = np.arange(T)
    W = np.tril(p ** np.clip(idx[:, None] - idx[None, :], 0, None).astype(float))
    np.testing.assert_allclose(got, W @ (D + z), rtol=1e-12, atol=1e-9)
    assert noise.calls == [(t, 3 / 0.5) for t in range(1, T + 1)]  # scale cap/ε, no slack


def test_exact_variance_is_the_discrete_laplace_variance_and_beats_naive() -> None:
    eps, p = 1.0, 0.9
    m = NaiveIntegerMechanism(p, 63, PureDP(eps))
    q = math.exp(-eps)
    unit = 2 * q / (1 - q) ** 2  # two-sided geometric, closed form
    assert m.variance(1) == pytest.approx(unit, rel=1e-12)
    assert m.variance(10**6) == pytest.approx(unit / (1 - p * p), rel=1e-12)
    assert m.sensitivity() == 1.0 and m.rounding_bound() == 0.0
    naive = make_mechanism("naive", p, 63, PureDP(eps))
    assert m.variance(50) < 0.93 * naive.variance(50)


def test_fractional_counts_and_caps_are_refused_state_unchanged() -> None:
    bank = CounterBank(make_mechanism("naive-int", 0.9, 63, PureDP(1.0)), ["a", "b"], KEY)
    bank.step(np.array([1.0, 2.0]))
    before = bank.to_bytes()
    with pytest.raises(ValueError, match="whole numbers"):
        bank.step(np.array([1.0, 0.5]))
    assert bank.to_bytes() == before
    with pytest.raises(ValueError, match="cap must be a whole number"):
        make_mechanism("naive-int", 0.9, 63, PureDP(1.0), cap=1.5)


def test_auto_considers_it_only_for_declared_integer_counts() -> None:
    privacy = PureDP(1.0)
    assert "naive-int" not in available("pure")
    assert "naive-int" in available("pure", integer_counts=True)
    assert pick(0.9, 1023, privacy) == "naive"
    assert pick(0.9, 1023, privacy, integer_counts=True) == "naive-int"
    # never worse than any candidate, integer ones included
    cands = compare(0.9, 1023, privacy, integer_counts=True)
    chosen = make_mechanism("auto", 0.9, 1023, privacy, integer_counts=True)
    assert chosen.mse_curve(1023).mean() == min(c.mean_mse for c in cands)
    # a fractional cap makes the integer strategies inapplicable rather than an error
    assert pick(0.9, 1023, privacy, cap=1.5, integer_counts=True) == "naive"
    counter = DecayedCounter(p=0.9, epsilon=1.0, key=KEY, integer_counts=True, name="c")
    assert counter.strategy == "naive-int"
    restored = DecayedCounter.from_bytes(counter.to_bytes(), KEY)
    assert restored.strategy == "naive-int"
