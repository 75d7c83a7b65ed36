"""Exact discrete Laplace sampling, vectorised over streams, integer arithmetic only.

Distribution: ``P(Y = y) ∝ exp(−|y| / b)`` on the integers (``b`` = scale in grid units), i.e. the
two-sided geometric distribution with ``q = exp(−1/b)``; variance ``2q / (1 − q)²``
(:func:`discrete_laplace_variance`).

Algorithm: Canonne, Kamath, Steinke 2020 ("The Discrete Gaussian for Differential Privacy"),
Alg. 2, for the scale written exactly as ``b = t / s`` with integers ``t`` and ``s = 2**j``, with
one generalisation that cuts the rejection rate from 37% to about 6%:

1. ``U`` uniform in ``{0, …, t'−1}`` where ``t' = ⌊t/8⌋`` (``t`` and ``s`` are first multiplied by
   the same power of two so that ``t ≥ 2^12``, which leaves ``t/s`` unchanged);
2. ``D ~ Bernoulli(exp(−U/t))``; if ``D = 0`` start over (so ``P(U = u) ∝ exp(−u/t)``);
3. ``V ~ Geometric``: ``P(V ≥ v) = exp(−v·t'/t)``;
4. ``X = U + t'·V``; ``Y = floor(X / s) = X >> j``;
5. ``B`` a fair bit; if ``B = 1`` and ``Y = 0`` start over; return ``(1 − 2B)·Y``.

Correctness: ``P(X = x) ∝ exp(−x/t)`` for ``x = u + t'v`` because ``exp(−x/t) = exp(−u/t) ·
exp(−v t'/t)`` factorises over the unique decomposition of ``x`` (CKS use ``t' = t``); so ``X``
is geometric with ``P(X ≥ x) = exp(−x/t)``, ``P(Y ≥ y) = exp(−y s/t)`` for ``y ≥ 0``, and the
sign step gives the two-sided distribution (CKS Thm. 26 / Alg. 2).

**No parameter rounding.** Every float is a dyadic rational, so ``b = t / 2**j`` exactly
(mantissa and exponent): the sampled distribution is exactly the requested one. ``b`` must lie
in ``[2**-8, 2**50]`` grid units (below, the noise is essentially 0; the upper end keeps every
intermediate value below 2**63).

**Bits.** Each attempt uses one 128-bit PRF block ``(w0, w1)`` of the stream: ``U = w0 mod t'``
(rejecting ``w0 ≥ 2^64 − (2^64 mod t')``, so ``U`` is exactly uniform; probability ≤ 2^-14);
the top 31 bits of ``w1`` start the uniform ``A`` of the test ``A < exp(−U/t)`` (step 2), the
next 32 bits start the uniform ``W`` with ``V = #{v ≥ 1 : W < exp(−v t'/t)}`` (step 3), the last
bit is ``B``.

**Exactness of the comparisons.** Step 2 compares the 31-bit prefix of ``A`` with ``exp(−U/t)``
in float64: ``U < 2^53`` is exact, ``U·fl(−1/t)`` is within a relative 2^-52 of ``−U/t`` (so
``γ = U/t ≤ 1/8`` is within 2^-55 absolutely) and numpy's ``exp`` is accurate to a few ulp, so the
float value is within a relative 2^-50 of the truth (the compiled kernel instead multiplies three
table entries ``exp(−x/t)`` for the 10-bit digits of ``U``, each within a relative 2^-50.9,
with two roundings: within 2^-49); the fast path decides only when the prefix
interval is farther than a relative ``2**FLOAT_MARGIN_LOG2`` (default 2^-40) from it. Step 3
compares the 32-bit prefix of ``W`` with the exact integer thresholds ``⌊2^32 exp(−v t'/t)⌋``
(computed once per scale with rational arithmetic, via a 2^14-cell lookup table). Any
undecided comparison (about 1 in 10^7 samples, measured) is resolved exactly in
:mod:`stream_dp.noise._exact` by appending more bits of the *same* uniform (from an independent
refinement channel keyed by the same draw) against rigorous rational brackets of exp(−γ). Both
paths decide the same real-number events, so the sample is exact and does not depend on the
margins (a test checks bit-identical output with the fast path switched off).

**Independence across streams.** Each element only reads its own blocks (its own stream id and
its own draw counter), so its value does not depend on the other streams in the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.noise import _exact, _fast

__all__ = [
    "MAX_SCALE",
    "MIN_SCALE",
    "discrete_laplace_params",
    "discrete_laplace_variance",
    "sample_discrete_laplace",
]

MIN_SCALE = 2.0**-8
MAX_SCALE = 2.0**50

#: Test knob: fast-path window (in 2^-32 units of ``W``) around each geometric threshold that is
#: sent to the exact path. 1 = only the cells containing a threshold (the minimum); larger
#: values also disable the lookup table.
GEOMETRIC_WINDOW = 1

_TWO64 = 1 << 64
_TAB_BITS = 14
_SPLIT = 8  # t' = t // 8
_MIN_T = 1 << 12  # numerators below are scaled up by a power of two (same rational)


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


def _floor_exp_neg(gamma: Fraction, prec: int) -> int:
    """⌊2^prec·exp(−γ)⌋ exactly (γ > 0 rational, so exp(−γ)·2^prec is irrational)."""
    extra = 8
    while True:
        lo, hi = _exact.exp_neg_bracket(gamma, prec + extra)
        flo, fhi = lo >> extra, hi >> extra
        if flo == fhi or (hi & ((1 << extra) - 1) == 0 and fhi == flo + 1):
            return flo
        extra += 32


@dataclass(frozen=True)
class _Plan:
    """Everything precomputed for one scale ``t / 2**j``."""

    t: int
    j: int
    tp: int  # t'
    rate: Fraction  # t'/t: P(V ≥ v) = exp(−v·rate)
    thresh: NDArray[np.int64]  # ascending ⌊2^32 exp(−v·rate)⌋ ≥ 1
    table: NDArray[np.int64]  # V for each top-14-bit cell of W, −1 where not constant
    #: exp(−x·2^(10k)/t) for the three 10-bit digits x of U (k = 0, 1, 2), or empty when
    #: t' > 2^30 (the compiled kernel then calls exp)
    exp_digits: NDArray[np.float64]


@lru_cache(maxsize=256)
def _plan(t: int, j: int) -> _Plan:
    tp = t // _SPLIT if t >= _SPLIT else t
    rate = Fraction(tp, t)
    lows: list[int] = []
    v = 1
    while True:
        lo = _floor_exp_neg(rate * v, 32)
        if lo < 1:
            break
        lows.append(lo)
        v += 1
    thresh = np.array(lows[::-1], dtype=np.int64)
    width = 1 << (32 - _TAB_BITS)
    starts = np.arange(1 << _TAB_BITS, dtype=np.int64) * width
    ends = starts + (width - 1)
    clean = np.searchsorted(thresh, starts, side="left") == np.searchsorted(
        thresh, ends, side="right"
    )
    counts = thresh.shape[0] - np.searchsorted(thresh, starts, side="right")
    table = np.where(clean, counts, -1).astype(np.int64)
    table[0] = -1  # W's prefix 0 is never decided by 32 bits
    exp_digits = np.zeros(0, dtype=np.float64)
    if tp <= 1 << 30:
        digit = np.arange(1 << 10, dtype=np.float64)
        # x·2^(10k) is exact, the quotient one rounding (t < 2^53 is exact), exp a few ulp
        exp_digits = np.concatenate([np.exp(-(digit * float(1 << (10 * k))) / float(t))
                                     for k in range(3)])
    return _Plan(t=t, j=j, tp=tp, rate=rate, thresh=thresh, table=table, exp_digits=exp_digits)


def _geometric_by_search(
    plan: _Plan, wv: NDArray[np.uint64], window: int
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """``V = #{thresholds > w}`` from the 32-bit prefix, and the undecided mask (within window)."""
    thr = plan.thresh
    m = thr.shape[0]
    w = wv.astype(np.int64)
    pos = np.searchsorted(thr, w, side="right")  # thresholds ≤ w
    v = (m - pos).astype(np.int64)
    if m == 0:
        return v, w == 0
    below = thr[np.maximum(pos - 1, 0)]
    above = thr[np.minimum(pos, m - 1)]
    amb = (w == 0) | ((pos > 0) & (w - below < window)) | ((pos < m) & (above - w < window))
    return v, amb


def _scaled_plan(t: int, j: int) -> _Plan:
    """The plan of ``t / 2**j``, written with ``t ≥ 2**12`` (same rational, larger numerator:
    the U step rarely rejects)."""
    if t < _MIN_T:
        k = _MIN_T.bit_length() - t.bit_length()
        t, j = t << k, j + k
    return _plan(t, j)


def laplace_core(
    source: _exact.DrawSource, ids: NDArray[np.uint64], counters: NDArray[np.uint64], t: int, j: int
) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """Discrete Laplace with scale ``t / 2**j`` for streams ``ids`` whose next draws are at
    ``counters``: (samples, counters after)."""
    plan = _scaled_plan(t, j)
    kernels = _fast.kernels
    if kernels is not None and GEOMETRIC_WINDOW == 1:
        values, after = _laplace_compiled(kernels, source, ids, counters, plan)
        assert after is not None
        return values, after

    def attempt(
        c_ids: NDArray[np.uint64], c_ctr: NDArray[np.uint64]
    ) -> tuple[NDArray[np.bool_], NDArray[np.int64], NDArray[np.uint64]]:
        accepted, values = _attempt(source, c_ids, c_ctr, plan)
        return accepted, values, c_ctr + np.uint64(1)

    return _exact.rejection_loop(ids, counters, attempt)


def _laplace_compiled(
    kernels: Any,
    source: _exact.DrawSource,
    ids: NDArray[np.uint64],
    counters: NDArray[np.uint64] | None,
    plan: _Plan,
    want_after: bool = True,
) -> tuple[NDArray[np.int64], NDArray[np.uint64] | None]:
    """:func:`laplace_core` with each attempt's common path in one compiled loop (the counters
    after only if ``want_after``; ``counters=None``: every stream starts at draw 0, without an
    array of n zeros).

    The same draws and decisions as :func:`_attempt` under :func:`_exact.rejection_loop` (every
    element reads its own blocks at its own counters, attempt after attempt); only the
    bookkeeping differs: accepted values are written straight into the result, and scratch
    buffers are reused across chunks."""
    n = ids.shape[0]
    out = np.empty(n, dtype=np.int64)
    m = min(n, _exact.CHUNK)
    status = np.empty(m, dtype=np.uint8)
    scratch = np.empty(2 * m + 2, dtype=np.uint64)
    pending: list[NDArray[np.intp]] = []
    zeros = np.zeros(m if counters is None else 0, dtype=np.uint64)
    for s in range(0, n, _exact.CHUNK):
        e = min(n, s + _exact.CHUNK)
        st = status[: e - s]
        first = zeros[: e - s] if counters is None else counters[s:e]
        _run_compiled(kernels, source, ids[s:e], first, plan, scratch, st, out[s:e])
        pending.append(np.flatnonzero(st != _ACCEPT) + s)
    pos = np.concatenate(pending) if pending else np.zeros(0, dtype=np.intp)
    # the pending elements' next draws
    ctr = (np.ones(pos.shape[0], dtype=np.uint64) if counters is None
           else counters[pos] + np.uint64(1))
    done: list[tuple[NDArray[np.intp], NDArray[np.uint64]]] = []
    while pos.shape[0]:  # about 6% of the elements per round
        k = pos.shape[0]
        vals = np.empty(k, dtype=np.int64)
        st = np.empty(k, dtype=np.uint8)
        _run_compiled(kernels, source, ids[pos], ctr, plan, None, st, vals)
        ctr += np.uint64(1)
        ok = st == _ACCEPT
        out[pos[ok]] = vals[ok]
        done.append((pos[ok], ctr[ok]))
        pos, ctr = pos[~ok], ctr[~ok]
    if not want_after:
        return out, None
    after = (np.ones(n, dtype=np.uint64) if counters is None else counters + np.uint64(1))
    for p, c in done:
        after[p] = c
    return out, after


def _run_compiled(
    kernels: Any,
    source: _exact.DrawSource,
    ids: NDArray[np.uint64],
    ctrs: NDArray[np.uint64],
    plan: _Plan,
    scratch: NDArray[np.uint64] | None,
    status: NDArray[np.uint8],
    values: NDArray[np.int64],
) -> None:
    """One attempt per element: ``status`` 1 (accepted, value written to ``values``) or 0."""
    words = source.draw(ids, ctrs, scratch)
    kernels.laplace_attempt(words, plan.tp, -1.0 / plan.t, plan.j, _exact.margin(), plan.table,
                            plan.thresh, plan.exp_digits, status, values)
    for e in np.flatnonzero(status >= _EXACT_D).tolist():
        res = _laplace_exact_one(source, int(ids[e]), int(ctrs[e]), plan,
                                 int(words[e, 0]) % plan.tp, int(words[e, 1]),
                                 int(status[e]) == _EXACT_V)
        if res is None:
            status[e] = 0
        else:
            status[e] = _ACCEPT
            values[e] = res


def _attempt(
    source: _exact.DrawSource, ids: NDArray[np.uint64], ctrs: NDArray[np.uint64], plan: _Plan
) -> tuple[NDArray[np.bool_], NDArray[np.int64]]:
    """One attempt of the algorithm (one block each): (accepted mask, values)."""
    words = source.draw(ids, ctrs)
    w0 = words[:, 0]
    w1 = words[:, 1]
    tp = plan.tp
    tp_u = np.uint64(tp)
    # step 1: U uniform in [0, t') by rejection (exactly uniform)
    if tp & (tp - 1) == 0:
        u = w0 & np.uint64(tp - 1)
        live = None
    else:
        u = w0 % tp_u
        live = w0 < np.uint64(_TWO64 - (_TWO64 % tp))
    # step 2: D = [A < exp(−U/t)] from A's 31-bit prefix a, decided outside a relative margin
    p31 = np.exp(u.astype(np.float64) * (-1.0 / plan.t))
    p31 *= 2.0**31
    diff = p31 - (w1 >> np.uint64(33)).astype(np.float64)  # > 0 ⇔ a < p
    p31 *= _exact.margin()
    acc_d = diff >= p31 + 1.0
    rej_d = diff <= -p31
    # step 3: V from W's 32-bit prefix (bits 1..32 of w1)
    if GEOMETRIC_WINDOW == 1:
        cell = ((w1 >> np.uint64(33 - _TAB_BITS)) & np.uint64((1 << _TAB_BITS) - 1)).view(np.int64)
        v = np.take(plan.table, cell)
        amb_v = v < 0
        if amb_v.any():
            sel = np.flatnonzero(amb_v)
            v_sel, amb_sel = _geometric_by_search(
                plan, (w1[sel] >> np.uint64(1)) & np.uint64(0xFFFFFFFF), 1
            )
            v[sel] = v_sel
            amb_v[sel] = amb_sel
    else:
        v, amb_v = _geometric_by_search(
            plan, (w1 >> np.uint64(1)) & np.uint64(0xFFFFFFFF), GEOMETRIC_WINDOW
        )
    # steps 4-5 (V ≤ 32·t/t' here, so U + t'V < 2^59: no overflow)
    y = v.view(np.uint64) * tp_u
    y += u
    if plan.j:
        y >>= np.uint64(plan.j)
    y_i = y.view(np.int64)
    neg = (w1 & np.uint64(1)).view(np.int64)
    undecided = ~(acc_d | rej_d) | amb_v
    if live is not None:
        undecided &= live
        acc_d &= live
    accepted = acc_d & ~amb_v & ((y_i != 0) | (neg == 0))
    neg = -neg  # 0 or all ones: (y ^ m) − m = ±y
    values = y_i ^ neg
    values -= neg
    exact = np.flatnonzero(undecided & ~rej_d)
    for e in exact.tolist():
        res = _laplace_exact_one(
            source, int(ids[e]), int(ctrs[e]), plan, int(u[e]), int(w1[e]), bool(acc_d[e])
        )
        if res is not None:
            accepted[e] = True
            values[e] = res
    return accepted, values


#: Status codes of the compiled attempt (stream_dp/csrc/fastnoise.c).
_ACCEPT, _EXACT_D, _EXACT_V = 1, 2, 3


def _laplace_exact_one(
    source: _exact.DrawSource, sid: int, ctr: int, plan: _Plan, u: int, w1: int, acc_d: bool
) -> int | None:
    """Steps 2–5 for one element with exact arithmetic; None = start over."""
    if not acc_d:

        def more_a(r: int) -> int:
            return source.refine(sid, ctr, _exact.CHANNEL_LAPLACE_ACCEPT, r)

        if not _exact.uniform_below_exp(w1 >> 33, 31, Fraction(u, plan.t), more_a):
            return None

    def more_w(r: int) -> int:
        return source.refine(sid, ctr, _exact.CHANNEL_LAPLACE_GEOMETRIC, r)

    v = _exact.geometric_exact((w1 >> 1) & 0xFFFFFFFF, 32, plan.rate, more_w)
    y = (u + plan.tp * v) >> plan.j
    if w1 & 1:
        if y == 0:
            return None
        y = -y
    if not -(2**63) < y < 2**63:  # pragma: no cover - probability below exp(−2^10)
        raise OverflowError("discrete Laplace sample exceeds int64")
    return y


def sample_discrete_laplace(
    source: _exact.DrawSource, ids: NDArray[np.uint64], scale: float
) -> NDArray[np.int64]:
    """One exact discrete Laplace sample per stream id (draw counters start at 0)."""
    t, j = discrete_laplace_params(scale)
    kernels = _fast.kernels
    if kernels is not None and GEOMETRIC_WINDOW == 1:  # without the counters after (unused)
        return _laplace_compiled(kernels, source, ids, None, _scaled_plan(t, j),
                                 want_after=False)[0]
    values, _ = laplace_core(source, ids, np.zeros(ids.shape[0], dtype=np.uint64), t, j)
    return values
