"""Plan of the ``blt`` strategy: a buffered-linear-Toeplitz (BLT) noise-correlation filter.

**Factorisation.** ``W_p = B·C`` with ``C`` lower-triangular Toeplitz,

    C(x) = 1 + Σ_i w_i·x/(1 − θ_i x)        (c_0 = 1, c_k = Σ_i w_i θ_i^(k−1) for k ≥ 1),

``d`` = :data:`BUFFERS` buffers with ``θ_i ∈ [0, 1)`` (McMahan et al., Dvijotham et al.: "BLT"), and
``B = W_p·C⁻¹``, generating function ``B(x) = Q(x)/((1 − p x)·P(x))`` where ``C = P/Q``,
``Q = Π(1 − θ_i x)``. The mechanism adds the noise ``N = C⁻¹Z`` to the counts and releases the
decayed sum, so the error is ``B·Z``: per-release variance ``σ²·Σ_{k<t} b_k²``.

**Sensitivity** (L2, per unit contribution): the column of ``C``,
``‖c‖₂² = 1 + Σ_ij w_i w_j/(1 − θ_i θ_j)`` (closed form, no horizon), and ``Σ_{k≥1}|c_k| ≤
Σ_i |w_i|/(1 − θ_i)`` for the slack terms of :mod:`.mechanism`.

**Fit.** :func:`fit` minimises the exact mean per-release error over ``min(horizon, 2**16)``
ticks, ``‖c‖₂²·mean_t Σ_{k<t} b_k²``, starting from a non-negative least-squares fit of the
Toeplitz square root ``(1 − p x)^(−1/2)`` (whose coefficients are completely monotone, hence close
to a sum of exponentials) and refining with Nelder–Mead. The parameters are rounded coarsely (:func:`_quantised`) and enter
the mechanism's description (a host that computes different ones refuses the
other's checkpoints instead of mixing noise). ``P``'s zeros must lie outside the unit disc (the
noise filter ``C⁻¹`` is stable); :func:`fit` checks it.

>>> th, w = fit(0.9, 255)
>>> len(th) == len(w) == BUFFERS and all(0 <= t < 1 for t in th)
True
>>> round(mean_factor(0.9, 255, th, w) / mean_factor_sqrt_bound(0.9, 255), 2)
1.0
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize, nnls
from scipy.signal import lfilter

__all__ = [
    "BUFFERS",
    "abs_sum",
    "coefficients",
    "fit",
    "inverse_coefficients",
    "mean_factor",
    "mean_factor_sqrt_bound",
    "polynomials",
    "reconstruction",
    "square_sum",
]

#: Number of buffers ``d`` (state floats per stream, besides the release).
BUFFERS = 4
#: Longest horizon the fit evaluates (longer horizons use the fit at this length).
_FIT_TICKS = 1 << 16
_QUANTUM = 2.0**-32
_MAX_EVALS = 2500
#: Buffers with |w| below this are switched off (θ = w = 0).
_IDLE = 2.0**-20


def polynomials(theta: NDArray[np.float64], w: NDArray[np.float64]
                ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(P, Q)`` with ``C = P/Q`` (ascending coefficients, degree ``d``)."""
    q = np.array([1.0])
    for t in theta:
        q = np.convolve(q, [1.0, -float(t)])
    p = q.copy()
    for i in range(len(theta)):
        r = np.array([0.0, float(w[i])])
        for j, t in enumerate(theta):
            if j != i:
                r = np.convolve(r, [1.0, -float(t)])
        p = p + np.pad(r, (0, len(p) - len(r)))
    return p, q


def coefficients(theta: NDArray[np.float64], w: NDArray[np.float64], n: int) -> NDArray[np.float64]:
    """``c_0..c_{n−1}`` of ``C`` (dense oracle and tests)."""
    k = np.arange(1, n, dtype=np.float64)
    tail = (np.asarray(w)[None, :] * np.asarray(theta)[None, :] ** (k[:, None] - 1.0)).sum(axis=1)
    return np.concatenate(([1.0], tail))


def inverse_coefficients(theta: NDArray[np.float64], w: NDArray[np.float64], n: int
                         ) -> NDArray[np.float64]:
    """``m_0..m_{n−1}`` of the noise filter ``C⁻¹ = Q/P``."""
    p, q = polynomials(theta, w)
    impulse = np.zeros(n)
    impulse[0] = 1.0
    return np.asarray(lfilter(q, p, impulse), dtype=np.float64)


def reconstruction(p: float, theta: NDArray[np.float64], w: NDArray[np.float64], n: int
                   ) -> NDArray[np.float64]:
    """``b_0..b_{n−1}`` of ``B = W_p·C⁻¹``."""
    big_p, q = polynomials(theta, w)
    impulse = np.zeros(n)
    impulse[0] = 1.0
    return np.asarray(lfilter(q, np.convolve([1.0, -p], big_p), impulse), dtype=np.float64)


def square_sum(theta: NDArray[np.float64], w: NDArray[np.float64]) -> float:
    """``Σ_{k≥1} c_k²`` (closed form, infinite sum)."""
    th = np.asarray(theta, dtype=np.float64)
    ww = np.asarray(w, dtype=np.float64)
    return float(np.sum(np.outer(ww, ww) / (1.0 - np.outer(th, th))))


def abs_sum(theta: NDArray[np.float64], w: NDArray[np.float64]) -> float:
    """An upper bound on ``Σ_{k≥1} |c_k|``: ``Σ_i |w_i|/(1 − θ_i)`` (``θ_i ≥ 0``)."""
    return float(np.sum(np.abs(w) / (1.0 - np.asarray(theta))))


def mean_factor(p: float, horizon: int, theta: NDArray[np.float64], w: NDArray[np.float64]
                ) -> float:
    """Mean over ticks ``1..horizon`` of the release variance for noise of unit L2 sensitivity
    and ``σ² = ‖c‖₂²`` (multiply by ``1/(2ρ)`` for ρ-zCDP)."""
    b = reconstruction(p, theta, w, horizon)
    if not np.all(np.isfinite(b)):
        return math.inf
    return (1.0 + square_sum(theta, w)) * float(np.cumsum(b * b).mean())


def mean_factor_sqrt_bound(p: float, horizon: int) -> float:
    """The factorisation lower bound in the same units (``2ρ`` times the zCDP bound)."""
    from stream_dp.lower_bound import nuclear_norm

    return nuclear_norm(int(horizon), float(p)) ** 2 / float(horizon) ** 2


def _stable(theta: NDArray[np.float64], w: NDArray[np.float64]) -> bool:
    big_p, _ = polynomials(theta, w)
    roots = np.roots(big_p[::-1])
    return bool(np.all(np.abs(roots) > 1.0 + 1e-9)) and bool(np.all((theta >= 0) & (theta < 1)))


def _unpack(x: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    d = BUFFERS
    return np.exp(-np.exp(np.clip(x[:d], -60.0, 60.0))), np.asarray(x[d:], dtype=np.float64)


def _initial(p: float, n: int) -> NDArray[np.float64]:
    span = min(n, int(20.0 / (1.0 - p))) if p < 1.0 else n
    span = max(span, 8)
    theta0 = 1.0 - np.geomspace(1.0 / span, 0.7, BUFFERS)
    k = np.arange(1, 4 * span, dtype=np.float64)
    c = np.cumprod((2.0 * k - 1.0) / (2.0 * k) * p)
    a = theta0[None, :] ** (k[:, None] - 1.0)
    w0, _ = nnls(a, c)
    return np.concatenate([np.log(-np.log(theta0)), np.maximum(w0, 1e-4)])


def _quantised(theta: NDArray[np.float64], w: NDArray[np.float64]
               ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Coarse, reproducible parameters: ``log₂(1 − θ)`` to 1/256 and ``w`` to 12 significant
    bits. The error is flat near the optimum, so this costs < 0.1%; it makes two hosts whose
    optimisers end a few ulps apart agree on the mechanism (and so on its noise)."""
    gap = np.clip(1.0 - np.asarray(theta, dtype=np.float64), _QUANTUM, 1.0)
    theta_q = 1.0 - np.exp2(np.round(np.log2(gap) * 256.0) / 256.0)
    theta_q = np.clip(theta_q, 0.0, 1.0 - _QUANTUM)
    theta_q[np.asarray(theta) <= 0.0] = 0.0
    mant, expo = np.frexp(np.asarray(w, dtype=np.float64))
    w_q = np.ldexp(np.round(mant * 4096.0) / 4096.0, expo)
    return theta_q, w_q


@lru_cache(maxsize=128)
def fit(p: float, horizon: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(θ, w)`` minimising the mean release error over ``min(horizon, 2**16)`` ticks."""
    n = max(2, min(int(horizon), _FIT_TICKS))
    x0 = _initial(float(p), n)

    def objective(x: NDArray[np.float64]) -> float:
        theta, w = _unpack(x)
        value = mean_factor(p, n, theta, w)
        return value if math.isfinite(value) and _stable(theta, w) else 1e30

    best = minimize(objective, x0, method="Nelder-Mead",
                    options={"maxfev": _MAX_EVALS, "xatol": 1e-7, "fatol": 1e-12})
    x = best.x if best.fun <= objective(x0) else x0
    theta, w = _quantised(*_unpack(x))
    # a buffer the fit switched off (w ≈ 0) would leave a spurious near-unit zero in P: drop it
    idle = np.abs(w) < _IDLE
    theta[idle] = 0.0
    w[idle] = 0.0
    if not _stable(theta, w):  # pragma: no cover - the non-negative start is stable in practice
        raise ValueError(f"no stable BLT filter found for p = {p!r}, horizon = {horizon!r}")
    return tuple(float(t) for t in theta), tuple(float(v) for v in w)
