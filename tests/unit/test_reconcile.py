"""reconcile(domain, noisy, variances): solver choice, flags, post-processing, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.consistency import reconcile
from stream_dp.consistency.general import weighted_general_solution
from stream_dp.consistency.reconcile import ReconcileResult
from stream_dp.domain import Domain

PATHS = [
    "eu/fr/paris",
    "eu/fr/lyon",
    "eu/de/berlin",
    "us/ny",
    "us/sf/soma",
    "us/sf/mission",
    "asia",
]


def test_flat_is_identity() -> None:
    dom = Domain.flat(["a", "b", "c"])
    x = np.array([1.0, -2.0, 3.5])
    res = reconcile(dom, x, np.array([1.0, 2.0, 3.0]))
    assert isinstance(res, ReconcileResult)
    np.testing.assert_array_equal(res.values, x)
    assert res.iterations == 0 and res.residual == 0.0 and res.consistent
    assert res.values is not x
    res = reconcile(dom, x, nonnegative=True)
    np.testing.assert_array_equal(res.values, [1.0, 0.0, 3.5])


def test_hierarchy_exact_in_one_pass_and_matches_oracle() -> None:
    rng = np.random.default_rng(0)
    dom = Domain.from_paths(PATHS)
    n = len(dom)
    x = rng.normal(0, 10, size=n)
    v = rng.uniform(0.5, 4, size=n)
    res = reconcile(dom, x, v)
    M = dom.constraint_matrix().toarray()
    ref = weighted_general_solution(M, np.zeros(M.shape[0]), x, v)
    np.testing.assert_allclose(res.values, ref, atol=1e-9)
    assert res.iterations == 1 and res.consistent and res.residual < 1e-9
    # scalar variance = equal variances
    np.testing.assert_allclose(reconcile(dom, x, 2.0).values, reconcile(dom, x).values, atol=1e-12)


def test_hierarchy_not_in_bfs_order() -> None:
    rng = np.random.default_rng(1)
    base = Domain.from_paths(PATHS)
    perm = rng.permutation(len(base))
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(base))
    assert base.parent is not None
    par = base.parent[perm]
    dom = Domain.from_parent(
        [base.names[i] for i in perm], np.where(par >= 0, inv[np.maximum(par, 0)], -1)
    )
    x = rng.normal(0, 10, size=len(dom))
    v = rng.uniform(0.5, 4, size=len(dom))
    a = reconcile(dom, x, v).values
    b = reconcile(base, x[inv], v[inv]).values
    np.testing.assert_allclose(a, b[perm], atol=1e-10)


def test_nonnegative_hierarchy_stays_consistent() -> None:
    rng = np.random.default_rng(2)
    dom = Domain.from_paths(PATHS)
    x = rng.normal(0, 10, size=len(dom))
    res = reconcile(dom, x, nonnegative=True)
    assert np.all(res.values >= 0)
    assert res.consistent and res.residual < 1e-9
    assert np.max(np.abs(dom.constraint_matrix() @ res.values)) < 1e-9


def test_nonnegative_grid_reports_consistency_honestly() -> None:
    dom = Domain.grid({"r": ["n", "s"], "p": ["a", "b", "c"]})
    rng = np.random.default_rng(3)
    x = rng.normal(0, 10, size=len(dom))
    res = reconcile(dom, x, nonnegative=True)
    assert np.all(res.values >= 0)
    true_res = float(np.linalg.norm(dom.constraint_matrix() @ res.values))
    assert res.consistent == (true_res <= 1e-6)
    # a grid with positive values far from 0 keeps consistency
    res = reconcile(dom, x + 1000, nonnegative=True)
    assert res.consistent


def test_max_iter_reports_not_converged() -> None:
    dom = Domain.grid({"r": ["n", "s", "e"], "p": ["a", "b", "c"], "q": ["x", "y"]})
    rng = np.random.default_rng(4)
    x = rng.normal(0, 10, size=len(dom))
    v = rng.uniform(0.1, 10, size=len(dom))
    res = reconcile(dom, x, v, max_iter=1, tol=1e-12, grid_solver="fgmc")
    assert res.iterations == 1 and not res.converged and not res.consistent
    assert res.residual > 1e-6
    exact = reconcile(dom, x, v, max_iter=1, tol=1e-12)  # joint grid solver: exact in one pass
    assert exact.iterations == 1 and exact.converged and exact.consistent


def test_bad_input() -> None:
    dom = Domain.from_paths(PATHS)
    n = len(dom)
    with pytest.raises(ValueError, match="shape"):
        reconcile(dom, np.zeros(n + 1))
    with pytest.raises(ValueError, match="finite"):
        reconcile(dom, np.full(n, np.nan))
    with pytest.raises(ValueError, match="> 0"):
        reconcile(dom, np.zeros(n), -np.ones(n))
    with pytest.raises(ValueError, match="> 0"):
        reconcile(dom, np.zeros(n), np.zeros(n))
    with pytest.raises(ValueError, match="variances"):
        reconcile(dom, np.zeros(n), np.ones(n - 1))
    with pytest.raises(ValueError, match="tol"):
        reconcile(dom, np.zeros(n), tol=0.0)
    with pytest.raises(ValueError, match="max_iter"):
        reconcile(dom, np.zeros(n), max_iter=0)
    with pytest.raises(ValueError, match="grid_solver"):
        reconcile(dom, np.zeros(n), grid_solver="magic")
