"""Plain running totals (``p = 1``): doubling epochs with super levels over blocks (private,
shared by ``tree-ls`` and ``blt``).

At ``p = 1`` a mechanism that restarts every block (``tree-ls``'s top block, ``blt``'s horizon)
adds one block's error per block forever. Both therefore run **epochs** of whole blocks: epoch 0 has ``n₀ = ⌈horizon/B⌉`` blocks, epoch ``e`` has
``n₀·2^e`` (so the epoch of tick ``t`` is ``O(log t)``). Epoch 0 is the plain mechanism at the full
budget (the figure inside the horizon is unchanged). From epoch 1 on the nested levels get
``1 − s`` of the budget (``s`` = :data:`SUPER_SHARE`) and ``s`` goes to ``m_e = ⌈log₂(n₀·2^e)⌉``
**super levels**: level ``ℓ`` measures the exact total of ``2^ℓ`` consecutive blocks of the
epoch, ``M = X + Z``, with the share ``s·ℓ/Σ_{i≤m_e} i`` (higher levels, which every later release
uses, get more). Each event lies in one block, hence in one node per super level: the shares add
up to the budget exactly as the nested levels' do.

**Estimates** (causal, Honaker-style, post-processing): a block's estimate ``E_0`` is its own
part of the release at its last tick (variance ``V̂_0`` = the block's ``part[B−1]``); when the
right child completes a level-``ℓ`` node,

    Ê_ℓ = λ_ℓ·M + (1 − λ_ℓ)·(Ê_left + Ê_right),   λ_ℓ = (1/v_ℓ)/(1/v_ℓ + 1/(2V̂_(ℓ−1))),

``V̂_ℓ = 1/(1/v_ℓ + 1/(2V̂_(ℓ−1)))`` (children and the node's own noise are independent). The
release inside epoch ``e`` at block ``k``, offset ``j``, is the sum of the completed epochs'
estimates, the estimates of the dyadic decomposition of the ``k`` completed blocks (one per set
bit of ``k``) and the open block's part: its variance is

    Σ_(e'<e) F_(e') + Σ_(ℓ: bit ℓ of k) V̂_ℓ + part_e[j],      F_e = Σ_(ℓ: bit ℓ of n_e) V̂_ℓ.

The data part of every estimate is the exact total it covers (each combination is unbiased), so
the rounding bound is that of the counts alone. Growth past the horizon: ``V̂_ℓ ≤ v_ℓ =
O(m_e⁴)`` and there are ``O(log t)`` epochs and bits, so the variance is ``O(log⁵ t)`` at worst
(measured for ``tree-ls``: 1.62× from ``t = 16T`` to ``256T`` at ``T = 32767``; docs/accuracy.md).

Exact totals of many blocks can exceed int64, so they are kept in two 32-bit limbs
(:func:`add_limbs`); :func:`fold_block` is the streaming update at a block's end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from stream_dp.noise.gaussian import discrete_gaussian_variance
from stream_dp.noise.laplace import discrete_laplace_variance

Model = Literal["pure", "zcdp"]

__all__ = [
    "SUPER_SHARE",
    "EpochNoise",
    "add_limbs",
    "epoch_noise",
    "epoch_of_block",
    "fold_block",
    "levels_needed",
    "nested_budget",
    "super_variance_at",
    "super_variance_curve",
]

#: Budget share of the super levels from epoch 1 on.
SUPER_SHARE = 0.4
#: Both parts are scaled by this so that float rounding can never make them add up to more
#: than the budget.
_SAFE = 1.0 - 2.0**-40


@dataclass(frozen=True)
class EpochNoise:
    """Super-level noise of one epoch ``e ≥ 1``: per level ``ℓ = 1..m`` (index ``ℓ − 1``) the
    noise scale (grid units), its variance, the combined variance ``V̂`` (index ``ℓ``; ``V̂_0`` the
    block's) and the weight ``λ`` of the direct measurement."""

    scales: tuple[float, ...]
    variances: tuple[float, ...]
    vhat: tuple[float, ...]
    weights: tuple[float, ...]

    @property
    def levels(self) -> int:
        return len(self.scales)


def nested_budget(budget: float) -> float:
    """The nested levels' budget in epochs ``≥ 1``: ``(1 − s)·budget``, rounded down."""
    return budget * (1.0 - SUPER_SHARE) * _SAFE


def epoch_of_block(block: int, first: int) -> tuple[int, int, int]:
    """``(e, k, n_e)`` for the global block index ``block`` (0-based): epoch, block within it,
    and the epoch's number of blocks, with ``first`` = ``n₀`` blocks in epoch 0."""
    e = (block // first + 1).bit_length() - 1
    start = first * ((1 << e) - 1)
    return e, block - start, first << e


def super_levels(n_blocks: int) -> int:
    """``m = max(1, ⌈log₂ n⌉)`` super levels for an epoch of ``n`` blocks."""
    return max(1, math.ceil(math.log2(n_blocks))) if n_blocks > 1 else 1


@lru_cache(maxsize=512)
def epoch_noise(model: Model, budget: float, slack_units: float, block_var: float,
                n_blocks: int) -> EpochNoise:
    """Super-level noise of an epoch of ``n_blocks`` blocks whose block estimates have variance
    ``block_var`` (grid units²)."""
    m = super_levels(n_blocks)
    total = m * (m + 1) / 2.0
    scales: list[float] = []
    variances: list[float] = []
    vhat = [float(block_var)]
    weights: list[float] = []
    for ell in range(1, m + 1):
        share = budget * SUPER_SHARE * ell / total * _SAFE
        if model == "pure":
            s = slack_units / share
            v = discrete_laplace_variance(s)
        else:
            s = slack_units / math.sqrt(2.0 * share)
            v = discrete_gaussian_variance(s)
        children = 2.0 * vhat[-1]
        lam = (1.0 / v) / (1.0 / v + 1.0 / children)
        scales.append(s)
        variances.append(v)
        weights.append(lam)
        vhat.append(1.0 / (1.0 / v + 1.0 / children))
    return EpochNoise(tuple(scales), tuple(variances), tuple(vhat), tuple(weights))


def _bits_sum(k: NDArray[np.int64], vhat: tuple[float, ...]) -> NDArray[np.float64]:
    out = np.zeros(k.shape, dtype=np.float64)
    for ell, v in enumerate(vhat):
        out += ((k >> ell) & 1) * v
    return out


def _epoch0_parts(part0: NDArray[np.float64], first: int) -> NDArray[np.float64]:
    """``part0`` as one row per block of epoch 0 (``first × B``): a 1-D ``part0`` is every
    block's; a 2-D one (``tree-ls``'s per-block budget schedule, issue #26) has a row per block."""
    rows = np.asarray(part0, dtype=np.float64)
    if rows.ndim == 1:
        return np.broadcast_to(rows, (first, rows.size))
    if rows.shape[0] != first:
        raise ValueError(f"part0 has {rows.shape[0]} rows for an epoch 0 of {first} blocks")
    return rows


def super_variance_at(t: int, block: int, first: int, part0: NDArray[np.float64],
                      part1: NDArray[np.float64], noise_of: object) -> float:
    """The variance of :func:`super_variance_curve` at one tick ``t`` (1-based), O(log t)
    (plus O(``first``) for a per-block ``part0``)."""
    index, j = divmod(int(t) - 1, block)
    e, k, _ = epoch_of_block(index, first)
    rows = _epoch0_parts(part0, first)
    ends = rows[:, -1]  # each epoch-0 block's estimate variance, carried by every later tick
    done = 0.0
    for ee in range(e):
        n_ee = first << ee
        if ee == 0:
            done += float(ends.sum())
        else:
            vh = noise_of(n_ee).vhat  # type: ignore[operator]
            done += sum(v for ell, v in enumerate(vh) if (n_ee >> ell) & 1)
    if e == 0:
        return done + float(ends[:k].sum()) + float(rows[k, j])
    vh = noise_of(first << e).vhat  # type: ignore[operator]
    return float(done + sum(v for ell, v in enumerate(vh) if (k >> ell) & 1) + float(part1[j]))


def super_variance_curve(part0: NDArray[np.float64], part1: NDArray[np.float64], first: int,
                         noise_of: object, ticks: int) -> NDArray[np.float64]:
    """Variance (grid units²) of the releases at ticks ``1..ticks``; ``part0``/``part1`` the
    block's own variance by offset in epoch 0 / later epochs (``part0`` may have one row per
    epoch-0 block), ``noise_of(n_blocks)`` the :class:`EpochNoise` of a later epoch."""
    rows = _epoch0_parts(part0, first)
    block = rows.shape[1]
    # the estimate variance carried into epoch-0 block k: Σ of the earlier blocks' ends
    carried0 = np.concatenate([[0.0], np.cumsum(rows[:, -1])])
    out = np.empty(ticks, dtype=np.float64)
    done = 0.0  # Σ F of the completed epochs
    e, t0 = 0, 0
    while t0 < ticks:
        n_e = first << e
        length = n_e * block
        n = min(length, ticks - t0)
        k = np.arange(n, dtype=np.int64) // block
        j = np.arange(n, dtype=np.int64) % block
        if e == 0:
            inner = carried0[k] + rows[k, j]
            final = float(carried0[-1])
        else:
            en: EpochNoise = noise_of(n_e)  # type: ignore[operator]
            inner = _bits_sum(k, en.vhat) + part1[j]
            final = float(_bits_sum(np.asarray([n_e], dtype=np.int64), en.vhat)[0])
        out[t0:t0 + n] = done + inner
        done += final
        t0 += length
        e += 1
    return out


LIMB = 32
_MASK = (1 << LIMB) - 1
#: Super-level node ids: ``2**47 | ℓ << 40 | first block`` (disjoint from ticks and tree nodes).
SUPER_BASE = 1 << 47


def add_limbs(hi: np.ndarray, lo: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(hi, lo) + x`` exactly, ``lo`` kept in ``[0, 2**32)`` (``x`` int64, any sign)."""
    lo = lo + (x & _MASK)
    hi = hi + (x >> LIMB) + (lo >> LIMB)
    return hi, lo & _MASK


def limbs_value(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """The float value of ``hi·2**32 + lo`` (rounded: used on measurements only)."""
    out: np.ndarray = np.ldexp(hi.astype(np.float64), LIMB) + lo.astype(np.float64)
    return out


def fold_block(state: dict[str, np.ndarray], block: int, first: int, own: np.ndarray,
               own_hi: np.ndarray, own_lo: np.ndarray, noise_of: object, draw: object
               ) -> np.ndarray:
    """Fold a closed block into its epoch and return the new carried estimate.

    ``state`` holds ``carry``, ``base`` and the per-level ``held``/``held_hi``/``held_lo``
    arrays; ``block`` is the global block index, ``first`` = ``n₀``; ``own`` the block's estimate
    and ``(own_hi, own_lo)`` its exact total (limbs). ``noise_of(n_blocks)`` gives the epoch's
    :class:`EpochNoise`, ``draw(node_id, scale)`` an integer noise sample per stream.
    """
    e, k, n_e = epoch_of_block(block, first)
    base = np.asarray(state["base"], dtype=np.float64)
    if e == 0:
        carry = np.asarray(state["carry"], dtype=np.float64) + own
    else:
        held, hi, lo = state["held"], state["held_hi"], state["held_lo"]
        en: EpochNoise = noise_of(n_e)  # type: ignore[operator]
        cur, cur_hi, cur_lo = own, own_hi, own_lo
        ell, i = 0, k
        while i & 1:  # the node is a right child: its parent (level ℓ + 1) completes
            p_hi, p_lo = add_limbs(hi[ell] + cur_hi, lo[ell], cur_lo)
            first_block = block - ((1 << (ell + 1)) - 1)
            z = np.asarray(draw(SUPER_BASE | ((ell + 1) << 40) | first_block,  # type: ignore[operator]
                                en.scales[ell]), dtype=np.int64)
            m_hi, m_lo = add_limbs(p_hi, p_lo, z)  # M = X + Z, exactly
            lam = en.weights[ell]
            cur = lam * limbs_value(m_hi, m_lo) + (1.0 - lam) * (held[ell] + cur)
            cur_hi, cur_lo = p_hi, p_lo
            ell += 1
            i >>= 1
        held[ell] = cur
        hi[ell] = cur_hi
        lo[ell] = cur_lo
        done = k + 1
        carry = base.copy()
        for level in range(done.bit_length()):
            if (done >> level) & 1:
                carry += held[level]
    if k + 1 == n_e:  # the epoch ends: its estimate becomes the base of the next
        state["base"] = carry.copy()
    out: np.ndarray = carry
    return out


def levels_needed(max_blocks: int) -> int:
    """Rows of the ``held`` arrays for at most ``max_blocks`` blocks in one epoch."""
    return max(1, math.ceil(math.log2(max(2, max_blocks)))) + 1
