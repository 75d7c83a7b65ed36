"""Refit ``blt``'s (θ, w) at p = 1 on the column-scaled loss, with its exact gradient (issue #36).

The shipped p = 1 fits minimise the *unscaled* block loss; the mechanism then equalises the
columns (``plan.column_scales``). This script minimises the scaled loss itself
(``stream_dp.strategies.blt._scaled_fit``: slack-free, unrounded scales, complex-step gradient)
by L-BFGS-B, from the shipped fit (``--start shipped``) or from ``plan._spread`` (``--start
spread``), then adds buffers one at a time (``plan._grow``) up to ``--buffers``. For each ``d`` it
prints the slack-free ratio to the bound, the ratio with quantised parameters and rounded scales
(``plan.scaled_mean_factor``), and the planner figure of ``blt`` and ``auto`` with that fit
substituted (ρ = 0.5 zCDP: discrete-Gaussian variance, privacy slack and rounding included).
Nothing is written to the package or the fit cache.

Usage::

    python benchmarks/blt_scaled_refit.py --horizon 32767 --buffers 9
    python benchmarks/blt_scaled_refit.py --horizon 255 --start spread --buffers 12
    python benchmarks/blt_scaled_refit.py --horizon 255 --free-scale
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize

from stream_dp.budget import ZCDP
from stream_dp.lower_bound import mean_mse_bound
from stream_dp.planner import make_mechanism
from stream_dp.strategies.blt import plan
from stream_dp.strategies.blt._scaled_fit import scaled_loss_and_gradient


def refit(x0: NDArray[np.float64], n: int, iters: int) -> tuple[float, NDArray[np.float64], int]:
    """L-BFGS-B on the scaled loss from ``x0 = (logit θ, log w)``: ``(loss, x, iterations)``."""
    d = len(x0) // 2

    def objective(x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        th, w = 1.0 / (1.0 + np.exp(-x[:d])), np.exp(x[d:])
        if not plan._stable(th, w) or np.any(th > plan._MAX_THETA):
            return 1e30, np.zeros_like(x)
        value, grad = scaled_loss_and_gradient(x, n)
        return (value, grad) if math.isfinite(value) else (1e30, np.zeros_like(x))

    res = minimize(objective, x0, jac=True, method="L-BFGS-B",
                   options={"maxiter": iters, "maxcor": 30, "ftol": 1e-13, "gtol": 1e-12})
    return float(res.fun), np.asarray(res.x, dtype=np.float64), int(res.nit)


def planner_figure(strategy: str, n: int, th: NDArray[np.float64], w: NDArray[np.float64]) -> float:
    """The planner's mean MSE over the bound with ``plan.fit`` returning ``(θ, w)``."""
    shipped = plan.fit
    plan.fit = lambda p, horizon: (tuple(th.tolist()), tuple(w.tolist()))  # type: ignore[assignment]
    try:
        mech = make_mechanism(strategy, 1.0, n, ZCDP(0.5))
        return float(mech.mse_curve(n).mean()) / mean_mse_bound(n, 1.0, ZCDP(0.5))
    finally:
        plan.fit = shipped  # type: ignore[assignment]


def free_scale(n: int) -> tuple[float, float, float]:
    """Dense, small ``n``: the loss at the shipped fit is quadratic in ``e = 1/d``; minimise it
    over every ``e`` privacy allows (``e_j ≥ √(S_(n−j)/S_n)``, i.e. ``d_j`` at most the equalising
    scale, so no column exceeds the first). Returns ``(equalising, free, share of active
    bounds)`` (ratios to the bound)."""
    th, w = (np.array(v) for v in plan.fit(1.0, n))
    m = plan.inverse_coefficients(th, w, n)
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    inv = np.where(lag >= 0, m[np.clip(lag, 0, None)], 0.0)
    sums = plan.column_square_sums(th, w, n)
    lower = np.sqrt(sums[::-1] / sums[-1])
    weights = (n - np.maximum.outer(np.arange(n), np.arange(n))) * (inv @ inv.T)
    bound = plan.mean_factor_sqrt_bound(1.0, n)

    def objective(e: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        return float(sums[-1] * (e @ weights @ e) / n), 2.0 * sums[-1] * (weights @ e) / n

    res = minimize(objective, lower, jac=True, method="L-BFGS-B",
                   bounds=[(float(v), None) for v in lower],
                   options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-14})
    return (objective(lower)[0] / bound, float(res.fun) / bound,
            float(np.mean(np.isclose(res.x, lower, rtol=1e-9, atol=0.0))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--horizon", type=int, default=32767)
    ap.add_argument("--buffers", type=int, default=9, help="largest d (state 2d + 1 floats)")
    ap.add_argument("--iters", type=int, default=300, help="L-BFGS-B iterations per d")
    ap.add_argument("--start", choices=("shipped", "spread"), default="shipped")
    ap.add_argument("--free-scale", action="store_true",
                    help="only the dense check of the column scale (small horizons)")
    args = ap.parse_args()
    n = int(args.horizon)
    if args.free_scale:
        eq, free, active = free_scale(n)
        print(f"T = {n}: equalising scale {eq:.6f}, best scale privacy allows {free:.6f} "
              f"({active:.0%} of the bounds active)")
        return
    bound = plan.mean_factor_sqrt_bound(1.0, n)
    if args.start == "shipped":
        th0, w0 = (np.array(v) for v in plan.fit(1.0, n))
        x = np.concatenate([np.log(th0 / (1.0 - th0)), np.log(w0)])
    else:
        x = plan._spread(1.0, n, 1)
    print(f"T = {n}; shipped fit: scaled {plan.scaled_mean_factor(n, *plan.fit(1.0, n)) / bound:.6f}")
    print("   d  scaled/bound  quantised  blt(planner)  auto(planner)  iters      s")
    while True:
        d = len(x) // 2
        t0 = time.perf_counter()
        value, x, nit = refit(x, n, args.iters)
        th, w = plan._quantised(1.0 / (1.0 + np.exp(-x[:d])), np.exp(x[d:]))
        quantised = plan.scaled_mean_factor(n, th, w) / bound
        print(f"  {d:2d}  {value / bound:12.6f}  {quantised:9.6f}  {planner_figure('blt', n, th, w):12.6f}"
              f"  {planner_figure('auto', n, th, w):13.6f}  {nit:5d}  {time.perf_counter() - t0:5.0f}",
              flush=True)
        if d >= args.buffers:
            break
        x = plan._grow(x)


if __name__ == "__main__":
    main()
