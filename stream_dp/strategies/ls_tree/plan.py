"""Plan of the ``tree-ls`` strategy: the nested block lengths and the budget share of each level.

Levels: every tick is a leaf (its count measured alone), and each level ``ℓ = 1..m`` has nodes of
``L_ℓ`` ticks (nested: ``L_1 | L_2 | … | L_m``; ``B = L_m`` is the *top block*) measuring the
node's decayed sum with fixed-point coefficients ``K_i = round(2**F·p^(L−1−i))`` (``i`` = 0-based
offset in the node, ``F`` = :data:`COEFF_BITS`). The leaves get the share ``a_0`` of the budget,
level ``ℓ`` the share ``a_ℓ`` (Σ a = 1). The release is the least-squares (best linear unbiased)
estimate of the decayed sum from *all* measurements of the open top block, including those it
completes later (see :mod:`.mechanism`): the leaf-only decayed sum plus the best combination of the
nodes' *residuals* ``R_n = Y_n − Σ_i K_i·y_i``, which carry noise only. With ``k = K·2**-F``,
``v₁`` the leaf noise variance, ``v_ℓ`` the node noise variances (grid units², the node's own units
scaled by ``2**-2F``) and ``Σ_R = diag(v_ℓ(n)) + v₁·k kᵀ`` the residuals' covariance, the release at
offset ``j`` of the top block has

* ``c_j = v₁·Σ_{i≤j} p^(j−i)·k_i`` (covariance of the leaf sum's noise with ``−R``),
  ``β_j = Σ_R⁻¹ c_j`` and own variance ``part_j = v₁·Σ_{i≤j} p^(2(j−i)) − c_jᵀ Σ_R⁻¹ c_j``;
* plus the carried estimate of the completed top blocks, ``p^(2(j+1))·C_k`` with
  ``C_k = part_(B−1)·Σ_{m<k} p^(2Bm)``.

:func:`best_plan` minimises the mean of that variance over ticks ``1..horizon`` (closed form,
:func:`mean_variance`) over two-level plans (one block length) and, for long memories, three- and four-level
plans (nested block lengths). At ``p = 1`` it then gives each top block of the horizon its own
shares (:attr:`LsPlan.schedule`, :func:`scheduled_mean`; issue #26): a block's end-of-block
estimate is carried by every later tick, so early blocks want more top share and the last one
less (pure ε = 1, T = 32767: 347.6 → 335.0).

**Hat levels** (issue #36, :data:`HAT`, :func:`hat_rows`): a level may instead measure
overlapping triangles of half-width ``L`` (stride ``L``, a partition of unity, cut at the top
block's edges), and the top block may be a plain sum (:data:`FLAT`). The decoder and the
formulas above are unchanged (they hold for any integer rows ``K`` inside the top block); one
event changes a hat level's rows by at most ``2**F·Δ`` in total, so the level is calibrated as a
decayed one. Pure ε = 1, T = 32767, mean MSE: 47.07 → 38.83 (p = 0.99), 66.26 → 54.84 (0.995),
126.1 → 101.7 (0.999), 249.8 → 202.5 (0.9999), 335.0 → 293.0 (1).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import solve_triangular
from scipy.signal import lfilter

from stream_dp.exact_budget import raise_until
from stream_dp.noise.gaussian import discrete_gaussian_variance
from stream_dp.noise.laplace import discrete_laplace_variance

__all__ = ["COEFF_BITS", "DECAYED", "FLAT", "HAT", "MAX_BLOCK", "LsPlan", "best_plan", "block_part",
           "block_terms", "coefficients", "curve", "hat_rows", "level_rows", "mean_variance",
           "noise_scales", "scheduled_mean", "structure"]

Model = Literal["pure", "zcdp"]

#: Fixed-point bits of the node coefficients (integers ``K_i ≤ 2**F``). The node's noise lives on
#: the lattice of ``K·q`` (units ``g·2**-F``), so shifts of the data are lattice vectors.
COEFF_BITS = 12
#: Longest top block considered (state is O(levels · B / L_1) per stream; the block-start work
#: is O(B) per top block).
MAX_BLOCK = 4096
#: Longest per-block share schedule (top blocks inside the horizon, ``p = 1``): 256 at
#: 2**20 − 1 ticks and ``B`` = 4096.
MAX_SCHEDULE = 512
_SHARES = tuple(round(0.05 * i, 2) for i in range(2, 19))  # leaf share a ∈ {0.10, …, 0.90}
#: Three-level search (p ≥ this): first level lengths × multiples, coarse then fine shares.
_THREE_LEVEL_P = 0.995
_FIRST = (4, 6, 8, 12, 16, 24, 32)
_MULTIPLE = (4, 6, 8, 10, 12, 16)
#: Four-level search (p ≥ this, horizons ≥ 2048): first level × multiple × top multiple.
_FOUR_LEVEL_P = 0.999
_FOUR_FIRST = (16, 24, 32)
_FOUR_MULTIPLE = (8, 12, 16)
_FOUR_TOP = (4, 8, 16)
#: Hat plans are searched for p ≥ this only (issue #36 asks for p ≥ 0.99). Below it they win too
#: (pure ε = 1, T = 32767: 17.31 against `naive`'s 20.51 at p = 0.95, 12.04 against `tree-ls`'s
#: 12.51 at 0.9), but `auto` would then switch the service's default decay (p = 0.95) from
#: `naive`/`naive-int` to `tree-ls`, changing every default deployment's releases and state: a
#: decision of its own, left out of this change.
_HAT_P = 0.99
#: Hat plans (issue #36, :func:`_hat_plan`): strides, top multiples, three-level search (first
#: stride 16 only: 8 and 32 never won at p ≥ 0.999 for T = 32767 and cost a 4096-tick geometry
#: each; four candidates, 16 ⊂ 160 ⊂ 1600 … 16 ⊂ 256 ⊂ 4096).
_HAT_STRIDES = (4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64)
_HAT_TOP = (4, 8, 10, 16)
_HAT3_P = 0.999
_HAT3_FIRST = (16,)
_HAT3_MULTIPLE = (10, 16)
_HAT3_TOP = (10, 16)
#: Most nodes per top block of a hat plan (the state per stream holds one residual per node;
#: today's four-level plans have 273).
_MAX_HAT_ROWS = 300
_CLIMB_PASSES = 6


@dataclass(frozen=True)
class LsPlan:
    """Node lengths ``levels`` (ticks, nested, increasing, ≥ 2) and the budget ``shares``
    (leaves first, one per level after; positive, summing to 1).

    ``schedule`` (``p = 1`` only, issue #26): the shares of the first top blocks, one vector per
    block (block ``k < len(schedule)`` uses ``schedule[k]``, later blocks ``shares``). Every
    event lies in exactly one top block, so each vector needs only sum to at most 1 on its own.
    Inside the horizon an early block's estimate is carried by every later tick, the last block's
    by none: early blocks give more to the top level, the last one less."""

    levels: tuple[int, ...]
    shares: tuple[float, ...]
    schedule: tuple[tuple[float, ...], ...] = ()
    #: Node shape per level (issue #36): :data:`DECAYED` (the node's decayed sum, one node per
    #: ``L`` ticks), :data:`FLAT` (its plain sum) or :data:`HAT` (overlapping triangles, see
    #: :func:`hat_rows`); empty = all decayed (every plan before issue #36). The top level is
    #: never a hat level (the top blocks are what the carried estimate steps over).
    shapes: tuple[str, ...] = ()

    @property
    def block(self) -> int:
        """The top block's length ``B`` (ticks)."""
        return self.levels[-1]

    @property
    def leaf_share(self) -> float:
        return self.shares[0]

    def shares_of(self, block: int) -> tuple[float, ...]:
        """The shares of top block ``block`` (0-based)."""
        return self.schedule[block] if block < len(self.schedule) else self.shares

    @property
    def level_shapes(self) -> tuple[str, ...]:
        """One shape per level (``shapes``, or all :data:`DECAYED` when empty)."""
        return self.shapes or (DECAYED,) * len(self.levels)


#: Node shapes (:attr:`LsPlan.shapes`): the node's decayed sum, overlapping triangles
#: (:func:`hat_rows`), or the node's plain sum (every ``K_i = 2**F``: at ``p < 1`` a decayed node
#: spends only ``p^(L−1−i)`` of its level's budget on the early ticks, a flat one all of it).
DECAYED = "decayed"
HAT = "hat"
FLAT = "flat"
SHAPES = (DECAYED, HAT, FLAT)


@lru_cache(maxsize=256)
def coefficients(p: float, block: int) -> tuple[int, ...]:
    """``K_i = round(2**F · p^(L−1−i))`` for offsets ``i = 0..L−1`` (last one ``2**F``)."""
    i = np.arange(block, dtype=np.float64)
    k = np.rint(np.ldexp(p ** (block - 1 - i), COEFF_BITS)).astype(np.int64)
    return tuple(int(v) for v in k)


def hat_rows(length: int, top: int) -> NDArray[np.int64]:
    """The rows of a :data:`HAT` level of stride ``length`` inside a top block of ``top`` ticks.

    Row ``r = 0..top/length`` peaks at offset ``c_r = r·length − 1`` (the last tick of the
    ``r``-th node of a decayed level of that length; row 0 peaks just before the block) and has
    ``K_i = 2**F − round(2**F·|i − c_r|/length)`` for ``|i − c_r| < length``, clipped to the top
    block. Between two peaks the two rows' coefficients add up to exactly ``2**F`` (rounding half
    up, and ``2**F·d/length`` is never a half-integer for ``length ≤ 2**F``), so one event changes
    the level's rows by at most ``2**F·Δ`` in total, as one decayed node does: the level is
    calibrated the same way. Issue #36: least-squares decoding of these overlapping
    measurements cuts the mean error by 12–19 % against decayed nodes (pure ε = 1, T = 32767,
    p ≥ 0.99)."""
    one = 1 << COEFF_BITS
    rows = np.zeros((top // length + 1, top), dtype=np.int64)
    i = np.arange(top, dtype=np.int64)
    for r in range(rows.shape[0]):
        d = np.abs(i - (r * length - 1))
        near = d < length
        rows[r, near] = one - (2 * one * d[near] + length) // (2 * length)
    return rows


def level_rows(p: float, shape: str, length: int, top: int) -> NDArray[np.int64]:
    """The integer coefficient rows of one level inside a top block of ``top`` ticks."""
    if shape == HAT:
        return hat_rows(length, top)
    if shape not in SHAPES:
        raise ValueError(f"node shape must be one of {SHAPES}, got {shape!r}")
    k = (np.asarray(coefficients(p, length), dtype=np.int64) if shape == DECAYED
         else np.full(length, 1 << COEFF_BITS, dtype=np.int64))
    rows = np.zeros((top // length, top), dtype=np.int64)
    for m, start in enumerate(range(0, top, length)):
        rows[m, start:start + length] = k
    return rows


def structure(p: float, levels: tuple[int, ...], shapes: tuple[str, ...] = ()
              ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(K, level)``: the integer coefficient matrix of the top block's nodes (one row per node,
    ordered by level then position; ``B`` columns) and each row's level (1-based)."""
    top = levels[-1]
    shapes = shapes or (DECAYED,) * len(levels)
    rows: list[NDArray[np.int64]] = []
    level: list[int] = []
    for ell, (length, shape) in enumerate(zip(levels, shapes, strict=True), start=1):
        block_rows = level_rows(p, shape, length, top)
        rows.append(block_rows)
        level += [ell] * block_rows.shape[0]
    return np.vstack(rows), np.asarray(level, dtype=np.int64)


def noise_scales(model: Model, budget: float, shares: tuple[float, ...], slack_units: float
                 ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(scales, variances)`` per level, leaves first: noise parameters in grid units (leaves)
    and node units ``g·2**-F`` (nodes), and the exact variances in grid units² (the nodes'
    scaled by ``2**-2F``). ``budget`` is ε (discrete Laplace) or ρ (discrete Gaussian σ);
    ``slack_units`` = ``cap/g + 1`` is the largest change of one rounded count.

    The levels spend at most ``budget`` *exactly*: the privacy one event spends, ``Σ Δ_ℓ/b_ℓ``
    (pure) or ``Σ Δ_ℓ²/(2σ_ℓ²)`` (zCDP) with ``Δ_ℓ`` = ``slack_units`` (leaves) or
    ``2**F·slack_units`` (nodes), is computed in rationals from the very floats the samplers draw
    with (they use them exactly). Only if it exceeds ``budget`` (float rounding of
    ``change/(budget·share)``, or shares whose float sum rounds to 1 while their exact sum does
    not: ``0.24 + 0.22 + 0.22 + 0.32000000000000006`` = 1 + 5.6e-17) is each scale raised ulp by
    ulp until its level spends at most ``budget·share/max(1, Σ shares)``; scales that were
    already within the budget are left as they were (their noise keys do not change)."""
    k_max = float(1 << COEFF_BITS)
    changes = [slack_units * (1.0 if ell == 0 else k_max) for ell in range(len(shares))]

    def spent(change: float, s: float) -> Fraction:
        if model == "pure":
            return Fraction(change) / Fraction(s)
        return Fraction(change) ** 2 / (2 * Fraction(s) ** 2)

    raw = [change / (budget * share) if model == "pure"
           else change / math.sqrt(2.0 * budget * share)
           for change, share in zip(changes, shares, strict=True)]
    if sum((spent(c, s) for c, s in zip(changes, raw, strict=True)), Fraction(0)) > Fraction(
            budget):
        # exact Σ of the shares (fsum and float sums round: 1 + 5.6e-17 passes both as 1.0)
        norm = max(Fraction(1), sum((Fraction(a) for a in shares), Fraction(0)))
        for ell, share in enumerate(shares):
            allowed = Fraction(budget) * Fraction(share) / norm
            def fits(s: float, c: float = changes[ell], a: Fraction = allowed) -> bool:
                return spent(c, s) <= a

            raw[ell] = raise_until(raw[ell], fits)
    scales: list[float] = []
    variances: list[float] = []
    for ell, s in enumerate(raw):
        unit = 1.0 if ell == 0 else k_max * k_max
        v = discrete_laplace_variance(s) if model == "pure" else discrete_gaussian_variance(s)
        scales.append(s)
        variances.append(v / unit)
    return tuple(scales), tuple(variances)


@lru_cache(maxsize=64)
def _geometry(p: float, levels: tuple[int, ...], shapes: tuple[str, ...] = ()) -> tuple[NDArray[np.float64], NDArray[np.float64],
                                                           NDArray[np.float64], NDArray[np.int64]]:
    """What :func:`block_terms` needs that depends on the lengths only (the plan search scores
    many share vectors per lengths): ``k kᵀ`` (``k = K·2**-F``), ``c`` and ``w`` of the docstring
    there for ``v₁ = 1`` (both are linear in ``v₁``) and each node's level."""
    big_k, level = structure(p, levels, shapes)
    k = big_k.astype(np.float64) / float(1 << COEFF_BITS)
    top = levels[-1]
    # c_j = p·c_(j−1) + k_j and w_j = p²·w_(j−1) + 1, as IIR filters along the block
    c = np.asarray(lfilter([1.0], [1.0, -p], k, axis=1), dtype=np.float64).T
    sq = np.asarray(lfilter([1.0], [1.0, -p * p], np.ones(top)), dtype=np.float64)
    gram = k @ k.T
    for a in (gram, c, sq, level):
        a.setflags(write=False)
    return gram, c, sq, level


def block_terms(p: float, levels: tuple[int, ...], variances: tuple[float, ...],
                shapes: tuple[str, ...] = ()) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(β, part)``: ``β[j]`` the decoder's weights on the top block's residuals at offset ``j``
    (``B × nodes``) and ``part[j]`` the exact variance of the block's own part of the release
    (grid units²)."""
    gram, c1, sq1, level = _geometry(p, levels, shapes)
    v1 = variances[0]
    sigma = np.diag(np.asarray([variances[int(ell)] for ell in level])) + v1 * gram
    c = v1 * c1
    sq = v1 * sq1
    beta = np.linalg.solve(sigma, c.T).T
    part = np.asarray(sq - np.einsum("jn,jn->j", c, beta), dtype=np.float64)
    return np.asarray(beta, dtype=np.float64), part


def _carried(p: float, block: int, last: float, k: NDArray[np.float64]) -> NDArray[np.float64]:
    """``C_k = last·Σ_{m<k} p^(2Bm)`` for top-block indices ``k``."""
    if p == 1.0:
        return last * k
    q = p ** (2 * block)
    if q == 0.0:
        return np.where(k > 0, last, 0.0)
    out: NDArray[np.float64] = last * (-np.expm1(k * math.log(q)) / (1.0 - q))
    return out


def curve(p: float, block: int, part: NDArray[np.float64], ticks: int) -> NDArray[np.float64]:
    """Exact variance (grid units²) of the releases at ticks ``1..ticks``."""
    n_blocks = -(-ticks // block)
    carried = _carried(p, block, float(part[-1]), np.arange(n_blocks, dtype=np.float64))
    decay = p ** (2.0 * np.arange(1, block + 1, dtype=np.float64))
    out = (carried[:, None] * decay[None, :] + part[None, :]).ravel()[:ticks]
    return np.asarray(out, dtype=np.float64)


def mean_variance(p: float, block: int, part: NDArray[np.float64], ticks: int) -> float:
    """``curve(...).mean()`` in closed form, O(B) whatever ``ticks`` (for the plan search)."""
    full, rem = divmod(ticks, block)
    decay = p ** (2.0 * np.arange(1, block + 1, dtype=np.float64))
    last = float(part[-1])
    if p == 1.0:
        carried_sum = last * full * (full - 1) / 2.0
    else:
        q = p ** (2 * block)
        geo = (-math.expm1(full * math.log(q)) / (1.0 - q)) if q > 0 else float(min(full, 1))
        carried_sum = last / (1.0 - q) * (full - geo)
    carried_rem = float(_carried(p, block, last, np.asarray([float(full)]))[0])
    total = carried_sum * float(decay.sum()) + full * float(part.sum())
    total += carried_rem * float(decay[:rem].sum()) + float(part[:rem].sum())
    return total / ticks


def _value(p: float, levels: tuple[int, ...], shares: tuple[float, ...], model: Model,
           budget: float, slack_units: float, horizon: int, shapes: tuple[str, ...] = ()) -> float:
    part = block_part(p, levels, model, budget, shares, slack_units, shapes)
    return mean_variance(p, levels[-1], part, horizon)


@lru_cache(maxsize=1024)
def block_part(p: float, levels: tuple[int, ...], model: Model, budget: float,
               shares: tuple[float, ...], slack_units: float, shapes: tuple[str, ...] = ()
               ) -> NDArray[np.float64]:
    """``part`` of :func:`block_terms` for the shares (grid units², read-only; cached: the plan
    search and the mechanism ask for the same ones, and ``β`` — ``B × nodes`` floats — is not
    kept)."""
    _, variances = noise_scales(model, budget, shares, slack_units)
    gram, c1, sq1, level = _geometry(p, levels, shapes)
    v1 = variances[0]
    sigma = np.diag(np.asarray([variances[int(ell)] for ell in level])) + v1 * gram
    # part_j = w_j − c_jᵀ Σ⁻¹ c_j = w_j − ‖L⁻¹c_j‖² with Σ = L Lᵀ (Σ is positive definite):
    # one triangular solve instead of β's full solve (the plan search needs only part)
    chol = np.linalg.cholesky(sigma)
    x = solve_triangular(chol, (v1 * c1).T, lower=True, check_finite=False)
    part = np.asarray(v1 * sq1 - np.einsum("nj,nj->j", x, x), dtype=np.float64)
    part.setflags(write=False)
    return part


def scheduled_mean(parts: list[NDArray[np.float64]], horizon: int) -> float:
    """Mean variance over ticks ``1..horizon`` at ``p = 1`` when top block ``k`` has its own
    ``parts[k]`` (one per block that starts inside the horizon): block ``k`` contributes its own
    part at its ticks inside the horizon, and its end-of-block variance ``parts[k][-1]`` to every
    later tick (the carried estimate)."""
    block = len(parts[0])
    total = 0.0
    for k, part in enumerate(parts):
        inside = min(block, horizon - k * block)
        later = max(0, horizon - (k + 1) * block)
        total += float(part[:inside].sum()) + later * float(part[-1])
    return total / horizon


def _schedule(levels: tuple[int, ...], shares: tuple[float, ...], model: Model, budget: float,
              slack_units: float, horizon: int, shapes: tuple[str, ...] = ()
              ) -> tuple[float, tuple[tuple[float, ...], ...]]:
    """``(mean variance, schedule)``: per top block inside the horizon (``p = 1``) the shares
    that minimise that block's part of the mean, from a one-parameter family: top share ``a``,
    the lower levels keeping their ratios of ``shares`` (measured at ε = 1, T = 32767, 16 ⊂ 256 ⊂
    4096: 335.05, against 334.91 for a free Nelder–Mead per block). ``a`` on a 0.04 grid, then
    moves of ±0.02 and ±0.01 per block."""
    block = levels[-1]
    n_blocks = -(-horizon // block)
    top = shares[-1]
    tried: dict[float, tuple[tuple[float, ...], NDArray[np.float64]]] = {}

    def family(a: float) -> tuple[tuple[float, ...], NDArray[np.float64]]:
        a = round(a, 2)
        if a not in tried:
            vec = _normalised((*(x * (1.0 - a) / (1.0 - top) for x in shares[:-1]), a))
            tried[a] = (vec, block_part(1.0, levels, model, budget, vec, slack_units, shapes))
        return tried[a]

    sums: dict[int, NDArray[np.float64]] = {}

    def cost(k: int, part: NDArray[np.float64]) -> float:
        inside = min(block, horizon - k * block)
        if id(part) not in sums:
            sums[id(part)] = np.cumsum(part)
        return float(sums[id(part)][inside - 1]) + max(0, horizon - (k + 1) * block) * float(
            part[-1])

    # a coarse grid up to 0.32 above the steady top share (early blocks of a long horizon want
    # more: 2**20 − 1 ticks at p = 1 has 256 blocks), then moves of 0.02 and 0.01 per block
    grid = [round(0.04 + 0.04 * i, 2) for i in range(23) if 0.04 + 0.04 * i <= top + 0.32]
    for a in grid:
        family(a)
    picks = [min(grid, key=lambda x: cost(k, family(x)[1])) for k in range(n_blocks)]
    for step in (0.02, 0.01):
        for k in range(n_blocks):
            near = [round(picks[k] + d, 2) for d in (-step, step)
                    if 0.02 <= picks[k] + d <= 0.95]
            picks[k] = min([picks[k], *near], key=lambda x: cost(k, family(x)[1]))
    schedule = tuple(family(a)[0] for a in picks)
    return scheduled_mean([family(a)[1] for a in picks], horizon), schedule


def _normalised(shares: tuple[float, ...]) -> tuple[float, ...]:
    """The last share is ``1 − Σ others``, nudged down until the float sum (and ``fsum``) is
    ``≤ 1``. The exact sum of the floats may still exceed 1 by ~1e-16 (``fsum`` rounds):
    :func:`noise_scales` makes the levels spend at most the budget exactly all the same."""
    head = tuple(float(a) for a in shares[:-1])
    last = 1.0 - math.fsum(head)
    while math.fsum((*head, last)) > 1.0 or sum((*head, last)) > 1.0:
        last = math.nextafter(last, 0.0)
    return (*head, last)


def _two_level_candidates(horizon: int) -> list[int]:
    top = min(horizon, MAX_BLOCK)
    small = list(range(2, min(top, 64) + 1))
    big = np.unique(np.geomspace(64, max(top, 64), 48).astype(int)).tolist() if top > 64 else []
    return sorted({b for b in small + big if 2 <= b <= top})


@lru_cache(maxsize=64)
def best_plan(p: float, horizon: int, model: Model, budget: float, slack_units: float) -> LsPlan:
    """The plan with the lowest mean release variance over ticks ``1..horizon`` (``≥ 2``).

    Two-level plans: every block length up to 64 and 48 longer ones, leaf shares 0.10…0.90. For
    ``p ≥ 0.995`` and horizons of at least 256 ticks also three-level plans (first level
    ``4…32`` ticks, top ``4…16×`` it, at most :data:`MAX_BLOCK`): a coarse share grid picks the
    lengths, a 0.05 grid then the shares. For ``p ≥ 0.999`` and horizons of at least 2048 ticks
    also four-level plans (first level 16…32 ticks, ×8…16, top ×4…16 ≤ :data:`MAX_BLOCK`), the
    same way, and if one wins its shares are refined off the grid (moves of 0.02 and 0.01
    between two levels; issue #26). Then the best plan with hat levels (:func:`_hat_plan`, issue
    #36; ``p ≥ 0.99`` only, :data:`_HAT_P`) replaces it if its mean is lower (at ``p = 1``: both
    with their per-block schedules)."""
    best: tuple[float, LsPlan] | None = None

    def consider(levels: tuple[int, ...], shares: tuple[float, ...],
                 shapes: tuple[str, ...] = ()) -> None:
        nonlocal best
        shares = _normalised(shares)
        value = _value(p, levels, shares, model, budget, slack_units, horizon, shapes)
        if best is None or value < best[0] * (1.0 - 1e-12):
            best = (value, LsPlan(levels, shares, (), shapes))

    for a in _SHARES:
        for block in _two_level_candidates(horizon):
            consider((block,), (a, round(1.0 - a, 2)))
    if p >= _THREE_LEVEL_P and horizon >= 256:
        coarse = [(a0, a1) for a0 in (0.3, 0.4, 0.5) for a1 in (0.2, 0.3)]
        lengths = [(f, f * m) for f in _FIRST for m in _MULTIPLE
                   if f * m <= min(horizon, MAX_BLOCK)]
        scored = sorted(
            (_value(p, lv, (a0, a1, round(1.0 - a0 - a1, 2)), model, budget, slack_units,
                    horizon), lv)
            for lv in lengths for a0, a1 in coarse
        )
        if scored:
            levels3 = scored[0][1]
            for a0 in np.arange(0.15, 0.8, 0.05):
                for a1 in np.arange(0.05, 0.9 - a0, 0.05):
                    a2 = 1.0 - a0 - a1
                    if a2 >= 0.05:
                        consider(levels3, (round(a0, 2), round(a1, 2), round(a2, 2)))
    if p >= _FOUR_LEVEL_P and horizon >= 2048:
        # two coarse share vectors pick the lengths (issue #26: the equal split finds
        # 16/256/4096 at p = 1, 350.3 against 360.6 for 32/512/4096 found by the first alone)
        coarse4s = (_normalised((0.3, 0.25, 0.2, 0.25)), _normalised((0.25, 0.25, 0.25, 0.25)))
        scored4 = sorted(
            (_value(p, (f, f * m, f * m * k), coarse4, model, budget, slack_units, horizon),
             (f, f * m, f * m * k))
            for f in _FOUR_FIRST for m in _FOUR_MULTIPLE for k in _FOUR_TOP
            if f * m * k <= min(horizon, MAX_BLOCK)
            for coarse4 in coarse4s
        )
        if scored4:
            levels4 = scored4[0][1]
            for a0 in (0.25, 0.3, 0.35):
                for a1 in (0.2, 0.25, 0.3):
                    for a2 in (0.15, 0.2, 0.25):
                        consider(levels4, (a0, a1, a2, round(1.0 - a0 - a1 - a2, 2)))
            assert best is not None
            if best[1].levels == levels4:
                # issue #26: a non-uniform split, refined off the 0.05 grid (one pass of moves of
                # 0.02, then of 0.01, between any two levels: ≤ 24 more plans). At p = 1,
                # T = 32767, ε = 1 the shares 0.25/0.24/0.24/0.27 give 347.6 against 350.3
                # (equal); the continuous optimum (Nelder–Mead) is 347.49.
                for step in (0.02, 0.01):
                    for i in range(4):
                        for j in range(4):
                            shares = list(best[1].shares)
                            if i != j and shares[j] - step >= 0.05:
                                shares[i] = round(shares[i] + step, 2)
                                shares[j] = round(shares[j] - step, 2)
                                consider(levels4, tuple(shares))
    assert best is not None
    finalists = [best]
    hat = _hat_plan(p, horizon, model, budget, slack_units) if p >= _HAT_P else None
    if hat is not None:
        finalists.append(hat)
    if p == 1.0:
        # issue #26: per-top-block shares (the last block's estimate is carried by no tick of
        # the horizon, the first block's by all the later ones); each finalist (the best
        # decayed plan and the best hat plan, issue #36) is compared with its schedule, so the
        # hats are taken only where they win after scheduling too
        finalists = [_scheduled(c, model, budget, slack_units, horizon) for c in finalists]
    winner = finalists[0]
    for c in finalists[1:]:
        if c[0] < winner[0] * (1.0 - 1e-12):
            winner = c
    return winner[1]


def _scheduled(candidate: tuple[float, LsPlan], model: Model, budget: float, slack_units: float,
               horizon: int) -> tuple[float, LsPlan]:
    """``p = 1``: the candidate with its per-block schedule if that lowers its mean."""
    value, plan = candidate
    if -(-horizon // plan.block) > MAX_SCHEDULE:
        return candidate
    new, schedule = _schedule(plan.levels, plan.shares, model, budget, slack_units, horizon,
                              plan.shapes)
    if new < value * (1.0 - 1e-12):
        return new, LsPlan(plan.levels, plan.shares, schedule, plan.shapes)
    return candidate


def _climb(score: Callable[[tuple[float, ...]], float], start: tuple[float, ...]
           ) -> tuple[float, tuple[float, ...]]:
    """Shares on the 0.01 grid from ``start`` by moves of 0.05, 0.02 then 0.01 between any two
    levels, taking each improving move at once (at most :data:`_CLIMB_PASSES` passes per step;
    every share stays ≥ 0.02). Deterministic: the same floats on every machine give the same
    path, and the shares stay round numbers."""
    cur = tuple(round(a, 2) for a in start)
    val = score(cur)
    k = len(cur)
    for step in (0.05, 0.02, 0.01):
        for _ in range(_CLIMB_PASSES):
            moved = False
            for i, j in itertools.permutations(range(k), 2):
                if cur[j] - step < 0.02 - 1e-9:
                    continue
                cand = list(cur)
                cand[i] = round(cand[i] + step, 2)
                cand[j] = round(cand[j] - step, 2)
                v = score(tuple(cand))
                if v < val * (1.0 - 1e-12):
                    cur, val, moved = tuple(cand), v, True
            if not moved:
                break
    return val, cur


def _hat_plan(p: float, horizon: int, model: Model, budget: float, slack_units: float
              ) -> tuple[float, LsPlan] | None:
    """The best plan with :data:`HAT` lower levels (issue #36), or None if none fits.

    Two levels (hats of stride ``S``, flat top block ``S·m``) for every ``p``; for
    ``p ≥ 0.999`` and horizons ≥ 2048 also three (hats ``S₁ ⊂ S₂``, top ``S₂·k``), at most
    :data:`_MAX_HAT_ROWS` nodes per top block (the per-stream state). Two coarse share vectors
    pick the lengths, :func:`_climb` then the shares (measured at pure ε = 1, T = 32767:
    39.2 / 55.4 / 102.9 / 202.4 at p = 0.99 / 0.995 / 0.999 / 0.9999, 304.5 at p = 1 before the
    per-block schedule)."""
    top_max = min(horizon, MAX_BLOCK)
    best: tuple[float, LsPlan] | None = None

    def run(candidates: list[tuple[int, ...]], coarse: tuple[tuple[float, ...], ...]) -> None:
        nonlocal best
        if not candidates:
            return
        shapes_of = {lv: (HAT,) * (len(lv) - 1) + (FLAT,) for lv in candidates}

        def score(lv: tuple[int, ...], shares: tuple[float, ...]) -> float:
            return _value(p, lv, _normalised(shares), model, budget, slack_units, horizon,
                          shapes_of[lv])

        scored = sorted((score(lv, c), lv, c) for lv in candidates for c in coarse)
        starts: list[tuple[tuple[int, ...], tuple[float, ...]]] = []
        for _, lv, c in scored:
            if all(lv != seen for seen, _ in starts):
                starts.append((lv, c))
        # the coarse vectors misrank lengths by a few percent (p = 0.9999: 32 ⊂ 512 first,
        # 16 ⊂ 256 better once climbed): climb from the best two
        for levels, start in starts[:2]:
            def at(a: tuple[float, ...], lv: tuple[int, ...] = levels) -> float:
                return score(lv, a)

            value, shares = _climb(at, start)
            if best is None or value < best[0] * (1.0 - 1e-12):
                best = (value, LsPlan(levels, _normalised(shares), (), shapes_of[levels]))

    two: list[tuple[int, ...]] = [(s, s * m) for s in _HAT_STRIDES for m in _HAT_TOP
           if s * m <= top_max and s * m // s + 2 <= _MAX_HAT_ROWS]
    run(two, ((0.48, 0.5, 0.02), (0.45, 0.45, 0.1), (0.4, 0.4, 0.2)))
    if p >= _HAT3_P and horizon >= 2048:
        three: list[tuple[int, ...]] = [(s, s * m, s * m * k) for s in _HAT3_FIRST for m in _HAT3_MULTIPLE
                 for k in _HAT3_TOP if s * m * k <= top_max
                 and (s * m * k) // s + (s * m * k) // (s * m) + 3 <= _MAX_HAT_ROWS]
        run(three, ((0.33, 0.26, 0.39, 0.02), (0.3, 0.25, 0.3, 0.15), (0.25, 0.25, 0.25, 0.25)))
    return best
