"""Consistent release of one tick's noisy values over a :class:`~stream_dp.domain.Domain`.

:func:`reconcile` picks the solver for the domain's constraint structure:

* flat, no groups: nothing to do (values returned unchanged);
* hierarchy, no groups: the exact two-pass GLS tree solver (one pass, exact);
* grid: by default the exact joint projection onto all k attribute trees
  (:class:`~stream_dp.consistency.fgmc.GridProjector`, one pass, no iterations);
  ``grid_solver="fgmc"`` alternates seed 002's FGMC projections of the k 3-level trees with the
  approximation method (seed 000), as in the paper;
* any extra constraint groups: the approximation method of seed 000 over all sub-problems.

**Lifting implied constraints (hierarchies).** A group row over leaves, e.g. seed 000's
``B v_t = 0`` over the five items' day-t leaves, implies the same constraint one level up
whenever the parents' children are exactly covered by group rows (``B x_I = Σ_t B v_t = 0`` for
every interval I). Such implied rows are added automatically (repeatedly, up the trees): the
feasible set, hence the optimum, is unchanged, but the sub-problem projections then (nearly)
commute — with equal variances ``P_tree ⊗ I`` and ``I ⊗ P_B`` commute exactly and one cycle is
exact — where the leaves-only split of the paper needs thousands of cycles on large trees.
``lift=False`` keeps the paper's split.

All projections are GLS projections in the metric of the noise variances, so the result is the
optimal consistent release ``x + Σ Mᵀ (M Σ Mᵀ)⁺ (0 − M x)``; see
:mod:`stream_dp.consistency.approx` for why the alternation must use that metric.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from stream_dp.consistency.approx import (
    GridBlock,
    GridTreeBlock,
    GroupBlock,
    SubProblem,
    TreeBlock,
    approximate,
)
from stream_dp.consistency.tree import TreePlan, nonnegative_bfs

Float64Array = NDArray[np.float64]
Int64Array = NDArray[np.int64]


class _Group(Protocol):
    """A constraint group: ``matrix @ values[rows[g]] = 0`` for every row ``g``."""

    @property
    def matrix(self) -> Float64Array: ...
    @property
    def rows(self) -> Int64Array: ...


class DomainShape(Protocol):
    """What the solver reads of a domain; :class:`stream_dp.domain.Domain` is one. (The domain
    module builds its tree plans with this package, so this package never imports it.)"""

    @property
    def kind(self) -> str: ...
    @property
    def parent(self) -> Int64Array | None: ...
    @property
    def cell_shape(self) -> tuple[int, ...]: ...
    @property
    def groups(self) -> Sequence[_Group]: ...
    def __len__(self) -> int: ...

__all__ = ["ReconcileResult", "lift_rows", "reconcile"]


@dataclass(frozen=True)
class ReconcileResult:
    """One tick's consistent release.

    ``values``: one per domain node, domain order (value units); ``iterations``: full cycles of
    the approximation method (1 for an exact single solve, 0 when there is nothing to do);
    ``residual``: ``‖M x‖₂`` of the returned values; ``seconds``: wall time; ``consistent``: the
    returned values satisfy every constraint to within ``tol`` (``residual ≤ tol``, or to
    rounding: ``residual ≤ 1e-9·(1 + max|x|)``);
    ``converged``: the stopping rule was met before ``max_iter``.
    """

    values: Float64Array
    iterations: int
    residual: float
    seconds: float
    consistent: bool
    converged: bool = True


@dataclass(frozen=True, eq=False)
class _Solver:
    order: Int64Array | None  # solver position -> domain index; None = identity
    subproblems: list[SubProblem]
    plan: TreePlan | None  # BFS-ordered plan (hierarchy), for non-negative post-processing


_SOLVERS: weakref.WeakKeyDictionary[DomainShape, dict[tuple[bool, str], _Solver]] = (
    weakref.WeakKeyDictionary()
)


def lift_rows(parent: Int64Array, rows: Int64Array) -> Int64Array:
    """Rows of parents on which a group constraint (rhs 0) is implied by the tree constraints.

    ``rows``: shape ``(G, c)`` node indices of disjoint group rows. A parent tuple ``P`` (the
    parents of the nodes of some rows, column by column) qualifies when, for every column j,
    the children of ``P_j`` are exactly the column-j nodes of the rows mapped to ``P``; then
    ``B x[P] = Σ B x[row] = 0``. Returns the qualifying tuples, shape ``(G', c)`` (disjoint).
    """
    if rows.shape[0] == 0:
        return rows
    par = parent[rows]
    keep = np.all(par >= 0, axis=1)
    if not keep.any():
        return np.zeros((0, rows.shape[1]), dtype=np.int64)
    tuples, counts = np.unique(par[keep], axis=0, return_counts=True)
    n_children = np.bincount(parent[parent >= 0], minlength=parent.size)
    ok = np.all(n_children[tuples] == counts[:, None], axis=1)
    srt = np.sort(tuples, axis=1)
    ok &= np.all(srt[:, 1:] != srt[:, :-1], axis=1)  # a node twice in one tuple cannot lift
    return np.asarray(tuples[ok], dtype=np.int64)


def _solver(domain: DomainShape, lift: bool, grid_solver: str) -> _Solver:
    per_domain = _SOLVERS.setdefault(domain, {})
    cached = per_domain.get((lift, grid_solver))
    if cached is not None:
        return cached
    order: Int64Array | None = None
    position: Int64Array | None = None
    subs: list[SubProblem] = []
    plan: TreePlan | None = None
    if domain.kind == "hierarchy":
        assert domain.parent is not None
        base = TreePlan(domain.parent)
        par = domain.parent
        if base.is_bfs_ordered:
            plan = base
        else:
            order, position = base.order, base.position
            p_sorted = par[order]
            plan = TreePlan(np.where(p_sorted >= 0, position[np.maximum(p_sorted, 0)], -1))
        subs.append(TreeBlock(plan))
    elif domain.kind == "grid":
        shape = domain.cell_shape
        offsets = tuple(int(o) for o in np.cumsum([1, *shape[:-1]]))
        cells = 1 + sum(shape)
        if grid_solver == "joint":
            subs.append(GridBlock(shape, 0, offsets, cells))
        else:
            subs.extend(GridTreeBlock(shape, i, 0, offsets[i], cells) for i in range(len(shape)))
    for g in domain.groups:
        rows = g.rows
        if lift and plan is not None and domain.parent is not None:
            levels = [rows]
            while True:
                up = lift_rows(domain.parent, levels[-1])
                if up.shape[0] == 0:
                    break
                levels.append(up)
            rows = np.concatenate(levels)
            if np.unique(rows).size != rows.size:  # pragma: no cover - lifted rows are disjoint
                rows = g.rows
        rows = rows if position is None else position[rows]
        subs.append(GroupBlock(g.matrix, rows))
    solver = _Solver(order, subs, plan)
    per_domain[(lift, grid_solver)] = solver
    return solver


def reconcile(
    domain: DomainShape,
    noisy: ArrayLike,
    variances: ArrayLike | None = None,
    *,
    nonnegative: bool = False,
    tol: float = 1e-6,
    max_iter: int = 1000,
    lift: bool = True,
    grid_solver: str = "joint",
) -> ReconcileResult:
    """Optimal consistent values for one tick's noisy releases over ``domain``.

    ``noisy``: shape ``(len(domain),)``, domain order, finite. ``variances``: noise variance of
    each release (``None``: all equal; scalar; or shape ``(len(domain),)``), finite and > 0.
    ``tol``: stop the approximation method when the mean absolute change of one cycle is below
    ``tol`` (value units), and the bound on ``residual`` for ``consistent``. ``nonnegative``:
    post-process for dashboards (hierarchies stay exactly consistent; with a grid or groups
    negative values are clipped and ``consistent`` reports whether the constraints still hold).
    ``lift``: add the group constraints implied at internal nodes (see the module docstring).
    ``grid_solver``: ``"joint"`` (exact, one pass) or ``"fgmc"`` (seed 002's per-tree FGMC,
    alternated); both converge to the same optimum.
    """
    start = time.perf_counter()
    n = len(domain)
    x = np.asarray(noisy, dtype=np.float64)
    if x.shape != (n,):
        raise ValueError(f"noisy must have shape ({n},) for this domain, got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("noisy must hold finite numbers (no NaN or inf)")
    if variances is None:
        v = np.ones(n)
    else:
        va = np.asarray(variances, dtype=np.float64)
        if va.shape not in ((), (n,)):
            raise ValueError(f"variances must be a scalar or have shape ({n},), got {va.shape}")
        v = np.broadcast_to(va, (n,))
        if not (np.all(np.isfinite(v)) and np.all(v > 0)):
            raise ValueError("variances must be finite and > 0 (noise variance of each release)")
    if not (math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a finite number > 0, got {tol!r}")
    if max_iter < 1:
        raise ValueError(f"max_iter must be ≥ 1, got {max_iter!r}")
    if grid_solver not in ("joint", "fgmc"):
        raise ValueError(f"grid_solver must be 'joint' or 'fgmc', got {grid_solver!r}")
    solver = _solver(domain, lift, grid_solver)
    xs = x if solver.order is None else x[solver.order]
    vs = v if solver.order is None else v[solver.order]
    if solver.subproblems:
        res = approximate(xs, vs, solver.subproblems, tol=tol, max_iter=max_iter)
        values, iterations, residual, converged = (
            res.values,
            res.iterations,
            res.residual,
            res.converged,
        )
    else:
        values, iterations, residual, converged = xs.astype(np.float64, copy=True), 0, 0.0, True
    if nonnegative:
        if solver.plan is not None and len(solver.subproblems) == 1:
            nonnegative_bfs(solver.plan, values)
        else:
            np.maximum(values, 0.0, out=values)
        if solver.subproblems:
            prepared = [s.prepare(vs) for s in solver.subproblems]
            residual = math.sqrt(sum(p.residual_sq(values) for p in prepared))
    if solver.order is not None:
        out = np.empty_like(values)
        out[solver.order] = values
        values = out
    return ReconcileResult(
        values=values,
        iterations=iterations,
        residual=residual,
        seconds=time.perf_counter() - start,
        consistent=residual <= max(tol, 1e-9 * (1.0 + float(np.max(np.abs(values))))),
        converged=converged,
    )
