"""Plan of the ``blt`` strategy: a buffered-linear-Toeplitz (BLT) noise-correlation filter.

**Factorisation.** ``W_p = B·C`` with ``C`` lower-triangular Toeplitz,

    C(x) = 1 + Σ_i w_i·x/(1 − θ_i x)        (c_0 = 1, c_k = Σ_i w_i θ_i^(k−1) for k ≥ 1),

``d`` ≤ :data:`BUFFERS` buffers with ``θ_i ∈ (0, 1)`` and output weights ``w_i > 0`` (McMahan et
al., Dvijotham et al.: "BLT"), and ``B = W_p·C⁻¹``. The mechanism adds the noise ``N = C⁻¹Z`` to
the counts and releases the decayed sum, so the error is ``B·Z``: per-release variance
``σ²·Σ_{k<t} b_k²``.

**The inverse is a BLT too** (:func:`poles`). With ``w > 0`` the zeros of ``C`` in ``λ = 1/x``
are the roots of the secular equation ``1 + Σ_i w_i/(λ − θ_i) = 0``: one below ``θ_(1)`` and one
between each pair of consecutive ``θ``'s, all real, so ``C⁻¹(x) = 1 + Σ_j a_j·x/(1 − λ_j x)``
with ``a_j = 1/f′(λ_j) < 0``. The filter is stable iff every ``|λ_j| < 1``, i.e. iff
``C(−1) > 0`` ⇔ ``Σ_i w_i/(1 + θ_i) < 1``. The roots are found by bisection (full accuracy in
each interval), and ``m = C⁻¹`` and ``b = W_p·m`` are evaluated as sums of first-order
recurrences — never through the product polynomials, whose coefficients lose the clustered
roots near 1 at six or more buffers (the former direct-form ``lfilter`` did).

**Sensitivity** (L2, per unit contribution): the column of ``C``,
``‖c‖₂² = 1 + Σ_ij w_i w_j/(1 − θ_i θ_j)`` (closed form, no horizon), and ``Σ_{k≥1}|c_k| =
Σ_i w_i/(1 − θ_i)`` for the slack terms of :mod:`.mechanism`.

**Fit** (:func:`fit`), as jax-privacy's ``buffered_toeplitz`` does it: parameters ``logit θ`` and
``log w`` (so ``0 < θ < 1``, ``w > 0``), the exact loss — the mean per-release error over
``n = min(horizon, 2**16)`` ticks, ``L = ‖c‖₂²·(1/n)·Σ_{k<n} (n − k)·b_k²`` — and its analytic
gradient in ``O(n·d)`` (:func:`loss_and_gradient`: ``∂b_k/∂c_l = −(b∗m)_(k−l)``, so
``∂L₂/∂c_l = −Σ_k g_k (b∗m)_(k−l)`` with ``g = 2v·b``, computed by running ``g`` backwards
through the filters ``C⁻¹`` and ``W_p·C⁻¹``; ``Σ_l r_l θ^(l−1)`` and ``Σ_l r_l (l−1)θ^(l−2)`` by
Horner recurrences), minimised by L-BFGS-B for ``d = 1, 2, …`` buffers, each ``d`` from two
starts (the ``d − 1`` optimum plus one new buffer, and a geometric spread of decays), until one
more buffer gains less than :data:`_KEEP` of the loss (or ``d = BUFFERS``): fewer buffers, less
state and work per tick. At ``p = 1`` the filter restarts every block of ``horizon`` ticks, so the
sensitivity is the column norm inside a block (:func:`square_sum` with ``block``), which the fit
uses too.

**Column scaling at** ``p = 1`` (:func:`column_scales`, issue #26). Inside a block an event at
position ``j`` has the squared column norm ``S_(T−j) = Σ_{k<T−j} c_k²`` (its shifts end with the
block), below the first column's ``S_T``: the late columns have slack. The mechanism measures
with ``C' = C·D``, ``D = diag(d_j)``, ``d_j = √(S_T/S_(T−j)) ≥ 1`` (rounded down), so every
column has the norm of the first and the sensitivity is unchanged, and ``B' = W·D⁻¹·C⁻¹``: the
noise ``C⁻¹Z`` is scaled by ``1/d_t`` *after* the filter. ``C'`` is not Toeplitz; the release
variance (:func:`scaled_variance_curve`) is evaluated in ``O(T·d²)`` from first-order
recurrences. (Scaling the noise *before* the filter, ``B·D⁻¹``, is the factorisation
``W = (B·D⁻¹)(D·C)``: ``D·C`` scales rows, its column norms are not equalised and the
sensitivity grows — 3.5% at T = 32767 with the shipped fit.) For ``p < 1`` there are no blocks:
the filter runs forever, every column has the infinite norm, and only the start rows below
make ``D ≠ I``.

**Start rows at** ``p < 1`` (issue #36). ``C' = R·C·D`` with ``r_t < 1`` for the stream's first
``t₁`` ticks only (:func:`start_rows`, ``log r_t = α·e^(−t/τ)``, two fitted parameters) and
``R = D = I`` after: the infinite column ``j < t₁`` of ``R·C`` is shorter than ``S_∞ = ‖c‖₂²``
(:func:`start_column_square_sums`), so ``d_j = √(S_∞/S'_j)`` (:func:`start_scales`) equalises it
at the same σ, forever. Early noise is larger (``σ/r_t``) and divided by ``d ≥ 1`` after the
filter; over ticks ``1..32767`` at ρ = 0.5 the mean error drops from 1.000513 / 1.016618× the
lower bound to 1.000494 / 1.015138× at p = 0.995 / 0.9999 (at 0.99 and 0.999 by 10⁻⁵ and 10⁻⁴
of it: not shipped). The variance is :func:`start_variance_curve`. Fits are made by
``benchmarks/blt_start_rows.py --write`` and shipped (:func:`start_fit`).

**Row scales at** ``p = 1`` (issue #36). ``C' = R·C·D`` with ``R = diag(r_t)``, ``r_t ≤ 1`` from four
parameters (:func:`row_scales`) and ``D`` equalising the columns of ``R·C``
(:func:`row_column_square_sums`, :func:`row_column_scales`): the noise is ``D⁻¹C⁻¹R⁻¹ζ``, the
release variance :func:`scaled_variance_curve` with ``u = 1/r²``. The column-scaled family stops
at 1.0361× the bound at T = 32767; with rows, fitted jointly with (θ, w) and a weight on the
block's last-tick variance (what later blocks build on), 1.0200×. Fits are made by
``benchmarks/blt_row_scaling.py --write`` and shipped (:func:`row_fit`), never made at run time.

The parameters are rounded coarsely (:func:`_quantised`) and enter the mechanism's description
(a host that computes different ones refuses the other's checkpoints instead of mixing noise);
a fit is cached in memory and on disk (``$STREAM_DP_CACHE_DIR``, as the tree plans).

>>> th, w = fit(0.9, 255)
>>> 1 <= len(th) == len(w) <= BUFFERS and all(0 < t < 1 for t in th)
True
>>> round(mean_factor(0.9, 255, th, w) / mean_factor_sqrt_bound(0.9, 255), 2)
1.0
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize
from scipy.signal import lfilter

__all__ = [
    "BUFFERS",
    "FIT_VERSION",
    "ROWS_VERSION",
    "START_TICKS",
    "START_VERSION",
    "abs_sum",
    "block_of",
    "coefficients",
    "column_scales",
    "fit",
    "fits_used",
    "inverse_coefficients",
    "loss_and_gradient",
    "mean_factor",
    "mean_factor_sqrt_bound",
    "pin_fits",
    "poles",
    "reconstruction",
    "row_column_scales",
    "row_column_square_sums",
    "row_fit",
    "row_scales",
    "scaled_abs_rows",
    "scaled_mean_factor",
    "scaled_variance_curve",
    "square_sum",
    "start_column_square_sums",
    "start_fit",
    "start_rows",
    "start_scales",
    "start_variance_curve",
]

#: Largest number of buffers ``d`` a fit considers (state: ``2d + 1`` floats per stream).
BUFFERS = 8
#: Bumped whenever the fit changes (part of the disk-cache file name).
FIT_VERSION = 3
#: Longest horizon the fit evaluates (longer horizons use the fit at this length).
_FIT_TICKS = 1 << 16
_QUANTUM = 2.0**-32
#: L-BFGS-B iterations per start.
_MAX_ITER = 250
#: A smaller ``d`` is kept if its loss is within this relative margin of the best ``d``'s.
_KEEP = 1e-6
#: Decays are kept at most this close to 1 (``1 − θ ≥ 2**-30``).
_MAX_THETA = 1.0 - 2.0**-30


def poles(theta: NDArray[np.float64], w: NDArray[np.float64]
          ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(λ, a)``: the inverse filter ``C⁻¹(x) = 1 + Σ_j a_j·x/(1 − λ_j x)`` (``w > 0``).

    ``λ_j`` are the roots of ``f(λ) = 1 + Σ_i w_i/(λ − θ_i)`` (``f`` decreases from ``+∞`` to
    ``−∞`` between consecutive poles, and from 1 to ``−∞`` below the smallest), by bisection to
    the last bit; ``a_j = 1/f′(λ_j)``.
    """
    th = np.asarray(theta, dtype=np.float64)
    ww = np.asarray(w, dtype=np.float64)
    if th.size == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(th)
    th, ww = th[order], ww[order]
    lo = np.concatenate(([th[0] - 1.0 - 2.0 * float(np.sum(ww))], th[:-1]))
    hi = th.copy()
    for _ in range(1100):  # each step halves the bracket; stops when it no longer shrinks
        mid = 0.5 * (lo + hi)
        inner = (mid > lo) & (mid < hi)
        if not np.any(inner):
            break
        with np.errstate(divide="ignore", invalid="ignore"):
            positive = 1.0 + np.sum(ww[None, :] / (mid[:, None] - th[None, :]), axis=1) > 0.0
        lo = np.where(inner & positive, mid, lo)
        hi = np.where(inner & ~positive, mid, hi)
    lam = 0.5 * (lo + hi)
    with np.errstate(divide="ignore"):  # λ never equals a θ (strict bracket), but be safe
        slope = -np.sum(ww[None, :] / (lam[:, None] - th[None, :]) ** 2, axis=1)
    return lam, 1.0 / slope


def _geometric(lam: float, x: NDArray[np.float64]) -> NDArray[np.float64]:
    """``y_k = Σ_{j≤k} lam^(k−j)·x_j`` (a first-order recurrence)."""
    return np.asarray(lfilter([1.0], [1.0, -lam], x), dtype=np.float64)


def _through_inverse(lam: NDArray[np.float64], a: NDArray[np.float64], x: NDArray[np.float64]
                     ) -> NDArray[np.float64]:
    """``C⁻¹`` applied to the sequence ``x`` (convolution with ``m``)."""
    out = np.array(x, dtype=np.float64, copy=True)
    if len(x) > 1:
        for lj, aj in zip(lam, a, strict=True):
            out[1:] += aj * _geometric(float(lj), x[:-1])
    return out


def coefficients(theta: NDArray[np.float64], w: NDArray[np.float64], n: int) -> NDArray[np.float64]:
    """``c_0..c_{n−1}`` of ``C`` (dense oracle and tests)."""
    k = np.arange(1, n, dtype=np.float64)
    tail = (np.asarray(w)[None, :] * np.asarray(theta)[None, :] ** (k[:, None] - 1.0)).sum(axis=1)
    return np.concatenate(([1.0], tail))


def inverse_coefficients(theta: NDArray[np.float64], w: NDArray[np.float64], n: int
                         ) -> NDArray[np.float64]:
    """``m_0..m_{n−1}`` of the noise filter ``C⁻¹`` (from :func:`poles`)."""
    impulse = np.zeros(n)
    impulse[0] = 1.0
    return _through_inverse(*poles(theta, w), impulse)


def reconstruction(p: float, theta: NDArray[np.float64], w: NDArray[np.float64], n: int
                   ) -> NDArray[np.float64]:
    """``b_0..b_{n−1}`` of ``B = W_p·C⁻¹``."""
    return _geometric(float(p), inverse_coefficients(theta, w, n))


def _column_factor(theta: NDArray[np.float64], block: int | None
                   ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(F(q_ij), F′(q_ij))`` with ``q_ij = θ_iθ_j`` and ``F(q) = Σ_{k<K} q^k`` (``K = block − 1``
    terms, or ``1/(1 − q)`` for ``block=None``), so that ``Σ_{1≤k<block} c_k² = wᵀF(q)w``."""
    th = np.asarray(theta, dtype=np.float64)
    q = np.outer(th, th)
    one_minus = 1.0 - q
    if block is None:
        return 1.0 / one_minus, 1.0 / one_minus**2
    k = float(max(int(block) - 1, 0))
    with np.errstate(divide="ignore"):
        log_q = np.log(q)
    q_k = np.exp(k * log_q)  # q^K, no overflow (q < 1)
    f = -np.expm1(k * log_q) / one_minus  # (1 − q^K)/(1 − q) without cancellation
    f_prime = (f - k * q_k / q) / one_minus
    return f, f_prime


def square_sum(theta: NDArray[np.float64], w: NDArray[np.float64], block: int | None = None
               ) -> float:
    """``Σ_{k≥1} c_k²`` (closed form, infinite sum), or ``Σ_{1≤k<block} c_k²`` — the squared
    column norm of ``C`` inside a block of ``block`` ticks (the filter restarts every block at
    ``p = 1``, so an event's noise shifts end with its block)."""
    ww = np.asarray(w, dtype=np.float64)
    f, _ = _column_factor(theta, block)
    return float(ww @ f @ ww)


def abs_sum(theta: NDArray[np.float64], w: NDArray[np.float64]) -> float:
    """An upper bound on ``Σ_{k≥1} |c_k|``: ``Σ_i |w_i|/(1 − θ_i)`` (``θ_i ≥ 0``)."""
    return float(np.sum(np.abs(w) / (1.0 - np.asarray(theta))))


def loss_and_gradient(p: float, n: int, theta: NDArray[np.float64], w: NDArray[np.float64],
                      block: int | None = None
                      ) -> tuple[float, NDArray[np.float64], NDArray[np.float64]]:
    """``(L, ∂L/∂θ, ∂L/∂w)`` for ``L`` = :func:`mean_factor` over ``n`` ticks (``O(n·d)``)."""
    th = np.asarray(theta, dtype=np.float64)
    ww = np.asarray(w, dtype=np.float64)
    lam, a = poles(th, ww)
    impulse = np.zeros(n)
    impulse[0] = 1.0
    b = _geometric(float(p), _through_inverse(lam, a, impulse))
    v = (n - np.arange(n, dtype=np.float64)) / n  # tick-weight of b_k in the mean error
    l2 = float(np.sum(v * b * b))
    f, f_prime = _column_factor(th, block)
    s2 = 1.0 + float(ww @ f @ ww)
    # r_l = Σ_k g_k h_(k−l), h = b∗m: g reversed through C⁻¹ and W_p·C⁻¹
    g = (2.0 * v * b)[::-1]
    r = _geometric(float(p), _through_inverse(lam, a, _through_inverse(lam, a, g)))[::-1]
    tail = np.ascontiguousarray(r[1:][::-1])  # Horner order: last entry multiplies θ^0
    d_w = np.empty_like(th)
    d_th = np.empty_like(th)
    for i, t in enumerate(th):
        d_w[i] = -float(_geometric(float(t), tail)[-1]) if n > 1 else 0.0
        d_th[i] = (-ww[i] * float(lfilter([1.0], [1.0, -2.0 * t, t * t], tail[:-1])[-1])
                   if n > 2 else 0.0)
    ds_w = 2.0 * (f @ ww)
    ds_th = 2.0 * ww * (f_prime @ (ww * th))
    return s2 * l2, s2 * d_th + l2 * ds_th, s2 * d_w + l2 * ds_w


#: The column scales are rounded down to multiples of this (reproducible across hosts) ...
_SCALE_QUANTUM = 2.0**-20
#: ... after a relative margin that covers the float error of the square sums.
_SCALE_MARGIN = 1.0 - 2.0**-30
#: ``blt-horizon``'s ``σ`` is computed from ``S_∞`` times this: the closed forms of the square
#: sums are float (≤ 10⁻¹⁴ relative off the true sums, measured against 80-bit brute force),
#: and the margin keeps every true column, not only its float value, within the budget.
FIRST_SQ_MARGIN = 1.0 + 2.0**-30


def column_square_sums(theta: NDArray[np.float64], w: NDArray[np.float64], block: int
                       ) -> NDArray[np.float64]:
    """``S_n = Σ_{k<n} c_k² = 1 + wᵀF_n(q)w`` for ``n = 1..block`` (closed form, ``O(block·d²)``)."""
    th = np.asarray(theta, dtype=np.float64)
    ww = np.asarray(w, dtype=np.float64)
    k = np.arange(int(block), dtype=np.float64)  # n − 1 terms beyond c_0
    out = np.ones(int(block))
    d = len(th)
    for i in range(d):
        for j in range(i, d):  # q and w w^T are symmetric: each off-diagonal pair twice
            qi = float(th[i] * th[j])
            weight = float(ww[i] * ww[j]) * (1.0 if i == j else 2.0)
            out += weight * (-np.expm1(k * math.log(qi)) / (1.0 - qi))  # (1 − q^(n−1))/(1 − q)
    return out


def column_scales(theta: NDArray[np.float64], w: NDArray[np.float64], block: int,
                  sums: NDArray[np.float64] | None = None) -> NDArray[np.float64]:
    """``d_j = √(S_T/S_(T−j))`` for block positions ``j = 0..T−1`` (``T = block``), times
    ``1 − 2⁻³⁰`` and rounded down to a multiple of ``2⁻²⁰`` (``d_0 = 1``): non-decreasing, and
    ``d_j²·S_(T−j) ≤ S_T`` for every ``j`` (every scaled column at most the first's norm).
    ``sums``: :func:`column_square_sums` if already computed (``O(T·d²)``)."""
    s = column_square_sums(theta, w, block) if sums is None else np.asarray(sums)
    ratio = np.sqrt(s[-1] / s[::-1]) * _SCALE_MARGIN
    d = np.floor(ratio / _SCALE_QUANTUM) * _SCALE_QUANTUM
    d = np.maximum.accumulate(np.maximum(d, 1.0))  # floor of a non-decreasing sequence
    d[0] = 1.0
    return d


def scaled_variance_curve(theta: NDArray[np.float64], w: NDArray[np.float64],
                          scales: NDArray[np.float64], u: NDArray[np.float64],
                          p: float = 1.0) -> NDArray[np.float64]:
    """Variance of ``E_t = Σ_{s≤t} p^(t−s)·M_s/d_s`` for ``t = 0..T−1`` (``T = len(scales)``),
    where ``M = C⁻¹ζ`` and ``ζ_j`` are independent with variances ``u_j`` — the release error of
    the column-scaled factorisation (units of ``u``; ``p = 1``: a block's, ``p < 1``: the start
    rows' of :func:`start_scales`).

    ``O(T·d²)``: with ``m_k = Σ_i a_i λ_i^(k−1)`` (:func:`poles`), ``Cov(M_s, M_t) =
    Σ_i a_i λ_i^(t−s−1)·R_i(s)`` for ``t > s``, ``R_i(s) = u_s + λ_i Σ_l a_l Q_il(s)``,
    ``Q_il(s) = Σ_{j<s} u_j (λ_iλ_l)^(s−1−j)``; then ``Var E_t = p²·Var E_(t−1) + 2p·e_t Σ_i a_i
    P_i(t) + e_t² Var M_t`` with ``e = 1/d`` and ``P_i(t) = Σ_{s<t} (pλ_i)^(t−1−s) e_s R_i(s)``."""
    lam, a = poles(np.asarray(theta, dtype=np.float64), np.asarray(w, dtype=np.float64))
    uu = np.asarray(u, dtype=np.float64)
    e = 1.0 / np.asarray(scales, dtype=np.float64)
    n = len(e)
    var_m = uu.copy()
    r = np.tile(uu, (len(lam), 1))
    for i, li in enumerate(lam.tolist()):
        for j, lj in enumerate(lam.tolist()):
            q_ij = np.concatenate(([0.0], _geometric(li * lj, uu[:-1])))  # Q_ij(s)
            r[i] += li * a[j] * q_ij
            var_m += a[i] * a[j] * q_ij
    cross = np.zeros(n)  # Σ_i a_i P_i(t)
    for i, li in enumerate(lam.tolist()):
        cross[1:] += a[i] * _geometric(float(p) * li, e[:-1] * r[i][:-1])
    step = 2.0 * float(p) * e * cross + e * e * var_m
    out: NDArray[np.float64] = (np.cumsum(step) if float(p) == 1.0
                                else _geometric(float(p) ** 2, step))
    return out


def scaled_abs_rows(p: float, theta: NDArray[np.float64], w: NDArray[np.float64],
                    scales: NDArray[np.float64]) -> float:
    """An upper bound on ``max_t Σ_j |K_tj|`` with ``K = W·D⁻¹·C⁻¹·D`` over one block (``p = 1``;
    the rounding errors enter the release through ``K``). Abel summation with ``e = 1/d``:
    ``|Σ_{k≤L} m_k e_(j+k)| ≤ |b_L|e_(j+L) + Σ_{k<L} |b_k|·|e_(j+k) − e_(j+k+1)|``, so
    ``Σ_j |K_tj| ≤ e_t g_t + Σ_{r<t} |e_r − e_(r+1)|·g_r`` with ``g = d ∗ |b|`` (any scales; the
    row-scaled ones need not be monotone)."""
    from scipy.signal import fftconvolve

    d = np.asarray(scales, dtype=np.float64)
    e = 1.0 / d
    b = np.abs(reconstruction(p, theta, w, len(d)))
    g = np.asarray(fftconvolve(d, b)[: len(d)], dtype=np.float64)
    g = g * (1.0 + 1e-9) + 1e-12 * float(np.max(g))  # FFT rounding (relative to the largest)
    de = np.concatenate((np.abs(e[:-1] - e[1:]), [0.0]))
    tail = np.concatenate(([0.0], np.cumsum(de * g)[:-1]))
    return float(np.max(e * g + tail))


#: Version of the row-scale fits (their file names and the mechanism's description).
ROWS_VERSION = 1


def row_scales(params: NDArray[np.float64] | tuple[float, ...], block: int) -> NDArray[np.float64]:
    """Row scales ``r_t``, ``t = 0..T−1`` (``T = block``) of a row fit's four parameters
    ``(α, β, log a, log b)``: ``log r_t = α·log(1 + t/a) + β·log(1 + (T − 1 − t)/b)``, divided
    by their largest and rounded down to a multiple of ``2⁻²⁰`` (at least ``2⁻²⁰``): every
    ``r_t ≤ 1``, which the slack terms of the mechanism assume."""
    alpha, beta, log_a, log_b = (float(v) for v in params)
    n = int(block)
    t = np.arange(n, dtype=np.float64)
    log_r = alpha * np.log1p(t / math.exp(log_a)) + beta * np.log1p((n - 1 - t) / math.exp(log_b))
    r = np.exp(log_r - float(np.max(log_r)))
    out: NDArray[np.float64] = np.maximum(np.floor(r / _SCALE_QUANTUM) * _SCALE_QUANTUM,
                                          _SCALE_QUANTUM)
    return out


def row_column_square_sums(theta: NDArray[np.float64], w: NDArray[np.float64],
                           rows: NDArray[np.float64]) -> NDArray[np.float64]:
    """``S'_j = Σ_{k<T−j} r_(j+k)²·c_k²`` for block positions ``j = 0..T−1`` (``T = len(rows)``):
    the squared norm of column ``j`` of ``R·C`` inside a block (``O(T·d²)``; sums of positive
    terms, relative float error ≲ ``T·2⁻⁵³``)."""
    return _weighted_column_sums(theta, w, np.asarray(rows, dtype=np.float64) ** 2)


def _weighted_column_sums(theta: NDArray[np.float64], w: NDArray[np.float64],
                          v: NDArray[np.float64]) -> NDArray[np.float64]:
    """``Σ_{k<n−j} v_(j+k)·c_k²`` for ``j = 0..n−1`` (``n = len(v)``), ``O(n·d²)``."""
    th = np.asarray(theta, dtype=np.float64)
    ww = np.asarray(w, dtype=np.float64)
    vv = np.asarray(v, dtype=np.float64)
    n = len(vv)
    out = vv.copy()  # k = 0: c_0 = 1
    for i in range(len(th)):
        for j in range(i, len(th)):
            # G(j) = Σ_{k≥1} (θ_iθ_j)^(k−1) v_(j+k), run backwards from the end
            g = np.zeros(n)
            g[:-1] = lfilter([1.0], [1.0, -float(th[i] * th[j])], vv[1:][::-1])[::-1]
            out += (1.0 if i == j else 2.0) * float(ww[i] * ww[j]) * g
    return out


def row_column_scales(sums: NDArray[np.float64]) -> NDArray[np.float64]:
    """Column scales of a row-scaled block: ``d_j = √(K/S'_j)`` with ``K = max S'`` (of
    :func:`row_column_square_sums`), times ``1 − 2⁻³⁰`` and rounded down to a multiple of
    ``2⁻²⁰``, at least 1: ``d_j²·S'_j ≤ K`` for every ``j``, so every column of ``R·C·D`` has at
    most the norm ``√K``. Not monotone (the rows rise, then fall)."""
    s = np.asarray(sums, dtype=np.float64)
    ratio = np.sqrt(float(np.max(s)) / s) * _SCALE_MARGIN
    out: NDArray[np.float64] = np.maximum(np.floor(ratio / _SCALE_QUANTUM) * _SCALE_QUANTUM, 1.0)
    return out


def _rows_name(horizon: int) -> str:
    return f"blt-rows-v{ROWS_VERSION}-n{int(horizon)}.json"


@lru_cache(maxsize=32)
def row_fit(horizon: int) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]] | None:
    """``(θ, w, row parameters)`` of the row-scaled filter at ``p = 1`` for a block of
    ``horizon`` ticks, or ``None``: only shipped fits (``fits/blt-rows-v1-n<T>.json``, made by
    ``benchmarks/blt_row_scaling.py --write``; a fit at ``T = 32767`` takes minutes), so every
    host steps the same filter. (θ, w) are a fit of their own, made jointly with the rows."""
    try:
        doc = json.loads((_PACKAGED / _rows_name(int(horizon))).read_text())
        th = tuple(float(t) for t in doc["theta"])
        w = tuple(float(v) for v in doc["w"])
        rows = tuple(float(v) for v in doc["rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (1 <= len(th) == len(w) <= BUFFERS and len(rows) == 4
            and all(math.isfinite(v) for v in rows) and _stable(np.array(th), np.array(w))):
        return None
    return th, w, rows


#: Version of the start-row fits at ``p < 1`` (file names and the mechanism's description).
START_VERSION = 1
#: Longest start-row table (ticks): past it every row is 1.
START_TICKS = 1 << 16


def start_rows(params: NDArray[np.float64] | tuple[float, ...]) -> NDArray[np.float64]:
    """Start rows ``r_t`` at ``p < 1`` of the two parameters ``(α, log τ)``, ``α < 0``:
    ``log r_t = α·e^(−t/τ)``, rounded down to a multiple of ``2⁻²⁰`` (at least ``2⁻²⁰``), for
    ``t = 0..t₁−1`` with ``t₁`` the first tick where ``α·e^(−t/τ) > −2⁻²⁰`` (at most
    :data:`START_TICKS`); every later row is exactly 1."""
    alpha, log_tau = (float(v) for v in params)
    if not (math.isfinite(alpha) and math.isfinite(log_tau) and alpha < 0.0):
        raise ValueError(f"start-row parameters must be finite with alpha < 0, got {params!r}")
    tau = math.exp(log_tau)
    t1 = min(START_TICKS, max(1, math.ceil(tau * math.log(-alpha / _SCALE_QUANTUM))))
    t = np.arange(t1, dtype=np.float64)
    r = np.exp(alpha * np.exp(-t / tau))
    out: NDArray[np.float64] = np.maximum(np.floor(r / _SCALE_QUANTUM) * _SCALE_QUANTUM,
                                          _SCALE_QUANTUM)
    return out


def start_column_square_sums(theta: NDArray[np.float64], w: NDArray[np.float64],
                             rows: NDArray[np.float64], s_inf: float) -> NDArray[np.float64]:
    """``S'_j = Σ_{k≥0} r_(j+k)²·c_k² = S_∞ − Σ_{k<t₁−j} (1 − r_(j+k)²)·c_k²`` for ``j < t₁ =
    len(rows)`` (``r = 1`` from ``t₁`` on): the squared infinite norm of column ``j`` of ``R·C``
    at ``p < 1``; ``s_inf`` is ``S_∞ = ‖c‖₂²``. A sum of non-negative deficits taken from
    ``S_∞``, so ``S'_j ≤ s_inf`` in floating point too."""
    r = np.asarray(rows, dtype=np.float64)
    deficit = _weighted_column_sums(theta, w, 1.0 - r * r)
    out: NDArray[np.float64] = float(s_inf) - np.maximum(deficit, 0.0)
    return out


def start_scales(theta: NDArray[np.float64], w: NDArray[np.float64],
                 rows: NDArray[np.float64], s_inf: float
                 ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(d, S')`` of the start rows: ``d_j = √(S_∞/S'_j)`` (:func:`start_column_square_sums`)
    times ``1 − 2⁻³⁰`` and rounded down to a multiple of ``2⁻²⁰``, at least 1, so that
    ``d_j²·S'_j ≤ S_∞``: every column of ``R·C·D`` has at most the norm of the columns past
    ``t₁`` (``d = r = 1`` there)."""
    sums = start_column_square_sums(theta, w, rows, s_inf)
    ratio = np.sqrt(float(s_inf) / sums) * _SCALE_MARGIN
    d: NDArray[np.float64] = np.maximum(np.floor(ratio / _SCALE_QUANTUM) * _SCALE_QUANTUM, 1.0)
    return d, sums


def start_variance_curve(p: float, theta: NDArray[np.float64], w: NDArray[np.float64],
                         scales: NDArray[np.float64], rows: NDArray[np.float64], n: int
                         ) -> NDArray[np.float64]:
    """Release variance at ticks ``0..n−1`` (units: ``σ²``, the scaled domain's draws ``d_t·Z_t``
    of variance ``σ²/r_t²``) of the start-row factorisation at ``p < 1``: ``N = D⁻¹C⁻¹R⁻¹ζ``
    with ``D, R`` the identity from ``t₁ = len(rows)`` on.

    :func:`scaled_variance_curve` over a prefix of ``n_c ≥ 2^16`` ticks, doubled until the
    difference ``δ_t`` to the plain curve ``Σ_{k≤t} b_k²`` is below ``2⁻⁵⁶`` of it for every
    later tick (bound: ``δ_t ≤ Σ_v [(1/r_v² − 1)·β_t² + (2β_t|G_v|q_t + G_v²q_t²)/r_v²]`` with
    ``β_t = max_(k > t−t₁) |b_k|``, ``q_t = p^(t−t₁+1)``, ``G_v = Σ_(u<t₁) p^(t₁−1−u)·m_(u−v)·
    (1/d_u − 1)``); past ``n_c`` the plain curve."""
    n = int(n)
    t1 = len(rows)
    b = reconstruction(p, theta, w, max(n, t1 + 1))
    plain = np.cumsum(b * b)[:n]
    r = np.asarray(rows, dtype=np.float64)
    e = 1.0 / np.asarray(scales, dtype=np.float64)
    m = inverse_coefficients(theta, w, t1)
    # G_v: Σ_(u=v..t1−1) p^(t1−1−u)·m_(u−v)·(e_u − 1)
    pw = float(p) ** np.arange(t1 - 1, -1, -1, dtype=np.float64)  # p^(t1−1−u)
    x = pw * (e - 1.0)
    g = _correlate(m, x)
    inv_r2 = 1.0 / (r * r)
    absb = np.abs(b)
    # β_t = max over the window (t − t1, t] of |b|: a running maximum from the window's start
    suffix = np.maximum.accumulate(absb[::-1])[::-1]
    n_c = min(n, max(1 << 16, 4 * t1))
    while True:
        if n_c >= n:
            n_c = n
            break
        ts = np.arange(n_c, n, dtype=np.float64)
        beta = suffix[np.maximum(np.arange(n_c, n) - t1 + 1, 0)]
        q = float(p) ** (ts - t1 + 1)
        bound = (float(np.sum(inv_r2 - 1.0)) * beta * beta
                 + 2.0 * beta * q * float(np.sum(np.abs(g) * inv_r2))
                 + q * q * float(np.sum(g * g * inv_r2)))
        if bool(np.all(bound <= 2.0**-56 * plain[n_c:])):
            break
        n_c *= 2
    k = min(t1, n_c)
    d = np.ones(n_c)
    d[:k] = np.asarray(scales, dtype=np.float64)[:k]
    u = np.ones(n_c)
    u[:k] = inv_r2[:k]
    out = plain.copy()
    out[:n_c] = scaled_variance_curve(theta, w, d, u, float(p))
    return out


#: Version of the planned first horizon (the mechanism's description).
FIRST_VERSION = 1
#: Longest first horizon ``blt-horizon`` plans at p < 1 (ticks; a table of that many floats):
#: past it the running filter's start rows or plain filter (the gain falls as ``1/horizon``).
FIRST_TICKS = 1 << 20


def first_scales(theta: NDArray[np.float64], w: NDArray[np.float64], horizon: int,
                 s_inf: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(d, S)`` of the planned first horizon at ``p < 1`` (``blt-horizon``): the filter
    restarts once, after tick ``T = horizon``, so an event at ``j < T`` shifts only ticks
    ``j..T−1``, its column ``S_(T−j) = Σ_(k<T−j) c_k²`` (:func:`column_square_sums`, reversed:
    ``S[j] = S_(T−j)``), and ``d_j = √(S_∞/S_(T−j))`` times ``1 − 2⁻³⁰`` rounded down to a
    multiple of ``2⁻²⁰`` (at least 1, non-decreasing): ``d_j²·S_(T−j) ≤ S_∞``, the norm of every
    column after the restart."""
    sums = column_square_sums(theta, w, int(horizon))[::-1].copy()
    ratio = np.sqrt(float(s_inf) / sums) * _SCALE_MARGIN
    d = np.maximum(np.floor(ratio / _SCALE_QUANTUM) * _SCALE_QUANTUM, 1.0)
    d = np.maximum.accumulate(d)  # a floor of a non-decreasing sequence already is; made sure
    return d, sums


def first_variance_curve(p: float, theta: NDArray[np.float64], w: NDArray[np.float64],
                         scales: NDArray[np.float64], n: int) -> NDArray[np.float64]:
    """Release variance at ticks ``0..n−1`` (units: ``σ²``, the scaled draws ``d_t·Z_t`` of
    variance ``σ²``) of ``blt-horizon`` at ``p < 1``: ticks ``t < T = len(scales)`` measure
    with ``C·D`` (:func:`scaled_variance_curve`); the filter restarts at ``T``, so a release
    at ``T + u`` carries ``p^(u+1)`` times the error at ``T − 1`` plus the fresh filter's
    ``Σ_(k≤u) b_k²``, independent of it (the noise after the restart does not depend on the
    noise before)."""
    n = int(n)
    t_end = len(scales)
    first = scaled_variance_curve(theta, w, scales, np.ones(t_end), float(p))
    if n <= t_end:
        out: NDArray[np.float64] = first[:n].copy()
        return out
    b = reconstruction(p, theta, w, n - t_end)
    later = np.cumsum(b * b)
    u = np.arange(1, n - t_end + 1, dtype=np.float64)
    later += float(p) ** (2.0 * u) * float(first[-1])
    return np.concatenate((first, later))


def _correlate(m: NDArray[np.float64], x: NDArray[np.float64]) -> NDArray[np.float64]:
    """``g_v = Σ_(k<n−v) m_k·x_(v+k)`` for ``v < n = len(x)`` (direct below 4096 terms, else by
    FFT: relative error ~10⁻¹⁵ of ``Σ|m_k·x_(v+k)|``)."""
    n = len(x)
    if n <= 4096:
        return np.array([float(np.dot(m[: n - v], x[v:])) for v in range(n)])
    from scipy.signal import fftconvolve

    full = fftconvolve(x, m[::-1])  # index n − 1 + v − k … : lag v at n − 1 + v
    out: NDArray[np.float64] = np.asarray(full[n - 1: 2 * n - 1], dtype=np.float64)
    return out


def _start_name(p: float) -> str:
    return f"blt-start-v{START_VERSION}-p{float(p).hex()}.json"


@lru_cache(maxsize=32)
def start_fit(p: float) -> tuple[float, float] | None:
    """The start-row parameters ``(α, log τ)`` (:func:`start_rows`) at ``p < 1``, or ``None``:
    only shipped fits (``fits/blt-start-v1-p<hex>.json``, made with the shipped ``(θ, w)`` at
    ``T = 32767`` by ``benchmarks/blt_start_rows.py --write``), so every host steps the same
    filter."""
    if not float(p) < 1.0:
        return None
    try:
        doc = json.loads((_PACKAGED / _start_name(float(p))).read_text())
        alpha, log_tau = float(doc["alpha"]), float(doc["log_tau"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (math.isfinite(alpha) and math.isfinite(log_tau) and alpha < 0.0):
        return None
    return alpha, log_tau


def scaled_mean_factor(horizon: int, theta: NDArray[np.float64], w: NDArray[np.float64]
                       ) -> float:
    """:func:`mean_factor` at ``p = 1`` for the column-scaled factorisation (slack-free:
    ``σ² = S_T``, unit noise variance ``u_j = 1`` in the scaled domain)."""
    scales = column_scales(theta, w, int(horizon))
    sq = 1.0 + square_sum(theta, w, int(horizon))
    return sq * float(scaled_variance_curve(theta, w, scales, np.ones(int(horizon))).mean())


def block_of(p: float, horizon: int) -> int | None:
    """The filter's block length: ``horizon`` at ``p = 1`` (it restarts), else ``None``."""
    return int(horizon) if p >= 1.0 else None


def mean_factor(p: float, horizon: int, theta: NDArray[np.float64], w: NDArray[np.float64]
                ) -> float:
    """Mean over ticks ``1..horizon`` of the release variance for noise of unit L2 sensitivity
    and ``σ² = ‖c‖₂²`` (multiply by ``1/(2ρ)`` for ρ-zCDP; at ``p = 1`` the column norm inside
    one block of ``horizon`` ticks)."""
    if not _stable(np.asarray(theta, dtype=np.float64), np.asarray(w, dtype=np.float64)):
        return math.inf
    b = reconstruction(p, theta, w, horizon)
    if not np.all(np.isfinite(b)):
        return math.inf
    return (1.0 + square_sum(theta, w, block_of(p, horizon))) * float(np.cumsum(b * b).mean())


def mean_factor_sqrt_bound(p: float, horizon: int) -> float:
    """The factorisation lower bound in the same units (``2ρ`` times the zCDP bound)."""
    from stream_dp.lower_bound import nuclear_norm

    return nuclear_norm(int(horizon), float(p)) ** 2 / float(horizon) ** 2


def _stable(theta: NDArray[np.float64], w: NDArray[np.float64]) -> bool:
    """``0 < θ < 1``, ``w > 0`` and ``C(−1) > 0`` (every pole of ``C⁻¹`` inside the unit disc)."""
    return (bool(np.all((theta > 0.0) & (theta < 1.0))) and bool(np.all(w > 0.0))
            and float(np.sum(w / (1.0 + theta))) < 1.0 - 1e-12)


def _quantised(theta: NDArray[np.float64], w: NDArray[np.float64]
               ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Coarse, reproducible parameters: ``log₂(1 − θ)`` to 1/256 and ``w`` to 12 significant
    bits. The error is flat near the optimum, so this costs < 10⁻⁴ (measured); it makes two
    hosts whose optimisers end a few ulps apart agree on the mechanism (and so on its noise)."""
    gap = np.clip(1.0 - np.asarray(theta, dtype=np.float64), _QUANTUM, 1.0)
    theta_q = 1.0 - np.exp2(np.round(np.log2(gap) * 256.0) / 256.0)
    theta_q = np.clip(theta_q, 0.0, 1.0 - _QUANTUM)
    mant, expo = np.frexp(np.asarray(w, dtype=np.float64))
    w_q = np.ldexp(np.round(mant * 4096.0) / 4096.0, expo)
    # buffers whose decays round to one value are one buffer (their weights add)
    merged = {float(t): 0.0 for t in sorted(theta_q.tolist(), reverse=True)}
    for t, v in zip(theta_q.tolist(), w_q.tolist(), strict=True):
        merged[float(t)] += float(v)
    # slowest buffer first: a canonical order
    return np.array(list(merged), dtype=np.float64), np.array(list(merged.values()))


def _minimise(p: float, n: int, x0: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
    """L-BFGS-B from ``x0 = (logit θ, log w)``; ``(loss, x)`` of the best point seen."""
    d = len(x0) // 2

    def objective(x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        th = 1.0 / (1.0 + np.exp(-x[:d]))
        w = np.exp(x[d:])
        if not _stable(th, w) or np.any(th > _MAX_THETA):
            return 1e30, np.zeros_like(x)  # outside the feasible set: the line search backs off
        value, d_th, d_w = loss_and_gradient(p, n, th, w, block_of(p, n))
        if not math.isfinite(value):
            return 1e30, np.zeros_like(x)
        return value, np.concatenate([d_th * th * (1.0 - th), d_w * w])

    start = objective(x0)[0]
    res = minimize(objective, x0, jac=True, method="L-BFGS-B",
                   options={"maxiter": _MAX_ITER, "maxcor": 30, "ftol": 1e-12, "gtol": 1e-11})
    x = np.asarray(res.x, dtype=np.float64)
    value = float(res.fun)
    return (value, x) if value <= start else (start, x0)


def _spread(p: float, n: int, d: int) -> NDArray[np.float64]:
    """A start: decays ``1 − θ`` spread geometrically from ``1/span`` to 0.7, small weights."""
    span = float(n) if p >= 1.0 else min(float(n), 20.0 / (1.0 - p))
    gaps = np.geomspace(1.0 / max(span, 2.0), 0.7, d)
    w0 = 0.5 / d * np.sqrt(gaps / gaps.max())
    return np.concatenate([np.log((1.0 - gaps) / gaps), np.log(w0)])


def _grow(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """The optimum with ``d`` buffers plus a new one between the slowest and the next, weight
    a quarter of the smallest (a start for ``d + 1``)."""
    d = len(x) // 2
    logit, logw = x[:d], x[d:]
    top = np.sort(logit)[::-1]
    new = 0.5 * (top[0] + top[1]) if d > 1 else top[0] - 2.0
    return np.concatenate([logit, [new], logw, [float(np.min(logw)) - math.log(4.0)]])


def _search(p: float, n: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``d = 1, 2, …`` buffers until one more no longer gains :data:`_KEEP` (or ``BUFFERS``)."""
    value, th, w = math.inf, np.zeros(0), np.zeros(0)
    previous: NDArray[np.float64] | None = None
    for d in range(1, BUFFERS + 1):
        starts = [_spread(p, n, d)] + ([] if previous is None else [_grow(previous)])
        runs = [_minimise(p, n, x0) for x0 in starts]
        previous = min(runs, key=lambda run: run[0])[1]
        th_d, w_d = _quantised(1.0 / (1.0 + np.exp(-previous[:d])), np.exp(previous[d:]))
        value_d = mean_factor(p, n, th_d, w_d)
        if not value_d < value * (1.0 - _KEEP):
            break  # one more buffer gains less than _KEEP: keep the smaller filter
        value, th, w = value_d, th_d, w_d
    if not (math.isfinite(value) and _stable(th, w)):  # pragma: no cover - d = 1 is always stable
        raise ValueError(f"no stable BLT filter found for p = {p!r}, n = {n!r}")
    return tuple(float(t) for t in th), tuple(float(v) for v in w)


def _cache_name(p: float, n: int) -> str:
    return f"blt-fit-v{FIT_VERSION}-p{float(p).hex()}-n{n}.json"


def _cache_file(p: float, n: int) -> Path:
    from stream_dp.strategies.tree.plan import cache_dir

    return cache_dir() / _cache_name(p, n)


#: fits shipped with the package for the decays and horizons the docs, the tests and the
#: benchmarks use (a fit of 2^16 ticks takes one to several CPU-minutes): the same parameters
#: on every machine, so a worker restarted elsewhere steps the same filter
_PACKAGED = Path(__file__).parent / "fits"


def _read_fit(path: Path) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    try:
        doc = json.loads(path.read_text())
        th = tuple(float(t) for t in doc["theta"])
        w = tuple(float(v) for v in doc["w"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no or unreadable file
    return (th, w) if _usable(th, w) else None


def _usable(th: tuple[float, ...], w: tuple[float, ...]) -> bool:
    """A fit read from outside (the package, the disk cache, a deployment's record) is used
    only if it is a stable filter of 1 to :data:`BUFFERS` finite buffers."""
    return (1 <= len(th) == len(w) <= BUFFERS and all(math.isfinite(v) for v in th + w)
            and _stable(np.array(th), np.array(w)))


#: Longest ``p = 1`` horizon whose fit is extended past :data:`_FIT_TICKS` (:func:`_extended`).
_EXTEND_TICKS = 1 << 22


def _extended(horizon: int, theta: tuple[float, ...], w: tuple[float, ...]
              ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``p = 1``, ``horizon > 2**16`` (issue #36): the fit over ``2**16`` ticks plus one buffer
    slower by ``r = horizon/2**16`` (``1 − θ_new = (1 − θ_slowest)/r``), whose weight
    ``λ·w_slowest/√r`` (the square root's ``k^(−1/2)`` tail, as a mixture of decays, has
    weights ``∝ √(1 − θ)``) is chosen by a golden-section search over ``log λ ∈ [log 1/64,
    log 2]`` on the exact loss over the whole horizon (:func:`mean_factor`, unscaled, as the
    fit's); kept only if it beats the ``2**16`` fit there. Without it the filter's slowest
    decay is too fast for the block: 2.16× the lower bound at ``T = 2**20 − 1``, 1.063× with."""
    n = int(horizon)
    th, ww = np.asarray(theta, dtype=np.float64), np.asarray(w, dtype=np.float64)
    if len(th) >= BUFFERS:
        return theta, w
    r = float(n) / float(_FIT_TICKS)
    gap = (1.0 - float(th[0])) / r

    def candidate(log_lam: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        new_w = math.exp(log_lam) * float(ww[0]) / math.sqrt(r)
        return _quantised(np.concatenate(([1.0 - gap], th)), np.concatenate(([new_w], ww)))

    def loss(log_lam: float) -> float:
        return mean_factor(1.0, n, *candidate(log_lam))

    lo, hi = math.log(1.0 / 64.0), math.log(2.0)
    golden = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
    fa, fb = loss(a), loss(b)
    for _ in range(14):  # the bracket shrinks to 0.6% of its width
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - golden * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + golden * (hi - lo)
            fb = loss(b)
    best = a if fa <= fb else b
    if not min(fa, fb) < mean_factor(1.0, n, th, ww):
        return theta, w
    th_e, w_e = candidate(best)
    if not _stable(th_e, w_e):  # pragma: no cover - positive weights, decays in (0, 1)
        return theta, w
    return tuple(float(t) for t in th_e), tuple(float(v) for v in w_e)


Fit = tuple[tuple[float, ...], tuple[float, ...]]

#: the fits this process has used, by ``(p, n)`` (:func:`fits_used`)
_USED: dict[tuple[float, int], Fit] = {}
#: the fits a deployment recorded (:func:`pin_fits`), used before the package's and the cache's
_PINNED: dict[tuple[float, int], Fit] = {}


@lru_cache(maxsize=128)
def fit(p: float, horizon: int) -> Fit:
    """``(θ, w)`` minimising the mean release error over ``min(horizon, 2**16)`` ticks (slowest
    buffer first); at ``p = 1`` with ``2**16 < horizon ≤ 2**22``, that fit extended by one slower
    buffer fitted over the whole horizon (:func:`_extended`). A fit pinned by :func:`pin_fits`
    comes first, then the package's, then the disk cache (a cached fit is used only if it is a
    stable filter); a fit made here is cached on disk."""
    if float(p) >= 1.0 and _FIT_TICKS < int(horizon) <= _EXTEND_TICKS:
        key = (1.0, int(horizon))
    else:
        # p < 1 over 2 ticks has no finite optimum (the fit ran off to θ, w → 0 and no filter
        # was found: `plan`/`auto` at horizons 1 and 2 failed); 3 ticks is the shortest objective
        key = (float(p), max(2 if float(p) >= 1.0 else 3, min(int(horizon), _FIT_TICKS)))
    found = _PINNED.get(key) or _found(*key)
    if found is None:
        n = key[1]
        if key[0] >= 1.0 and n > _FIT_TICKS:
            found = _extended(n, *fit(1.0, _FIT_TICKS))
        else:
            found = _search(key[0], n)
        _write_fit(_cache_file(*key), *found)
    _USED[key] = found
    return found


def _found(p: float, n: int) -> Fit | None:
    """The package's fit for ``(p, n)``, else the disk cache's, else ``None``."""
    for known in (_PACKAGED / _cache_name(p, n), _cache_file(p, n)):
        found = _read_fit(known)
        if found is not None:
            return found
    return None


def fits_used() -> list[dict[str, object]]:
    """Every fit this process has used, as ``{"p", "n", "theta", "w"}`` (``n``: the ticks it
    is fitted over), for a deployment to record so that all its workers step the same filter.

    A fit the package does not ship is made on the host, by an optimiser whose path goes through
    the host's BLAS: on another CPU it can end at another optimum, and so another mechanism
    (docs/operations.md). :func:`pin_fits` makes a process use recorded ones.
    """
    return [{"p": p, "n": n, "theta": list(th), "w": list(w)}
            for (p, n), (th, w) in sorted(_USED.items())]


def pin_fits(fits: list[dict[str, object]]) -> bool:
    """Use these fits (as :func:`fits_used` gives them) wherever :func:`fit` is asked for their
    ``(p, n)`` from now on; ``True`` if one of them differs from a fit this process has already
    used (mechanisms built before must then be built again). ``ValueError`` for a malformed or
    unstable fit (nothing pinned)."""
    pinned: dict[tuple[float, int], Fit] = {}
    for item in fits:
        try:
            raw_p, raw_n, raw_th, raw_w = item["p"], item["n"], item["theta"], item["w"]
            if (isinstance(raw_n, bool) or not isinstance(raw_n, int)
                    or not isinstance(raw_p, (int, float)) or isinstance(raw_p, bool)
                    or not isinstance(raw_th, list) or not isinstance(raw_w, list)):
                raise TypeError("p a number, n an integer, theta and w lists")
            p, n = float(raw_p), raw_n
            th = tuple(float(t) for t in raw_th)
            w = tuple(float(v) for v in raw_w)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed blt fit {item!r}: {exc}") from None
        if not (0.0 < p <= 1.0 and n >= 2 and _usable(th, w)):
            raise ValueError(f"blt fit for p = {p!r}, n = {n!r} is not a stable filter of at "
                             f"most {BUFFERS} buffers: theta {th!r}, w {w!r}")
        pinned[(p, n)] = (th, w)
    changed = any(k in _USED and _USED[k] != v for k, v in pinned.items())
    _PINNED.update(pinned)
    fit.cache_clear()
    return changed


def _write_fit(path: Path, th: tuple[float, ...], w: tuple[float, ...]) -> None:
    """Store a fit in the disk cache (atomically; a read-only cache dir is no error)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".json.tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump({"theta": list(th), "w": list(w)}, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # read-only cache dir: the fit is still returned
