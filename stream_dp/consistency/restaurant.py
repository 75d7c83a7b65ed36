"""Seed 000's worked example: the restaurant sales histogram (interval trees + package constraints).

``c = 5`` items; for each item a k-ary interval tree over ``T`` days (the leaves are the daily
sales ``v_{t,i}``, internal nodes the sums over intervals); the restaurant only sells packages, so
every day's sales satisfy ``B v_t = 0`` with ``B = [[1, −5, 3, 4, 0], [−1, −1, 1, 0, 2]]``
(seed 000, eq. (13)). The three packages ``(2,1,1,0,1)``, ``(0,2,2,1,0)``, ``(1,1,0,1,1)`` span the
null space of ``B``.

Layout (the solver order): item ``i``'s tree occupies ``x[i·n : (i+1)·n]`` in breadth-first
order; the tree has ``h = ⌈log_k T⌉ + 1`` levels and all leaves at the last level, leaf ``j`` being
day ``j`` (node at level ℓ, position j covers days ``[j·k^(h−1−ℓ), min((j+1)·k^(h−1−ℓ), T))``).
One event (one package bought) changes at most ``c = 5`` item counts by one each day, i.e. the
L1 sensitivity of the whole release is ``c·h`` (seed 000, section 7).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from stream_dp.consistency.approx import GroupBlock, SubProblem, TreeBlock
from stream_dp.consistency.tree import TreePlan

Float64Array = NDArray[np.float64]
Int64Array = NDArray[np.int64]

__all__ = [
    "PACKAGES",
    "RESTAURANT_B",
    "interval_tree_levels",
    "interval_tree_parent",
    "restaurant_constraints",
    "restaurant_subproblems",
    "restaurant_truth",
]

#: Package constraint matrix of seed 000, eq. (13): ``B v_t = 0`` for every day t.
RESTAURANT_B: Float64Array = np.array([[1.0, -5.0, 3.0, 4.0, 0.0], [-1.0, -1.0, 1.0, 0.0, 2.0]])
#: The three packages (items per package), rows span the null space of ``RESTAURANT_B``.
PACKAGES: Float64Array = np.array(
    [[2.0, 1.0, 1.0, 0.0, 1.0], [0.0, 2.0, 2.0, 1.0, 0.0], [1.0, 1.0, 0.0, 1.0, 1.0]]
)


def interval_tree_levels(days: int, fanout: int = 2) -> list[int]:
    """Number of nodes per level, root first, of the k-ary interval tree over ``days`` leaves."""
    if days < 1:
        raise ValueError(f"days must be ≥ 1, got {days}")
    if fanout < 2:
        raise ValueError(f"fanout must be ≥ 2, got {fanout}")
    h = 1
    while fanout ** (h - 1) < days:
        h += 1
    return [-(-days // fanout ** (h - 1 - lvl)) for lvl in range(h)]


def interval_tree_parent(days: int, fanout: int = 2) -> Int64Array:
    """Parent array (BFS order) of the k-ary interval tree over ``days`` leaves (last level)."""
    sizes = interval_tree_levels(days, fanout)
    parts = [np.array([-1], dtype=np.int64)]
    offset = 0
    for lvl in range(1, len(sizes)):
        parts.append(np.arange(sizes[lvl], dtype=np.int64) // fanout + offset)
        offset += sizes[lvl - 1]
    return np.concatenate(parts)


def restaurant_subproblems(
    days: int, fanout: int = 2, items: int = 5, *, lifted: bool = False
) -> tuple[list[SubProblem], int]:
    """Sub-problems (all item trees as one batch; all days' package constraints as one group).

    ``lifted=False`` is the paper's split: ``B v_t = 0`` on the T leaves only. ``lifted=True``
    also states the *implied* constraints ``B x_I = 0`` for every interval node I (they follow
    from the tree constraints, so the feasible set and the optimum are the same). With equal
    variances the two projections then commute (``P_tree ⊗ I`` and ``I ⊗ P_B``) and the method
    is exact after one cycle; with other variances it still converges far faster.
    Returns ``(subproblems, n)`` with ``n = items · nodes_per_tree`` values in the solver order.
    """
    plan = TreePlan(interval_tree_parent(days, fanout))
    n = plan.n
    leaf_lo = 0 if lifted else n - days
    nodes = (np.arange(items, dtype=np.int64)[None, :] * n) + np.arange(leaf_lo, n, dtype=np.int64)[
        :, None
    ]
    matrix = RESTAURANT_B if items == 5 else np.ones((1, items))
    return [TreeBlock(plan, 0, items), GroupBlock(matrix, nodes)], items * n


def restaurant_constraints(days: int, fanout: int = 2, items: int = 5) -> sp.csr_matrix:
    """The full constraint matrix ``M`` (``M x = 0``) in the solver order, sparse (for oracles)."""
    par = interval_tree_parent(days, fanout)
    n = par.size
    child = np.flatnonzero(par >= 0)
    internal = np.unique(par[child])
    row_of = np.full(n, -1, dtype=np.int64)
    row_of[internal] = np.arange(internal.size)
    rows, cols, vals = [], [], []
    m_tree = internal.size
    for i in range(items):
        rows += [row_of[internal] + i * m_tree, row_of[par[child]] + i * m_tree]
        cols += [internal + i * n, child + i * n]
        vals += [np.ones(internal.size), -np.ones(child.size)]
    base = items * m_tree
    matrix = RESTAURANT_B if items == 5 else np.ones((1, items))
    r = matrix.shape[0]
    leaf_lo = n - days
    for day in range(days):
        for a in range(r):
            for i in range(items):
                if matrix[a, i] != 0:
                    rows.append(np.array([base + day * r + a]))
                    cols.append(np.array([i * n + leaf_lo + day]))
                    vals.append(np.array([matrix[a, i]]))
    m = base + days * r
    return sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(m, items * n)
    )


def restaurant_truth(sales: Float64Array, fanout: int = 2) -> Float64Array:
    """True node values (solver order) from daily package sales ``sales`` of shape ``(T, 3)``."""
    daily = np.asarray(sales, dtype=np.float64) @ PACKAGES  # (T, 5)
    days = daily.shape[0]
    sizes = interval_tree_levels(days, fanout)
    trees = []
    for i in range(daily.shape[1]):
        levels = [daily[:, i]]
        for size in reversed(sizes[:-1]):
            cur = levels[0]
            pad = size * fanout - cur.size
            levels.insert(0, np.concatenate([cur, np.zeros(pad)]).reshape(size, fanout).sum(axis=1))
        trees.append(np.concatenate(levels))
    return np.concatenate(trees)
