"""How far row scales at the *start* would take ``blt`` at p < 1 (issue #36; a measurement).

At p < 1 the filter never restarts, so every column's norm is the infinite one and a column
scaling has nothing to equalise; the issue's p < 1 anchors (1.0012× at 0.999, 1.0079× at
0.9999) are single-horizon figures that scale the *last* columns of the horizon, which a
filter that keeps running cannot do without paying after it (RESULTS.md). What a running
filter can change is its start: rows ``r_t < 1`` for ``t < t1`` and exactly 1 after, so every
column's infinite norm ``S'_j = S_∞ − Σ_(k<t1−j) (1 − r_(j+k)²)·c_k² ≤ S_∞`` and ``d_j =
√(S_∞/S'_j)`` — private forever at the same σ. ``log r_t = log r_0·(1 − t/t1)^γ``; a grid over
``(r_0, t1, γ)`` with the shipped ``(θ, w)``, the mean release variance over ``T = 32767`` ticks
(decayed-sum recurrences in ``O(T·d²)``) against the lower bound.

``--write`` then fits the shipped family (:func:`stream_dp.strategies.blt.plan.start_rows`:
``log r_t = α·e^(−t/τ)``, quantised, with the mechanism's own column scales and variance curve,
:func:`~stream_dp.strategies.blt.plan.start_variance_curve`) by Nelder–Mead over ``(log(−α),
log τ)`` from the best of a small grid, prints the figure and writes
``stream_dp/strategies/blt/fits/blt-start-v1-p<hex>.json`` (the mechanism keeps the rows only
where they lower its mean error over the horizon).

Usage::

    python benchmarks/blt_start_rows.py 0.999
    python benchmarks/blt_start_rows.py 0.995 --write
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import minimize
from scipy.signal import lfilter

from stream_dp.strategies.blt import plan

sys.path.insert(0, str(Path(__file__).parent))
import blt_row_scaling as R


def sums_prime(th: np.ndarray, w: np.ndarray, r: np.ndarray, s_inf: float) -> np.ndarray:
    """``S'_j = S_∞ − Σ_(k<n−j) (1 − r_(j+k)²)·c_k²`` (``r = 1`` from ``n = len(r)`` on)."""
    n = len(r)
    g2 = 1.0 - r * r
    out = g2.copy()  # k = 0
    for i in range(len(th)):
        for j in range(i, len(th)):
            g = np.zeros(n, dtype=complex)
            g[:-1] = lfilter([1.0], [1.0, -th[i] * th[j]], g2[1:][::-1])[::-1]
            out = out + (1.0 if i == j else 2.0) * w[i] * w[j] * g
    return s_inf - out


def curve(p: float, th: np.ndarray, w: np.ndarray, r: np.ndarray, n: int) -> np.ndarray:
    """Release variance at ticks ``0..n−1`` (units: σ² = S_∞) of ``N = D⁻¹C⁻¹R⁻¹ζ``, decayed
    (``blt_row_scaling.curve`` with the columns' infinite norms ``S'``)."""
    rr = np.ones(n, dtype=complex)
    rr[:len(r)] = r
    s_inf = 1.0 + sum(w[i] * w[j] / (1 - th[i] * th[j])
                      for i in range(len(th)) for j in range(len(th)))
    out: np.ndarray = R.curve(th, w, rr, p, sums_prime(th, w, rr, s_inf))
    return out


def rows(r0: float, t1: float, gam: float) -> np.ndarray:
    t = np.arange(math.ceil(t1))
    return np.exp(math.log(r0) * (1 - t / t1) ** gam).astype(complex)


def shipped_figure(p: float, n: int, params: tuple[float, float]) -> float:
    """Mean release variance over ticks ``1..n`` of the shipped family (the mechanism's own
    tables and curve), in the units of :func:`plan.mean_factor` (``σ² = S_∞``)."""
    th, w = (np.asarray(v, dtype=np.float64) for v in plan.fit(p, n))
    rows = plan.start_rows(params)
    s_inf = 1.0 + plan.square_sum(th, w, None)
    d, _ = plan.start_scales(th, w, rows, s_inf)
    return s_inf * float(plan.start_variance_curve(p, th, w, d, rows, n).mean())


def write_fit(p: float, n: int) -> None:
    t0 = time.perf_counter()
    bound = plan.mean_factor_sqrt_bound(p, n)
    th, w = plan.fit(p, n)
    base = plan.mean_factor(p, n, np.asarray(th), np.asarray(w))

    def loss(x: np.ndarray) -> float:
        return shipped_figure(p, n, (-math.exp(float(x[0])), float(x[1]))) / bound

    grid = [(math.log(-math.log(r0)), math.log(tau))
            for r0 in (0.6, 0.75, 0.9) for tau in (5.0, 20.0, 80.0, 300.0, 1200.0)]
    start = min(grid, key=lambda x: loss(np.array(x)))
    res = minimize(loss, np.array(start), method="Nelder-Mead",
                   options={"maxiter": 80, "xatol": 1e-3, "fatol": 1e-10})
    alpha, log_tau = -math.exp(float(res.x[0])), float(res.x[1])
    fig = loss(res.x)
    print(f"p = {p}: shipped blt {base / bound:.7f}, with start rows {fig:.7f} "
          f"(alpha {alpha:.6f}, tau {math.exp(log_tau):.2f}, "
          f"{len(plan.start_rows((alpha, log_tau)))} rows; {time.perf_counter() - t0:.0f} s)")
    if not fig < base / bound:
        print("no gain: nothing written")
        return
    path = Path(plan.__file__).parent / "fits" / f"blt-start-v{plan.START_VERSION}-p{p.hex()}.json"
    path.write_text(json.dumps({
        "alpha": alpha, "log_tau": log_tau, "horizon": n, "figure": fig,
        "command": f"python benchmarks/blt_start_rows.py {p} --write"}) + "\n")
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("p", type=float, help="decay, below 1")
    ap.add_argument("--write", action="store_true", help="fit the shipped family and write it")
    args = ap.parse_args()
    p, n = args.p, 32767
    if args.write:
        write_fit(p, n)
        return
    th, w = (np.array(v, dtype=complex) for v in plan.fit(p, n))
    bound = plan.mean_factor_sqrt_bound(p, n)
    base = curve(p, th, w, np.ones(0, dtype=complex), n).real.mean()
    check = plan.mean_factor(p, n, th.real, w.real)
    k = np.arange(1, 40 * n)
    root = np.concatenate(([1.0], np.cumprod((2 * k - 1) / (2 * k) * p)))  # (1 − p·x)^(−1/2)
    sqrt_fig = float(np.sum(root**2)) * float(np.cumsum(root[:n] ** 2).mean())
    print(f"p = {p}: shipped blt {base / bound:.6f} (plan.mean_factor {check / bound:.6f}); "
          f"the exact Toeplitz square root {sqrt_fig / bound:.6f}")
    best, where = base, None
    for r0 in (0.5, 0.7, 0.85, 0.95):
        for t1 in (100, 300, 1000, 3000, 10000):
            for gam in (0.5, 1.0, 2.0, 4.0):
                v = curve(p, th, w, rows(r0, t1, gam), n).real.mean()
                if v < best:
                    best, where = v, (r0, t1, gam)
    print(f"best start rows {best / bound:.6f} at (r_0, t1, γ) = {where}")


if __name__ == "__main__":
    main()
