"""Attribute dependence from a *noisy* bootstrap measurement (charged to the budget).

Two bootstraps, both measured once over the whole log with exact discrete Laplace noise from the
keyed samplers; :func:`measure_bootstrap` uses the one with the smaller sensitivity:

* **pair tables** (:func:`measure_pairs`): the ``2×2`` table of total counts of every pair
  (``C(m, 2)`` tables). Adding or removing one event changes exactly one cell of every pair table
  by 1: L1 sensitivity ``C(m, 2)`` (496 for m = 32), scale ``C(m, 2)/ε₀``, integer counts.
* **bounded co-occurrence** (:func:`measure_cooccurrence`, for sparse data): the number of events
  ``N``, the one-counts ``n_i`` and the co-occurrence counts ``n_ij``. An event with ``k`` ones adds
  1 to ``N``, ``w₁`` to each of its ``k`` one-counts and ``w₂`` to each of its ``C(k, 2)``
  co-occurrences, with ``w₁ = w₂ = 1`` if ``k ≤ K`` (``K = max_ones``) and otherwise
  ``w₁ = K/k``, ``w₂ = C(K, 2)/C(k, 2)``, both rounded *down* to the grid ``g = 2**-8`` (a function
  of the event alone). So one event changes the measured vector by at most
  ``1 + K + C(K, 2)`` in L1 (37 for K = 8), whatever ``m``; every value is a multiple of ``g``
  (exact in float64), so the noise is added in grid units with no rounding slack. The 2×2 table
  of a pair is then ``n11 = n_ij, n10 = n_i − n_ij, n01 = n_j − n_ij, n00 = N − n_i − n_j + n_ij``.
  Events with more than K ones are down-weighted: a bias acceptable for choosing the structure
  only (the tables themselves are measured without it).

Choosing K (:func:`measure_bootstrap`, default): 5 % of the bootstrap budget buys a noisy
histogram of the number of ones per event (one event is in one bin: sensitivity 1); K is the
smallest value that counts at least 90 % of the (noisy) events at full weight, and the pair tables
are used instead when ``1 + K + C(K, 2) ≥ C(m, 2)``. Down-weighting by ``k`` is harmless on sparse
data and badly biased on dense data (a random tree over 32 attributes with 1-rates ≈ 0.5: mean TV
0.128 / 0.212 with K = 8 against 0.022 / 0.042 with the pair tables).

Everything computed from the noisy values — one-way rates, mutual information, the null
threshold, the structure — is post-processing.

Mutual information (nats) of a pair is computed from the noisy table with negative cells clipped
to 0. Noise alone makes the plug-in MI of independent attributes positive: to second order
``MI ≈ ½ Σ_cells δ²/q``, with ``δ = noise/N`` and ``q`` the cell's probability under independence,
so ``E[MI_noise] ≈ σ²/(2N²) · Σ_cells 1/q`` (σ² the noise variance). The *excess* dependence of a
pair is its MI minus ``null_factor`` times that; pairs with excess ≤ 0 are not distinguishable
from noise and are never measured together.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from stream_dp.attributes.tables import count_table
from stream_dp.exact_budget import lower_until

__all__ = [
    "BootstrapStats",
    "PairSketch",
    "bootstrap_budgets",
    "check_bootstrap_scales",
    "choose_max_ones",
    "cooccurrence_scale",
    "cooccurrence_sensitivity",
    "cooccurrence_vector",
    "histogram_scale",
    "measure_bootstrap",
    "measure_cooccurrence",
    "measure_pairs",
    "noisy_cooccurrence",
    "noisy_ones_histogram",
    "ones_histogram",
    "pair_sensitivity",
    "pair_vector",
    "pairs_scale",
]

#: Grid of the co-occurrence weights (a power of two: sums are exact in float64).
WEIGHT_GRID = 2.0**-8
_CHUNK = 1 << 16
#: Share of the bootstrap budget spent on the histogram of ones per event (choice of K).
HISTOGRAM_SHARE = 0.05
#: Share of events the co-occurrence bootstrap must count at full weight (choice of K).
COVERAGE = 0.9
#: The co-occurrence bootstrap is used only if its sensitivity is below this share of the pair
#: tables' (its derived cells combine up to 4 noisy values: 2.25× the variance on average).
COOC_ADVANTAGE = 2.0 / 3.0
#: Default bound K on the ones of an event counted at full weight by the co-occurrence bootstrap.
DEFAULT_MAX_ONES = 8

Float64Array = NDArray[np.float64]


class BootstrapStats:
    """Exact sufficient statistics of a set of events for every bootstrap of this module.

    Per number of ones ``k = 0 … m``: the events with ``k`` ones (``counts[k]``) and the Gram
    matrix ``gram[k] = Σ x xᵀ`` over those events (diagonal: one-counts, off-diagonal:
    co-occurrences). Every bootstrap vector is a fixed linear function of these (the
    co-occurrence weights depend on ``k`` only), so a live service can add each tick's events
    as they close and measure at the end of an epoch without keeping the events. Integer
    weights keep every entry an exact integer in float64.

    >>> s = BootstrapStats.of(np.array([[1, 1, 0], [0, 1, 0]], dtype=np.uint8))
    >>> s.pair_vector().reshape(3, 4).tolist()[0]  # pair (0, 1): cells 00, 01, 10, 11
    [0.0, 1.0, 0.0, 1.0]
    """

    def __init__(self, m: int) -> None:
        if not 1 <= m <= 64:
            raise ValueError(f"m must be in [1, 64], got {m!r}")
        self.m = m
        self.counts: Float64Array = np.zeros(m + 1)
        self.gram: Float64Array = np.zeros((m + 1, m, m))

    @classmethod
    def of(cls, bits: NDArray[np.uint8], weights: NDArray[np.float64] | None = None) -> BootstrapStats:
        """The statistics of the ``(n, m)`` 0/1 matrix ``bits`` (row ``r`` counted ``weights[r]``
        times, default once)."""
        out = cls(int(bits.shape[1]))
        out.add(bits, weights)
        return out

    def add(self, bits: NDArray[np.uint8], weights: NDArray[np.float64] | None = None) -> None:
        """Add events (rows of ``bits``), each ``weights[r]`` times (whole numbers)."""
        if bits.ndim != 2 or bits.shape[1] != self.m:
            raise ValueError(f"bits must have shape (n, {self.m}), got {bits.shape}")
        for start in range(0, bits.shape[0], _CHUNK):
            chunk = bits[start : start + _CHUNK]
            w = (
                np.ones(chunk.shape[0])
                if weights is None
                else np.asarray(weights[start : start + _CHUNK], dtype=np.float64)
            )
            k = chunk.sum(axis=1, dtype=np.int64)
            for kk in np.unique(k):
                sel = k == kk
                x = chunk[sel].astype(np.float64)
                ws = w[sel]
                self.counts[kk] += ws.sum()
                self.gram[kk] += x.T @ (x * ws[:, None])

    @property
    def total(self) -> float:
        """Number of events added (with their weights)."""
        return float(self.counts.sum())

    def ones_histogram(self) -> Float64Array:
        """Events with ``k`` ones, ``k = 0 … m``."""
        out: Float64Array = self.counts.copy()
        return out

    def cooccurrence_vector(self, max_ones: int = DEFAULT_MAX_ONES) -> Float64Array:
        """:func:`cooccurrence_vector` of the events added (equal to it, entry for entry)."""
        m = self.m
        ones = np.zeros(m)
        co = np.zeros((m, m))
        for k in range(m + 1):
            if self.counts[k] == 0:
                continue
            if k > max_ones:
                w1 = float(_down(np.array(max_ones / k))[()])
                w2 = float(_down(np.array(max_ones * (max_ones - 1) / (k * (k - 1))))[()])
            else:
                w1 = w2 = 1.0
            g = self.gram[k]
            ones += w1 * np.diag(g)  # multiples of the grid: exact in any order
            co += w2 * g
        iu = np.triu_indices(m, 1)
        out: Float64Array = np.concatenate([[self.total], ones, co[iu]])
        return out

    def pair_vector(self) -> Float64Array:
        """:func:`pair_vector` of the events added: 4 cells (00, 01, 10, 11) per pair."""
        g = self.gram.sum(axis=0)
        n = self.total
        i, j = np.triu_indices(self.m, 1)
        ones = np.diag(g)
        co = g[i, j]
        cells = np.stack([n - ones[i] - ones[j] + co, ones[j] - co, ones[i] - co, co], axis=1)
        out: Float64Array = cells.reshape(-1)
        return out

    def to_bytes(self) -> bytes:
        """The rows with events, little-endian (checkpoints)."""
        rows = np.flatnonzero(self.counts)
        head = np.array([self.m, rows.size], dtype="<i8").tobytes()
        return (
            head
            + rows.astype("<i8").tobytes()
            + self.counts[rows].astype("<f8").tobytes()
            + self.gram[rows].astype("<f8").tobytes()
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> BootstrapStats:
        """Inverse of :meth:`to_bytes` (``ValueError`` on a malformed blob)."""
        try:
            m, r = (int(v) for v in np.frombuffer(data[:16], dtype="<i8"))
            out = cls(m)
            at = 16
            rows = np.frombuffer(data[at : at + 8 * r], dtype="<i8")
            at += 8 * r
            out.counts[rows] = np.frombuffer(data[at : at + 8 * r], dtype="<f8")
            at += 8 * r
            size = 8 * r * m * m
            out.gram[rows] = np.frombuffer(data[at : at + size], dtype="<f8").reshape(r, m, m)
            if at + size != len(data):
                raise ValueError("trailing bytes")
        except (ValueError, IndexError) as exc:
            raise ValueError(f"bootstrap statistics blob is malformed: {exc}") from None
        return out


def _as_stats(x: NDArray[np.uint8] | BootstrapStats) -> BootstrapStats:
    return x if isinstance(x, BootstrapStats) else BootstrapStats.of(x)


def pair_sensitivity(m: int) -> int:
    """L1 sensitivity of the pair-table bootstrap: one cell of each of ``C(m, 2)`` tables."""
    return m * (m - 1) // 2


def cooccurrence_sensitivity(max_ones: int) -> int:
    """L1 sensitivity of the co-occurrence bootstrap: ``1 + K + C(K, 2)`` (counts)."""
    return 1 + max_ones + max_ones * (max_ones - 1) // 2


@dataclass(frozen=True)
class PairSketch:
    """Noisy total-count ``2×2`` tables of every attribute pair (cells ``00, 01, 10, 11``).

    ``pairs[k] = (i, j)`` with ``i < j``; ``tables[k]`` its 4 noisy counts (events);
    ``noise_variance``: (mean) variance of each cell's noise (events²); ``epsilon``: budget
    spent; ``sensitivity``: its L1 sensitivity (counts); ``method``: which bootstrap.
    """

    m: int
    pairs: tuple[tuple[int, int], ...]
    tables: Float64Array
    noise_variance: float
    epsilon: float
    sensitivity: float = 0.0
    method: str = "pairs"
    max_ones: int | None = None
    histogram_epsilon: float = 0.0

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
    bits: NDArray[np.uint8] | BootstrapStats, epsilon: float, key: bytes, description: str
) -> PairSketch:
    """Bootstrap: noisy total counts of every pair table of the ``(n, m)`` 0/1 matrix ``bits``
    (or of the events summarised by a :class:`BootstrapStats`).

    ``epsilon`` (> 0) is spent once on all ``C(m, 2)`` tables together (sensitivity
    :func:`pair_sensitivity`); ``description`` names the run canonically and keys the noise, so
    no other measurement shares it.
    """
    from stream_dp.noise.keyed import KeyedNoise
    from stream_dp.noise.keys import stream_ids

    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"bootstrap epsilon must be a finite number > 0, got {epsilon!r}")
    stats = _as_stats(bits)
    m = stats.m
    pairs = tuple(itertools.combinations(range(m), 2))
    if not pairs:
        return PairSketch(m, (), np.zeros((0, 4)), 0.0, 0.0)
    exact = stats.pair_vector().reshape(len(pairs), 4)
    # one ulp up: the correctly rounded quotient may lie half an ulp below Δ/ε
    scale = pairs_scale(m, epsilon)
    names = [f"{description}/bootstrap/pair={i},{j}/cell={c}" for i, j in pairs for c in range(4)]
    noise = KeyedNoise(key, f"attributes-bootstrap/v1/{description}", stream_ids(names))
    noisy = exact + noise.discrete_laplace(0, scale).reshape(len(pairs), 4).astype(np.float64)
    from stream_dp.noise.laplace import discrete_laplace_variance

    sens = pair_sensitivity(m)
    return PairSketch(m, pairs, noisy, discrete_laplace_variance(scale), epsilon, sens, "pairs")


def _down(x: Float64Array) -> Float64Array:
    out: Float64Array = np.floor(x / WEIGHT_GRID) * WEIGHT_GRID
    return out


def cooccurrence_vector(bits: NDArray[np.uint8], max_ones: int = DEFAULT_MAX_ONES) -> Float64Array:
    """Exact bounded co-occurrence vector ``[N, n_0 … n_{m-1}, n_01, n_02, …]`` (pairs in
    ``itertools.combinations`` order), every entry a multiple of :data:`WEIGHT_GRID`."""
    m = int(bits.shape[1])
    ones = np.zeros(m)
    co = np.zeros((m, m))
    for start in range(0, bits.shape[0], _CHUNK):  # bounded memory; sums stay exact
        chunk = bits[start : start + _CHUNK]
        k = chunk.sum(axis=1, dtype=np.int64).astype(np.float64)
        big = k > max_ones
        kk = np.where(big, k, 2.0)
        w1 = np.where(big, _down(max_ones / kk), 1.0)
        w2 = np.where(big, _down(max_ones * (max_ones - 1) / (kk * (kk - 1))), 1.0)
        x = chunk.astype(np.float64)
        ones += x.T @ w1  # multiples of the grid: exact in any summation order
        co += x.T @ (x * w2[:, None])
    iu = np.triu_indices(m, 1)
    out: Float64Array = np.concatenate([[float(bits.shape[0])], ones, co[iu]])
    return out


def pair_vector(bits: NDArray[np.uint8]) -> Float64Array:
    """Exact counts of all pair tables, flattened (pairs in ``combinations`` order, 4 cells each)."""
    m = int(bits.shape[1])
    pairs = list(itertools.combinations(range(m), 2))
    if not pairs:
        return np.zeros(0)
    out: Float64Array = np.concatenate([count_table(bits, p) for p in pairs])
    return out


def noisy_cooccurrence(
    bits: NDArray[np.uint8] | BootstrapStats,
    epsilon: float,
    key: bytes,
    description: str,
    max_ones: int = DEFAULT_MAX_ONES,
    _weaken: float = 1.0,
) -> tuple[Float64Array, float]:
    """The noisy bounded co-occurrence vector (counts) and its noise scale (grid units).

    ``_weaken`` divides the noise scale: for the privacy audit's control only (a broken
    mechanism the audit must catch), never in releases.
    """
    from stream_dp.noise.keyed import KeyedNoise
    from stream_dp.noise.keys import stream_ids

    stats = _as_stats(bits)
    m = stats.m
    pairs = tuple(itertools.combinations(range(m), 2))
    exact = stats.cooccurrence_vector(max_ones) / WEIGHT_GRID  # integers, exactly
    scale = cooccurrence_scale(max_ones, epsilon)
    names = (
        [f"{description}/cooc/N"]
        + [f"{description}/cooc/one={i}" for i in range(m)]
        + [f"{description}/cooc/pair={i},{j}" for i, j in pairs]
    )
    noise = KeyedNoise(
        key, f"attributes-cooccurrence/v1/K={max_ones}/{description}", stream_ids(names)
    )
    draws = noise.discrete_laplace(0, scale / _weaken).astype(np.float64)
    noisy: Float64Array = (exact + draws) * WEIGHT_GRID
    return noisy, scale


def measure_cooccurrence(
    bits: NDArray[np.uint8] | BootstrapStats,
    epsilon: float,
    key: bytes,
    description: str,
    max_ones: int = DEFAULT_MAX_ONES,
) -> PairSketch:
    """Bootstrap for sparse data: noisy ``N``, ``n_i``, ``n_ij`` with bounded contributions
    (module doc); returns the derived 2×2 pair tables."""
    from stream_dp.noise.laplace import discrete_laplace_variance

    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"bootstrap epsilon must be a finite number > 0, got {epsilon!r}")
    if max_ones < 2:
        raise ValueError(f"max_ones must be ≥ 2, got {max_ones}")
    bits = _as_stats(bits)
    m = bits.m
    pairs = tuple(itertools.combinations(range(m), 2))
    noisy, scale = noisy_cooccurrence(bits, epsilon, key, description, max_ones)
    n_hat, ones_hat, co_hat = noisy[0], noisy[1 : m + 1], noisy[m + 1 :]
    i_idx = np.array([p[0] for p in pairs], dtype=np.int64)
    j_idx = np.array([p[1] for p in pairs], dtype=np.int64)
    n11 = co_hat
    n10 = ones_hat[i_idx] - co_hat
    n01 = ones_hat[j_idx] - co_hat
    n00 = n_hat - ones_hat[i_idx] - ones_hat[j_idx] + co_hat
    tables = np.stack([n00, n01, n10, n11], axis=1) if pairs else np.zeros((0, 4))
    var = discrete_laplace_variance(scale) * WEIGHT_GRID**2
    # cells combine 1, 2, 2 and 4 noisy values: mean variance 2.25 σ²
    return PairSketch(
        m, pairs, tables, 2.25 * var, epsilon, float(cooccurrence_sensitivity(max_ones)), "cooc"
    )


def ones_histogram(bits: NDArray[np.uint8]) -> Float64Array:
    """Exact number of events with ``k`` ones, ``k = 0 … m`` (one event: one bin, L1 change 1)."""
    m = int(bits.shape[1])
    out: Float64Array = np.bincount(bits.sum(axis=1, dtype=np.int64), minlength=m + 1).astype(
        np.float64
    )
    return out


def noisy_ones_histogram(
    bits: NDArray[np.uint8] | BootstrapStats, epsilon: float, key: bytes, description: str
) -> Float64Array:
    """:func:`ones_histogram` with discrete Laplace noise of scale ``1/ε`` (sensitivity 1)."""
    from stream_dp.noise.keyed import KeyedNoise
    from stream_dp.noise.keys import stream_ids

    stats = _as_stats(bits)
    m = stats.m
    names = [f"{description}/ones-histogram/k={k}" for k in range(m + 1)]
    noise = KeyedNoise(key, f"attributes-ones-histogram/v1/{description}", stream_ids(names))
    scale = histogram_scale(epsilon)
    out: Float64Array = stats.ones_histogram() + noise.discrete_laplace(0, scale).astype(np.float64)
    return out


def choose_max_ones(histogram: Float64Array, m: int, coverage: float | None = None) -> int | None:
    """Smallest ``K ≥ 2`` such that at most ``1 − coverage`` of the (noisy, clipped) events have
    more than ``K`` ones — those are the only ones the co-occurrence bootstrap down-weights, and
    down-weighting by ``k`` biases the dependence (on dense data badly). ``None`` when that ``K``
    makes the co-occurrence bootstrap no cheaper than the pair tables: use those."""
    coverage = COVERAGE if coverage is None else coverage
    h = np.clip(np.asarray(histogram, dtype=np.float64), 0.0, None)
    total = float(h.sum())
    above = total - np.cumsum(h)  # above[K] = events with more than K ones
    for k in range(2, m + 1):
        if above[k] <= (1.0 - coverage) * total:
            return k if cooccurrence_sensitivity(k) < COOC_ADVANTAGE * pair_sensitivity(m) else None
    return None


def bootstrap_budgets(epsilon: float, histogram: bool) -> tuple[float, float]:
    """``(ε_h, rest)``: the bootstrap's budget ``epsilon`` split between the histogram of ones
    (:data:`HISTOGRAM_SHARE`, 0 without it) and the pair measurement. ``rest`` is
    ``fl(ε − ε_h)`` lowered ulp by ulp until ``ε_h + rest ≤ ε`` holds exactly (the rounded
    difference can lie half an ulp above the rational one)."""
    if not histogram:
        return 0.0, epsilon
    eps_h = HISTOGRAM_SHARE * epsilon
    room = Fraction(epsilon) - Fraction(eps_h)
    return eps_h, lower_until(epsilon - eps_h, lambda r: Fraction(r) <= room)


def histogram_scale(epsilon: float) -> float:
    """Noise scale of the histogram of ones (sensitivity 1): one ulp above ``fl(1/ε)``, hence
    ``≥ 1/ε`` exactly (the rounded quotient may lie half an ulp below)."""
    return math.nextafter(_over(1.0, epsilon), math.inf)


def _over(change: float, epsilon: float) -> float:
    """``change/epsilon``, ``inf`` for a budget that underflowed to 0 (e.g. 5 % of a subnormal
    ε₀): the samplers then refuse the scale in one line instead of a ZeroDivisionError."""
    return change / epsilon if epsilon > 0 else math.inf


def pairs_scale(m: int, epsilon: float) -> float:
    """Noise scale of the pair tables: one ulp above ``fl(C(m, 2)/ε)`` (≥ ``C(m, 2)/ε``)."""
    return math.nextafter(_over(pair_sensitivity(m), epsilon), math.inf)


def cooccurrence_scale(max_ones: int, epsilon: float) -> float:
    """Noise scale (grid units) of the co-occurrence bootstrap: one ulp above
    ``fl(Δ/(g·ε))``, ``Δ`` = :func:`cooccurrence_sensitivity` (≥ ``Δ/(g·ε)`` exactly)."""
    return math.nextafter(_over(cooccurrence_sensitivity(max_ones) / WEIGHT_GRID, epsilon),
                          math.inf)


def check_bootstrap_scales(m: int, epsilon: float) -> None:
    """``ValueError`` (one line) unless every bootstrap :func:`measure_bootstrap` may run at
    budget ``epsilon`` for ``m`` attributes (histogram of ones, pair tables, co-occurrences for
    every K it may choose) has a noise scale the exact sampler accepts (``[2**-8, 2**50]`` grid
    units). Which one runs depends on noisy data, so the service checks all at start-up rather
    than fail at an epoch's end."""
    from stream_dp.noise.laplace import MAX_SCALE, MIN_SCALE

    if m < 2 or epsilon <= 0:
        return
    eps_h, rest = bootstrap_budgets(epsilon, True)
    scales = [histogram_scale(eps_h), pairs_scale(m, rest), pairs_scale(m, epsilon)]
    scales += [cooccurrence_scale(k, r) for k in range(2, m + 1) for r in (rest, epsilon)
               if cooccurrence_sensitivity(k) < pair_sensitivity(m)]
    if min(scales) < MIN_SCALE:
        raise ValueError(
            f"the bootstrap budget ε₀ = {epsilon:g} is too large for {m} attributes: a "
            f"bootstrap noise scale would be {min(scales):.3g} grid units, below the exact "
            f"sampler's minimum {MIN_SCALE:g}; lower the bootstrap fraction at least "
            f"{MIN_SCALE / min(scales):.3g}-fold (its noise is negligible there)")
    if max(scales) > MAX_SCALE:
        raise ValueError(
            f"the bootstrap budget ε₀ = {epsilon:g} is too small for {m} attributes: a "
            f"bootstrap noise scale would be {max(scales):.3g} grid units, above the exact "
            f"sampler's maximum {MAX_SCALE:g}; use a larger bootstrap fraction or ε")


def measure_bootstrap(
    bits: NDArray[np.uint8] | BootstrapStats,
    epsilon: float,
    key: bytes,
    description: str,
    max_ones: int | None = None,
) -> PairSketch:
    """The bootstrap with the smaller sensitivity (module doc), for a total budget ``epsilon``.

    ``max_ones=None`` (default): spend :data:`HISTOGRAM_SHARE` of ``epsilon`` on a noisy
    histogram of the number of ones per event (sensitivity 1) and pick ``K`` with
    :func:`choose_max_ones`; the rest goes to the chosen bootstrap. A fixed ``max_ones`` skips
    the histogram. ``bits`` may be a :class:`BootstrapStats` of the events instead.
    """
    bits = _as_stats(bits)
    m = bits.m
    eps_h, rest = bootstrap_budgets(epsilon, max_ones is None)
    if max_ones is None:
        hist = noisy_ones_histogram(bits, eps_h, key, description)
        chosen = choose_max_ones(hist, m)
    else:
        chosen = max_ones if cooccurrence_sensitivity(max_ones) < pair_sensitivity(m) else None
    if chosen is not None:
        sk = measure_cooccurrence(bits, rest, key, description, chosen)
    else:
        sk = measure_pairs(bits, rest, key, description)
    return dataclasses.replace(sk, epsilon=epsilon, max_ones=chosen, histogram_epsilon=eps_h)
