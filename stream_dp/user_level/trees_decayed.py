"""The trees' block program at ``p < 1``, exactly: a Pareto set per state.

At ``p < 1`` a block's measurement is its *decayed* sum ``s_v = Σ_{j ∈ v} p^(e_v − j) x_j``, which
depends on where the events sit, not only on how many there are. The program of
:mod:`stream_dp.user_level.trees` keeps one number per state (count ``c``, first offset ``a``,
last offset ``z``); here each state keeps every pair ``(s, inner)`` — the block's decayed sum and
the best value of the terms inside it — that no other pair of the state beats in both
coordinates. Every ancestor's term ``w² (p^d s + …)²`` grows with ``s`` and the objective adds
``inner``, so a dominated pair never leads to the optimum and dropping it keeps the program
exact. Combining blocks: ``s = p^(len right)·s_left + s_right``, ``inner = inner_left +
inner_right``; a parent adds ``w² s²``. At the top level only ``inner`` counts, and the top
blocks are chained as in :mod:`.trees`.

The sets can grow; :class:`DecayedProgram` counts the pairs it builds and raises
:class:`TooLong` past ``max_pairs`` (callers then use the bound of :mod:`.trees`).

>>> from stream_dp.user_level.trees import tree_norm_sq
>>> exact = DecayedProgram((0, 1), (1.0, 1.0), 0.5, 2, 1).window(0, 4)[-1]
>>> float(exact)  # ticks 1 and 2 of a pair: 1 + 1 + (0.5 + 1)² = 4.25
4.25
>>> tree_norm_sq((0, 1), (1.0, 1.0), 0.5, 2, 1, 0, 4)  # the bound: (1 + 0.5)² as well here
4.25
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from stream_dp.user_level._chain import chain_top_blocks

__all__ = ["DecayedProgram", "TooLong"]

Float64Array = NDArray[np.float64]
_NEG = -math.inf
#: a block's table: (count, a, z) → its Pareto pairs, an (m, 2) array of (s, inner)
_Table = dict[tuple[int, int, int], Float64Array]


class TooLong(RuntimeError):
    """The Pareto sets grew past the work limit."""


def _prune(points: Float64Array) -> Float64Array:
    """The pairs no other pair beats in both ``s`` and ``inner`` (s descending)."""
    order = np.lexsort((-points[:, 1], -points[:, 0]))  # s desc, then inner desc
    pts = points[order]
    best = np.maximum.accumulate(pts[:, 1])
    keep = np.ones(len(pts), dtype=bool)
    keep[1:] = pts[1:, 1] > best[:-1]
    return pts[keep]


class DecayedProgram:
    """The exact program of one tree at ``p < 1`` for ``n`` events ``sep`` (≥ 1) apart."""

    def __init__(self, levels: Sequence[int], weights: Sequence[float], p: float, n: int,
                 sep: int, max_pairs: int = 2_000_000) -> None:
        self.n, self.sep, self.clip, self.p = n, sep, sep - 1, float(p)
        self.w2 = [float(w) ** 2 for w in weights]
        self.sizes = [1 << lv for lv in levels]
        self.top = self.sizes[-1]
        self.full: dict[int, _Table] = {}
        self.partial: dict[tuple[int, int, int], _Table] = {}
        self.budget = max_pairs

    def _spend(self, pairs: int) -> None:
        self.budget -= pairs
        if self.budget < 0:
            raise TooLong("the Pareto sets grew past the work limit")

    def _own(self, t: _Table, i: int) -> _Table:
        w2 = self.w2[i]
        out: _Table = {}
        for key, pts in t.items():
            moved = pts.copy()
            moved[:, 1] += w2 * moved[:, 0] ** 2
            out[key] = _prune(moved)
        return out

    def _combine(self, left: _Table, len_left: int, right: _Table, len_right: int) -> _Table:
        clip, n = self.clip, self.n
        decay = self.p ** len_right
        acc: dict[tuple[int, int, int], list[Float64Array]] = {}
        for (c, a, z), pts in left.items():  # right empty
            moved = pts.copy()
            moved[:, 0] *= decay
            acc.setdefault((c, a, min(z + len_right, clip)), []).append(moved)
        for (c, a, z), pts in right.items():  # left empty
            acc.setdefault((c, min(a + len_left, clip), z), []).append(pts)
        for (c1, a1, z1), lp in left.items():
            ls = lp[:, 0] * decay
            for (c2, a2, z2), rp in right.items():
                if c1 + c2 > n or z1 + a2 + 1 < self.sep:
                    continue
                self._spend(len(lp) * len(rp))
                pts = np.empty((len(lp) * len(rp), 2))
                pts[:, 0] = (ls[:, None] + rp[None, :, 0]).ravel()
                pts[:, 1] = (lp[:, 1][:, None] + rp[None, :, 1]).ravel()
                acc.setdefault((c1 + c2, a1, z2), []).append(pts)
        return {key: _prune(np.concatenate(parts)) for key, parts in acc.items()}

    def full_block(self, i: int) -> _Table:
        """The table of a level-``i`` block wholly inside the window."""
        if i not in self.full:
            if i == 0:
                self.full[0] = self._own({(1, 0, 0): np.array([[1.0, 0.0]])}, 0)
            else:
                child = self.full_block(i - 1)
                acc, length = child, self.sizes[i - 1]
                for _ in range(self.sizes[i] // self.sizes[i - 1] - 1):
                    acc = self._combine(acc, length, child, self.sizes[i - 1])
                    length += self.sizes[i - 1]
                self.full[i] = self._own(acc, i)
        return self.full[i]

    def block(self, i: int, lo: int, hi: int) -> _Table:
        """The table of a level-``i`` block whose allowed ticks are ``[lo, hi)`` of it."""
        size = self.sizes[i]
        lo, hi = max(lo, 0), min(hi, size)
        if lo == 0 and hi == size:
            return self.full_block(i)
        if hi <= lo:
            return {}
        key = (i, lo, hi)
        if key not in self.partial:
            child_size = self.sizes[i - 1]
            acc: _Table | None = None
            length = 0
            for k in range(size // child_size):
                child = self.block(i - 1, lo - k * child_size, hi - k * child_size)
                acc = child if acc is None else self._combine(acc, length, child, child_size)
                length += child_size
            assert acc is not None
            self.partial[key] = self._own(acc, i)
        return self.partial[key]

    def _scalar(self, t: _Table) -> Float64Array:
        v = np.full((self.n + 1, self.sep, self.sep), _NEG)
        for (c, a, z), pts in t.items():
            v[c, a, z] = max(v[c, a, z], float(pts[:, 1].max()))
        return v

    def window(self, lo: int, hi: int) -> Float64Array:
        """The best value over patterns of at most ``c`` events in ticks ``[lo, hi)``, for
        ``c = 0 … n`` (as :meth:`stream_dp.user_level.trees._Program.window`)."""
        last = len(self.sizes) - 1
        return chain_top_blocks(self.n, self.sep, self.top, lo, hi, lambda first: self._scalar(
            self.block(last, lo - first, hi - first)))
