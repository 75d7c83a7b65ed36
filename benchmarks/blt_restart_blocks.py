"""p < 1 with blocks that restart (issue #36; a measurement, not a mechanism).

The issue's p < 1 anchors scale the last columns of a horizon, which needs the filter to
restart at its end. A restarting filter at p < 1 needs no super levels (the release
``p·r + y`` carries the closed blocks' noise, decaying), so a block at position ``u`` has the
variance ``curve(u) + p^(2(u+1))·V_end/(1 − p^(2T))``: every later block pays
``μ·V_end``, ``μ = Σ_(u<T) p^(2(u+1))/(T·(1 − p^(2T)))``. This script fits the row + column
scaled block (``benchmarks/blt_row_scaling.py``'s family, decayed) once for the first block
alone and once with ``μ·V_end`` in the loss (the later blocks' mean), and prints both blocks'
means against the lower bound next to the filter that never restarts (``blt`` today).

Usage::

    python benchmarks/blt_restart_blocks.py 0.999 --iters 150
"""

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

sys.path.insert(0, str(Path(__file__).parent))
import blt_row_scaling as R

from stream_dp.strategies.blt import plan


def parts(p: float, x: np.ndarray, n: int) -> np.ndarray:
    """The block's release variance curve (``S'``-normalised) at parameters ``x``."""
    out: np.ndarray = R.curve(*R.unpack(x.astype(complex), n), p)
    return out


def mu_of(p: float, n: int) -> float:
    u = np.arange(n)
    return float(np.sum(p ** (2 * (u + 1))) / (n * (1 - p ** (2 * n))))

def obj(x: np.ndarray, p: float, n: int, mu: float) -> tuple[float, np.ndarray]:
    """First-block mean plus ``mu`` times the block's end variance, and its complex-step
    gradient."""
    th, w, _ = R.unpack(x.astype(complex), n)
    if not plan._stable(th.real, w.real) or np.any(th.real > plan._MAX_THETA):
        return 1e30, np.zeros_like(x)
    v = R.loss(*R.unpack(x.astype(complex), n), mu, p).real
    g = np.empty(len(x))
    for k in range(len(x)):
        xc = x.astype(complex)
        xc[k] += 1j * R.STEP
        g[k] = R.loss(*R.unpack(xc, n), mu, p).imag / R.STEP
    return (v, g) if math.isfinite(v) else (1e30, np.zeros_like(x))

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("p", type=float)
    ap.add_argument("--iters", type=int, default=150)
    ap.add_argument("--max-logit", type=float, default=11.5)
    args = ap.parse_args()
    p, n, iters, cap = args.p, 32767, args.iters, args.max_logit
    mu = mu_of(p, n)
    bound = plan.mean_factor_sqrt_bound(p, n)
    th0, w0 = (np.array(v) for v in plan.fit(p, n))
    # stationary blt: first block and the next block (steady), infinite norm
    b = plan.reconstruction(p, th0, w0, 2 * n)
    v = (1.0 + plan.square_sum(th0, w0, None)) * np.cumsum(b * b)
    print(f"p {p}: mu {mu:.5f}; stationary blt first block {v[:n].mean()/bound:.6f}, next block {v[n:].mean()/bound:.6f}", flush=True)
    d = len(th0)
    x0 = np.concatenate([np.log(th0/(1-th0)), np.log(w0), [0, 0, 0, 0]])
    x0[:d] = np.minimum(x0[:d], cap)
    c0 = parts(p, x0, n).real
    print(f"  restart, columns only, shipped fit: first {c0.mean()/bound:.6f} next {(c0.mean()+mu*c0[-1])/bound:.6f}", flush=True)
    bounds = [(None, cap)] * d + [(None, None)] * (d + 4)
    for m in (0.0, mu):
        t0 = time.time()
        res = minimize(obj, x0, args=(p, n, m), jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": iters, "maxcor": 30, "ftol": 1e-14, "gtol": 1e-13})
        c = parts(p, res.x, n).real
        r = R.unpack(res.x.astype(complex), n)[2].real
        print(f"  rows+cols, end weight {m:.5f}: first {c.mean()/bound:.6f} next {(c.mean()+mu*c[-1])/bound:.6f} min r {r.min()/r.max():.3f} it {res.nit} {time.time()-t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
