"""Plan of the ``tree-ls`` strategy: the block length ``b`` and the budget share of the leaves.

Two levels: every tick is a leaf (its count measured alone) and every block of ``b`` ticks is a
node measuring the block's decayed sum with fixed-point coefficients ``K_i = round(2**F·p^(b−1−i))``
(``i`` = 0-based offset in the block, ``F`` = :data:`COEFF_BITS`). The leaves get the share ``a`` of
the budget, the nodes ``1 − a``. The release is the least-squares (best linear unbiased) estimate
of the decayed sum from *all* measurements of the open block, including the nodes' and leaves'
noise that the open block will measure later (see :mod:`.mechanism`). Its exact variance is

* within block ``k`` at offset ``j`` (``1..b`` ticks of the block released):
  ``part_j = v₁·Σ_{i<j} p^(2(j−1−i)) − c_j²/V_R``, ``c_j = v₁·Σ_{i<j} p^(j−1−i)·k_i``,
  ``V_R = v₂ + v₁·Σ_i k_i²`` (``k_i = K_i/2**F``; ``v₁``/``v₂`` the exact leaf/node noise
  variances in grid units², the node's in its own units scaled by ``2**-2F``);
* plus the carried estimate of the completed blocks, ``p^(2j)·C_k`` with
  ``C_k = part_b·Σ_{m<k} p^(2bm)``.

:func:`best_plan` minimises the mean of that variance over ticks ``1..horizon`` over ``b`` and
``a`` (closed form per candidate, no simulation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from stream_dp.noise import discrete_gaussian_variance, discrete_laplace_variance

__all__ = ["COEFF_BITS", "MAX_BLOCK", "LsPlan", "best_plan", "coefficients", "curve",
           "noise_scales"]

Model = Literal["pure", "zcdp"]

#: Fixed-point bits of the node coefficients (integers ``K_i ≤ 2**F``). The node's noise lives on
#: the lattice of ``K·q`` (units ``g·2**-F``), so shifts of the data are lattice vectors.
COEFF_BITS = 12
#: Longest block considered (state is O(1) per stream; the block-start work is O(b) per block).
MAX_BLOCK = 4096
_SHARES = tuple(round(0.05 * i, 2) for i in range(2, 19))  # leaf share a ∈ {0.10, …, 0.90}


@dataclass(frozen=True)
class LsPlan:
    """Block length ``block`` (ticks, ≥ 2) and the leaves' share ``leaf_share`` ∈ (0, 1)."""

    block: int
    leaf_share: float


@lru_cache(maxsize=256)
def coefficients(p: float, block: int) -> tuple[int, ...]:
    """``K_i = round(2**F · p^(b−1−i))`` for offsets ``i = 0..b−1`` (last one ``2**F``)."""
    i = np.arange(block, dtype=np.float64)
    k = np.rint(np.ldexp(p ** (block - 1 - i), COEFF_BITS)).astype(np.int64)
    return tuple(int(v) for v in k)


def noise_scales(model: Model, budget: float, share: float, slack_units: float
                 ) -> tuple[float, float, float, float]:
    """``(leaf scale, node scale, v₁, v₂)``: noise parameters in grid units (leaf) and in node
    units ``g·2**-F`` (node), and the exact variances in grid units² (node variance scaled by
    ``2**-2F``). ``budget`` is ε (pure: discrete Laplace scales) or ρ (zCDP: discrete Gaussian σ);
    ``slack_units`` = ``cap/g + 1`` is the largest change of one rounded count."""
    k_max = float(1 << COEFF_BITS)
    if model == "pure":
        s1 = slack_units / (budget * share)
        s2 = k_max * slack_units / (budget * (1.0 - share))
        v1 = discrete_laplace_variance(s1)
        v2 = discrete_laplace_variance(s2) / (k_max * k_max)
    else:
        s1 = slack_units / math.sqrt(2.0 * budget * share)
        s2 = k_max * slack_units / math.sqrt(2.0 * budget * (1.0 - share))
        v1 = discrete_gaussian_variance(s1)
        v2 = discrete_gaussian_variance(s2) / (k_max * k_max)
    return s1, s2, v1, v2


def block_terms(p: float, block: int, v1: float, v2: float
                ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(β_j, part_j)`` for ``j = 1..b``: the decoder's weight on the block's residual and the
    exact variance of the block's own part of the release (grid units²)."""
    k = np.asarray(coefficients(p, block), dtype=np.float64) / float(1 << COEFF_BITS)
    v_r = v2 + v1 * float(k @ k)
    # running sums over i < j of p^(j−1−i)·k_i and p^(2(j−1−i)), by the recurrences u ← p·u + k
    cross = np.empty(block)
    sq = np.empty(block)
    u = 0.0
    w = 0.0
    for j in range(block):
        u = p * u + k[j]
        w = p * p * w + 1.0
        cross[j] = u
        sq[j] = w
    c = v1 * cross
    beta = c / v_r
    part = v1 * sq - c * c / v_r
    return beta, part


def curve(p: float, block: int, v1: float, v2: float, ticks: int) -> NDArray[np.float64]:
    """Exact variance (grid units²) of the releases at ticks ``1..ticks``."""
    _, part = block_terms(p, block, v1, v2)
    n_blocks = -(-ticks // block)
    m = np.arange(n_blocks, dtype=np.float64)
    if p == 1.0:
        carried = part[-1] * m
    else:
        q = p ** (2 * block)
        carried = part[-1] * (-np.expm1(m * math.log(q)) / (1.0 - q)) if q > 0 else (
            np.where(m > 0, part[-1], 0.0))
    j = np.arange(1, block + 1, dtype=np.float64)
    decay = p ** (2.0 * j)
    out = (carried[:, None] * decay[None, :] + part[None, :]).ravel()[:ticks]
    return np.asarray(out, dtype=np.float64)


def mean_variance(p: float, block: int, v1: float, v2: float, ticks: int) -> float:
    """``curve(...).mean()`` in closed form, O(b) whatever ``ticks`` (for the plan search)."""
    _, part = block_terms(p, block, v1, v2)
    full, rem = divmod(ticks, block)
    j = np.arange(1, block + 1, dtype=np.float64)
    decay = p ** (2.0 * j)
    last = float(part[-1])
    if p == 1.0:
        carried_sum = last * full * (full - 1) / 2.0  # Σ_{m<full} m·last
        carried_rem = last * full
    else:
        q = p ** (2 * block)
        # Σ_{m<full} last·(1 − q^m)/(1 − q)
        carried_sum = last / (1.0 - q) * (full - (-math.expm1(full * math.log(q)) / (1.0 - q)
                                                  if q > 0 else min(full, 1)))
        carried_rem = last * (-math.expm1(full * math.log(q)) / (1.0 - q) if q > 0 else
                              (1.0 if full > 0 else 0.0))
    total = carried_sum * float(decay.sum()) + full * float(part.sum())
    total += carried_rem * float(decay[:rem].sum()) + float(part[:rem].sum())
    return total / ticks


def _candidates(horizon: int) -> list[int]:
    top = min(horizon, MAX_BLOCK)
    small = list(range(2, min(top, 64) + 1))
    big = np.unique(np.geomspace(64, max(top, 64), 48).astype(int)).tolist() if top > 64 else []
    return sorted({b for b in small + big if 2 <= b <= top})


@lru_cache(maxsize=64)
def best_plan(p: float, horizon: int, model: Model, budget: float, slack_units: float) -> LsPlan:
    """The plan with the lowest mean release variance over ticks ``1..horizon`` (ties: shorter
    block, then smaller share). ``horizon ≥ 2``."""
    best: tuple[float, int, float] | None = None
    for share in _SHARES:
        _, _, v1, v2 = noise_scales(model, budget, share, slack_units)
        for block in _candidates(horizon):
            value = mean_variance(p, block, v1, v2, horizon)
            if best is None or value < best[0] * (1.0 - 1e-12):
                best = (value, block, share)
    assert best is not None
    return LsPlan(best[1], best[2])
