"""Seed 000's restaurant problem: interval trees per item + per-day package constraints."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.consistency import reconcile
from stream_dp.consistency.approx import approximate
from stream_dp.consistency.general import general_solution, weighted_general_solution
from stream_dp.consistency.reconcile import lift_rows
from stream_dp.consistency.restaurant import (
    PACKAGES,
    RESTAURANT_B,
    interval_tree_levels,
    interval_tree_parent,
    restaurant_constraints,
    restaurant_subproblems,
    restaurant_truth,
)
from stream_dp.domain import Domain


def test_packages_span_null_space_and_tree_shape() -> None:
    np.testing.assert_array_equal(RESTAURANT_B @ PACKAGES.T, 0)
    assert np.linalg.matrix_rank(RESTAURANT_B) == 2
    # h = ⌈log_k T⌉ + 1 levels, all leaves at the last level
    assert interval_tree_levels(1024, 2) == [2**i for i in range(11)]
    assert interval_tree_levels(10, 3) == [1, 2, 4, 10]
    par = interval_tree_parent(10, 3)
    assert par.size == 17 and par[0] == -1
    truth = restaurant_truth(np.arange(30).reshape(10, 3), fanout=3)
    assert np.all(restaurant_constraints(10, 3) @ truth == 0)


@pytest.mark.parametrize("days,fanout", [(8, 2), (20, 2), (13, 3), (33, 4)])
@pytest.mark.parametrize("lifted", [False, True])
def test_approximation_equals_general_solution(days: int, fanout: int, lifted: bool) -> None:
    rng = np.random.default_rng(days * 10 + fanout + lifted)
    subs, n = restaurant_subproblems(days, fanout, lifted=lifted)
    M = restaurant_constraints(days, fanout)
    truth = restaurant_truth(rng.integers(0, 30, size=(days, 3)), fanout)
    x = truth + rng.laplace(0, 10, size=n)
    v = rng.uniform(0.5, 5, size=n)
    res = approximate(x, v, subs, tol=1e-13, max_iter=100000)
    ref = weighted_general_solution(M.toarray(), np.zeros(M.shape[0]), x, v, method="dense")
    assert res.converged
    assert np.max(np.abs(res.values - ref)) / np.abs(ref).max() < 1e-6
    assert res.residual < 1e-6
    # equal variances (the paper's experiment): the lifted split is exact after one cycle
    res1 = approximate(x, None, subs, tol=1e-12, max_iter=100000)
    ref1 = general_solution(M.toarray(), np.zeros(M.shape[0]), x, method="dense")
    assert np.max(np.abs(res1.values - ref1)) / np.abs(ref1).max() < 1e-6
    if lifted:
        assert res1.iterations <= 2


def restaurant_domain(days: int, fanout: int) -> tuple[Domain, np.ndarray]:
    """The same problem through the public Domain API (5 trees in one forest + a group)."""
    items = ["cola", "burger", "wings", "fries", "nuggets"]
    par = interval_tree_parent(days, fanout)
    n = par.size
    names = [f"{it}/{j}" for it in items for j in range(n)]
    parent = np.concatenate([np.where(par >= 0, par + i * n, -1) for i in range(5)])
    dom = Domain.from_parent(names, parent)
    rows = [[f"{it}/{n - days + d}" for it in items] for d in range(days)]
    return dom.with_constraints("packages", RESTAURANT_B, rows), parent


@pytest.mark.parametrize("days", [16, 21])
@pytest.mark.parametrize("lift", [True, False])
def test_domain_reconcile_restaurant_equals_general_solution(days: int, lift: bool) -> None:
    rng = np.random.default_rng(3 + days)
    dom, _ = restaurant_domain(days, 2)
    n = len(dom)
    truth = restaurant_truth(rng.integers(0, 30, size=(days, 3)))
    assert np.max(np.abs(dom.constraint_matrix() @ truth)) == 0
    x = truth + rng.laplace(0, 5, size=n)
    M = dom.constraint_matrix().toarray()
    for v in (None, rng.uniform(0.5, 5, size=n)):
        res = reconcile(dom, x, v, tol=1e-12, max_iter=100000, lift=lift)
        ref = weighted_general_solution(M, np.zeros(M.shape[0]), x, np.ones(n) if v is None else v)
        assert np.max(np.abs(res.values - ref)) / np.abs(ref).max() < 1e-6
        assert res.consistent and res.converged and res.iterations > 1
        if lift and v is None:
            assert res.iterations == 2  # exact after one cycle, confirmed by the second


def test_lift_rows() -> None:
    # two trees r1 -> (a1, b1), r2 -> (a2, b2); rows (a1, a2), (b1, b2) lift to (r1, r2)
    parent = np.array([-1, 0, 0, -1, 3, 3])
    rows = np.array([[1, 4], [2, 5]])
    np.testing.assert_array_equal(lift_rows(parent, rows), [[0, 3]])
    # a missing sibling row blocks the lift
    assert lift_rows(parent, rows[:1]).shape == (0, 2)
    # roots do not lift further
    assert lift_rows(parent, np.array([[0, 3]])).shape == (0, 2)


def test_restaurant_mse_drops() -> None:
    rng = np.random.default_rng(8)
    days = 32
    subs, n = restaurant_subproblems(days, 2, lifted=True)
    truth = restaurant_truth(rng.integers(0, 30, size=(days, 3)))
    before, after = [], []
    for _ in range(200):
        x = truth + rng.laplace(0, 30, size=n)
        res = approximate(x, None, subs, tol=1e-9)
        before.append(np.mean((x - truth) ** 2))
        after.append(np.mean((res.values - truth) ** 2))
    assert np.mean(after) < 0.8 * np.mean(before)
