"""Attribute dependence from a *noisy* bootstrap measurement (charged to the budget).

The bootstrap measures, once, the ``2×2`` table of total counts of every pair of attributes
(``C(m, 2)`` tables, ``4·C(m, 2)`` cells) with exact discrete Laplace noise from the keyed
samplers. Sensitivity from first principles: adding or removing one event changes exactly one cell
of every pair table by 1, so the L1 sensitivity is ``C(m, 2)`` and the scale is ``C(m, 2)/ε₀``
(integer counts: no rounding slack). Everything computed from these noisy tables — one-way rates,
mutual information, the null threshold, the structure — is post-processing.

Mutual information (nats) of a pair is computed from the noisy table with negative cells clipped
to 0. Noise alone makes the plug-in MI of independent attributes positive: to second order
``MI ≈ ½ Σ_cells δ²/q``, with ``δ = noise/N`` and ``q`` the cell's probability under independence,
so ``E[MI_noise] ≈ σ²/(2N²) · Σ_cells 1/q`` (σ² the noise variance). The *excess* dependence of a
pair is its MI minus ``null_factor`` times that; pairs with excess ≤ 0 are not distinguishable
from noise and are never measured together.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from stream_dp.attributes.tables import count_table

__all__ = ["PairSketch", "measure_pairs", "pair_sensitivity"]

Float64Array = NDArray[np.float64]


def pair_sensitivity(m: int) -> int:
    """L1 sensitivity of the bootstrap: one event changes one cell of each of ``C(m, 2)`` tables."""
    return m * (m - 1) // 2


@dataclass(frozen=True)
class PairSketch:
    """Noisy total-count ``2×2`` tables of every attribute pair (cells ``00, 01, 10, 11``).

    ``pairs[k] = (i, j)`` with ``i < j``; ``tables[k]`` its 4 noisy counts (events);
    ``noise_variance``: variance of each cell's noise (events²); ``epsilon``: budget spent.
    """

    m: int
    pairs: tuple[tuple[int, int], ...]
    tables: Float64Array
    noise_variance: float
    epsilon: float

    @property
    def total(self) -> float:
        """Estimated number of events (mean of the tables' totals, at least 1)."""
        if not self.pairs:
            return 1.0
        return max(1.0, float(self.tables.sum(axis=1).mean()))

    def rates(self) -> Float64Array:
        """Estimated share of events with each attribute = 1 (mean over its tables), in [0, 1]."""
        ones = np.zeros(self.m)
        seen = np.zeros(self.m)
        for (i, j), t in zip(self.pairs, self.tables, strict=True):
            ones[i] += t[2] + t[3]
            ones[j] += t[1] + t[3]
            seen[i] += 1
            seen[j] += 1
        out: Float64Array = np.clip(ones / np.maximum(seen, 1) / self.total, 0.0, 1.0)
        return out

    def mutual_information(self) -> Float64Array:
        """``(m, m)`` symmetric matrix of the plug-in MI (nats) of the clipped noisy tables."""
        mi = np.zeros((self.m, self.m))
        for (i, j), t in zip(self.pairs, self.tables, strict=True):
            q = np.clip(t, 0.0, None)
            s = q.sum()
            if s <= 0:
                continue
            pr = q.reshape(2, 2) / s
            pi = pr.sum(axis=1, keepdims=True)
            pj = pr.sum(axis=0, keepdims=True)
            with np.errstate(divide="ignore", invalid="ignore"):
                terms = np.where(pr > 0, pr * np.log(pr / (pi * pj)), 0.0)
            mi[i, j] = mi[j, i] = max(0.0, float(terms.sum()))
        return mi

    def null_mi(self) -> Float64Array:
        """``(m, m)`` approximate expected MI (nats) that the noise alone produces for each pair."""
        r = np.clip(self.rates(), 1e-6, 1 - 1e-6)
        inv = 1.0 / r + 1.0 / (1.0 - r)  # Σ_x 1/p(x) for one attribute
        n = self.total
        out: Float64Array = self.noise_variance / (2.0 * n * n) * np.outer(inv, inv)
        out += 1.0 / (2.0 * n)  # sampling: χ²(1)/(2N)
        np.fill_diagonal(out, 0.0)
        return out

    def excess(self, null_factor: float = 3.0) -> Float64Array:
        """MI minus ``null_factor`` × the noise-only MI (nats); > 0 means "dependent"."""
        out: Float64Array = self.mutual_information() - null_factor * self.null_mi()
        np.fill_diagonal(out, -math.inf)
        return out


def measure_pairs(
    bits: NDArray[np.uint8], epsilon: float, key: bytes, description: str
) -> PairSketch:
    """Bootstrap: noisy total counts of every pair table of the ``(n, m)`` 0/1 matrix ``bits``.

    ``epsilon`` (> 0) is spent once on all ``C(m, 2)`` tables together (sensitivity
    :func:`pair_sensitivity`); ``description`` names the run canonically and keys the noise, so
    no other measurement shares it.
    """
    from stream_dp.noise import KeyedNoise, stream_ids

    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"bootstrap epsilon must be a finite number > 0, got {epsilon!r}")
    m = int(bits.shape[1])
    pairs = tuple(itertools.combinations(range(m), 2))
    if not pairs:
        return PairSketch(m, (), np.zeros((0, 4)), 0.0, 0.0)
    exact = np.stack([count_table(bits, p) for p in pairs])
    # one ulp up: the correctly rounded quotient may lie half an ulp below Δ/ε
    scale = math.nextafter(pair_sensitivity(m) / epsilon, math.inf)
    names = [f"{description}/bootstrap/pair={i},{j}/cell={c}" for i, j in pairs for c in range(4)]
    noise = KeyedNoise(key, f"attributes-bootstrap/v1/{description}", stream_ids(names))
    noisy = exact + noise.discrete_laplace(0, scale).reshape(len(pairs), 4).astype(np.float64)
    from stream_dp.noise import discrete_laplace_variance

    return PairSketch(m, pairs, noisy, discrete_laplace_variance(scale), epsilon)
