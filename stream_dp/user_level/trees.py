"""The zCDP user-level sensitivity of the tree strategies (``tree``, ``binary-tree``) at a
minimum separation ``b ≥ 1``: a dynamic program over the nested blocks.

A tree measures, for every block ``v`` of every level ``i`` (blocks of ``s_i`` ticks, each level's
size a multiple of the one below, the top level repeated forever), ``w_i · Σ_{j ∈ v} p^(e_v − j)
x_j`` (``e_v`` the block's last tick), all with the same noise scale. One person's events ``x``
(``n`` unit events, any two at least ``b`` ticks apart) move the measurements by

    ‖L x‖² = Σ_v w_v² s_v²,   s_v = Σ_{j ∈ v} p^(e_v − j) x_j,

and the zCDP factor is its maximum over the patterns divided by the largest single column,
``Σ_i w_i²`` (an event on the last tick of a top block). :func:`tree_norm_sq` maximises it.

**The program.** A block's table ``V[c, a, z]`` is the best value of the terms inside the block
for ``c`` events whose first is ``a`` ticks after the block's start and whose last is ``z`` ticks
before its end (both clipped at ``b − 1``: further away, the offset no longer constrains a
neighbour). Two adjacent blocks combine when ``z_left + a_right + 1 ≥ b`` (their closest events
are ``b`` apart); a parent is its children combined left to right plus its own term
``w² σ(c)²``. Blocks wholly inside the window are alike per level (computed once); only the
``O(depth)`` blocks cut by the window's edges are computed on their own. Top blocks do not
share any measurement, so the window's top blocks are chained with the state ``(c, z)`` only.

**Exactness.** At ``p = 1``, ``s_v`` is the number of events in ``v``: ``σ(c) = c`` and the
program is exact. At ``p < 1`` it uses ``σ(c) = Σ_{k<c} p^(k·b)``, the largest decayed sum of
``c`` events ``b`` apart in one block (all packed against its end): every ``s_v ≤ σ(c_v)``, so the
result is a valid upper bound, reported as not exact. :func:`tree_period_norm_sq` first tries the
exact program of :mod:`.trees_decayed` (Pareto sets of the decayed sums) and uses this bound only
when those sets grow too large.

**Cost.** Combining two blocks is a (max, +) product over the boundary offsets:
``O(c_max² · β³)`` with ``β = min(b, block size)`` and ``c_max = min(n, ⌈size / b⌉)``; a
window costs ``O(depth · n² · β³)`` for its blocks plus ``O(top blocks · n² · β²)`` for the
chain. :func:`tree_cost` estimates it; callers fall back to a bound when it is too large.

>>> tree_norm_sq(levels=(0, 1), weights=(1.0, 1.0), p=1.0, count=2, min_sep=1, start=0,
...              length=4)  # two events in one pair: 1 + 1 + 2² = 6
6.0
>>> tree_norm_sq(levels=(0, 1), weights=(1.0, 1.0), p=1.0, count=2, min_sep=2, start=0,
...              length=4)  # two ticks apart: never in one pair, 2·(1 + 1)
4.0
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.user_level._chain import chain_top_blocks
from stream_dp.user_level.trees_decayed import DecayedProgram, TooLong

__all__ = [
    "nested_period_norm_sq", "tree_block_values", "tree_cost", "tree_norm_sq",
    "tree_period_norm_sq",
]

Float64Array = NDArray[np.float64]
_NEG = -math.inf


class _Table:
    """A block's program: its length in ticks and ``V[c, a, z]`` (``c = 0`` row unused: the
    empty block, value 0, is always allowed implicitly)."""

    __slots__ = ("length", "v")

    def __init__(self, length: int, v: Float64Array) -> None:
        self.length = length
        self.v = v


def _shift(v: Float64Array, axis: int, by: int, clip: int) -> Float64Array:
    """``v`` with offsets along ``axis`` (1: a, 2: z) moved up by ``by`` and clipped at
    ``clip`` (the farthest offset kept), the clipped ones combined by max."""
    out = np.full_like(v, _NEG)
    size = v.shape[axis]
    for old in range(size):
        new = min(old + by, clip)
        src = v[:, old, :] if axis == 1 else v[:, :, old]
        if axis == 1:
            np.maximum(out[:, new, :], src, out=out[:, new, :])
        else:
            np.maximum(out[:, :, new], src, out=out[:, :, new])
    return out


def _combine(left: _Table, right: _Table, n: int, sep: int) -> _Table:
    """The table of ``left`` followed by ``right`` (no term of their own)."""
    beta = sep  # offsets 0 … b − 1 (b − 1 standing for "b − 1 or more")
    clip = beta - 1
    out = np.full((n + 1, beta, beta), _NEG)
    # one side empty
    np.maximum(out, _shift(left.v, 2, right.length, clip), out=out)
    np.maximum(out, _shift(right.v, 1, left.length, clip), out=out)
    # both non-empty: z_left + a_right ≥ b − 1; best right for "a_right at least t"
    rs = np.maximum.accumulate(right.v[:, ::-1, :], axis=1)[:, ::-1, :]
    lc = [c for c in range(1, n) if np.isfinite(left.v[c]).any()]
    rc = [c for c in range(1, n) if np.isfinite(right.v[c]).any()]
    if lc and rc:
        r_idx = np.array(rc)
        for c1 in lc:
            keep = r_idx[r_idx <= n - c1]
            if keep.size == 0:
                continue
            best = np.full((beta, keep.size, beta), _NEG)  # a_left, c2, z_right
            for z1 in range(beta):
                col = left.v[c1, :, z1]
                if not np.isfinite(col).any():
                    continue
                need = max(clip - z1, 0)
                cand = col[:, None, None] + rs[keep, need, :][None, :, :]
                np.maximum(best, cand, out=best)
            for k, c2 in enumerate(keep):
                np.maximum(out[c1 + c2], best[:, k, :], out=out[c1 + c2])
    return _Table(left.length + right.length, out)


def _sigma_sq(p: float, n: int, sep: int) -> Float64Array:
    """``σ(c)²`` for ``c = 0 … n``: the largest decayed block sum of ``c`` events ``sep``
    apart, squared (``c`` at ``p = 1``)."""
    if p == 1.0:
        s = np.arange(n + 1, dtype=np.float64)
    else:
        s = np.concatenate([[0.0], np.cumsum(p ** (sep * np.arange(n, dtype=np.float64)))])
    return s * s


def _check(levels: Sequence[int], weights: Sequence[float], p: float, count: int,
           min_sep: int) -> None:
    if not levels or levels[0] != 0 or any(
            b <= a for a, b in itertools.pairwise(levels)):
        raise ValueError(f"levels must start at 0 and increase, got {tuple(levels)!r}")
    if len(weights) != len(levels):
        raise ValueError("weights must have one entry per level")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p!r}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an integer >= 1, got {count!r}")
    if isinstance(min_sep, bool) or not isinstance(min_sep, int) or min_sep < 1:
        raise ValueError(f"min_sep must be an integer >= 1, got {min_sep!r}")


def tree_cost(levels: Sequence[int], count: int, min_sep: int, length: int) -> float:
    """Rough number of elementary steps :func:`tree_norm_sq` takes for a window of ``length``
    ticks (0: the infinite stream), to decide whether to run it."""
    top = 1 << levels[-1]
    work = 0.0
    for lv in levels:
        size = 1 << lv
        c = min(count, -(-size // min_sep))
        beta = min(min_sep, size)
        work += 3.0 * c * c * beta ** 3
    blocks = _top_blocks_infinite(count, min_sep, top) if length == 0 else length // top + 2
    return work + blocks * count * count * min_sep ** 2


def _top_blocks_infinite(n: int, sep: int, top: int) -> int:
    """Top blocks that hold an optimal pattern of the infinite stream: ``n`` non-empty ones and
    at most ``⌈(b − 1)/B⌉`` empty ones between two of them (more can be dropped: the later
    blocks move earlier by whole top blocks, the value is unchanged and the gap stays ≥ b)."""
    return n + (n - 1) * (-(-(sep - 1) // top))


class _Program:
    """The program of one tree for ``n`` events ``sep`` apart: full blocks computed once and
    shared by every window asked of it."""

    def __init__(self, levels: Sequence[int], weights: Sequence[float], p: float, n: int,
                 sep: int) -> None:
        sig = _sigma_sq(p, n, sep)
        self._setup([1 << lv for lv in levels], [float(w) ** 2 * sig for w in weights], n, sep)

    @classmethod
    def nested(cls, sizes: Sequence[int], terms: Sequence[Float64Array], n: int,
               sep: int) -> _Program:
        """A program over nested blocks of ``sizes`` ticks (1 first, each a multiple of the one
        below) whose level-``i`` block adds ``terms[i][c]`` for ``c`` events in it."""
        prog = cls.__new__(cls)
        prog._setup(list(sizes), [np.asarray(t, dtype=np.float64) for t in terms], n, sep)
        return prog

    def _setup(self, sizes: list[int], terms: list[Float64Array], n: int, sep: int) -> None:
        if sizes[0] != 1 or any(b % a for a, b in itertools.pairwise(sizes)):
            raise ValueError(f"block sizes must start at 1, each a multiple of the one below, "
                             f"got {tuple(sizes)!r}")
        self.n, self.sep, self.clip = n, sep, sep - 1
        self.terms = terms
        self.sizes = sizes
        self.top = self.sizes[-1]
        self.full: dict[int, _Table] = {}
        self.partial: dict[tuple[int, int, int], _Table] = {}

    def _own(self, t: _Table, i: int) -> _Table:
        return _Table(t.length, t.v + self.terms[i][:, None, None])

    def _empty(self, size: int) -> _Table:
        return _Table(size, np.full((self.n + 1, self.sep, self.sep), _NEG))

    def full_block(self, i: int) -> _Table:
        """The table of a level-``i`` block wholly inside the window."""
        if i not in self.full:
            if i == 0:
                v = np.full((self.n + 1, self.sep, self.sep), _NEG)
                v[1, 0, 0] = 0.0
                self.full[0] = self._own(_Table(1, v), 0)
            else:
                child = self.full_block(i - 1)
                acc = child
                for _ in range(self.sizes[i] // self.sizes[i - 1] - 1):
                    acc = _combine(acc, child, self.n, self.sep)
                self.full[i] = self._own(acc, i)
        return self.full[i]

    def block(self, i: int, lo: int, hi: int) -> _Table:
        """The table of a level-``i`` block whose allowed ticks are ``[lo, hi)`` relative to its
        start (cut by the window's edges)."""
        size = self.sizes[i]
        lo, hi = max(lo, 0), min(hi, size)
        if lo == 0 and hi == size:
            return self.full_block(i)
        if hi <= lo:
            return self._empty(size)
        key = (i, lo, hi)
        if key not in self.partial:
            child_size = self.sizes[i - 1]
            acc: _Table | None = None
            for k in range(size // child_size):
                child = self.block(i - 1, lo - k * child_size, hi - k * child_size)
                acc = child if acc is None else _combine(acc, child, self.n, self.sep)
            assert acc is not None
            self.partial[key] = self._own(acc, i)
        return self.partial[key]

    def window(self, lo: int, hi: int) -> Float64Array:
        """The best value over patterns of at most ``c`` events in ticks ``[lo, hi)``, for
        ``c = 0 … n`` (0-based ticks; top blocks start at multiples of the top block size)."""
        last = len(self.sizes) - 1
        return chain_top_blocks(self.n, self.sep, self.top, lo, hi,
                                lambda first: self.block(last, lo - first, hi - first).v)


def tree_norm_sq(levels: Sequence[int], weights: Sequence[float], p: float, count: int,
                 min_sep: int, start: int = 0, length: int = 0) -> float:
    """``max ‖L x‖²`` over at most ``count`` unit events ``min_sep`` (≥ 1) ticks apart in the
    window of ``length`` ticks starting at 0-based tick ``start`` (top blocks start at multiples
    of ``2**levels[-1]``; ``length = 0``: the infinite stream), for a tree with block sizes
    ``2**levels[i]`` and weights ``weights[i]`` (measurements ``w_i · decayed block sum``, all
    with the same noise scale). Exact at ``p = 1``, an upper bound at ``p < 1`` (module
    docstring). Units: squared measurement units (the weights' square)."""
    _check(levels, weights, p, count, min_sep)
    if length < 0 or start < 0:
        raise ValueError("start and length must be >= 0")
    prog = _Program(levels, weights, p, count, min_sep)
    if length == 0:
        return float(prog.window(0, prog.top * _top_blocks_infinite(count, min_sep, prog.top))[-1])
    return float(prog.window(start, start + length)[-1])


def tree_block_values(levels: Sequence[int], weights: Sequence[float], p: float, count: int,
                      min_sep: int) -> Float64Array:
    """:func:`tree_norm_sq` on one top block's window, for every count ``0 … count`` (the
    yearly figure's building block)."""
    _check(levels, weights, p, count, min_sep)
    prog = _Program(levels, weights, p, count, min_sep)
    return prog.window(0, prog.top)


#: the exact p < 1 program gives up (falling back to the bound) past this many Pareto pairs
#: (about a second of work)
DECAYED_MAX_PAIRS = 400_000


def tree_period_norm_sq(levels: Sequence[int], weights: Sequence[float], p: float, count: int,
                        min_sep: int, period_ticks: int, max_offsets: int = 64,
                        max_pairs: int = DECAYED_MAX_PAIRS) -> tuple[Float64Array, bool]:
    """``(values, exact)``: for ``c = 0 … count`` events, the largest ``‖L x‖²`` over the
    periods of ``period_ticks`` ticks (period ``P`` covers 0-based ticks ``[P·T, (P+1)·T)``;
    ``0``: the infinite stream).

    A period's value depends only on where it starts within a top block of ``B`` ticks, i.e. on
    ``P·T mod B``, which takes every multiple of ``gcd(T, B)``: with at most ``max_offsets`` of
    them each is computed; otherwise the infinite stream with at most ``⌊(T − 1)/b⌋ + 1``
    events (as many as fit in a period) stands for every period — a valid upper bound. At
    ``p < 1`` the exact program of :mod:`.trees_decayed` runs first (Pareto sets of the decayed
    block sums), unless its sets grow past ``max_pairs`` pairs; then the count program with
    the packed bound on each block's sum does. ``exact`` is True when every period alignment
    was computed by an exact program.

    >>> values, exact = tree_period_norm_sq((0, 1), (1.0, 1.0), 1.0, 2, 1, period_ticks=3)
    >>> [float(v) for v in values], exact  # periods 1–3, 4–6, …: one holds a whole pair
    ([0.0, 2.0, 6.0], True)
    """
    _check(levels, weights, p, count, min_sep)
    if isinstance(period_ticks, bool) or not isinstance(period_ticks, int) or period_ticks < 0:
        raise ValueError(f"period_ticks must be an integer >= 0, got {period_ticks!r}")
    if p < 1.0:
        try:
            def decayed(n: int) -> DecayedProgram:
                return DecayedProgram(levels, weights, p, n, min_sep, max_pairs=max_pairs)

            values, every = _over_periods(decayed, count, min_sep, period_ticks, max_offsets)
            if every:
                return values, True
        except TooLong:
            pass

    def counted(n: int) -> _Program:
        return _Program(levels, weights, p, n, min_sep)

    values, every = _over_periods(counted, count, min_sep, period_ticks, max_offsets)
    return values, every and p == 1.0


def nested_period_norm_sq(sizes: Sequence[int], terms: Callable[[int], list[Float64Array]],
                          count: int, min_sep: int, period_ticks: int, max_offsets: int = 64
                          ) -> tuple[Float64Array, bool]:
    """As :func:`tree_period_norm_sq` for any nested blocks (``sizes``: 1 first, each a
    multiple of the one below) whose level-``i`` block adds ``terms(n)[i][c]`` for ``c`` of at
    most ``n`` events in it: ``(values, every_period)``. Exact when the terms are (a block's
    term depending only on its count)."""
    if isinstance(min_sep, bool) or not isinstance(min_sep, int) or min_sep < 1:
        raise ValueError(f"min_sep must be an integer >= 1, got {min_sep!r}")

    def nested(n: int) -> _Program:
        return _Program.nested(sizes, terms(n), n, min_sep)

    return _over_periods(nested, count, min_sep, period_ticks, max_offsets)


def _over_periods(make: Callable[[int], Any], count: int, min_sep: int, period_ticks: int,
                  max_offsets: int) -> tuple[Float64Array, bool]:
    if period_ticks == 0:
        prog = make(count)
        return prog.window(0, prog.top * _top_blocks_infinite(count, min_sep, prog.top)), True
    # no more events than fit in a period b apart: the figures for more are the same
    fit = min(count, (period_ticks - 1) // min_sep + 1)
    prog = make(fit)
    top = prog.top
    g = math.gcd(period_ticks, top)
    if top // g <= max_offsets:
        best = np.zeros(fit + 1)
        for o in range(0, top, g):
            np.maximum(best, prog.window(o, o + period_ticks), out=best)
        every = True
    else:
        best, every = prog.window(0, top * _top_blocks_infinite(fit, min_sep, top)), False
    return np.concatenate([best, np.full(count - fit, best[-1])]), every
