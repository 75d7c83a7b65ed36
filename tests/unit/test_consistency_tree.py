"""Exact GLS tree solver against independent oracles (dense pseudo-inverse, Hay et al.'s formula)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.consistency.general import general_solution, weighted_general_solution
from stream_dp.consistency.tree import TreePlan, consistent_tree, consistent_trees


def random_tree(rng: np.random.Generator, n: int, max_fanout: int | None = None) -> np.ndarray:
    """Random tree, random fan-out, randomly relabelled (so not in BFS order)."""
    par = np.full(n, -1, dtype=np.int64)
    for i in range(1, n):
        lo = 0 if max_fanout is None else max(0, (i - 1) // max_fanout - 3)
        par[i] = rng.integers(lo, i)
    perm = rng.permutation(n)
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n)
    out = np.full(n, -1, dtype=np.int64)
    has = par >= 0
    out[inv[has]] = inv[par[has]]
    return out


def tree_matrix(parent: np.ndarray) -> np.ndarray:
    """Dense constraint matrix: one row x_p − Σ children per internal node (independent oracle)."""
    n = parent.size
    internal = sorted({int(p) for p in parent if p >= 0})
    M = np.zeros((len(internal), n))
    for r, p in enumerate(internal):
        M[r, p] = 1.0
        for c in range(n):
            if parent[c] == p:
                M[r, c] = -1.0
    return M


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


@pytest.mark.parametrize("n,seed", [(1, 0), (2, 1), (7, 2), (60, 3), (400, 4), (2000, 5)])
def test_random_trees_match_weighted_general_solution(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    parent = random_tree(rng, n)
    x = rng.normal(0, 20, size=n)
    v = rng.uniform(0.1, 10.0, size=n)
    got = consistent_tree(parent, x, v)
    if n == 1:
        np.testing.assert_array_equal(got, x)
        return
    if n <= 400:
        M = tree_matrix(parent)
        ref = weighted_general_solution(M, np.zeros(M.shape[0]), x, v, method="dense")
    else:
        import scipy.sparse as sp

        child = np.flatnonzero(parent >= 0)
        internal = np.unique(parent[child])
        row = np.full(n, -1)
        row[internal] = np.arange(internal.size)
        M = sp.csr_matrix(
            (
                np.r_[np.ones(internal.size), -np.ones(child.size)],
                (np.r_[row[internal], row[parent[child]]], np.r_[internal, child]),
            ),
            shape=(internal.size, n),
        )
        ref = weighted_general_solution(M, np.zeros(internal.size), x, v, method="sparse-normal")
    assert rel_err(got, ref) < 1e-6
    # exactly consistent (to rounding)
    assert np.max(np.abs(TreePlan(parent).residual(got))) < 1e-9 * max(
        1.0, float(np.abs(got).max())
    )


def hay_boosting(k: int, height: int, x: np.ndarray) -> np.ndarray:
    """Hay et al. (2010) boosting for a complete k-ary tree in BFS order, node loops (oracle)."""
    n = (k**height - 1) // (k - 1)
    children = {i: [k * i + j + 1 for j in range(k)] for i in range(n) if k * i + 1 < n}
    level = {}

    def set_level(i: int, lv: int) -> None:  # leaves have level 1
        level[i] = lv
        for c in children.get(i, []):
            set_level(c, lv - 1)

    set_level(0, height)
    z = x.astype(float).copy()
    for i in reversed(range(n)):
        if i in children:
            lv = level[i]
            a = (k**lv - k ** (lv - 1)) / (k**lv - 1)
            b = (k ** (lv - 1) - 1) / (k**lv - 1)
            z[i] = a * x[i] + b * sum(z[c] for c in children[i])
    out = z.copy()
    for i in range(n):
        if i in children:
            gap = out[i] - sum(z[c] for c in children[i])
            for c in children[i]:
                out[c] = z[c] + gap / k
    return out


@pytest.mark.parametrize("k,height", [(2, 5), (3, 4), (4, 3)])
def test_equal_variances_reduce_to_hay_boosting(k: int, height: int) -> None:
    rng = np.random.default_rng(k * 10 + height)
    n = (k**height - 1) // (k - 1)
    parent = np.r_[-1, (np.arange(1, n) - 1) // k]
    x = rng.normal(0, 5, size=n)
    np.testing.assert_allclose(consistent_tree(parent, x), hay_boosting(k, height, x), atol=1e-10)
    np.testing.assert_allclose(
        consistent_tree(parent, x, 3.0), hay_boosting(k, height, x), atol=1e-10
    )


def test_batched_equals_rowwise_and_forest() -> None:
    rng = np.random.default_rng(11)
    parent = random_tree(rng, 150)
    X = rng.normal(size=(6, 150))
    V = rng.uniform(0.5, 2, size=(6, 150))
    got = consistent_trees(parent, X, V)
    for r in range(6):
        np.testing.assert_allclose(got[r], consistent_tree(parent, X[r], V[r]), atol=1e-12)
    # a forest of two copies is solved like two separate trees
    forest = np.r_[parent, np.where(parent >= 0, parent + 150, -1)]
    both = consistent_tree(forest, np.r_[X[0], X[1]], np.r_[V[0], V[1]])
    np.testing.assert_allclose(both, np.r_[got[0], got[1]], atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    n=st.integers(min_value=2, max_value=60),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_property_random_shapes(data: st.DataObject, n: int, seed: int) -> None:
    parents = [data.draw(st.integers(min_value=0, max_value=i - 1)) for i in range(1, n)]
    parent = np.array([-1, *parents], dtype=np.int64)
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 10, size=n)
    v = rng.uniform(0.05, 20, size=n)
    M = tree_matrix(parent)
    ref = weighted_general_solution(M, np.zeros(M.shape[0]), x, v)
    got = consistent_tree(parent, x, v)
    assert rel_err(got, ref) < 1e-6
    # projection is idempotent and equal variances give the Euclidean general solution
    np.testing.assert_allclose(consistent_tree(parent, got, v), got, atol=1e-9)
    assert rel_err(consistent_tree(parent, x), general_solution(M, np.zeros(M.shape[0]), x)) < 1e-6


def test_monte_carlo_mse_matches_gls_theory() -> None:
    """Empirical MSE after projection vs trace(Σ − Σ Mᵀ (M Σ Mᵀ)⁻¹ M Σ), Gaussian noise."""
    rng = np.random.default_rng(20261122)
    k, height = 3, 4
    n = (k**height - 1) // (k - 1)
    parent = np.r_[-1, (np.arange(1, n) - 1) // k]
    v = rng.uniform(0.5, 4.0, size=n)
    M = tree_matrix(parent)
    S = np.diag(v)
    cov = S - S @ M.T @ np.linalg.solve(M @ S @ M.T, M @ S)
    theory = float(np.trace(cov))
    reps = 20000
    truth = np.zeros(n)
    noise = rng.normal(size=(reps, n)) * np.sqrt(v)
    est = consistent_trees(parent, truth + noise, v)
    sq = np.sum(est**2, axis=1)
    before = np.sum(noise**2, axis=1)
    se = float(sq.std(ddof=1) / np.sqrt(reps))
    assert abs(float(sq.mean()) - theory) < 5 * se  # two-sided, p ≈ 6e-7 under the theory
    assert float(sq.mean()) < float(before.mean())
    assert theory < float(v.sum())
    # per-node variances match the diagonal of the projected covariance
    np.testing.assert_allclose(est.var(axis=0), np.diag(cov), rtol=0.08)


@pytest.mark.parametrize(
    "parent,match",
    [
        ([1, 0], "cycle"),
        ([-1, 2, 1], "cycle"),
        ([-1, 5], "not a node index"),
        ([], "at least one node"),
        ([[-1, 0]], "1-D"),
        ([-1, 0.5], "integer"),
    ],
)
def test_bad_parent_arrays(parent: list[object], match: str) -> None:
    # the parent array is validated before the values (whose length is then irrelevant)
    with pytest.raises(ValueError, match=match):
        consistent_tree(np.array(parent), np.zeros(2))
    with pytest.raises(ValueError, match=match):
        TreePlan(np.array(parent))


def test_bad_values_and_variances() -> None:
    parent = np.array([-1, 0, 0])
    with pytest.raises(ValueError, match="shape"):
        consistent_tree(parent, np.zeros(4))
    with pytest.raises(ValueError, match="finite"):
        consistent_tree(parent, np.array([1.0, np.nan, 0.0]))
    with pytest.raises(ValueError, match="> 0"):
        consistent_tree(parent, np.zeros(3), np.array([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="> 0"):
        consistent_tree(parent, np.zeros(3), np.array([1.0, np.nan, 1.0]))
    with pytest.raises(ValueError, match="variances"):
        consistent_tree(parent, np.zeros(3), np.ones(5))
    with pytest.raises(ValueError, match="2-D"):
        consistent_trees(parent, np.zeros(3))


def test_prepare_reuses_the_coefficients_only_for_equal_variances() -> None:
    """TreePlan.prepare keeps the last PreparedTree: the same variances (a new array, equal
    values) give it back; other variances (one node changed, another batch shape) give fresh
    coefficients, equal to a PreparedTree built from scratch (the oracle)."""
    from stream_dp.consistency.tree import PreparedTree, TreePlan

    rng = np.random.default_rng(5)
    parent = np.array([-1, 0, 0, 1, 1, 2, 2, 2, -1, 8])
    plan = TreePlan(parent)
    v = rng.uniform(0.5, 2.0, size=parent.size)
    first = plan.prepare(v)
    assert plan.prepare(v.copy()) is first
    w = v.copy()
    w[6] *= 1.5
    second = plan.prepare(w)
    assert second is not first
    z = rng.normal(size=parent.size)
    for prepared, var in ((second, w), (plan.prepare(v), v)):
        want = PreparedTree(plan, var).apply_bfs(z.copy())
        np.testing.assert_array_equal(prepared.apply_bfs(z.copy()), want)
    v[:] = 1.0  # the caller's array changing later cannot change the cached coefficients
    np.testing.assert_array_equal(plan.prepare(w).apply_bfs(z.copy()),
                                  PreparedTree(plan, w).apply_bfs(z.copy()))
    batch = plan.prepare(np.stack([w, w]), (2,))
    assert batch is not plan.prepare(w) and batch.apply_bfs(np.stack([z, z])).shape == (2, 10)
