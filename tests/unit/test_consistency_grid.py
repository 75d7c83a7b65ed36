"""Attribute grids (seed 002): FGMC closed form and the alternation vs the general solution."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.consistency import reconcile
from stream_dp.consistency.fgmc import fgmc_paper, fgmc_project
from stream_dp.consistency.general import general_solution, weighted_general_solution
from stream_dp.domain import Domain


def one_tree_matrix(shape: tuple[int, ...], axis: int) -> np.ndarray:
    """Dense constraints of one attribute tree over (total, categories of axis, cells)."""
    k1 = shape[axis]
    n = math.prod(shape)
    M = np.zeros((1 + k1, 1 + k1 + n))
    M[0, 0] = 1
    M[0, 1 : 1 + k1] = -1
    idx = np.arange(n).reshape(shape)
    for j in range(k1):
        M[1 + j, 1 + j] = 1
        M[1 + j, 1 + k1 + idx.take(j, axis=axis).ravel()] = -1
    return M


def grid_matrix(shape: tuple[int, ...]) -> np.ndarray:
    """Dense constraints of a full grid, all k trees (rank-deficient: every tree's root row)."""
    n = math.prod(shape)
    N = 1 + sum(shape) + n
    rows = []
    idx = np.arange(n).reshape(shape)
    off = 1
    for a, na in enumerate(shape):
        r = np.zeros(N)
        r[0] = 1
        r[off : off + na] = -1
        rows.append(r)
        for j in range(na):
            r = np.zeros(N)
            r[off + j] = 1
            r[1 + sum(shape) + idx.take(j, axis=a).ravel()] = -1
            rows.append(r)
        off += na
    return np.array(rows)


@pytest.mark.parametrize("shape,axis", [((3,), 0), ((2, 5), 1), ((3, 4, 2), 0), ((2, 3, 2, 2), 3)])
def test_fgmc_equals_general_solution_on_one_tree(shape: tuple[int, ...], axis: int) -> None:
    rng = np.random.default_rng(len(shape) * 7 + axis)
    cells = rng.normal(0, 5, size=shape)
    marg = rng.normal(0, 5, size=shape[axis])
    total = float(rng.normal(0, 5))
    M = one_tree_matrix(shape, axis)
    x = np.r_[total, marg, cells.ravel()]
    v = rng.uniform(0.2, 5, size=x.size)
    ref = weighted_general_solution(M, np.zeros(M.shape[0]), x, v)
    t, m, c = fgmc_project(
        total, marg, cells, axis, v[0], v[1 : 1 + shape[axis]], v[1 + shape[axis] :].reshape(shape)
    )
    np.testing.assert_allclose(np.r_[t, m, c.ravel()], ref, atol=1e-9)
    ref1 = general_solution(M, np.zeros(M.shape[0]), x)
    t, m, c = fgmc_paper(total, marg, cells, axis)
    np.testing.assert_allclose(np.r_[t, m, c.ravel()], ref1, atol=1e-9)


@pytest.mark.parametrize("cats", [[2, 2], [2, 3], [4, 2, 3], [2, 3, 2, 3], [5, 1, 2]])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("solver", ["joint", "fgmc"])
def test_grid_reconcile_equals_general_solution(
    cats: list[int], weighted: bool, solver: str
) -> None:
    rng = np.random.default_rng(sum(cats) * 3 + weighted)
    dom = Domain.grid({f"a{i}": [f"c{j}" for j in range(n)] for i, n in enumerate(cats)})
    n = len(dom)
    x = rng.normal(0, 10, size=n)
    v = rng.uniform(0.1, 5, size=n) if weighted else None
    res = reconcile(dom, x, v, tol=1e-13, max_iter=5000, grid_solver=solver)
    assert (res.iterations == 1) == (solver == "joint")
    M = grid_matrix(tuple(cats))
    ref = weighted_general_solution(M, np.zeros(M.shape[0]), x, np.ones(n) if v is None else v)
    assert np.max(np.abs(res.values - ref)) / max(1.0, np.abs(ref).max()) < 1e-6
    assert res.converged and res.consistent
    assert np.max(np.abs(M @ res.values)) < 1e-8
    # the domain's (full-rank) constraint matrix describes the same set
    assert np.max(np.abs(dom.constraint_matrix() @ res.values)) < 1e-8


@settings(max_examples=25, deadline=None)
@given(
    cats=st.lists(st.integers(min_value=1, max_value=4), min_size=2, max_size=4),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_property_random_grids(cats: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    dom = Domain.grid({f"a{i}": [f"c{j}" for j in range(n)] for i, n in enumerate(cats)})
    n = len(dom)
    x = rng.normal(0, 10, size=n)
    v = rng.uniform(0.1, 5, size=n)
    M = grid_matrix(tuple(cats))
    ref = weighted_general_solution(M, np.zeros(M.shape[0]), x, v)
    for solver in ("joint", "fgmc"):
        res = reconcile(dom, x, v, tol=1e-13, max_iter=20000, grid_solver=solver)
        assert np.max(np.abs(res.values - ref)) / max(1.0, np.abs(ref).max()) < 1e-6


def test_grid_with_constraint_group_and_uniform_cells() -> None:
    """Grid + an extra group (alternation of the joint grid block and the group)."""
    rng = np.random.default_rng(9)
    dom = Domain.grid({"r": ["n", "s"], "p": ["a", "b", "c"]}).with_constraints(
        "same", [[1.0, -1.0]], [["r=n|p=a", "r=s|p=a"]]
    )
    n = len(dom)
    x = rng.normal(0, 10, size=n)
    v = np.r_[rng.uniform(0.5, 5, size=6), np.full(6, 2.0)]
    M = dom.constraint_matrix().toarray()
    ref = weighted_general_solution(M, np.zeros(M.shape[0]), x, v)
    for solver in ("joint", "fgmc"):
        res = reconcile(dom, x, v, tol=1e-13, max_iter=100000, grid_solver=solver)
        assert np.max(np.abs(res.values - ref)) < 1e-8
        assert res.consistent


def test_grid_monte_carlo_mse_drops_and_matches_theory() -> None:
    rng = np.random.default_rng(5)
    cats = (3, 4, 2)
    dom = Domain.grid({f"a{i}": [f"c{j}" for j in range(n)] for i, n in enumerate(cats)})
    n = len(dom)
    v = np.full(n, 4.0)
    v[0] = 9.0
    M = dom.constraint_matrix().toarray()
    S = np.diag(v)
    theory = float(np.trace(S - S @ M.T @ np.linalg.solve(M @ S @ M.T, M @ S)))
    reps = 1500
    sq = np.empty(reps)
    for r in range(reps):
        e = rng.normal(size=n) * np.sqrt(v)
        sq[r] = np.sum(reconcile(dom, e, v).values ** 2)
    se = sq.std(ddof=1) / np.sqrt(reps)
    assert sq.mean() < v.sum()
    assert abs(sq.mean() - theory) < 5 * se
