"""Exact arithmetic behind the samplers: rigorous brackets of exp(−γ) and lazy comparisons.

A uniform real ``U ∈ [0, 1)`` is represented lazily by its binary expansion: a prefix ``a`` of
``k`` bits says ``U ∈ [a/2^k, (a+1)/2^k)``; more bits can always be appended. Deciding
``U < exp(−γ)`` exactly (a Bernoulli(exp(−γ)) draw) only needs enough bits of ``U`` and a tight
enough bracket ``lo ≤ 2^P·exp(−γ) ≤ hi`` computed here with integer/rational arithmetic only.

Fast path (vectorised, in the samplers): compare the prefix with a float64 value of exp(−γ)
widened by a relative margin ``2**FLOAT_MARGIN_LOG2`` (default 2^-40, i.e. thousands of times the
float rounding error of the few operations involved, see the sampler modules). Whenever the prefix
interval and the widened interval overlap, the comparison is *ambiguous* and is settled here,
exactly, with more bits. The answer is the same real-number comparison either way, so the
margin only changes speed, never the sample (a test checks bit-identical samples under a huge
margin).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

#: log2 of the relative error margin granted to the float64 fast path (tests may raise it).
FLOAT_MARGIN_LOG2 = -40
#: Absolute margin on -ln(W) in the geometric fast path (tests may raise it).
LOG_MARGIN = 2.0**-30

#: Number of comparisons settled by the exact paths so far (diagnostics and tests).
exact_calls = 0

#: Refinement channels (one independent bit sequence per comparison kind and draw).
CHANNEL_LAPLACE_ACCEPT = 1
CHANNEL_LAPLACE_GEOMETRIC = 2
CHANNEL_GAUSS_ACCEPT = 3


class DrawSource(Protocol):
    """Pseudo-random 128-bit blocks addressed by ``(stream id, draw counter)`` (node fixed).

    ``draw(ids, counters, out=None)`` returns one block per element as an ``(m, 2)`` uint64
    array (in ``out``'s storage if given: a scratch buffer of at least ``2m + 2`` uint64); the
    caller advances its counters. ``refine(stream_id, counter, channel, round)`` returns 128
    further bits (a Python int) for the block drawn at ``counter``: an independent sequence per
    ``(channel, round)``, used only by the exact paths, so the main counters never depend on the
    fast path's margins.
    """

    def draw(
        self,
        ids: NDArray[np.uint64],
        counters: NDArray[np.uint64],
        out: NDArray[np.uint64] | None = None,
    ) -> NDArray[np.uint64]: ...

    def refine(self, stream_id: int, counter: int, channel: int, round_: int) -> int: ...


#: Elements per vectorised step (cache-resident temporaries).
CHUNK = 1 << 16

#: One attempt over a chunk: ``(ids, counters) -> (accepted, values, counters after)``.
Attempt = Callable[
    [NDArray[np.uint64], NDArray[np.uint64]],
    tuple[NDArray[np.bool_], NDArray[np.int64], NDArray[np.uint64]],
]


def rejection_loop(
    ids: NDArray[np.uint64], counters: NDArray[np.uint64], attempt: Attempt
) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """Run ``attempt`` until every element is accepted: (values, counters after).

    Each pass processes the still-pending elements in chunks of :data:`CHUNK`; the pending
    elements' ids and counters travel in compact arrays (no gathers from the full arrays). An
    element's result depends only on its own id and counters, never on the others.
    """
    n = ids.shape[0]
    out = np.zeros(n, dtype=np.int64)
    ctr_out = counters.astype(np.uint64, copy=True)
    p_ids, p_ctr = ids, counters
    p_pos: NDArray[np.intp] | None = None  # None: first pass, positions = 0..n-1
    while p_ids.shape[0]:
        m = p_ids.shape[0]
        r_pos: list[NDArray[np.intp]] = []
        r_ids: list[NDArray[np.uint64]] = []
        r_ctr: list[NDArray[np.uint64]] = []
        for s in range(0, m, CHUNK):
            e = min(m, s + CHUNK)
            c_ids = p_ids[s:e]
            accepted, values, after = attempt(c_ids, p_ctr[s:e])
            rejected = ~accepted
            if p_pos is None:
                out[s:e][accepted] = values[accepted]
                ctr_out[s:e] = after
                r_pos.append(np.flatnonzero(rejected) + s)
            else:
                pos = p_pos[s:e]
                out[pos[accepted]] = values[accepted]
                ctr_out[pos] = after
                r_pos.append(pos[rejected])
            r_ids.append(c_ids[rejected])
            r_ctr.append(after[rejected])
        p_pos = np.concatenate(r_pos)
        p_ids = np.concatenate(r_ids)
        p_ctr = np.concatenate(r_ctr)
    return out, ctr_out


def _exp_neg_series(f: Fraction, prec: int) -> tuple[int, int]:
    """Bracket ``lo ≤ 2^prec·exp(−f) ≤ hi`` for 0 ≤ f ≤ 1, integer fixed point only.

    With ``M = prec + 24`` fractional bits, ``F = ⌊f·2^M⌋`` and the terms computed as
    ``t'_i = ⌊⌊t'_{i−1}·F / 2^M⌋ / i⌋`` (``t'_0 = 2^M``), each term underestimates the true
    ``t_i = 2^M f^i / i!`` by ``d_i ≤ d_{i−1}·f/i + 3 ≤ 3i`` units (the ``F`` truncation costs
    < 1, each floor < 1). Stopping at the first ``t'_N = 0`` leaves an alternating remainder
    ``≤ t_N ≤ 3N``. So the alternating partial sum ``S`` is within ``err = 2N² + 4N + 8`` units of
    ``2^M exp(−f)``, and ``(S ∓ err) / 2^24`` (rounded outward) bracket ``2^prec exp(−f)``.
    """
    if not 0 <= f <= 1:
        raise ValueError("f must be in [0, 1]")
    guard = 24
    m = prec + guard
    one = 1 << m
    big_f = (f.numerator << m) // f.denominator
    term = one
    total = one
    i = 0
    while term:
        i += 1
        term = ((term * big_f) >> m) // i
        total = total - term if i & 1 else total + term
    err = 2 * i * i + 4 * i + 8
    return (total - err) >> guard, -((-(total + err)) >> guard)


@lru_cache(maxsize=64)
def _exp_neg_one(prec: int) -> tuple[int, int]:
    return _exp_neg_series(Fraction(1), prec)


def exp_neg_bracket(gamma: Fraction, prec: int) -> tuple[int, int]:
    """Integers ``lo ≤ 2^prec·exp(−γ) ≤ hi`` (γ ≥ 0 rational), with ``hi − lo`` a few units."""
    if gamma < 0:
        raise ValueError("gamma must be >= 0")
    if gamma == 0:
        return 1 << prec, 1 << prec
    # exp(−γ) < 2^-prec as soon as γ > prec·ln 2; 0.7 > ln 2.
    if gamma > Fraction(7 * prec + 10, 10):
        return 0, 1
    n = gamma.numerator // gamma.denominator
    f = gamma - n
    guard = 2 * max(n, 1).bit_length() + 24
    p = prec + guard
    lo_f, hi_f = _exp_neg_series(f, p)
    lo, hi = lo_f, hi_f
    if n:
        lo1, hi1 = _exp_neg_one(p)
        # power by squaring, rounding lo down and hi up at every step
        plo, phi = 1 << p, 1 << p
        blo, bhi = lo1, hi1
        m = n
        while m:
            if m & 1:
                plo = (plo * blo) >> p
                phi = -((-phi * bhi) >> p)
            m >>= 1
            if m:
                blo = (blo * blo) >> p
                bhi = -((-bhi * bhi) >> p)
        lo = (lo * plo) >> p
        hi = -((-hi * phi) >> p)
    return lo >> guard, -((-hi) >> guard)


def uniform_below_exp(a: int, k: int, gamma: Fraction, more: Callable[[int], int]) -> bool:
    """Exactly decide ``U < exp(−γ)`` for ``U ∈ [a/2^k, (a+1)/2^k)`` uniform.

    ``more(r)`` returns the ``r``-th further 128 bits of ``U`` (r = 0, 1, …), appended below the
    prefix. Terminates with probability 1 (each round is ambiguous with probability ≈ 2^-12).
    """
    global exact_calls
    exact_calls += 1
    r = 0
    while True:
        prec = k + 16
        lo, hi = exp_neg_bracket(gamma, prec)
        if (a + 1) << 16 <= lo:
            return True
        if a << 16 >= hi:
            return False
        a = (a << 128) | more(r)
        k += 128
        r += 1


def geometric_exact(a: int, k: int, rate: Fraction, more: Callable[[int], int]) -> int:
    """Exactly ``V = #{v ≥ 1 : W < exp(−v·rate)}`` for ``W ∈ [a/2^k, (a+1)/2^k)`` uniform.

    ``V`` is geometric: ``P(V ≥ v) = exp(−v·rate)`` (``rate > 0`` rational).

    Bits of ``W`` are appended with ``more`` as needed; the prefix grows consistently across the
    successive comparisons (they all refer to the same real ``W``).
    """
    global exact_calls
    exact_calls += 1
    v = 0
    r = 0
    while True:
        gamma = rate * (v + 1)
        while True:
            prec = k + 16
            lo, hi = exp_neg_bracket(gamma, prec)
            if (a + 1) << 16 <= lo:
                below = True
                break
            if a << 16 >= hi:
                below = False
                break
            a = (a << 128) | more(r)
            k += 128
            r += 1
        if not below:
            return v
        v += 1


def fraction_of_float(x: float) -> Fraction:
    """The exact dyadic rational value of a float (no rounding)."""
    return Fraction(x)


def margin() -> float:
    """Current relative margin for float fast paths."""
    return float(2.0**FLOAT_MARGIN_LOG2)


def as_intp(idx: NDArray[np.integer]) -> NDArray[np.intp]:
    return np.asarray(idx, dtype=np.intp)
