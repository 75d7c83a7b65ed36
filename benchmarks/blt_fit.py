"""The ``blt`` fits of issue #26 against the lower bound, and the full-Toeplitz optimum at p = 1.

For each decay p (ρ-zCDP, ρ = 0.5, T = 32767 by default) prints the number of buffers the fit
chose, blt's mean per-release MSE over ticks 1..T divided by the factorisation lower bound
(``planner`` figures: discrete-Gaussian variance, privacy slack and quantised parameters
included), the fit's own ratio (slack-free: ``plan.mean_factor``, at p = 1 the column-scaled
``plan.scaled_mean_factor`` the mechanism uses), the unscaled Toeplitz ``C``'s ratio with the
same (θ, w) ("toeplitz"; equal to "fit" for p < 1, which has no blocks), the slack's share of
σ², the float-error bound ``E`` (units) and the build time. With ``--toeplitz`` it also minimises the
same mean error over *every* Toeplitz ``C`` (``T − 1`` free coefficients, L-BFGS-B from the blt
fit, FFT series inversion; state O(T) per stream, so a reference, not a strategy).

Usage::

    python benchmarks/blt_fit.py                       # p = 0.9 … 1
    python benchmarks/blt_fit.py --p 1 --toeplitz
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.optimize import minimize
from scipy.signal import fftconvolve

from stream_dp.budget import ZCDP
from stream_dp.figures import figures
from stream_dp.lower_bound import mean_mse_bound
from stream_dp.strategies.blt import plan
from stream_dp.strategies.registry import make


def toeplitz_optimum(p: float, n: int, c0: np.ndarray) -> float:
    """Lowest mean factor over all lower-triangular Toeplitz ``C`` with ``c_0 = 1`` (from ``c0``);
    the block-restart sensitivity ``Σ_{k<n} c_k²`` (p = 1) or the same finite sum (p < 1)."""
    v = (n - np.arange(n)) / n

    def inverse(c: np.ndarray) -> np.ndarray:
        m, k = np.array([1.0]), 1
        while k < n:  # Newton: m ← m(2 − c·m) mod x^(2k)
            k2 = min(2 * k, n)
            t = -fftconvolve(c[:k2], m)[:k2]
            t[0] += 2.0
            m, k = fftconvolve(m, t)[:k2], k2
        return m

    def loss(x: np.ndarray) -> tuple[float, np.ndarray]:
        c = np.concatenate(([1.0], x))
        m = inverse(c)
        b = np.cumsum(m) if p == 1.0 else np.asarray(
            fftconvolve(p ** np.arange(n), m)[:n])
        l2, s2 = float(np.sum(v * b * b)), float(np.sum(c * c))
        h = fftconvolve(b, m)[:n]
        r = fftconvolve(h, (2 * v * b)[::-1])[n - 1::-1][:n]
        return s2 * l2, s2 * (-r[1:]) + l2 * 2.0 * x

    res = minimize(loss, c0[1:], jac=True, method="L-BFGS-B",
                   options={"maxiter": 3000, "maxcor": 50, "ftol": 1e-15, "gtol": 1e-12})
    return float(res.fun) / plan.mean_factor_sqrt_bound(p, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--horizon", type=int, default=32767)
    ap.add_argument("--p", type=float, nargs="*",
                    default=[0.9, 0.99, 0.995, 0.999, 0.9999, 1.0])
    ap.add_argument("--rho", type=float, default=0.5)
    ap.add_argument("--toeplitz", action="store_true")
    args = ap.parse_args()
    privacy, horizon = ZCDP(args.rho), args.horizon
    print(f"{'p':>7}{'d':>3}{'blt/bound':>11}{'fit/bound':>11}{'toeplitz':>11}{'slack':>10}"
          f"{'E units':>10}{'s':>6}")
    for p in args.p:
        t0 = time.perf_counter()
        mech = make("blt", p, horizon, privacy)
        fig = figures(("blt",), p, horizon, privacy)[0]
        bound = mean_mse_bound(horizon, p, privacy)
        n = min(horizon, 1 << 16)
        lb = plan.mean_factor_sqrt_bound(p, n)
        toeplitz = plan.mean_factor(p, n, mech.theta, mech.w) / lb
        fit = (plan.scaled_mean_factor(horizon, mech.theta, mech.w)
               / plan.mean_factor_sqrt_bound(p, horizon) if p == 1.0 else toeplitz)
        slack = mech._shift_sq / (mech.d_units**2 * (
            1.0 + plan.square_sum(mech.theta, mech.w, mech.block))) - 1.0
        print(f"{p:>7g}{len(mech.theta):>3}{fig.error_mse / bound:>11.6f}{fit:>11.6f}"
              f"{toeplitz:>11.6f}"
              f"{slack:>10.1e}{mech.float_error:>10.3g}{time.perf_counter() - t0:>6.0f}",
              flush=True)
        if args.toeplitz:
            c = plan.coefficients(mech.theta, mech.w, n)
            print(f"{'':>7}   full Toeplitz optimum (O(T) state): "
                  f"{toeplitz_optimum(p, n, c):.6f}", flush=True)


if __name__ == "__main__":
    main()
