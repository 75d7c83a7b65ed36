"""The factorisation lower bound: singular values vs dense SVD, constants, validity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.lower_bound import mean_mse_bound, noise_constant, nuclear_norm, singular_values
from stream_dp.planner import make_mechanism
from stream_dp.strategies.registry import available


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))


def _workload(n: int, p: float) -> np.ndarray:
    return np.tril(p ** np.clip(np.subtract.outer(np.arange(n), np.arange(n)), 0, None))


@pytest.mark.parametrize("n", [1, 2, 3, 17, 128, 400])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 0.99, 0.999, 1.0])
def test_singular_values_match_dense_svd(n: int, p: float) -> None:
    dense = np.linalg.svd(_workload(n, p), compute_uv=False)
    assert np.allclose(singular_values(n, p), dense, rtol=1e-11, atol=0)
    assert nuclear_norm(n, p) == pytest.approx(float(dense.sum()), rel=1e-12)


def test_noise_constants_are_exact() -> None:
    assert noise_constant(PureDP(1.0)) == 2.0
    assert noise_constant(PureDP(2.0)) == 0.5
    assert noise_constant(ZCDP(0.5)) == 1.0
    assert noise_constant(ZCDP(0.125)) == 4.0
    # one release of one count (n = 1): Laplace 2Δ²/ε², Gaussian Δ²/(2ρ)
    assert mean_mse_bound(1, 0.7, PureDP(0.5), cap=3.0) == pytest.approx(2 * 9 / 0.25)
    assert mean_mse_bound(1, 0.7, ZCDP(2.0), cap=3.0) == pytest.approx(9 / 4.0)
    with pytest.raises(ValueError, match="privacy"):
        noise_constant(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="p must be"):
        singular_values(4, 1.5)


@pytest.mark.parametrize("p", [0.5, 0.95, 1.0])
def test_bound_holds_for_random_dense_factorisations(p: float) -> None:
    """mean MSE = κ·max_j‖L e_j‖₂²·‖B‖_F²/n ≥ κ‖W‖_*²/n² for W = B·L, any invertible L."""
    n = 24
    w = _workload(n, p)
    rng = np.random.default_rng(0)
    privacy = ZCDP(0.5)
    bound = mean_mse_bound(n, p, privacy)
    for _ in range(50):
        big_l = np.tril(rng.normal(size=(n, n))) + 3 * np.eye(n)
        big_b = w @ np.linalg.inv(big_l)
        delta2 = float(np.sqrt((big_l**2).sum(axis=0)).max())
        mse = noise_constant(privacy) * delta2**2 * float((big_b**2).sum()) / n
        assert mse >= bound * (1 - 1e-12)
    # the bound is κ·(Σ σ_i)²/n² with σ the singular values of W
    s = np.linalg.svd(w, compute_uv=False)
    assert float(s.sum()) ** 2 / n**2 == pytest.approx(bound / noise_constant(privacy))


@pytest.mark.parametrize("privacy", [PureDP(1.0), ZCDP(0.5)])
@pytest.mark.parametrize("p", [0.3, 0.9, 0.99, 1.0])
def test_no_registered_strategy_beats_the_bound(privacy: Privacy, p: float) -> None:
    horizon = 1023
    bound = mean_mse_bound(horizon, p, privacy)
    for name in available(privacy.model):
        mse = float(make_mechanism(name, p, horizon, privacy).mse_curve(horizon).mean())
        assert mse >= bound, name


def test_large_horizons_match_the_tridiagonal_eigenproblem() -> None:
    from scipy.linalg import eigvalsh_tridiagonal

    n, p = 4095, 0.999
    diag = np.full(n, 1 + p * p)
    diag[-1] = 1.0
    lam = eigvalsh_tridiagonal(diag, np.full(n - 1, -p))  # (I − pS)ᵀ(I − pS)
    assert np.allclose(singular_values(n, p), np.sort(1 / np.sqrt(lam))[::-1], rtol=1e-9)
    s = singular_values(32767, p)
    assert s.shape == (32767,) and np.all(np.diff(s) <= 0)
    assert 0.99 / (1 - p) < s[0] <= 1.0 / (1.0 - p)  # ‖W_p‖₂ ≤ Σ p^k
