"""The column-scaled ``p = 1`` loss of the ``blt`` filter and its exact gradient (issue #36).

At ``p = 1`` the mechanism measures with ``C·D``, ``d_j = √(S_T/S_(T−j))`` (:func:`.plan.column_scales`),
so the slack-free mean release variance per unit sensitivity is

    L(θ, w) = S_T · (1/T)·Σ_t Var(Σ_{s≤t} M_s/d_s),     M = C⁻¹ζ, ζ white (unit variance),

which depends on ``(θ, w)`` through the poles ``(λ, a)`` of ``C⁻¹`` *and* through ``d``.
:func:`scaled_loss` evaluates it in ``O(T·d²)`` (unrounded ``d``) in arithmetic that is analytic in
the parameters, so it accepts complex ``(θ, w)``; :func:`scaled_loss_and_gradient` differentiates it
by the complex step (``∂L/∂x_k = Im L(x + i·h·e_k)/h``, ``h = 10⁻³⁰``): no difference is taken, so
the gradient is exact to rounding, whatever the conditioning (unlike finite differences). The
poles enter through one Newton step of the secular equation from the real roots, which carries
the implicit derivative ``∂λ/∂x = −(∂f/∂x)/(∂f/∂λ)`` exactly.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.signal import lfilter

from stream_dp.strategies.blt.plan import poles

__all__ = ["scaled_loss", "scaled_loss_and_gradient"]

#: Imaginary step of the complex-step derivative (far below every real part's ulp).
_STEP = 1e-30


def _geometric(lam: complex, x: NDArray[np.complex128]) -> NDArray[np.complex128]:
    """``y_k = Σ_{j≤k} lam^(k−j)·x_j``."""
    return np.asarray(lfilter([1.0], [1.0, -lam], x), dtype=np.complex128)


def _poles(theta: NDArray[np.complex128], w: NDArray[np.complex128]
           ) -> tuple[NDArray[np.complex128], NDArray[np.complex128]]:
    """:func:`.plan.poles` continued analytically: the real roots (bisection) and one Newton
    step of ``f(λ) = 1 + Σ_i w_i/(λ − θ_i)`` in complex arithmetic."""
    lam_r, _ = poles(theta.real.copy(), w.real.copy())
    lam = lam_r.astype(np.complex128)
    diff = lam[:, None] - theta[None, :]
    f = 1.0 + np.sum(w[None, :] / diff, axis=1)
    slope = -np.sum(w[None, :] / diff**2, axis=1)
    lam = lam - f / slope
    diff = lam[:, None] - theta[None, :]
    slope = -np.sum(w[None, :] / diff**2, axis=1)
    return lam, 1.0 / slope


def _square_sums(theta: NDArray[np.complex128], w: NDArray[np.complex128], block: int
                 ) -> NDArray[np.complex128]:
    """``S_n = 1 + Σ_ij w_i w_j (1 − q_ij^(n−1))/(1 − q_ij)`` for ``n = 1..block``."""
    k = np.arange(int(block), dtype=np.float64)
    out = np.ones(int(block), dtype=np.complex128)
    d = len(theta)
    for i in range(d):
        for j in range(i, d):
            q = theta[i] * theta[j]
            weight = w[i] * w[j] * (1.0 if i == j else 2.0)
            out += weight * (-np.expm1(k * np.log(q)) / (1.0 - q))
    return out


def scaled_loss(theta: NDArray[np.complex128] | NDArray[np.float64],
                w: NDArray[np.complex128] | NDArray[np.float64], block: int) -> complex:
    """``L(θ, w)`` over one block of ``block`` ticks (complex parameters allowed)."""
    th = np.asarray(theta, dtype=np.complex128)
    ww = np.asarray(w, dtype=np.complex128)
    n = int(block)
    s = _square_sums(th, ww, n)
    e = np.sqrt(s[::-1] / s[-1])  # 1/d_j
    lam, a = _poles(th, ww)
    d = len(lam)
    var_m = np.ones(n, dtype=np.complex128)
    r = np.ones((d, n), dtype=np.complex128)
    ones = np.ones(n - 1, dtype=np.complex128)
    for i in range(d):
        for j in range(i, d):
            q_ij = np.concatenate(([0.0], _geometric(lam[i] * lam[j], ones)))
            r[i] += lam[i] * a[j] * q_ij
            if j != i:
                r[j] += lam[j] * a[i] * q_ij
            var_m += (1.0 if i == j else 2.0) * a[i] * a[j] * q_ij
    cross = np.zeros(n, dtype=np.complex128)
    for i in range(d):
        cross[1:] += a[i] * _geometric(lam[i], e[:-1] * r[i][:-1])
    curve = np.cumsum(2.0 * e * cross + e * e * var_m)
    return complex(s[-1] * np.mean(curve))


def scaled_loss_and_gradient(x: NDArray[np.float64], block: int
                             ) -> tuple[float, NDArray[np.float64]]:
    """``(L, ∂L/∂x)`` at ``x = (logit θ, log w)`` (complex step: exact to rounding)."""
    d = len(x) // 2

    def at(xc: NDArray[np.complex128]) -> complex:
        return scaled_loss(1.0 / (1.0 + np.exp(-xc[:d])), np.exp(xc[d:]), block)

    value = at(np.asarray(x, dtype=np.complex128)).real
    grad = np.empty(len(x))
    for k in range(len(x)):
        xc = np.asarray(x, dtype=np.complex128)
        xc[k] += 1j * _STEP
        grad[k] = at(xc).imag / _STEP
    return float(value), grad

