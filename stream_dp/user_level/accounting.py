"""What one person's bounded contribution costs: :func:`stream_factor` per released stream and
:class:`UserAccountant` for a whole release, per period and over a year.

**Per stream.** A stream's mechanism spends its per-event budget (ε or ρ) on one event of size
``cap`` in one tick. A person contributes at most ``n`` events to one stream in one period (``n``
from :class:`~stream_dp.user_level.bounds.UserBounds`), ``b`` ticks apart or, with ``b = 0``,
several in one tick. :func:`stream_factor` is the multiple of the per-event budget that covers
every such pattern:

* pure DP: with ``b ≥ 1`` and measurements ``≥ 0`` whose column norms repeat with a fixed cycle
  (the trees; the Fenwick strategies at ``p < 1``), ``‖M x‖₁ = Σ x_j ‖M e_j‖₁`` and the exact
  factor is the best ``b``-spaced sum of the columns' L1 changes within a period over the
  per-event sensitivity — each column's change with the grid slack of the coordinates it
  touches, as the mechanism's sensitivity counts it (VecSens; :func:`periodic_spaced_sum`, every
  period alignment); otherwise ``n`` — each
  event moves the measurements by at most the largest column L1 norm, so ``n`` events by at most
  ``n`` times it (group privacy) — exact when ``n`` events can all sit on a column of the
  largest norm (naive; any strategy at ``b = 0``), an upper bound otherwise;
* zCDP, ``b = 0``: ``n²`` — exact (all ``n`` events in the tick of the largest column);
* zCDP, Toeplitz strategies (``sqrt``; ``blt`` with ``p < 1``) whose coefficients are
  non-negative and non-increasing (checked): the autocorrelation ``G(d) = Σ_k c_k c_{k+d}`` of the
  coefficients (of the infinite stream: a finite horizon only drops non-negative terms) is
  non-increasing in ``d``, so spacing the events exactly ``b`` apart makes every pairwise distance
  as small as any pattern allows: ``Σ_{a,a'<n} G(|a−a'|·b) / G(0)`` with ``n`` the events that
  fit in a period ``b`` apart (at most ``⌊(T − 1)/b⌋ + 1``) — exact;
* zCDP, trees (``tree``, ``binary-tree``), ``b ≥ 1``: the program over the blocks of
  :mod:`stream_dp.user_level.trees`, maximised over every alignment a period can have within a
  top block — exact at ``p = 1``, and at ``p < 1`` while the Pareto sets of the decayed block
  sums stay small (:mod:`stream_dp.user_level.trees_decayed`); otherwise an upper bound (each
  block's decayed sum bounded by its packed maximum), as when a period has more than
  :data:`TREE_MAX_OFFSETS` alignments (the unending stream then stands for all of them);
* zCDP, ``tree-ls`` at ``p < 1`` with decayed levels only: the same block program over its
  nested blocks, each block's fixed-point weighted sum bounded by its best ``b``-spaced
  coefficients — an upper bound (hat or flat levels, issue #36: ``n²`` below);
* zCDP otherwise (``tree-ls`` at ``p = 1`` with its per-block shares and super levels, ``blt``
  at ``p = 1`` with its column scales, ``blt`` at ``p < 1`` with start rows — an event-level
  mechanism: a user-level deployment runs ``blt`` without them, the registry's
  ``user_level`` factory): ``n²``, the triangle inequality's bound, reported as not exact.

**Whole release.** An event feeds ``h`` nodes, one in each *layer* (a hierarchy's depth, a grid's
total / one category per attribute / the cell). In one layer the nodes have disjoint leaves, so
a person's ``N = min(K, L·k)`` counted events split over them, each node taking at most its own
bound ``c``: a layer costs at most the largest ``Σ φ(n_v)`` over such splits (an unbounded
knapsack over the counts; for a convex, superadditive φ — ``n``, ``n²``, the Toeplitz sum — it is
``⌊N/c⌋·φ(c) + φ(N mod c)``, but the trees' program need not be convex in the count) — and the
release as a whole the sum over its layers.

**A year** of ``Y`` periods: pure DP adds (``Y`` × the period's total, group privacy over the
year). Under zCDP the periods share one mechanism, so cross-period terms appear: for the Toeplitz
strategies they are bounded through ``G`` at the smallest distance two periods' events can have;
for the trees no measurement spans two top blocks, so the year is a sum over top blocks
(``Y ×`` the period when a top block never straddles two periods; else the number of top blocks
a year touches times one top block's worst case with the events of every period it overlaps);
otherwise the bound treats the year's ``Y·N`` events as one group (``(Y·N)²``), said as such.

>>> from stream_dp.budget import ZCDP, PureDP
>>> from stream_dp.planner import make_mechanism
>>> stream_factor(make_mechanism("tree", 0.99, 1023, PureDP(1.0)), events=5, min_sep=1).value
5.0
>>> f = stream_factor(make_mechanism("sqrt", 0.9, 1023, ZCDP(0.5)), events=5, min_sep=10)  # ≪ 5²
>>> f.exact, round(f.value, 3)
(True, 5.654)
>>> stream_factor(make_mechanism("sqrt", 0.9, 1023, ZCDP(0.5)), events=5, min_sep=0).value
25.0
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from stream_dp.accounting import Accountant
from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.domain import Domain
from stream_dp.user_level.bounds import UserBounds
from stream_dp.user_level.rounding import float_up, format_up
from stream_dp.user_level.sensitivity import max_spaced_sums
from stream_dp.user_level.trees import (
    nested_period_norm_sq,
    tree_block_values,
    tree_period_norm_sq,
)

__all__ = ["UserAccountant", "UserFactor", "layer_leaves", "stream_factor", "year_periods"]

Float64Array = NDArray[np.float64]

#: seconds in a (365-day) year, for the yearly figure
YEAR_SECONDS = 365 * 86_400


@dataclass(frozen=True)
class UserFactor:
    """A multiple of the per-event budget that covers one person's bounded contribution."""

    value: float
    exact: bool
    method: str


def _toeplitz_autocorrelation(mech: object) -> Callable[[int], float] | None:
    """``d ↦ G(d)`` for a Toeplitz mechanism with non-negative, non-increasing coefficients
    (infinite stream), or None."""
    name = getattr(mech, "name", "")
    if name == "sqrt":
        c = np.asarray(getattr(mech, "coefficients", None), dtype=np.float64)
        if (c < 0).any() or (np.diff(c) > 0).any():
            return None

        def sqrt_g(d: int) -> float:
            return float(c[: max(c.size - d, 0)] @ c[d:]) if d < c.size else 0.0
        return sqrt_g
    if name == "blt" and getattr(mech, "scales", None) is None:
        return _plain_blt_autocorrelation(mech)
    return None


def _blt_start_rows_bound(mech: object) -> tuple[Callable[[int], float], float] | None:
    """``(G, max d)`` for ``blt`` at ``p < 1`` with start rows, or None.

    Its columns are ``d_j·r_t·c(t − j)`` (``r_t ≤ 1`` on the first ``t₁`` rows, ``d_j ≥ 1`` on
    the first ``t₁`` columns, both 1 beyond), each of squared norm ``≤ G(0)``, and ``c ≥ 0``. So
    two columns ``Δ`` apart have inner product ``≤ d_j·d_k·G(Δ) ≤ (max d)²·G(Δ)``: the plain
    filter's cross terms scaled by ``(max d)²`` bound the person's sum."""
    if getattr(mech, "name", "") != "blt" or _p(mech) >= 1.0:
        return None
    rows, scales = getattr(mech, "rows", None), getattr(mech, "scales", None)
    if rows is None or scales is None:
        return None
    r = np.asarray(rows, dtype=np.float64)
    if not ((r > 0.0).all() and (r <= 1.0).all()):
        return None
    g = _plain_blt_autocorrelation(mech)
    return None if g is None else (g, max(1.0, float(np.max(scales))))


def _plain_blt_autocorrelation(mech: object) -> Callable[[int], float] | None:
    """``d ↦ G(d)`` of the filter ``(θ, w)`` itself (``c_0 = 1``, ``c_k = Σ w θ^(k−1)``), when
    its coefficients are non-negative and non-increasing, or None."""
    theta = np.asarray(getattr(mech, "theta", None), dtype=np.float64)
    w = np.asarray(getattr(mech, "w", None), dtype=np.float64)
    if (theta < 0).any() or (theta >= 1).any() or (w < 0).any() or float(w.sum()) > 1.0:
        return None  # c_1 = Σw ≤ c_0 = 1 and geometric tails: non-negative, non-increasing
    cross = np.outer(w, w) / (1.0 - np.outer(theta, theta))

    def blt_g(d: int) -> float:
        c_d = 1.0 if d == 0 else float(w @ theta ** (d - 1))
        return c_d + float((cross * (theta ** d)[None, :]).sum())
    return blt_g


def _events_in_period(events: int, min_sep: int, period_ticks: int) -> int:
    """How many of ``events`` (≥ 1 tick apart, ``min_sep`` ≥ 1) one period of ``period_ticks``
    ticks holds (``0``: the whole epoch, all of them)."""
    return events if period_ticks == 0 else min(events, (period_ticks - 1) // min_sep + 1)


def _spaced_sum(g: Callable[[int], float], events: int, min_sep: int) -> float:
    """``Σ_{a,a'<n} G(|a−a'|·b) / G(0)`` with ``n = events``, ``b = min_sep``."""
    g0 = g(0)
    total = events * g0 + 2.0 * sum((events - d) * g(d * min_sep) for d in range(1, events))
    return total / g0


def stream_factor(mech: object, events: int, min_sep: int, period_ticks: int = 0) -> UserFactor:
    """The per-person multiple of ``mech``'s per-event budget for ``events`` events (≥ 1) on
    one stream in one period of ``period_ticks`` ticks (``0``: the whole epoch, i.e. any
    pattern of the unending stream), ``min_sep`` (≥ 0) ticks apart (see the module docstring).
    Dimensionless: ``ε_person = value · ε`` (pure) or ``ρ_person = value · ρ`` (zCDP)."""
    if isinstance(events, bool) or not isinstance(events, int) or events < 1:
        raise ValueError(f"events must be an integer >= 1, got {events!r}")
    if isinstance(min_sep, bool) or not isinstance(min_sep, int) or min_sep < 0:
        raise ValueError(f"min_sep must be an integer >= 0, got {min_sep!r}")
    if isinstance(period_ticks, bool) or not isinstance(period_ticks, int) or period_ticks < 0:
        raise ValueError(f"period_ticks must be an integer >= 0, got {period_ticks!r}")
    privacy = getattr(mech, "privacy", None)
    if not isinstance(privacy, (PureDP, ZCDP)):
        raise ValueError("mech must be a configured mechanism with a privacy budget")
    if events == 1:
        return UserFactor(1.0, True, "one event")
    name = getattr(mech, "name", "")
    if isinstance(privacy, PureDP):
        found = _column_cycle(mech) if min_sep > 0 else None
        factors = None if found is None else _pure_factors(*found, events, min_sep, period_ticks)
        if factors is not None:
            return UserFactor(float(factors[events]), True,
                              "the best b-spaced sum of the columns' L1 changes, grid slack "
                              "included (VecSens)")
        # n × the largest column: exact when n events can all sit on a largest column — every
        # column is one (naive; trees at p = 1), or several events may share a tick (b = 0)
        exact = min_sep == 0 or name in ("naive", "naive-int")
        return UserFactor(float(events), exact, "group privacy: n × the largest column L1 norm")
    if min_sep == 0:
        return UserFactor(float(events) ** 2, True, "n events in one tick: n²")
    g = _toeplitz_autocorrelation(mech)
    if g is not None:
        # no more than ⌊(T − 1)/b⌋ + 1 events b apart fit in a period: the worst pattern is
        # that many, exactly b apart from the period's first tick (more would overstate it)
        fit = _events_in_period(events, min_sep, period_ticks)
        return UserFactor(_spaced_sum(g, fit, min_sep), True,
                          "Toeplitz: events exactly b apart (non-increasing autocorrelation), "
                          "as many as a period holds")
    start = _blt_start_rows_bound(mech)
    if start is not None:
        g, d_max = start
        fit = _events_in_period(events, min_sep, period_ticks)
        cross = _spaced_sum(g, fit, min_sep) - fit
        return UserFactor(min(fit + d_max * d_max * cross, float(fit) ** 2), False,
                          "blt with start rows: the Toeplitz cross terms × (largest column "
                          "scale)², events b apart; an upper bound (user-level deployments run "
                          "the plain filter, whose factor is exact)")
    if name in _TREES:
        levels = tuple(int(v) for v in mech.levels)  # type: ignore[attr-defined]
        weights = tuple(float(w) for w in np.asarray(mech.weights))  # type: ignore[attr-defined]
        values, exact = _tree_factors(levels, weights, _p(mech), events, min_sep, period_ticks)
        value = values[events]
        method = ("tree: program over the blocks" if exact else
                  "tree: program over the blocks, bounded (decayed sums by their packed maximum, "
                  "or every period alignment by the unending stream)")
        value = _with_tree_slack(mech, value, events, min_sep, period_ticks)
        return UserFactor(min(value, float(events) ** 2), exact, method)
    if name == "tree-ls" and _p(mech) < 1.0:
        ls_value = _ls_tree_factor(mech, events, min_sep, period_ticks)
        if ls_value is not None:
            # the grid slack of the coordinates a person touches: √factor ≤ max(√F, √n) (the
            # data and the slack terms each scale by at most their own ratio)
            fit = _events_in_period(events, min_sep, period_ticks)
            ls_value = max(ls_value, float(fit))
            return UserFactor(min(ls_value, float(events) ** 2), False,
                              "tree-ls: program over the blocks, each block's sum bounded by "
                              "its best b-spaced coefficients; an upper bound")
    return UserFactor(float(events) ** 2, False, "bound: n² (triangle inequality)")


def _ls_tree_factor(mech: object, events: int, min_sep: int, period_ticks: int) -> float | None:
    """``tree-ls`` at ``p < 1`` (every top block alike): leaves measured on their own and each
    level's blocks with fixed-point coefficients ``K(pos)·2^-F``, each row with its level's noise
    variance. The block program of :mod:`.trees` over these nested blocks, a level-``ℓ`` block
    with ``c`` events adding ``(best b-spaced sum of c coefficients)² / var_ℓ`` — at least its
    true term, so an upper bound — over the largest column ``max_r Σ_ℓ K_ℓ(r)²/var_ℓ``."""
    from stream_dp.strategies.ls_tree.plan import COEFF_BITS, coefficients

    if any(shape != "decayed" for shape in mech.plan.shapes):  # type: ignore[attr-defined]
        # issue #36: hat levels overlap (two nodes per level per tick) and flat ones have other
        # coefficients: the nested-block program below does not describe them (None: n²)
        return None
    levels = [int(v) for v in mech.plan.levels]  # type: ignore[attr-defined]
    grid2 = float(mech.grid) ** 2  # type: ignore[attr-defined]
    var = [float(v) * grid2 for v in mech.variances]  # type: ignore[attr-defined]
    p = _p(mech)
    coeffs = [np.asarray(coefficients(p, length), dtype=np.float64) / float(1 << COEFF_BITS)
              for length in levels]
    top = levels[-1]
    r = np.arange(top)
    column = np.full(top, 1.0 / var[0])
    for k, v in zip(coeffs, var[1:], strict=True):
        column += k[r % k.size] ** 2 / v
    single = float(column.max())

    def terms(n: int) -> list[Float64Array]:
        counts = np.arange(n + 1, dtype=np.float64)
        out = [counts * counts / var[0]]
        for k, v in zip(coeffs, var[1:], strict=True):
            best = max_spaced_sums(k[None, :], n, min_sep)[0]
            out.append(best * best / v)
        return out

    key = ("tree-ls", tuple(levels), tuple(var), p, min_sep, period_ticks)
    have = _LS_CACHE.get(key)
    if have is None or have.size <= events:  # one run gives every smaller count
        values, _ = nested_period_norm_sq([1, *levels], terms, events, min_sep, period_ticks,
                                          max_offsets=TREE_MAX_OFFSETS)
        have = np.asarray(values, dtype=np.float64) / single
        if len(_LS_CACHE) > 64:
            _LS_CACHE.clear()
        _LS_CACHE[key] = have
    return float(have[events])


_LS_CACHE: dict[tuple[object, ...], Float64Array] = {}


def _column_cycle(mech: object) -> tuple[Float64Array, float] | None:
    """``(cycle, Δ₁)``: per tick of one cycle of ``mech``'s structure, the most one event there
    can move its measurements in L1 — the data term (``cap`` × the column's norm) **plus the
    grid slack of every coordinate it touches** — and the per-event sensitivity ``Δ₁`` the noise
    is calibrated to (value units). Every measurement is ≥ 0, so a person's change is at most
    the sum over their events (slack counted per event: an over-count where events share a
    coordinate). A tree's top block (tick ``r`` feeds level ``i``'s block ending at
    ``⌈(r+1)/s_i⌉·s_i − 1`` with weight ``w_i p^(end − r)``; each event touches one coordinate
    per level), a Fenwick strategy's epoch at ``p < 1`` (every epoch alike; the column sums and
    path lengths of its plan), naive (every tick alike). Else None."""
    name = getattr(mech, "name", "")
    p = _p(mech)
    if name in ("naive", "naive-int"):
        return np.ones(1), 1.0  # every tick measured on its own, alike
    if name in _TREES:
        levels = [int(v) for v in mech.levels]  # type: ignore[attr-defined]
        weights = np.asarray(mech.weights, dtype=np.float64)  # type: ignore[attr-defined]
        cap = float(mech.cap)  # type: ignore[attr-defined]
        delta = float(mech.sensitivity())  # type: ignore[attr-defined]
        top = 1 << levels[-1]
        r = np.arange(top)
        norms = np.zeros(top)
        for lv, w in zip(levels, weights, strict=True):
            size = 1 << lv
            norms += w * p ** ((r // size + 1) * size - 1 - r)
        # Δ₁ = cap·max(1, Σw) + slack (TreeMechanism): the slack is what is left of it
        slack = delta - cap * max(1.0, float(weights.sum()))
        return cap * norms + slack, delta
    if name in _FENWICK and p < 1.0:
        from stream_dp.strategies.fenwick.base import COEFFICIENT_SLACK, SLACK_UNITS
        from stream_dp.strategies.fenwick.plan import column_sums

        length = int(mech.epoch_of(1)[2])  # type: ignore[attr-defined]
        plan = mech.plan(length)  # type: ignore[attr-defined]
        sums, lengths = column_sums(np.asarray(mech.weights(length), dtype=np.float64), p)  # type: ignore[attr-defined]
        cap_eff = float(mech.cap) * (1.0 + COEFFICIENT_SLACK)  # type: ignore[attr-defined]
        cycle = cap_eff * sums + SLACK_UNITS * float(plan.grid) * lengths
        return np.asarray(cycle, dtype=np.float64), float(plan.sensitivity)
    return None


#: the Fenwick strategies (pure DP; weights > 0, so every measurement is ≥ 0)
_FENWICK = frozenset({"dm", "dmfda", "fenwick-opt"})


def periodic_spaced_sum(cycle: Float64Array, events: int, min_sep: int, period_ticks: int,
                        max_offsets: int = 1024) -> float | None:
    """The largest sum of at most ``events`` entries ``min_sep`` (≥ 1) apart of the sequence that
    repeats ``cycle`` forever (tick ``t ≥ 1`` has ``cycle[(t − 1) mod C]``), within one period
    of ``period_ticks`` ticks (``[P·T + 1, (P+1)·T]``, maximised over every ``P``: the period's
    start takes every multiple of ``gcd(T, C)`` within the cycle), or anywhere (``0``: a window
    of ``C + (n − 1)(C + b)`` ticks holds an optimum, since a longer gap between two picks can
    shrink by whole cycles). None if the period has more than ``max_offsets`` alignments.
    Units: those of ``cycle``.

    >>> periodic_spaced_sum(np.array([1.0, 0.0, 0.0, 2.0]), events=2, min_sep=2, period_ticks=4)
    3.0
    >>> periodic_spaced_sum(np.array([1.0, 0.0, 0.0, 2.0]), events=2, min_sep=2, period_ticks=2)
    2.0
    """
    sums = periodic_spaced_sums(cycle, events, min_sep, period_ticks, max_offsets)
    return None if sums is None else float(sums[-1])


def periodic_spaced_sums(cycle: Float64Array, events: int, min_sep: int, period_ticks: int,
                         max_offsets: int = 1024) -> Float64Array | None:
    """:func:`periodic_spaced_sum` for every count ``0 … events`` at once (one pass of the
    program over every alignment together)."""
    c = np.asarray(cycle, dtype=np.float64)
    size = c.size
    if period_ticks == 0:
        length = size + (events - 1) * (size + min_sep)
        sums: Float64Array = max_spaced_sums(np.resize(c, length)[None, :], events, min_sep)[0]
        return sums
    g = math.gcd(period_ticks, size)
    if size // g > max_offsets:
        return None
    fit = min(events, (period_ticks - 1) // min_sep + 1)  # more never fit in a period
    idx = np.arange(period_ticks)
    windows = c[(np.arange(0, size, g)[:, None] + idx[None, :]) % size]
    best = max_spaced_sums(windows, fit, min_sep).max(axis=0)
    return np.concatenate([best, np.full(events - fit, best[-1])])


def _pure_factors(cycle: Float64Array, delta: float, events: int, min_sep: int,
                  period_ticks: int) -> Float64Array | None:
    """:func:`periodic_spaced_sums` over the per-event sensitivity ``delta`` (at least the
    largest entry), cached (the accountant asks for every count up to a layer's bound)."""
    key = (hashlib.sha256(np.ascontiguousarray(cycle).tobytes()).hexdigest(), delta, min_sep,
           period_ticks)
    have = _PURE_CACHE.get(key)
    if have is None or have.size <= events:
        sums = periodic_spaced_sums(cycle, events, min_sep, period_ticks)
        if sums is None:
            return None
        have = sums / max(delta, float(cycle.max()))
        if len(_PURE_CACHE) > 64:
            _PURE_CACHE.clear()
        _PURE_CACHE[key] = have
    return have


_PURE_CACHE: dict[tuple[str, float, int, int], Float64Array] = {}


def _with_tree_slack(mech: object, value: float, events: int, min_sep: int,
                     period_ticks: int) -> float:
    """A tree's zCDP factor with its grid slack: ``Δ₂ = D + S`` (``D = cap·max(1, ‖w‖₂)``,
    ``S = 2√m·g`` for the ``m`` coordinates one event touches). A person's ``n`` events move the
    data by at most ``D·√value`` and touch at most ``n·m`` coordinates, each with the same slack
    however many events it holds: ``√(factor) ≤ (D·√value + S·√n)/Δ₂``, which exceeds
    ``√value`` only when ``value < n`` (then this is the figure; else ``value``)."""
    fit = _events_in_period(events, min_sep, period_ticks)
    if value >= fit:
        return value
    weights = np.asarray(mech.weights, dtype=np.float64)  # type: ignore[attr-defined]
    delta = float(mech.sensitivity())  # type: ignore[attr-defined]
    data = float(mech.cap) * max(1.0, math.sqrt(float(weights @ weights)))  # type: ignore[attr-defined]
    slack = delta - data
    return max(value, ((data * math.sqrt(value) + slack * math.sqrt(fit)) / delta) ** 2)


def _p(mech: object) -> float:
    return float(getattr(mech, "p", 1.0))


#: the tree strategies whose zCDP factor the block program gives (trees.py)
_TREES = frozenset({"tree", "binary-tree"})


def _tree_factors(levels: tuple[int, ...], weights: tuple[float, ...], p: float, events: int,
                  min_sep: int, period_ticks: int) -> tuple[tuple[float, ...], bool]:
    """The tree's zCDP factors for ``0 … events`` events and whether they are exact (an exact
    program over every period alignment: always at ``p = 1``; at ``p < 1`` while the Pareto
    sets stay small). One run of the program gives every
    count; the last (largest) run is kept, so the accountant's questions for smaller counts
    cost nothing."""
    key = (levels, weights, p, min_sep, period_ticks)
    have = _TREE_CACHE.get(key)
    if have is None or len(have[0]) <= events:
        values, exact = tree_period_norm_sq(levels, weights, p, events, min_sep, period_ticks,
                                            max_offsets=TREE_MAX_OFFSETS)
        single = sum(w * w for w in weights)  # an event on a top block's last tick: every p^0
        have = (tuple(float(v) / single for v in values), exact)
        if len(_TREE_CACHE) > 64:
            _TREE_CACHE.clear()
        _TREE_CACHE[key] = have
    return have


_TREE_CACHE: dict[tuple[object, ...], tuple[tuple[float, ...], bool]] = {}


#: the year's program on one top block runs when (events × min(b, top block)) is at most this
TREE_YEAR_WORK = 4096

#: at most this many period alignments (within a top block) are computed one by one; beyond,
#: the unending stream's figure bounds them all (trees.tree_period_norm_sq)
TREE_MAX_OFFSETS = 1024


def year_periods(period_ticks: int, tick_seconds: float) -> int:
    """The most periods one year — *any* 365 days, not only a year that starts on a period
    boundary — can touch: its event times meet at most ``W = ⌈year / tick_seconds⌉ + 1``
    consecutive ticks (one more than ``⌈year / tick_seconds⌉`` when it starts inside a tick:
    a year of exactly 10 ticks meets 11), and those meet at most ``⌈(W − 1) / T⌉ + 1`` aligned
    periods of ``T`` ticks (1 for ``period_ticks = 0``, a period that never ends). A year of
    daily periods touches 366 of them, a year of yearly ones 2.

    >>> year_periods(1440, 60.0), year_periods(525_600, 60.0), year_periods(0, 60.0)
    (366, 2, 1)
    """
    if period_ticks == 0:
        return 1
    # exact: a float quotient may round across an integer
    ticks = math.ceil(Fraction(YEAR_SECONDS) / Fraction(tick_seconds)) + 1
    return -(-(ticks - 1) // period_ticks) + 1


def _layer_cost(phi: Callable[[int], UserFactor], total: int, cap: int,
                spaced: bool = False) -> tuple[float, bool]:
    """The largest ``Σ φ(n_v)`` over splits of ``total`` events into nodes of at most ``cap``
    each, and whether it is exact. For a convex, superadditive φ (``n``, ``n²``, the Toeplitz
    sum) that is ``⌊N/c⌋·φ(c) + φ(N mod c)``; the trees' program is not known to be convex in
    the count, so every split is searched (an unbounded knapsack, O(N·c)).

    Each node's φ is its worst pattern on its own; with ``spaced`` (``b ≥ 1``) the person's
    events are ``b`` apart across nodes too, so worst patterns of several nodes may not fit
    together: the value is then exact only when one node holding every event is the best split
    (the same pattern is every ancestor's), else an upper bound."""
    c = min(cap, total)
    # the largest count first: the programs behind φ give every smaller count from that run
    phis = [phi(j) for j in range(c, 0, -1)][::-1]
    best = [0.0] * (total + 1)
    for m in range(1, total + 1):
        best[m] = max(phis[j - 1].value + best[m - j] for j in range(1, min(c, m) + 1))
    exact = all(f.exact for f in phis)
    if spaced:
        exact = exact and total <= c and best[total] <= phis[total - 1].value * (1 + 1e-12)
    return best[total], exact


@dataclass(frozen=True)
class UserAccountant:
    """User-level accounting of one release: ``event`` (per-node budget, h, cap), ``bounds``,
    ``layer_leaves`` (per layer, the most leaves one node of that layer has below it; a flat
    domain: ``(1,)``), ``mech`` (the per-stream mechanism, for the factors) and the tick length
    in seconds (for the yearly figure)."""

    event: Accountant
    bounds: UserBounds
    layer_leaves: tuple[int, ...]
    mech: object
    tick_seconds: float

    def __post_init__(self) -> None:
        if len(self.layer_leaves) != self.event.nodes_touched:
            raise ValueError(f"layer_leaves must have one entry per node an event feeds "
                             f"({self.event.nodes_touched}), got {len(self.layer_leaves)}")
        if not (math.isfinite(self.tick_seconds) and self.tick_seconds > 0):
            raise ValueError(f"tick_seconds must be a finite number > 0, got {self.tick_seconds!r}")

    def _phi(self, n: int) -> UserFactor:
        return stream_factor(self.mech, n, self.bounds.min_separation_ticks,
                             self.bounds.period_ticks)

    @property
    def per_stream(self) -> UserFactor:
        """The factor of one released leaf stream per person per period."""
        return self._phi(self.bounds.per_leaf_events)

    @property
    def per_node_max(self) -> UserFactor:
        """The largest factor of any one released stream per person per period: a node with
        more leaves below it may receive more of one person's events (``min(K, L·k)`` against
        ``min(K, k)`` on a leaf), so its factor is the largest over the layers."""
        factors = [self._phi(self.bounds.per_node_events(leaves)) for leaves in self.layer_leaves]
        return max(factors, key=lambda f: f.value)

    @property
    def events_per_period(self) -> int:
        """``N``: the most events of one person counted in one period (over all leaves)."""
        return self.bounds.per_node_events(max(self.layer_leaves))

    def period_factor(self) -> tuple[float, bool]:
        """The release's total per person per period as a multiple of the per-node budget."""
        total, exact = 0.0, True
        for leaves in self.layer_leaves:
            value, ok = _layer_cost(self._phi, self.events_per_period,
                                    self.bounds.per_node_events(leaves),
                                    spaced=self.bounds.min_separation_ticks > 0)
            total, exact = total + value, exact and ok
        return total, exact

    def year_factor(self) -> tuple[float, bool]:
        """The release's total per person over a year, as a multiple of the per-node budget."""
        y = year_periods(self.bounds.period_ticks, self.tick_seconds)
        period, exact = self.period_factor()
        if y == 1:
            return period, exact
        # a year that starts inside a period holds only parts of the first and last periods it
        # touches, so Y × the period (and what follows) bounds it without being reached: never
        # said exact (the adversarial review's straddling year)
        value, _ = self._year_bound(y, period, exact)
        return value, False

    def _year_bound(self, y: int, period: float, exact: bool) -> tuple[float, bool]:
        if isinstance(self.event.per_node, PureDP):
            # pure DP adds over the periods; Y × the period is reached when the periods' worst
            # patterns do not constrain each other (b ≤ 1: distinct ticks only)
            return y * period, exact and self.bounds.min_separation_ticks <= 1
        if getattr(self.mech, "name", "") in _TREES:
            return self._tree_year(y, period, exact)
        g = _toeplitz_autocorrelation(self.mech)
        n, t, b = self.events_per_period, self.bounds.period_ticks, self.bounds.min_separation_ticks
        if g is None:
            return float(self.event.nodes_touched * (y * n) ** 2), False
        # cross terms of two periods d apart: n² pairs at distance ≥ max(b, (d−1)·T + 1), per layer
        cross = sum((y - d) * g(max(b, (d - 1) * t + 1)) for d in range(1, y))
        return y * period + 2.0 * self.event.nodes_touched * n * n * cross / g(0), False

    def _tree_year(self, y: int, period: float, period_exact: bool) -> tuple[float, bool]:
        """A tree's year under zCDP. No measurement spans two top blocks (``B`` ticks), so the
        year's ``‖L x‖²`` is a sum over top blocks. When ``B`` divides the period, every top
        block lies in one period: the year is at most ``Y ×`` the period (exact when the period
        is and ``b ≤ 1``: then the periods' patterns do not constrain each other). Otherwise a
        top block overlaps at most ``u = ⌈(B − 1)/T⌉ + 1`` periods, so it holds at most ``u``
        periods' events, and a year touches at most ``Q = ⌈(Y·T − 1)/B⌉ + 1`` top blocks: the
        year is at most ``Q ×`` the layers' cost of one top block with ``u·N`` events (the
        program on one top block's window, or ``j²`` where the program would be too long)."""
        b, t = self.bounds.min_separation_ticks, self.bounds.period_ticks
        levels = tuple(int(v) for v in self.mech.levels)  # type: ignore[attr-defined]
        weights = tuple(float(w) for w in np.asarray(self.mech.weights))  # type: ignore[attr-defined]
        top = 1 << levels[-1]
        if t % top == 0:
            return y * period, period_exact and b <= 1
        u = -(-(top - 1) // t) + 1
        q = -(-(y * t - 1) // top) + 1
        most = u * self.events_per_period
        single = sum(w * w for w in weights)
        if b >= 1 and most * min(b, top) <= TREE_YEAR_WORK:
            values = tree_block_values(levels, weights, self.mech.p, most, b)  # type: ignore[attr-defined]
            table = [float(v) / single for v in values]
        else:
            table = [float(j * j) for j in range(most + 1)]

        def phi(j: int) -> UserFactor:
            return UserFactor(table[j], False, "one top block")

        total = 0.0
        for leaves in self.layer_leaves:
            value, _ = _layer_cost(phi, most, u * self.bounds.per_node_events(leaves))
            total += value
        return min(q * total, float(self.event.nodes_touched * (y * self.events_per_period) ** 2)
                   ), False

    def _scaled(self, factor: float) -> Privacy:
        # the exact product of the two floats, rounded up: a float product may round below it
        # (0.7 × 3 = 2.0999999999999996), and a per-person figure is an upper bound
        per = self.event.per_node
        value = float_up(Fraction(per.value) * Fraction(factor))
        return PureDP(value) if isinstance(per, PureDP) else ZCDP(value)

    def figures(self) -> dict[str, dict[str, object]]:
        """The per-person figures (``stream``, ``period``, ``year``) as budgets with their factor
        over the per-node budget and whether each is exact (``stream-dp plan --format json``)."""
        stream = self.per_stream
        total, exact = self.period_factor()
        year, year_exact = self.year_factor()
        out: dict[str, dict[str, object]] = {}
        for key, factor, ok, method in (("stream", stream.value, stream.exact, stream.method),
                                        ("period", total, exact, "sum over the layers"),
                                        ("year", year, year_exact, "composition over the year")):
            out[key] = {"factor": factor, "privacy": self._scaled(factor).as_dict(),
                        "exact": ok, "method": method}
        out["year"]["periods"] = year_periods(self.bounds.period_ticks, self.tick_seconds)
        return out

    def summary(self, delta: float | None = None) -> list[str]:
        """Human-readable lines for ``stream-dp plan`` and the worker's start-up log; under
        zCDP with ``delta``, each per-person ρ also as the (ε, δ)-DP it implies."""
        b = self.bounds
        sym = "ε" if isinstance(self.event.per_node, PureDP) else "ρ"
        period = (f"{b.period_ticks} ticks ({_duration(b.period_ticks * self.tick_seconds)})"
                  if b.period_ticks else "the whole epoch")
        stream = self.per_stream
        total, exact = self.period_factor()
        year, year_exact = self.year_factor()
        knobs = [f"K = {b.max_events} events"]
        if b.max_streams:
            knobs.append(f"L = {b.max_streams} streams")
        if b.max_events_per_stream:
            knobs.append(f"k = {b.max_events_per_stream} per stream")
        if b.min_separation_ticks:
            knobs.append(f"b = {b.min_separation_ticks} ticks apart")

        def shown(factor: float) -> str:
            budget = self._scaled(factor)
            text = f"{sym} = {_fmt(budget.value)}"
            if isinstance(budget, ZCDP) and delta is not None:
                text += f" (ε = {_fmt(budget.to_approx_dp(delta))} at δ = {delta:g})"
            return text

        def kind(ok: bool) -> str:
            return "exact" if ok else "an upper bound"

        node = self.per_node_max
        above = [] if node.value <= stream.value else [
            f"per stream above leaves: {shown(node.value)} per person per period (a node over "
            f"several leaves takes up to {self.events_per_period} of one person's events; "
            f"{kind(node.exact)})"]
        return [
            "unit of privacy:         one person",
            f"period:                  {period}",
            f"bounds per period:       {', '.join(knobs)}",
            f"per released stream:     {shown(stream.value)} per person per period "
            f"({stream.method}; {kind(stream.exact)})",
            *above,
            f"total per person:        {shown(total)} per period, over every node a person "
            f"reaches ({kind(exact)})",
            f"over a year:             {shown(year)} ({_periods(b, self.tick_seconds)}; "
            f"{kind(year_exact)})",
        ]


def _periods(b: UserBounds, tick_seconds: float) -> str:
    y = year_periods(b.period_ticks, tick_seconds)
    return f"{y} period" if y == 1 else f"{y} periods"


def _fmt(x: float) -> str:
    return format_up(x)


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86_400.0), ("hours", 3_600.0), ("minutes", 60.0)):
        if seconds >= size and seconds % size == 0:
            count = seconds / size
            return f"{count:g} {unit if count != 1 else unit[:-1]}"
    return f"{seconds:g} s"


def layer_leaves(domain: Domain) -> tuple[int, ...]:
    """Per layer of nodes one event feeds (``domain.touches`` of them), the most leaves one node
    of the layer has below it: a hierarchy by depth from the root, a grid's total, one layer per
    attribute, and its cells; a flat domain ``(1,)``."""
    if domain.kind == "flat":
        return (1,)
    if domain.kind == "grid":
        sizes = [len(c) for _, c in domain.attributes]
        cells = math.prod(sizes)
        return (cells, *(cells // s for s in sizes), 1)
    parent = np.asarray(domain.parent)
    n = parent.size
    depth = np.zeros(n, dtype=np.int64)
    order = []  # nodes in an order where every parent comes before its children
    children: list[list[int]] = [[] for _ in range(n)]
    for v in range(n):
        if parent[v] >= 0:
            children[int(parent[v])].append(v)
    stack = [v for v in range(n) if parent[v] < 0]
    while stack:
        v = stack.pop()
        order.append(v)
        for c in children[v]:
            depth[c] = depth[v] + 1
            stack.append(c)
    leaves = np.zeros(n, dtype=np.int64)
    for v in reversed(order):
        leaves[v] = 1 if not children[v] else sum(int(leaves[c]) for c in children[v])
    out = [0] * (int(depth.max()) + 1)
    for v in range(n):
        out[int(depth[v])] = max(out[int(depth[v])], int(leaves[v]))
    return tuple(out)
