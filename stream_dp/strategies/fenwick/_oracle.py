"""Dense-matrix oracle of the Fenwick family (library-private; tests and checks only).

``dense(mech, n) = (L, B, v)`` for ticks ``1..n`` of the first epoch (``n`` ≤ its length): the
release is ``B @ (L @ x + z)`` with independent noise ``z_j`` of variance ``v_j`` (squared value
units), so the per-release noise variance is ``(B**2) @ v``. ``L = Λ·S`` (weights times the
Fenwick strategy matrix), ``B = R·Λ⁻¹`` (reconstruction), ``B @ L = W_p``.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from stream_dp.strategies.fenwick.plan import reconstruction_matrix, strategy_matrix

__all__ = ["dense", "release"]


def dense(mech: object, n: int) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """``(L, B, v)`` for ticks ``1..n`` of a ``dm``/``dmfda``/``fenwick-opt`` mechanism."""
    _, _, length = mech.epoch_of(1)  # type: ignore[attr-defined]
    if n > length:
        raise ValueError(f"n must be at most the first epoch's length {length}, got {n}")
    p = float(mech.p)  # type: ignore[attr-defined]
    w: NDArray[np.float64] = np.asarray(mech.weights(length), dtype=np.float64)[:n]  # type: ignore[attr-defined]
    big_l = w[:, None] * strategy_matrix(n, p)
    big_b = reconstruction_matrix(n, p) / w[None, :]
    var = np.full(n, float(mech.plan(length).measurement_variance))  # type: ignore[attr-defined]
    return big_l, big_b, var


def _exact_rounded(
    w: NDArray[np.float64], p: float, d: NDArray[np.float64], g: float
) -> NDArray[np.float64]:
    """``round_half_even(a_τ·S_τ/g)`` for every node ``τ`` and stream, in exact rational
    arithmetic (exact powers of the float ``p``), independent of the mechanism's float code."""
    fp, fg = Fraction(p), Fraction(g)
    m, streams = d.shape
    out = np.zeros((m, streams))
    for tau in range(1, m + 1):
        low = tau & -tau
        a = Fraction(float(w[tau - 1]))
        for s in range(streams):
            total = sum(
                (fp ** (tau - j) * Fraction(float(d[j - 1, s])) for j in range(tau - low + 1, tau + 1)),
                Fraction(0),
            )
            out[tau - 1, s] = float(round(a * total / fg))
    return out


def release(
    mech: object, counts: NDArray[np.float64], z: NDArray[np.int64], rounded: bool
) -> NDArray[np.float64]:
    """Releases for ``counts`` (ticks × streams) and known grid-unit noise ``z`` (one row per
    measurement = tick): ``R Λ⁻¹ (g·round(Λ S D/g) + g·z)`` per epoch (the rounding computed
    exactly, :func:`_exact_rounded`), carrying
    ``p^τ·(last release)`` across epochs (unrounded measurements if not ``rounded``)."""
    p, ticks = float(mech.p), counts.shape[0]  # type: ignore[attr-defined]
    out = np.zeros_like(counts)
    start, carry = 0, np.zeros(counts.shape[1])
    while start < ticks:
        _, s0, n = mech.epoch_of(start + 1)  # type: ignore[attr-defined]
        if s0 != start:
            raise AssertionError(f"epoch layout: tick {start + 1} starts at {s0}")
        m = min(n, ticks - start)
        w = np.asarray(mech.weights(n), dtype=np.float64)[:m, None]  # type: ignore[attr-defined]
        g = float(mech.plan(n).grid)  # type: ignore[attr-defined]
        d, ze = counts[start : start + m], z[start : start + m]
        if p == 1.0 and rounded:  # p = 1 measures the counts rounded to the epoch's grid
            d = np.rint(d / g) * g
        x = _exact_rounded(w[:, 0], p, d, g) if rounded else w * (strategy_matrix(m, p) @ d) / g
        meas = g * (x + ze)
        tau = np.arange(1, m + 1, dtype=np.float64)[:, None]
        rel = reconstruction_matrix(m, p) @ (meas / w) + p**tau * carry
        out[start : start + m] = rel
        carry = rel[-1]
        start += m
    return out
