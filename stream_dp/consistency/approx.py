"""The approximation method of seed 000 for several groups of consistency constraints.

Split the constraints ``M x = b`` into row blocks (sub-problems) ``M_1 … M_k``, each with a cheap
exact projection ``f_i``; iterate ``x ← f_k(… f_1(x))`` until the mean absolute change of one
full cycle falls below ``tol`` (seed 000, section 8.2: ``tol = 1e-6``) or ``max_iter`` cycles.
Independent sub-problems of one kind (the trees of a batch, the days of a package constraint,
the categories of an attribute) are projected together, vectorised.

**Metric.** Seed 000 proves convergence to ``x + M⁺(b − M x)`` for Euclidean projections, i.e.
equal noise variances. With per-coordinate variances ``v`` the optimum is the GLS projection in the
metric ``‖y‖²_Σ⁻¹ = Σ y_i² / v_i``. Every sub-problem here is projected in that *same* weighted
metric (each block's projection is ``x + Σ M_iᵀ (M_i Σ M_iᵀ)⁺ (b_i − M_i x)``, which touches only
the block's coordinates because ``Σ`` is diagonal). In the rescaled coordinates ``y = Σ^{-1/2} x``
these are ordinary orthogonal projections onto affine subspaces, so the paper's argument (von
Neumann / Halperin alternating projections) applies unchanged and the cycle converges to the GLS
optimum. Projecting each block with its own unweighted formula would converge to a different,
non-optimal consistent point.

Sub-problem kinds (all take values in the solver's order, a 1-D float64 array):

* :class:`TreeBlock` — a forest, or ``batch`` same-shaped trees stored one after another, each
  in breadth-first order (exact two-pass GLS, :mod:`stream_dp.consistency.tree`);
* :class:`GroupBlock` — ``matrix @ x[nodes[g]] = rhs[g]`` for node-disjoint rows ``g`` (e.g. seed
  000's per-day package constraints ``B v_t = 0``), exact small projections batched over ``g``;
* :class:`GridTreeBlock` — one attribute's 3-level tree of an attribute grid (FGMC closed form);
* :class:`GridBlock` — all k trees of a grid at once (exact, via the small normal system, see
  :class:`~stream_dp.consistency.fgmc.GridProjector`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from stream_dp.consistency.fgmc import AttributeTreeProjector, GridProjector
from stream_dp.consistency.tree import PreparedTree, TreePlan

Float64Array = NDArray[np.float64]
Int64Array = NDArray[np.int64]

__all__ = [
    "ApproxResult",
    "GridBlock",
    "GridTreeBlock",
    "GroupBlock",
    "Projector",
    "SubProblem",
    "TreeBlock",
    "approximate",
]


class Projector(Protocol):
    """A sub-problem with its variances bound: an exact in-place projection."""

    def project(self, x: Float64Array) -> None:
        """Replace ``x`` by its weighted projection onto this block's constraints (in place)."""
        ...

    def residual_sq(self, x: Float64Array) -> float:
        """``‖M_i x − b_i‖²`` of this block."""
        ...


class SubProblem(Protocol):
    """A block of constraints, independent of the variances."""

    @property
    def n_rows(self) -> int:
        """Number of constraint rows in this block."""
        ...

    def prepare(self, variances: Float64Array) -> Projector:
        """Bind the noise variances (solver order, shape ``(n,)``, all > 0)."""
        ...


@dataclass(frozen=True)
class ApproxResult:
    """Outcome of :func:`approximate`.

    ``iterations``: full cycles run; ``residual``: ``‖M x − b‖₂`` at the end (value units);
    ``seconds``: wall time of the iterations; ``converged``: the stopping rule was met before
    ``max_iter``; ``last_change``: mean ``|Δx|`` of the last cycle.
    """

    values: Float64Array
    iterations: int
    residual: float
    seconds: float
    converged: bool
    last_change: float


class _TreeProjector:
    def __init__(self, block: TreeBlock, prepared: PreparedTree) -> None:
        self._block = block
        self._prepared = prepared

    def _view(self, x: Float64Array) -> Float64Array:
        b = self._block
        n = b.plan.n
        return x[b.offset : b.offset + b.batch * n].reshape(b.batch, n)

    def project(self, x: Float64Array) -> None:
        self._prepared.apply_bfs(self._view(x))

    def residual_sq(self, x: Float64Array) -> float:
        r = self._block.plan.residual(self._view(x))
        return float(np.sum(r * r))


@dataclass(frozen=True, eq=False)
class TreeBlock:
    """``batch`` trees of shape ``plan`` at ``x[offset : offset + batch·n]``, each in BFS order."""

    plan: TreePlan
    offset: int = 0
    batch: int = 1

    def __post_init__(self) -> None:
        if not self.plan.is_bfs_ordered:
            raise ValueError("TreeBlock needs a plan whose nodes are numbered in BFS order")
        if self.offset < 0 or self.batch < 1:
            raise ValueError("offset must be ≥ 0 and batch ≥ 1")

    @property
    def n_rows(self) -> int:
        return self.batch * int(
            np.count_nonzero(np.bincount(self.plan.parent[self.plan.parent >= 0]))
        )

    def prepare(self, variances: Float64Array) -> Projector:
        n = self.plan.n
        v = variances[self.offset : self.offset + self.batch * n].reshape(self.batch, n)
        return _TreeProjector(self, self.plan.prepare(v, (self.batch,)))


class _GroupProjector:
    def __init__(self, block: GroupBlock, variances: Float64Array) -> None:
        self._block = block
        B = block.matrix
        d = variances[block.nodes]  # (G, c)
        if np.all(d == d[:1]):
            # one projector for every row: K = D Bᵀ (B D Bᵀ)⁺, shape (c, r)
            dd = d[0]
            self._k: Float64Array = (dd[:, None] * B.T) @ np.linalg.pinv((B * dd) @ B.T)
            self._shared = True
        else:
            bdb = np.einsum("rc,gc,sc->grs", B, d, B)
            self._k = np.einsum("gc,rc,grs->gcs", d, B, np.linalg.pinv(bdb))
            self._shared = False

    def _res(self, y: Float64Array) -> Float64Array:
        b = self._block
        r: Float64Array = y @ b.matrix.T
        if b.rhs is not None:
            r -= b.rhs
        return r

    def project(self, x: Float64Array) -> None:
        nodes = self._block.nodes
        y = x[nodes]
        r = self._res(y)
        if self._shared:
            y -= r @ self._k.T
        else:
            y -= np.einsum("gcr,gr->gc", self._k, r)
        x[nodes] = y

    def residual_sq(self, x: Float64Array) -> float:
        r = self._res(x[self._block.nodes])
        return float(np.sum(r * r))


@dataclass(frozen=True, eq=False)
class GroupBlock:
    """Constraints ``matrix @ x[nodes[g]] = rhs[g]`` for every row ``g`` of ``nodes``.

    ``matrix``: shape ``(r, c)``; ``nodes``: shape ``(G, c)`` of solver-order indices, rows
    pairwise disjoint (so the G small projections are independent); ``rhs``: ``None`` (zeros) or
    shape ``(G, r)``.
    """

    matrix: Float64Array
    nodes: Int64Array
    rhs: Float64Array | None = None

    def __post_init__(self) -> None:
        if (
            self.matrix.ndim != 2
            or self.nodes.ndim != 2
            or self.nodes.shape[1] != self.matrix.shape[1]
        ):
            raise ValueError(
                f"nodes must have shape (groups, {self.matrix.shape[-1]}) for a matrix of shape "
                f"{self.matrix.shape}, got {self.nodes.shape}"
            )
        flat = self.nodes.reshape(-1)
        if np.unique(flat).size != flat.size:
            raise ValueError("the rows of a constraint group must use pairwise disjoint nodes")
        if self.rhs is not None and self.rhs.shape != (self.nodes.shape[0], self.matrix.shape[0]):
            raise ValueError(f"rhs must have shape {(self.nodes.shape[0], self.matrix.shape[0])}")

    @property
    def n_rows(self) -> int:
        return int(self.nodes.shape[0] * self.matrix.shape[0])

    def prepare(self, variances: Float64Array) -> Projector:
        return _GroupProjector(self, variances)


class _GridProjector:
    def __init__(self, block: GridTreeBlock, variances: Float64Array) -> None:
        self._b = block
        sl_m, sl_c = block.marginal_slice, block.cells_slice
        self._p = AttributeTreeProjector(
            block.axis,
            float(variances[block.total_index]),
            variances[sl_m],
            variances[sl_c].reshape(block.cell_shape),
            block.cell_shape,
        )

    def _parts(self, x: Float64Array) -> tuple[Float64Array, Float64Array, Float64Array]:
        b = self._b
        t = x[b.total_index : b.total_index + 1]
        return t, x[b.marginal_slice], x[b.cells_slice].reshape(b.cell_shape)

    def project(self, x: Float64Array) -> None:
        self._p.project(*self._parts(x))

    def residual_sq(self, x: Float64Array) -> float:
        return self._p.residual_sq(*self._parts(x))


@dataclass(frozen=True, eq=False)
class GridTreeBlock:
    """Attribute ``axis``'s 3-level tree: total ``x[total_index]``, categories at
    ``x[marginal_offset : + n_axis]``, cells (C order, shape ``cell_shape``) at ``x[cells_offset:]``.
    """

    cell_shape: tuple[int, ...]
    axis: int
    total_index: int
    marginal_offset: int
    cells_offset: int

    @property
    def marginal_slice(self) -> slice:
        return slice(self.marginal_offset, self.marginal_offset + self.cell_shape[self.axis])

    @property
    def cells_slice(self) -> slice:
        return slice(self.cells_offset, self.cells_offset + math.prod(self.cell_shape))

    @property
    def n_rows(self) -> int:
        return 1 + self.cell_shape[self.axis]

    def prepare(self, variances: Float64Array) -> Projector:
        return _GridProjector(self, variances)


class _GridJointProjector:
    def __init__(self, block: GridBlock, variances: Float64Array) -> None:
        self._b = block
        vc = variances[block.cells_slice]
        cells_var: Float64Array | float = (
            float(vc[0]) if np.all(vc == vc[0]) else vc.reshape(block.cell_shape)
        )
        self._p = GridProjector(
            block.cell_shape,
            float(variances[block.total_index]),
            [variances[sl] for sl in block.marginal_slices],
            cells_var,
        )

    def _parts(self, x: Float64Array) -> tuple[Float64Array, list[Float64Array], Float64Array]:
        b = self._b
        t = x[b.total_index : b.total_index + 1]
        return t, [x[sl] for sl in b.marginal_slices], x[b.cells_slice].reshape(b.cell_shape)

    def project(self, x: Float64Array) -> None:
        self._p.project(*self._parts(x))

    def residual_sq(self, x: Float64Array) -> float:
        r = self._p.residual(*self._parts(x))
        return float(np.dot(r, r))


@dataclass(frozen=True, eq=False)
class GridBlock:
    """All attribute trees of a grid: total ``x[total_index]``, the categories of attribute i at
    ``x[marginal_offsets[i] : + n_i]``, the cells (C order, ``cell_shape``) at ``x[cells_offset:]``.
    """

    cell_shape: tuple[int, ...]
    total_index: int
    marginal_offsets: tuple[int, ...]
    cells_offset: int

    @property
    def marginal_slices(self) -> list[slice]:
        return [
            slice(o, o + n) for o, n in zip(self.marginal_offsets, self.cell_shape, strict=True)
        ]

    @property
    def cells_slice(self) -> slice:
        return slice(self.cells_offset, self.cells_offset + math.prod(self.cell_shape))

    @property
    def n_rows(self) -> int:
        return 1 + sum(self.cell_shape)

    def prepare(self, variances: Float64Array) -> Projector:
        return _GridJointProjector(self, variances)


def approximate(
    noisy: ArrayLike,
    variances: ArrayLike | None,
    subproblems: Sequence[SubProblem],
    *,
    tol: float = 1e-6,
    max_iter: int = 1000,
) -> ApproxResult:
    """Cycle through the sub-problems' exact projections until converged (seed 000, eq. (8)).

    ``noisy``: values in solver order, shape ``(n,)``; ``variances``: ``None`` (equal), or shape
    ``(n,)`` (> 0), the noise variance of each value. Stops when the mean absolute change over a
    full cycle is below ``tol`` (value units), or after ``max_iter`` cycles. One sub-problem is
    solved exactly in one pass.
    """
    x = np.array(noisy, dtype=np.float64, copy=True).reshape(-1)
    if not np.all(np.isfinite(x)):
        raise ValueError("noisy must hold finite numbers (no NaN or inf)")
    v = (
        np.ones_like(x)
        if variances is None
        else np.asarray(variances, dtype=np.float64).reshape(-1)
    )
    if v.shape != x.shape:
        raise ValueError(f"variances must have shape {x.shape}, got {v.shape}")
    if not (np.all(np.isfinite(v)) and np.all(v > 0)):
        raise ValueError("variances must be finite and > 0")
    if not (math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a finite number > 0, got {tol!r}")
    if max_iter < 1:
        raise ValueError(f"max_iter must be ≥ 1, got {max_iter!r}")
    start = time.perf_counter()
    projectors = [sp.prepare(v) for sp in subproblems]
    iterations = 0
    change = 0.0
    converged = True
    if len(projectors) == 1:
        projectors[0].project(x)
        iterations = 1
    elif projectors:
        converged = False
        prev = np.empty_like(x)
        for it in range(1, max_iter + 1):
            np.copyto(prev, x)
            for p in projectors:
                p.project(x)
            prev -= x
            change = float(np.abs(prev).mean())
            iterations = it
            if change < tol:
                converged = True
                break
    residual = math.sqrt(sum(p.residual_sq(x) for p in projectors))
    return ApproxResult(x, iterations, residual, time.perf_counter() - start, converged, change)
