"""Square-root factorisation of the decay workload, truncated to ``K`` taps, with exact error.

``W_p`` is lower-triangular Toeplitz with generating function ``1/(1 − p x)``. Its square root
``W_p^½`` has generating function ``(1 − p x)^(−1/2)``, coefficients
``c_k = binom(2k, k)/4^k · p^k`` (positive and strictly decreasing for ``p ≤ 1``).

**Truncation.** ``L_K(x) = Σ_{k<K} c_k x^k`` (a banded Toeplitz strategy: one event touches ``K``
measured coordinates) and ``B = W_p·L_K^(−1)``, generating function
``B(x) = 1/((1 − p x)·L_K(x))``. Then ``W = B·L_K`` holds *exactly* (no bias): the release is the
linear recurrence

    u_t = ỹ_t − Σ_{1≤k<K} c_k u_{t−k},      s_t = p·s_{t−1} + u_t,

on the noisy measurements ``ỹ = L_K·D + noise``. It is stable: by Eneström–Kakeya (positive,
strictly decreasing coefficients) every zero of ``L_K`` lies outside the closed unit disc, so
``B_k`` decays geometrically for ``p < 1``.

**Exact error.** With i.i.d. noise of variance ``σ²`` per coordinate, the release at tick ``t``
has variance ``σ²·Σ_{k<t} B_k²``; the L2 sensitivity per unit contribution is
``‖(c_0, …, c_{K−1})‖₂`` (every column of ``L_K`` holds the full ``K`` taps once ``t ≥ K``).

>>> [round(float(x), 4) for x in sqrt_coefficients(1.0, 4)]
[1.0, 0.5, 0.375, 0.3125]
>>> b = reconstruction_coefficients(0.5, 3, 6)
>>> bool(np.allclose(np.convolve(np.convolve(b, sqrt_coefficients(0.5, 3))[:6], [1, -0.5])[:6], [1, 0, 0, 0, 0, 0]))
True
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.signal import lfilter

from stream_dp.mechanism import Float64Array

__all__ = [
    "K_CHOICES",
    "choose_taps",
    "dense_sqrt",
    "mean_error_factor",
    "reconstruction_coefficients",
    "sqrt_coefficients",
]

#: Tap counts the planner may choose (powers of two; state is about 2K floats per stream).
K_CHOICES = (4, 8, 16, 32, 64, 128, 256)
#: Stop increasing K once the next doubling improves the mean error by less than this fraction.
_GAIN = 0.01


def sqrt_coefficients(p: float, k: int) -> Float64Array:
    """``c_0..c_{k−1}`` of ``(1 − p x)^(−1/2)``: ``binom(2i, i)/4^i · p^i``."""
    if k < 1:
        raise ValueError(f"k must be an integer ≥ 1, got {k!r}")
    i = np.arange(1, k, dtype=np.float64)
    ratios = (2.0 * i - 1.0) / (2.0 * i) * p
    out: Float64Array = np.concatenate(([1.0], np.cumprod(ratios)))
    return out


def denominator(p: float, k: int) -> Float64Array:
    """Coefficients of ``(1 − p x)·L_K(x)`` (degree ``K``), the release recurrence's polynomial."""
    out: Float64Array = np.convolve(sqrt_coefficients(p, k), [1.0, -p])
    return out


@lru_cache(maxsize=8)
def _b_cached(p: float, k: int, n: int) -> Float64Array:
    impulse = np.zeros(n)
    impulse[0] = 1.0
    out: Float64Array = np.asarray(lfilter([1.0], denominator(p, k), impulse), dtype=np.float64)
    out.setflags(write=False)
    return out


def reconstruction_coefficients(p: float, k: int, n: int) -> Float64Array:
    """``B_0..B_{n−1}`` of ``1/((1 − p x)·L_K(x))`` (series division, O(nK))."""
    return _b_cached(float(p), int(k), int(n))


def error_curve_factor(p: float, k: int, n: int) -> Float64Array:
    """``Σ_{j<t} B_j²`` for ``t = 1..n``: the release variance at tick ``t`` per unit noise."""
    b = reconstruction_coefficients(p, k, n)
    out: Float64Array = np.cumsum(b * b)
    return out


def mean_error_factor(p: float, k: int, n: int) -> float:
    """Mean over ``t = 1..n`` of the release variance, noise σ² per unit L2 sensitivity = 1."""
    c = sqrt_coefficients(p, k)
    return float(np.sum(c * c)) * float(error_curve_factor(p, k, n).mean())


@lru_cache(maxsize=256)
def choose_taps(p: float, horizon: int) -> int:
    """Smallest ``K`` in :data:`K_CHOICES` after which doubling gains < 1% (mean error)."""
    n = max(1, int(horizon))
    prev = mean_error_factor(p, K_CHOICES[0], n)
    chosen = K_CHOICES[0]
    for k in K_CHOICES[1:]:
        cur = mean_error_factor(p, k, n)
        if cur > prev * (1.0 - _GAIN):
            break
        prev, chosen = cur, k
    return chosen


def dense_sqrt(n: int, p: float, k: int) -> tuple[Float64Array, Float64Array]:
    """Dense ``(L_K, B)`` for ticks ``1..n`` (tests and checks only): ``W_p == B @ L_K``."""
    c = sqrt_coefficients(p, k)
    b = reconstruction_coefficients(p, k, n)
    big_l = np.zeros((n, n))
    big_b = np.zeros((n, n))
    for d in range(n):
        idx = np.arange(n - d)
        if d < k:
            big_l[idx + d, idx] = c[d]
        big_b[idx + d, idx] = b[d]
    return big_l, big_b


def l2_sensitivity(p: float, k: int) -> float:
    """``‖(c_0, …, c_{K−1})‖₂``: the largest column norm of ``L_K`` per unit contribution."""
    c = sqrt_coefficients(p, k)
    return math.sqrt(float(np.sum(c * c)))
