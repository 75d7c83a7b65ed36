"""fenwick-opt: problem (21) solved numerically; optimal vs a generic solver; never worse than dm/dmfda."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize

from stream_dp.analysis import expected_mse
from stream_dp.strategies.fenwick import opt_weights as fenwick_opt
from stream_dp.strategies.fenwick.dmfda_weights import lambdas
from stream_dp.strategies.fenwick.plan import column_sums, reconstruction_matrix, strategy_matrix


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(fenwick_opt.CACHE_ENV, str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("p", (0.3, 0.9, 1.0))
def test_products_match_dense(p: float) -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 8, 100, 255):
        L = strategy_matrix(n, p)
        mu = rng.uniform(0.1, 2.0, n)
        np.testing.assert_allclose(fenwick_opt._node_sums(mu, p), L @ mu, rtol=1e-12)
        np.testing.assert_allclose(fenwick_opt._col_sums(mu, p), L.T @ mu, rtol=1e-12)


@pytest.mark.parametrize("p", (0.3, 1.0))
def test_column_norms_are_those_of_B(p: float) -> None:
    for n in (1, 7, 64, 100):
        B = reconstruction_matrix(n, p)
        np.testing.assert_allclose(fenwick_opt.column_norms(n, p), (B**2).sum(axis=0), rtol=1e-12)
        np.testing.assert_allclose(
            fenwick_opt.column_norms(n, p, rows=n // 2 + 1),
            (B[: n // 2 + 1] ** 2).sum(axis=0),
            rtol=1e-12,
        )


@pytest.mark.parametrize(("n", "p"), [(7, 0.3), (15, 0.5), (31, 0.9), (31, 1.0), (63, 0.99)])
def test_solver_reaches_the_optimum_of_a_generic_solver(n: int, p: float) -> None:
    c = fenwick_opt.column_norms(n, p)
    L = strategy_matrix(n, p)
    ref = minimize(
        lambda x: np.sum(c / x**2),
        lambdas(n, p),
        jac=lambda x: -2 * c / x**3,
        method="SLSQP",
        constraints=[{"type": "ineq", "fun": lambda x: 1 - L.T @ x, "jac": lambda x: -L.T}],
        bounds=[(1e-9, None)] * n,
        options={"ftol": 1e-15, "maxiter": 2000},
    )
    ref_x = ref.x / max(1.0, float((L.T @ ref.x).max()))  # made exactly feasible
    ref_f = fenwick_opt.objective(ref_x, c)
    assert ref_f <= fenwick_opt.objective(lambdas(n, p), c) * (1 + 1e-8)  # it did optimise
    w = fenwick_opt.solve(n, p)
    assert float((L.T @ w).max()) <= 1 + 1e-12
    assert fenwick_opt.objective(w, c) <= ref_f * (1 + 1e-6)


@pytest.mark.parametrize("p", (0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999, 1.0))
def test_never_worse_than_dm_or_dmfda(p: float) -> None:
    for T in (1, 2, 3, 7, 8, 63, 100, 1023, 2**12 - 1):
        mse = {s: expected_mse(s, p, T, 1.0) for s in ("dm", "dmfda", "fenwick-opt")}
        assert mse["fenwick-opt"] <= min(mse["dm"], mse["dmfda"]) * (1 + 1e-12), (T, mse)


def test_strictly_better_somewhere() -> None:
    """The solve matters: at p = 0.9, T = 1023 it beats both paper strategies by > 20 %."""
    mse = {s: expected_mse(s, 0.9, 1023, 1.0) for s in ("dm", "dmfda", "fenwick-opt")}
    assert mse["fenwick-opt"] < 0.8 * min(mse["dm"], mse["dmfda"])


def test_weights_feasible_and_cached(_cache: Path) -> None:
    w = fenwick_opt.optimal_weights(255, 0.8)
    sums, _ = column_sums(w, 0.8)
    assert float(sums.max()) <= 1 + 1e-12
    files = list(_cache.glob("fenwick-opt-*.npy"))
    assert len(files) == 1
    # The cache is read back: overwrite it with other valid weights and see them returned.
    other = np.full(255, 0.125)
    np.save(files[0], other)
    np.testing.assert_array_equal(fenwick_opt.optimal_weights(255, 0.8), other)
    # A corrupt cache file is ignored and replaced.
    files[0].write_bytes(b"not an npy file")
    np.testing.assert_allclose(fenwick_opt.optimal_weights(255, 0.8), w, rtol=1e-12)


def test_bad_rows() -> None:
    with pytest.raises(ValueError, match="rows must"):
        fenwick_opt.optimal_weights(7, 0.5, rows=8)
