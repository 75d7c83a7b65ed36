"""Exact discrete Laplace sampling, vectorised over streams, integer arithmetic only.

Distribution: ``P(Y = y) ∝ exp(−|y| / b)`` on the integers (``b`` = scale in grid units), i.e. the
two-sided geometric distribution with ``q = exp(−1/b)``; variance ``2q / (1 − q)²``
(:func:`discrete_laplace_variance`).

Algorithm (Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for Differential Privacy",
Alg. 2), for the scale written exactly as ``b = t / s`` with integers ``t`` and ``s = 2**j``:

1. ``U`` uniform in ``{0, …, t−1}``;
2. ``D ~ Bernoulli(exp(−U/t))``; if ``D = 0`` start over;
3. ``V ~ Geometric``: ``P(V ≥ v) = e^{−v}``;
4. ``X = U + t·V`` (geometric with ``P(X ≥ x) = exp(−x/t)``), ``Y = floor(X / s) = X >> j``;
5. ``B`` a fair bit; if ``B = 1`` and ``Y = 0`` start over; return ``(1 − 2B)·Y``.

**No parameter rounding.** Every float is a dyadic rational, so ``b = t / 2**j`` exactly (the
mantissa and the exponent of ``b``): the sampled distribution is exactly the requested one.
``b`` must lie in ``[2**-8, 2**50]`` grid units (below, the noise would be essentially 0; the
upper end keeps every intermediate value below 2**63).

**Bits.** Each attempt uses one 128-bit PRF block ``(w0, w1)`` of the stream: ``U = w0 mod t``
(rejecting ``w0 ≥ 2^64 − (2^64 mod t)``, so ``U`` is exactly uniform; probability ≤ 2^-11),
the top 31 bits of ``w1`` start the uniform ``A`` of the test ``A < exp(−U/t)`` (step 2), the
next 32 bits start the uniform ``W`` with ``V = floor(−ln W)`` (step 3), the last bit is ``B``.

**Exactness of the comparisons.** Step 2 compares the 31-bit prefix of ``A`` with ``exp(−U/t)``
computed in float64: ``U, t < 2^53`` are exact floats, ``U/t`` is correctly rounded (relative
error 2^-53) and numpy's ``exp`` is accurate to a few ulp, so the float value is within a
relative 2^-50 of the truth; the fast path decides only when the prefix interval is farther than
a relative ``2**FLOAT_MARGIN_LOG2`` (default 2^-40) from it. Step 3 compares the 32-bit prefix of
``W`` with the exact integer thresholds ``⌊2^32·e^{−v}⌋`` (v = 1..22), computed once with rational
arithmetic. Any undecided comparison (probability ≈ 2^-30 per attempt) is resolved exactly in
:mod:`stream_dp.noise._exact` by appending more bits of the same uniform (from an independent
refinement channel keyed by the same draw), against rigorous rational brackets of exp(−γ). The
result therefore is an exact sample whatever the margins; they only change speed.

**Independence across streams.** Each element only ever reads its own blocks (its own stream id
and its own draw counter), so its value does not depend on the other streams in the batch.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from stream_dp.noise import _exact

__all__ = [
    "MAX_SCALE",
    "MIN_SCALE",
    "discrete_laplace_params",
    "discrete_laplace_variance",
    "sample_discrete_laplace",
]

MIN_SCALE = 2.0**-8
MAX_SCALE = 2.0**50

#: Test knob: fast-path window (in 2^-32 units) around the geometric thresholds that is sent to
#: the exact path. 1 = only the cells containing a threshold (the minimum for correctness).
GEOMETRIC_WINDOW = 1

_TWO64 = 1 << 64


def _geometric_thresholds() -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Ascending exact thresholds ⌊2^32 e^{-v}⌋ for v = 22..1 and matching v."""
    lows = []
    for v in range(1, 23):
        lo, hi = _exact.exp_neg_bracket(Fraction(v), 32)
        if hi - lo != 1:  # pragma: no cover - e^{-v}·2^32 is irrational, bracket is one unit
            raise AssertionError("bracket of e^-v not tight")
        lows.append(lo)
    asc = np.array(lows[::-1], dtype=np.int64)  # lows decrease with v; ascending = reversed
    return asc, np.arange(22, 0, -1, dtype=np.int64)


_THRESH, _THRESH_V = _geometric_thresholds()


def discrete_laplace_params(scale: float) -> tuple[int, int]:
    """Exact rational form ``scale = t / 2**j`` (``t`` odd unless ``j = 0``), validated.

    >>> discrete_laplace_params(1000.0)
    (1000, 0)
    >>> discrete_laplace_params(0.75)
    (3, 2)
    """
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise ValueError(f"scale must be a number in [2**-8, 2**50] grid units, got {scale!r}")
    b = float(scale)
    if not (math.isfinite(b) and MIN_SCALE <= b <= MAX_SCALE):
        raise ValueError(f"scale must be a number in [2**-8, 2**50] grid units, got {scale!r}")
    num, den = b.as_integer_ratio()  # exact; den is a power of two
    return num, den.bit_length() - 1


def discrete_laplace_variance(scale: float) -> float:
    """Exact variance ``2q/(1−q)²``, ``q = exp(−1/scale)``, of the discrete Laplace (grid units²).

    >>> round(discrete_laplace_variance(1.0), 6)
    1.841347
    """
    t, j = discrete_laplace_params(scale)
    x = -1.0 / (t / 2.0**j)
    q = math.exp(x)
    one_minus_q = -math.expm1(x)
    return 2.0 * q / (one_minus_q * one_minus_q)


def _geometric_fast(wv: NDArray[np.uint64]) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """``V = #{v ≥ 1: W < e^-v}`` from the 32-bit prefix where decided, and the undecided mask."""
    w = wv.astype(np.int64)
    pos = np.searchsorted(_THRESH, w, side="right")  # thresholds ≤ w
    v = (22 - pos).astype(np.int64)  # thresholds > w  ⇔  W < e^{-v} surely
    below = _THRESH[np.maximum(pos - 1, 0)]
    above = _THRESH[np.minimum(pos, 21)]
    win = GEOMETRIC_WINDOW
    amb = (w == 0) | ((pos > 0) & (w - below < win)) | ((pos < 22) & (above - w < win))
    return v, amb


def laplace_core(
    source: _exact.DrawSource, idx: NDArray[np.intp], t: int, j: int
) -> NDArray[np.int64]:
    """Discrete Laplace with scale ``t / 2**j`` for the elements ``idx`` of ``source``."""
    n = idx.shape[0]
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out
    t_u = np.uint64(t)
    t_f = float(t)
    power_of_two = t & (t - 1) == 0
    lim = _TWO64 - (_TWO64 % t)
    shift = np.uint64(j)
    two31 = 2.0**-31
    pending = np.arange(n, dtype=np.intp)
    while pending.size:
        words, ctrs = source.draw(idx[pending])
        w0 = words[:, 0]
        w1 = words[:, 1]
        u = w0 & (t_u - np.uint64(1)) if power_of_two else w0 % t_u
        ok_u = np.ones(w0.shape, dtype=np.bool_) if lim == _TWO64 else w0 < np.uint64(lim)
        a = (w1 >> np.uint64(33)).astype(np.float64) * two31
        p = np.exp(u.astype(np.float64) / -t_f)
        rel = _exact.margin()
        acc_d = a + two31 <= p * (1.0 - rel)
        rej_d = a >= p * (1.0 + rel)
        v, amb_v = _geometric_fast((w1 >> np.uint64(1)) & np.uint64(0xFFFFFFFF))
        sign = (w1 & np.uint64(1)).astype(np.bool_)
        live = ok_u & ~rej_d
        fast = live & acc_d & ~amb_v
        y = (u + t_u * v.astype(np.uint64)) >> shift
        y_i = y.astype(np.int64)
        accepted = fast & ~(sign & (y_i == 0))
        values = np.where(sign, -y_i, y_i)
        exact = np.flatnonzero(live & ~fast)
        for e in exact.tolist():
            res = _laplace_exact_one(source, int(idx[pending[e]]), int(ctrs[e]), t, j,
                                     int(u[e]), int(words[e, 1]), bool(acc_d[e]))
            if res is not None:
                accepted[e] = True
                values[e] = res
        out[pending[accepted]] = values[accepted]
        pending = pending[~accepted]
    return out


def _laplace_exact_one(
    source: _exact.DrawSource, i: int, ctr: int, t: int, j: int, u: int, w1: int, acc_d: bool
) -> int | None:
    """Steps 2–5 for one element with exact arithmetic; None = start over."""
    if not acc_d:
        def more_a(r: int) -> int:
            return source.refine(i, ctr, _exact.CHANNEL_LAPLACE_ACCEPT, r)

        if not _exact.uniform_below_exp(w1 >> 33, 31, Fraction(u, t), more_a):
            return None

    def more_w(r: int) -> int:
        return source.refine(i, ctr, _exact.CHANNEL_LAPLACE_GEOMETRIC, r)

    v = _exact.geometric_exact((w1 >> 1) & 0xFFFFFFFF, 32, more_w)
    y = (u + t * v) >> j
    if w1 & 1:
        if y == 0:
            return None
        y = -y
    if not -(2**63) < y < 2**63:  # pragma: no cover - probability below e^(-2^10)
        raise OverflowError("discrete Laplace sample exceeds int64")
    return y


def sample_discrete_laplace(source: _exact.DrawSource, n: int, scale: float) -> NDArray[np.int64]:
    """``n`` exact discrete Laplace samples (one per element ``0..n-1`` of ``source``)."""
    t, j = discrete_laplace_params(scale)
    return laplace_core(source, np.arange(n, dtype=np.intp), t, j)
