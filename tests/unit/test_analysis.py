"""Exact analytics: paper constants, closed forms, dense oracles, scaling, bad input."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from stream_dp.analysis import expected_mse, mse_curve, sensitivity
from stream_dp.budget import PureDP
from stream_dp.figures import figures
from stream_dp.strategies._common import discrete_laplace_variance
from stream_dp.strategies.fenwick.dmfda_weights import lambdas
from stream_dp.strategies.fenwick.plan import reconstruction_matrix, strategy_matrix

STRATEGIES = ("naive", "dm", "dmfda", "fenwick-opt")


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))


def test_paper_worked_example() -> None:
    assert round(7 * expected_mse("dm", 0.3, 7, 1.0), 3) == 25.635
    assert round(7 * expected_mse("dm", 0.3, 7, 0.01) * 1e-4, 3) == 25.635
    assert sensitivity("dm", 0.3, 7) == pytest.approx(1.0, abs=2**-17)


def test_dmfda_dense_oracle() -> None:
    """Mean MSE = 2/ε²·Δ²·trace(BᵀBΛ⁻²)/T (eq. 19), up to the documented grid slack."""
    for p, T in ((0.3, 7), (0.9, 63), (1.0, 127)):
        lam = lambdas(T if p < 1 else T + 1, p)
        n = lam.size
        B = reconstruction_matrix(n, p)[:T, :T]
        delta = float((lam[:, None] * strategy_matrix(n, p)).sum(axis=0).max())
        dense = 2 * delta**2 * float(((B / lam[None, :T]) ** 2).sum()) / T
        assert expected_mse("dmfda", p, T, 1.0) == pytest.approx(dense, rel=3e-5)


@pytest.mark.parametrize("p", (0.1, 0.5, 0.9, 0.99))
def test_naive_closed_form(p: float) -> None:
    T = 4096
    t = np.arange(1, T + 1)
    g = 2.0**-17
    var = g**2 * discrete_laplace_variance((1 + g) / g)
    np.testing.assert_allclose(
        mse_curve("naive", p, T, 1.0), var * (1 - p ** (2 * t)) / (1 - p * p), rtol=1e-12
    )
    assert mse_curve("naive", p, T, 1.0)[-1] == pytest.approx(2 / (1 - p * p), rel=1e-4)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_inverse_square_scaling_in_epsilon_and_square_in_cap(strategy: str) -> None:
    base = expected_mse(strategy, 0.95, 255, 1.0)
    assert expected_mse(strategy, 0.95, 255, 0.1) == pytest.approx(100 * base, rel=1e-9)
    assert expected_mse(strategy, 0.95, 255, 1.0, cap=4.0) == pytest.approx(16 * base, rel=1e-9)


def test_figures_and_big_horizon_without_dense_matrices() -> None:
    T = 2**20 - 1
    rows = figures(("naive", "dm", "dmfda"), 0.999, T, PureDP(1.0))
    assert [r.strategy for r in rows] == ["naive", "dm", "dmfda"]
    for r in rows:
        assert math.isfinite(r.mean_mse) and r.mean_mse > 0
        assert r.rmse == pytest.approx(math.sqrt(r.mean_mse))
        assert 1.0 <= r.sensitivity <= 1.0 + 2**-16


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0.0, 7, 1.0), "p must"),
        ((0.5, 0, 1.0), "horizon"),
        ((0.5, 7, 0.0), "epsilon"),
        ((0.5, 7, math.nan), "epsilon"),
    ],
)
def test_bad_input(args: tuple[float, int, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        expected_mse("dm", *args)
