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
        s = cells.sum(axis=self._others) if self._others else cells.copy()
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
        s = cells.sum(axis=self._others) if self._others else cells
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
