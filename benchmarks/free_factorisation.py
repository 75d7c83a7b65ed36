"""Unstructured pure-DP factorisation search: how the hat levels of ``tree-ls`` were found
(issue #36).

Minimises the mean per-release MSE ``(2/ε²)·‖W L⁺‖²_F / n`` of the decayed-sum workload ``W_p``
(``n`` ticks) over *every* measurement matrix ``L`` (``n + n/B + n/4`` rows) whose columns all
have L1 norm 1 — the Laplace problem of the issue, with least-squares decoding — by L-BFGS from
``tree-ls``'s two-level structure (leaves with share ``a``, decayed blocks of ``B`` ticks with
``1 − a``) plus a little noise. The columns are normalised inside the objective (``L = V/‖V‖₁``
per column, a smoothed absolute value), so the gradient is exact. Dense and O(n³) per step:
small ``n`` only. It prints the objective as it goes and the rows the search ends with around
the middle tick: the block rows turn into overlapping triangles of twice the block length, one
peaking at each block's end, which is what :data:`stream_dp.strategies.ls_tree.plan.HAT`
measures.

Usage::

    python benchmarks/free_factorisation.py --p 0.99 --n 256 --block 16 --share 0.5
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.linalg as sl
from numpy.typing import NDArray
from scipy.optimize import minimize


def start(p: float, n: int, block: int, share: float, seed: int) -> NDArray[np.float64]:
    rows = [np.eye(n)[i] * share for i in range(n)]
    for end in range(block, n + 1, block):
        row = np.zeros(n)
        i = np.arange(end - block, end)
        row[i] = (1.0 - share) * p ** (end - 1 - i)
        rows.append(row)
    rows += [np.zeros(n) for _ in range(n // 4)]  # free rows the search may use
    v = np.array(rows)
    return v + 1e-4 * np.random.default_rng(seed).standard_normal(v.shape)


def objective(x: NDArray[np.float64], shape: tuple[int, int], work: NDArray[np.float64]
              ) -> tuple[float, NDArray[np.float64]]:
    """Mean MSE at ε = 1 (Laplace variance 2 per unit column norm) and its gradient."""
    n = shape[1]
    v = x.reshape(shape)
    a = np.sqrt(v * v + 1e-9)
    c = a.sum(0)
    big_l = v / c
    chol = sl.cho_factor(big_l.T @ big_l)
    xs = sl.cho_solve(chol, work.T)
    f = 2.0 * float(np.einsum("ij,ij->", work.T, xs)) / n
    g_l = -(4.0 / n) * (big_l @ (xs @ xs.T))
    s = (g_l * v).sum(0) / c**2
    g_v = g_l / c - s[None, :] * (v / a)
    return f, g_v.ravel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--p", type=float, default=0.99)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--share", type=float, default=0.5, help="leaf share of the start")
    ap.add_argument("--iterations", type=int, default=400)
    args = ap.parse_args()
    n, p = args.n, args.p
    t = np.arange(n)
    work = np.where(t[:, None] >= t[None, :], p ** np.abs(t[:, None] - t[None, :]), 0.0)
    v0 = start(p, n, args.block, args.share, 0)
    shape = (v0.shape[0], v0.shape[1])
    print(f"p = {p}, n = {n}: start (tree-ls two-level, B = {args.block}, a = {args.share}) "
          f"{objective(v0.ravel(), shape, work)[0]:.3f}")
    t0 = time.perf_counter()
    res = minimize(objective, v0.ravel(), args=(shape, work), jac=True, method="L-BFGS-B",
                   options={"maxiter": args.iterations, "maxcor": 20})
    print(f"end {res.fun:.3f} after {res.nit} iterations, {time.perf_counter() - t0:.0f} s")
    v = res.x.reshape(shape)
    big_l = v / np.sqrt(v * v + 1e-9).sum(0)
    mid = n // 2
    np.set_printoptions(linewidth=160, precision=3, suppress=True)
    for i in range(n, big_l.shape[0]):  # the non-leaf rows around the middle
        row = big_l[i]
        if np.abs(row).max() > 0.05 and abs(int(np.argmax(np.abs(row))) - mid) < args.block:
            nz = np.flatnonzero(np.abs(row) > 0.02)
            print(f"row {i}: ticks {nz.min()}..{nz.max()}: {row[nz.min():nz.max() + 1]}")
    print(f"leaf coefficients around the middle: {np.diag(big_l[:n])[mid - 4:mid + 4]}")


if __name__ == "__main__":
    main()
