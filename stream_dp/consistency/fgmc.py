"""Closed form for the 3-level attribute trees of seed 002 (FGMC), with per-node variances.

An attribute grid with k attributes (``n_i`` categories each, ``n = Π n_i`` cells) releases the
total ``t``, the category counts ``s^i_j`` and the cells ``m(z)``. Attribute i gives the 3-level tree
``t → s^i_j → {m(z) : z_i = j}`` (root fan-out ``k1 = n_i``, category fan-out ``k2 = n / n_i``).

:func:`fgmc_project` is the exact GLS projection onto one such tree, written for the cells held
as a k-dimensional array, so every step is a reduction or a broadcast along axes (no index
arrays): the two passes of :mod:`stream_dp.consistency.tree` specialised to three levels.

:func:`fgmc_paper` is seed 002's formula (32)–(33) for equal variances, with the correction
``A_0 = (d_0 w + d_s) / r`` (the text prints ``d_0 t``); the sign convention is
``d(u) = v(u) − Σ_children v`` and the result is ``x̃ − A``. Kept as a cross-check in the tests.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Float64Array = NDArray[np.float64]

__all__ = ["AttributeTreeProjector", "fgmc_paper", "fgmc_project"]


def axis_sums(cells: Float64Array, axis: int) -> Float64Array:
    """Sums of ``cells`` over every axis but ``axis`` (shape ``(cells.shape[axis],)``).

    Reshaped to 3 axes ``(before, n_axis, after)`` first: NumPy reduces that much faster than a
    tuple of up to k − 1 axes.
    """
    shape = cells.shape
    before = int(np.prod(shape[:axis]))
    after = int(np.prod(shape[axis + 1 :]))
    c3 = cells.reshape(before, shape[axis], after)
    out: Float64Array = c3.sum(axis=2).sum(axis=0) if after > 1 else c3.sum(axis=(0, 2))
    return out


class AttributeTreeProjector:
    """Precomputed GLS projection onto attribute ``axis``'s 3-level tree (variances fixed).

    ``var_total``: variance of the total (scalar); ``var_marginal``: shape ``(n_axis,)``;
    ``var_cells``: shape of the cell array (or broadcastable to it). All > 0.
    """

    def __init__(
        self,
        axis: int,
        var_total: float,
        var_marginal: Float64Array,
        var_cells: Float64Array,
        cell_shape: tuple[int, ...],
    ) -> None:
        self.axis = axis
        self.cell_shape = cell_shape
        k = len(cell_shape)
        self._others = tuple(a for a in range(k) if a != axis)
        vc = np.broadcast_to(np.asarray(var_cells, dtype=np.float64), cell_shape)
        vm = np.asarray(var_marginal, dtype=np.float64)
        # upward: category j from its cells
        w = vc.sum(axis=self._others) if self._others else vc.copy()
        self._alpha_cat = w / (vm + w)  # weight of the category's own measurement
        u_cat = vm * w / (vm + w)
        big_w = float(u_cat.sum())
        self._alpha_root = big_w / (var_total + big_w)
        self._share_cat = u_cat / big_w
        bshape = [1] * k
        bshape[axis] = cell_shape[axis]
        self._bshape = tuple(bshape)
        uniform = bool(np.all(vc == vc.flat[0]))
        if uniform:
            self._share_cell: Float64Array = (float(vc.flat[0]) / w).reshape(self._bshape)
        else:
            self._share_cell = vc / w.reshape(self._bshape)

    def project(self, total: Float64Array, marginal: Float64Array, cells: Float64Array) -> None:
        """Project in place: ``total`` (0-d or shape (1,)), ``marginal`` (n_axis,), ``cells``."""
        s = axis_sums(cells, self.axis)
        z_cat = s + self._alpha_cat * (marginal - s)
        big_s = z_cat.sum()
        t_new = big_s + self._alpha_root * (total[...] - big_s)
        total[...] = t_new
        marginal[...] = z_cat + self._share_cat * (t_new - big_s)
        cells += self._share_cell * (marginal - s).reshape(self._bshape)

    def residual_sq(
        self, total: Float64Array, marginal: Float64Array, cells: Float64Array
    ) -> float:
        """Sum of squared constraint residuals of this tree (total and category rows)."""
        s = axis_sums(cells, self.axis)
        r_cat = marginal - s
        r_tot = float(np.asarray(total).reshape(-1)[0]) - float(marginal.sum())
        return float(np.dot(r_cat, r_cat)) + r_tot * r_tot


def fgmc_project(
    total: float,
    marginal: Float64Array,
    cells: Float64Array,
    axis: int,
    var_total: float = 1.0,
    var_marginal: Float64Array | float = 1.0,
    var_cells: Float64Array | float = 1.0,
) -> tuple[float, Float64Array, Float64Array]:
    """GLS-consistent ``(total, marginal, cells)`` for attribute ``axis``'s 3-level tree.

    ``cells``: k-dimensional array of cell values; ``marginal``: the ``cells.shape[axis]``
    category values of that attribute; variances (> 0) per node, broadcastable.
    """
    c = np.array(cells, dtype=np.float64, copy=True)
    m = np.array(marginal, dtype=np.float64, copy=True).reshape(-1)
    if not 0 <= axis < c.ndim:
        raise ValueError(f"axis must be in [0, {c.ndim - 1}], got {axis}")
    if m.size != c.shape[axis]:
        raise ValueError(f"marginal must have {c.shape[axis]} values for axis {axis}, got {m.size}")
    vm = np.broadcast_to(np.asarray(var_marginal, dtype=np.float64), m.shape)
    vc = np.broadcast_to(np.asarray(var_cells, dtype=np.float64), c.shape)
    for name, v in (("var_total", np.asarray(var_total)), ("var_marginal", vm), ("var_cells", vc)):
        if not (np.all(np.isfinite(v)) and np.all(v > 0)):
            raise ValueError(f"{name} must be finite and > 0")
    t = np.array([float(total)])
    AttributeTreeProjector(axis, float(var_total), vm, vc, c.shape).project(t, m, c)
    return float(t[0]), m, c


def fgmc_paper(
    total: float, marginal: Float64Array, cells: Float64Array, axis: int
) -> tuple[float, Float64Array, Float64Array]:
    """Seed 002's FGMC, formula (32)–(33), equal variances: returns ``x̃ − A``."""
    c = np.asarray(cells, dtype=np.float64)
    m = np.asarray(marginal, dtype=np.float64).reshape(-1)
    k1 = c.shape[axis]
    k2 = c.size // k1
    others = tuple(a for a in range(c.ndim) if a != axis)
    d = m - (c.sum(axis=others) if others else c)  # d_i for the category nodes
    d0 = float(total) - float(m.sum())
    ds = float(d.sum())
    w = 1.0 + k2
    r = 1.0 + k2 + k1 * k2
    common = d0 / r + ds / (w * r)
    a_root = (d0 * w + ds) / r
    a_cat = d / w - k2 * common
    a_leaf = -d / w - common
    bshape = [1] * c.ndim
    bshape[axis] = k1
    return float(total) - a_root, m - a_cat, c - a_leaf.reshape(bshape)


class GridProjector:
    """Exact GLS projection onto *all* k attribute trees of a grid at once (no alternation).

    The grid has only ``m = 1 + Σ n_i`` independent constraints (the first attribute's total row
    and one row per category; the other totals are implied). So the general solution
    ``x − Σ Mᵀ (M Σ Mᵀ)⁻¹ M x`` needs only the small ``m × m`` normal matrix, whose entries are
    marginals of the variances: category/category entries of attributes ``i ≠ l`` are the
    2-D marginals of the cell variances over axes ``(i, l)`` (``σ_c n / (n_i n_l)`` for uniform
    cell variances), the diagonal holds ``σ_ij + Σ_{z_i = j} σ_c(z)``. It is factorised once per
    variance vector. One projection then costs k 1-D marginal sums of the cells, one ``m × m``
    solve and one broadcast update of the cells: a closed form that extends seed 002's FGMC
    (one tree) to the whole grid.

    ``var_total``: scalar; ``var_marginals``: one array per attribute (``n_i`` values);
    ``var_cells``: scalar or the cell shape. All > 0.
    """

    def __init__(
        self,
        cell_shape: tuple[int, ...],
        var_total: float,
        var_marginals: list[Float64Array],
        var_cells: Float64Array | float,
    ) -> None:
        import scipy.linalg as sla

        self.cell_shape = cell_shape
        k = len(cell_shape)
        n = int(np.prod(cell_shape))
        sizes = list(cell_shape)
        starts = np.concatenate([[1], 1 + np.cumsum(sizes)[:-1]]).astype(int)
        m = 1 + sum(sizes)
        vc = np.asarray(var_cells, dtype=np.float64)
        uniform = vc.ndim == 0 or bool(np.all(vc == vc.reshape(-1)[0]))
        vcs = float(vc.reshape(-1)[0]) if uniform else 0.0
        vcells = None if uniform else np.broadcast_to(vc, cell_shape)
        N = np.zeros((m, m))
        vm0 = np.asarray(var_marginals[0], dtype=np.float64)
        N[0, 0] = var_total + vm0.sum()
        N[0, starts[0] : starts[0] + sizes[0]] = -vm0
        N[starts[0] : starts[0] + sizes[0], 0] = -vm0
        for i in range(k):
            si = slice(starts[i], starts[i] + sizes[i])
            if vcells is None:
                w = np.full(sizes[i], vcs * n / sizes[i])
            else:
                w = vcells.sum(axis=tuple(a for a in range(k) if a != i))
            N[si, si] = np.diag(np.asarray(var_marginals[i], dtype=np.float64) + w)
            for j in range(i + 1, k):
                sj = slice(starts[j], starts[j] + sizes[j])
                if vcells is None:
                    block = np.full((sizes[i], sizes[j]), vcs * n / (sizes[i] * sizes[j]))
                else:
                    block = vcells.sum(axis=tuple(a for a in range(k) if a not in (i, j)))
                N[si, sj] = block
                N[sj, si] = block.T
        self._factor = sla.cho_factor(N)
        self._solve = sla.cho_solve
        self._starts = starts
        self._sizes = sizes
        self._var_total = float(var_total)
        self._var_marg = [np.asarray(v, dtype=np.float64) for v in var_marginals]
        self._var_cells: Float64Array | float = vcs if vcells is None else np.array(vcells)
        self._shapes = [tuple(sizes[i] if a == i else 1 for a in range(k)) for i in range(k)]

    def _marginals(self, cells: Float64Array) -> list[Float64Array]:
        return [axis_sums(cells, i) for i in range(len(self.cell_shape))]

    def residual(
        self, total: Float64Array, marginals: list[Float64Array], cells: Float64Array
    ) -> Float64Array:
        """``M x`` for the independent rows (first total row, then every category row)."""
        sums = self._marginals(cells)
        r0 = float(np.asarray(total).reshape(-1)[0]) - float(marginals[0].sum())
        return np.concatenate([[r0], *[marginals[i] - sums[i] for i in range(len(sums))]])

    def project(
        self, total: Float64Array, marginals: list[Float64Array], cells: Float64Array
    ) -> None:
        """Project in place: ``total`` (shape (1,)), ``marginals`` (views), ``cells`` (view)."""
        lam = self._solve(self._factor, self.residual(total, marginals, cells))
        total[...] -= self._var_total * lam[0]
        acc: Float64Array | None = None
        for i, (s0, ni) in enumerate(zip(self._starts, self._sizes, strict=True)):
            li = lam[s0 : s0 + ni]
            corr = li - lam[0] if i == 0 else li
            marginals[i] -= self._var_marg[i] * corr
            part = li.reshape(self._shapes[i])
            acc = part if acc is None else acc + part
        assert acc is not None
        cells += self._var_cells * acc
