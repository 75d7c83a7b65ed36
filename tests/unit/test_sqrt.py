"""``sqrt`` (truncated Toeplitz square root, zCDP) against dense oracles and the lower bound."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.special import comb

from stream_dp.budget import ZCDP, PureDP
from stream_dp.lower_bound import mean_mse_bound
from stream_dp.mechanism import Int64Array
from stream_dp.planner import make_mechanism
from stream_dp.strategies.sqrt.mechanism import SLACK_UNITS, SqrtMechanism
from stream_dp.strategies.sqrt.toeplitz import (
    choose_taps,
    dense_sqrt,
    mean_error_factor,
    sqrt_coefficients,
)

CASES = [(0.5, 4), (0.9, 16), (0.99, 32), (1.0, 8)]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))


class TickNoise:
    """``BoundNoise`` returning a known noise matrix ``z[node − 1]`` (an oracle input)."""

    def __init__(self, z: Int64Array) -> None:
        self.z = z

    def discrete_laplace(self, node: int, scale: float) -> Int64Array:  # pragma: no cover
        raise AssertionError("sqrt must draw Gaussian noise")

    def discrete_gaussian(self, node: int, sigma: float) -> Int64Array:
        return self.z[node - 1].copy()


def _workload(n: int, p: float) -> np.ndarray:
    return np.tril(p ** np.clip(np.subtract.outer(np.arange(n), np.arange(n)), 0, None))


@pytest.mark.parametrize("p", [0.3, 0.9, 1.0])
def test_coefficients_are_the_square_root(p: float) -> None:
    k = np.arange(40)
    c = sqrt_coefficients(p, 40)
    assert np.allclose(c, comb(2 * k, k) / 4.0**k * p**k, rtol=1e-13)
    # (Σ c_k x^k)² = 1/(1 − p x): the untruncated square root squares to W_p
    assert np.allclose(np.convolve(c, c)[:40], p**k, rtol=1e-12)
    full = np.tril(np.zeros((40, 40)))
    for d in range(40):
        full += np.diag(np.full(40 - d, c[d]), -d)
    assert np.allclose(full @ full, _workload(40, p), atol=1e-12)


@pytest.mark.parametrize(("p", "k"), CASES)
def test_truncated_factorisation_is_exact_and_stable(p: float, k: int) -> None:
    n = 80
    big_l, big_b = dense_sqrt(n, p, k)
    assert np.allclose(big_b @ big_l, _workload(n, p), atol=1e-12)
    assert np.count_nonzero(big_l[:, 0]) == k  # banded: one event touches K coordinates
    roots = np.roots(sqrt_coefficients(p, k)[::-1])  # zeros of L_K(x)
    assert np.all(np.abs(roots) > 1.0)  # Eneström–Kakeya


@pytest.mark.parametrize(("p", "k"), CASES)
def test_structured_release_equals_dense(p: float, k: int) -> None:
    n, s = 60, 3
    mech = SqrtMechanism(p, 63, ZCDP(0.5), 2.0, taps=k)
    big_l, big_b = dense_sqrt(n, p, k)
    rng = np.random.default_rng(5)
    d = rng.uniform(0.0, 2.0, size=(n, s))
    z = rng.integers(-(10**6), 10**6, size=(n, s))
    state = mech.new_state(s)
    noise = TickNoise(z)
    got = np.array([mech.step(state, d[t], noise) for t in range(n)])
    want = big_b @ (big_l @ d + mech.grid * z)
    assert np.max(np.abs(got - want)) <= mech.rounding_bound() + 1e-9


@pytest.mark.parametrize(("p", "k"), CASES)
def test_variance_and_sensitivity_match_dense(p: float, k: int) -> None:
    n, cap, rho = 70, 3.0, 0.25
    mech = SqrtMechanism(p, 63, ZCDP(rho), cap, taps=k)
    big_l, big_b = dense_sqrt(n, p, k)
    assert np.allclose(mech.mse_curve(n), mech.unit_variance * (big_b**2).sum(axis=1), rtol=1e-12)
    assert mech.variance(37) == pytest.approx(
        mech.unit_variance * (big_b[36] ** 2).sum(), rel=1e-12
    )
    col = float(np.sqrt((big_l**2).sum(axis=0)).max())
    assert mech.sensitivity() == pytest.approx(
        cap * col + SLACK_UNITS * math.sqrt(k) * mech.grid, rel=1e-14
    )
    # σ = Δ₂/√(2ρ) in grid units: exactly ρ-zCDP for the integer measurement (CKS)
    assert mech.sigma_units * mech.grid * math.sqrt(2 * rho) == pytest.approx(mech.sensitivity())
    assert mech.unit_variance <= (mech.sigma_units * mech.grid) ** 2


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.7, 0.9, 0.95, 0.99])
def test_sqrt_within_5_percent_of_lower_bound(p: float) -> None:
    """Issue 3 acceptance: under zCDP, sqrt ≤ 1.05 × the factorisation lower bound (T = 4095)."""
    horizon = 4095
    privacy = ZCDP(0.5)
    mech = make_mechanism("sqrt", p, horizon, privacy)
    bound = mean_mse_bound(horizon, p, privacy)
    mine = float(mech.mse_curve(horizon).mean())
    assert bound <= mine <= 1.05 * bound


def test_tap_choice_is_monotone_and_bounded() -> None:
    ks = [choose_taps(p, 4095) for p in (0.1, 0.5, 0.9, 0.99, 0.999)]
    assert ks == sorted(ks) and ks[-1] <= 256
    k = choose_taps(0.99, 4095)
    assert mean_error_factor(0.99, 2 * k, 4095) > 0.99 * mean_error_factor(0.99, k, 4095)


def test_pure_dp_is_refused_and_bad_input_keeps_state() -> None:
    with pytest.raises(ValueError, match="supports privacy models"):
        make_mechanism("sqrt", 0.9, 63, PureDP(1.0))
    with pytest.raises(ValueError, match="ZCDP"):
        SqrtMechanism(0.9, 63, PureDP(1.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="taps"):
        SqrtMechanism(0.9, 63, ZCDP(1.0), taps=1)
    mech = SqrtMechanism(0.9, 63, ZCDP(1.0), taps=4)
    state = mech.new_state(2)
    with pytest.raises(ValueError, match="state unchanged"):
        mech.step(state, np.array([1e30, 0.0]), TickNoise(np.zeros((5, 2), dtype=np.int64)))
    assert int(state["tick"]) == 0 and not state["counts"].any() and not state["u"].any()


def test_p_equal_one_error_grows_linearly() -> None:
    mech = make_mechanism("sqrt", 1.0, 4095, ZCDP(0.5))
    v = mech.mse_curve(20000)
    slope = (v[-1] - v[9999]) / 10000
    assert slope > 0 and v[-1] > v[999]
