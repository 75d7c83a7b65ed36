"""Exact discrete Gaussian sampling, vectorised over streams, integer arithmetic only.

Distribution: ``P(Y = y) ∝ exp(−y² / (2σ²))`` on the integers (``σ`` in grid units). Its
variance is at most σ² and equals σ² to within a relative ``e^{−2π²σ²}``-sized term for σ ≳ 1
(:func:`discrete_gaussian_variance` computes it).

Algorithm (Canonne, Kamath, Steinke 2020, Alg. 3), with ``σ² = Fraction(σ)²`` exactly (a float
is a dyadic rational: **no rounding of the parameter**):

1. ``t = ⌊σ⌋ + 1``; draw ``Y`` from the discrete Laplace with scale ``t``
   (:func:`stream_dp.noise.laplace.laplace_core`, exact);
2. ``C ~ Bernoulli(exp(−γ))`` with ``γ = (|Y| − σ²/t)² / (2σ²)``; if ``C = 1`` return ``Y``,
   else start over. Expected attempts < 2 for every σ.

**Large σ without overflow.** The exact acceptance probability involves rationals whose
numerators and denominators exceed 64 bits as soon as σ ≳ 2^16, so step 2 is a *lazy
comparison*: ``C = [A < exp(−γ)]`` for a uniform ``A`` whose first 53 bits come from one PRF
block. The fast path computes γ in float64 (``|Y| < 2^52`` is exact; ``σ²/t`` and the difference
carry a relative error ≤ 2^-51, which makes the absolute error of γ at most
``(γ + sqrt(2γ))·2^-49``), then ``exp(−γ)`` (a few ulp). It decides only when the prefix
interval ``[a, a + 2^-53)`` lies outside ``exp(−γ)·(1 ± m)`` widened by 2^-1000, with
``m = 2**FLOAT_MARGIN_LOG2 · 2(1 + γ) ≥ 2**FLOAT_MARGIN_LOG2 · (1 + γ + sqrt(2γ))`` (default
2^-40·…: over 2^9 times the error bound).
Everything else (|Y| ≥ 2^52, a prefix near the threshold, p underflowing) goes to
:func:`stream_dp.noise._exact.uniform_below_exp`, which appends more bits of the same ``A``
(independent refinement channel) and compares against rigorous rational brackets of exp(−γ)
computed with Python integers. Both paths decide the same real-number event, so the output is
an exact discrete Gaussian sample; the margin only moves work between them.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.noise import _exact, _fast
from stream_dp.noise.laplace import laplace_core

__all__ = [
    "MAX_SIGMA",
    "MIN_SIGMA",
    "discrete_gaussian_variance",
    "sample_discrete_gaussian",
    "validate_sigma",
]

MIN_SIGMA = 2.0**-8
MAX_SIGMA = 2.0**46

_TWO53 = 2.0**-53
_TINY = 2.0**-1000


def validate_sigma(sigma: float) -> float:
    """Return ``sigma`` as a float if it is in ``[2**-8, 2**46]`` grid units, else raise."""
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float, np.floating, np.integer)):
        raise ValueError(f"sigma must be a number in [2**-8, 2**46] grid units, got {sigma!r}")
    s = float(sigma)
    if not (math.isfinite(s) and MIN_SIGMA <= s <= MAX_SIGMA):
        raise ValueError(f"sigma must be a number in [2**-8, 2**46] grid units, got {sigma!r}")
    return s


def discrete_gaussian_variance(sigma: float) -> float:
    """Variance of the discrete Gaussian with parameter ``sigma`` (grid units²).

    Direct summation for σ < 64; beyond, σ² (the relative difference is below 10^-1000).

    >>> round(discrete_gaussian_variance(1.0), 6)
    1.0
    >>> discrete_gaussian_variance(1000.0)
    1000000.0
    """
    s = validate_sigma(sigma)
    if s >= 64.0:
        return s * s
    k = np.arange(0, math.ceil(40.0 * s) + 10, dtype=np.float64)
    w = np.exp(-(k * k) / (2.0 * s * s))
    w[1:] *= 2.0
    return float(np.sum(w * k * k) / np.sum(w))


def gaussian_core(
    source: _exact.DrawSource, ids: NDArray[np.uint64], counters: NDArray[np.uint64], sigma: float
) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """Discrete Gaussian with parameter ``sigma`` for streams ``ids`` whose next draws are at
    ``counters``: (samples, counters after)."""
    s = validate_sigma(sigma)
    t = math.floor(s) + 1
    consts = (t, Fraction(s) ** 2, s * s / t, 2.0 * s * s)
    kernels = _fast.kernels
    if kernels is not None:
        return _gaussian_compiled(kernels, source, ids, counters, consts)

    def attempt(
        c_ids: NDArray[np.uint64], c_ctr: NDArray[np.uint64]
    ) -> tuple[NDArray[np.bool_], NDArray[np.int64], NDArray[np.uint64]]:
        return _attempt(source, c_ids, c_ctr, consts)

    return _exact.rejection_loop(ids, counters, attempt)


def _gaussian_compiled(
    kernels: Any,
    source: _exact.DrawSource,
    ids: NDArray[np.uint64],
    counters: NDArray[np.uint64],
    consts: tuple[int, Fraction, float, float],
) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """:func:`gaussian_core` with the acceptance test in one compiled loop: the same draws and
    decisions as :func:`_attempt` under :func:`_exact.rejection_loop`, less bookkeeping (values
    go straight into the result, one scratch buffer for the blocks)."""
    n = ids.shape[0]
    out = np.empty(n, dtype=np.int64)
    after = np.empty(n, dtype=np.uint64)
    m = min(n, _exact.CHUNK)
    status = np.empty(m, dtype=np.uint8)
    scratch = np.empty(2 * m + 2, dtype=np.uint64)
    pending: list[NDArray[np.intp]] = []
    for s in range(0, n, _exact.CHUNK):
        e = min(n, s + _exact.CHUNK)
        st = status[: e - s]
        y, ctr = _accept_compiled(kernels, source, ids[s:e], counters[s:e], consts, scratch, st)
        out[s:e] = y  # the rejected ones are overwritten by a later round
        after[s:e] = ctr
        pending.append(np.flatnonzero(st != 1) + s)
    pos = np.concatenate(pending) if pending else np.zeros(0, dtype=np.intp)
    while pos.shape[0]:
        st = np.empty(pos.shape[0], dtype=np.uint8)
        y, ctr = _accept_compiled(kernels, source, ids[pos], after[pos], consts, None, st)
        after[pos] = ctr
        ok = st == 1
        out[pos[ok]] = y[ok]
        pos = pos[~ok]
    return out, after


def _accept_compiled(
    kernels: Any,
    source: _exact.DrawSource,
    ids: NDArray[np.uint64],
    ctrs: NDArray[np.uint64],
    consts: tuple[int, Fraction, float, float],
    scratch: NDArray[np.uint64] | None,
    status: NDArray[np.uint8],
) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """One attempt per element (``status`` 1 = accepted): (Laplace proposals, counters after)."""
    t, s2_exact, q, two_s2 = consts
    y, ctrs = laplace_core(source, ids, ctrs, t, 0)
    words = source.draw(ids, ctrs, scratch)
    kernels.gaussian_accept(words, y, q, two_s2, 2.0 ** (_exact.FLOAT_MARGIN_LOG2 + 1), _TINY,
                            status)
    for e in np.flatnonzero(status == 2).tolist():
        status[e] = _exact_accept(source, int(ids[e]), int(ctrs[e]), int(y[e]),
                                  int(words[e, 0]), t, s2_exact)
    ctrs += np.uint64(1)
    return y, ctrs


def _exact_accept(source: _exact.DrawSource, sid: int, ctr: int, y: int, w0: int, t: int,
                  s2_exact: Fraction) -> bool:
    """Step 2 decided exactly for one element (the fast path could not)."""
    gamma_exact = (abs(y) - s2_exact / t) ** 2 / (2 * s2_exact)

    def more(r: int) -> int:
        return source.refine(sid, ctr, _exact.CHANNEL_GAUSS_ACCEPT, r)

    return _exact.uniform_below_exp(w0 >> 11, 53, gamma_exact, more)


def _attempt(
    source: _exact.DrawSource,
    ids: NDArray[np.uint64],
    ctrs: NDArray[np.uint64],
    consts: tuple[int, Fraction, float, float],
) -> tuple[NDArray[np.bool_], NDArray[np.int64], NDArray[np.uint64]]:
    """One attempt of CKS Alg. 3: (accepted mask, values, counters after)."""
    t, s2_exact, q, two_s2 = consts
    y, ctrs = laplace_core(source, ids, ctrs, t, 0)
    words = source.draw(ids, ctrs)
    accepted, undecided = _accept_test(words, y, q, two_s2)
    for e in undecided.tolist():
        if _exact_accept(source, int(ids[e]), int(ctrs[e]), int(y[e]), int(words[e, 0]), t,
                         s2_exact):
            accepted[e] = True
    return accepted, y, ctrs + np.uint64(1)


def _accept_test(
    words: NDArray[np.uint64], y: NDArray[np.int64], q: float, two_s2: float
) -> tuple[NDArray[np.bool_], NDArray[np.intp]]:
    """Step 2's fast path in NumPy: (accepted, positions left to the exact comparison)."""
    a = (words[:, 0] >> np.uint64(11)).astype(np.float64)
    a *= _TWO53
    ay = np.abs(y)
    big = ay >= 2**52
    gamma = ay.astype(np.float64)
    gamma -= q
    gamma *= gamma
    gamma /= two_s2
    p = np.exp(-gamma)
    # relative margin 2^FLOAT_MARGIN_LOG2 · (1 + γ + sqrt(2γ)) ≤ 2^FLOAT_MARGIN_LOG2 · 2(1 + γ)
    gamma += 1.0
    gamma *= 2.0 ** (_exact.FLOAT_MARGIN_LOG2 + 1)
    gamma *= p  # absolute margin
    gamma += _TINY
    acc = a + _TWO53 <= p - gamma
    rej = a >= p + gamma
    if big.any():
        acc &= ~big
        rej &= ~big
    return acc, np.flatnonzero(~(acc | rej))


def sample_discrete_gaussian(
    source: _exact.DrawSource, ids: NDArray[np.uint64], sigma: float
) -> NDArray[np.int64]:
    """One exact discrete Gaussian sample per stream id (draw counters start at 0)."""
    values, _ = gaussian_core(source, ids, np.zeros(ids.shape[0], dtype=np.uint64), sigma)
    return values
