"""Consistency engine benchmarks: seed 000's restaurant experiment and seed 002's attribute grids.

Prints tables (no assertions). Every ratio is measured side by side in the same run.

    python benchmarks/consistency.py                 # default run (a few minutes on 2 cores)
    python benchmarks/consistency.py --quick         # smoke run (seconds)
    python benchmarks/consistency.py --svd-max-days 1024   # also the SVD pseudo-inverse at T=1024 (~20 min)

Methods compared:

* ``ours (lifted)`` — :func:`stream_dp.consistency.approximate` with the item trees as one batched
  tree block and the package constraints on every interval node (implied constraints; what
  :func:`stream_dp.consistency.reconcile` does automatically for a hierarchy domain);
* ``ours (paper split)`` — the same method with the package constraints on the leaves only
  (seed 000's Algorithm 1), stopping rule mean |Δx| < 1e-6 as in the paper;
* ``reconcile(domain)`` — the production path on a named :class:`~stream_dp.domain.Domain`
  (5 interval trees in one forest + the package group), warm solver cache (one tick);
* general solution ``x + M⁺(0 − M x)``: ``SVD`` = ``numpy.linalg.lstsq`` (the pseudo-inverse, the
  paper's general solution), ``Cholesky`` = dense ``Mᵀ(M Mᵀ)⁻¹`` (O(m³)), ``sparse LU`` = SciPy
  ``splu`` of the sparse normal matrix ``M Mᵀ``, ``LSQR`` = one sparse least-squares solve.
"""

from __future__ import annotations

import os

# One BLAS thread: the machines are shared and a multi-threaded BLAS under contention makes the
# dense/sparse baselines erratic (measured up to 10× slower). Override by setting the variable.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import math
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import numpy as np

from stream_dp.consistency import reconcile
from stream_dp.consistency.approx import approximate
from stream_dp.consistency.general import general_solution
from stream_dp.consistency.restaurant import (
    RESTAURANT_B,
    interval_tree_levels,
    interval_tree_parent,
    restaurant_constraints,
    restaurant_subproblems,
    restaurant_truth,
)
from stream_dp.domain import Domain

EPSILON = 1.0
ITEMS = ("cola", "burger", "wings", "fries", "nuggets")


def timed(fn: Callable[..., Any], *args: Any, repeat: int = 1, **kwargs: Any) -> tuple[float, Any]:
    """Best wall time of ``repeat`` calls of ``fn(*args, **kwargs)`` (seconds) and its result."""
    best = math.inf
    out: Any = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t0)
    return best, out


def fmt_s(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s:.4f}" if s < 10 else f"{s:.1f}"


def fmt_x(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:,.0f}×"


def machine() -> str:
    model = platform.processor() or "?"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    nproc = os.cpu_count()  # (`nproc` itself would honour OMP_NUM_THREADS=1 set above)
    load = os.getloadavg()[0]
    return (
        f"{model}, nproc={nproc}, load avg {load:.1f} at start, OPENBLAS_NUM_THREADS="
        f"{os.environ.get('OPENBLAS_NUM_THREADS')}, numpy {np.__version__}, Python {sys.version.split()[0]}"
    )


def restaurant_noise(
    days: int, fanout: int, rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Truth from random package sales + Laplace noise of scale c·h/ε (seed 000, section 7)."""
    h = len(interval_tree_levels(days, fanout))  # = ⌈log_k T⌉ + 1
    truth = restaurant_truth(rng.integers(0, 20, size=(days, 3)).astype(float), fanout)
    return truth, truth + rng.laplace(0.0, 5 * h / EPSILON, size=n)


def restaurant_domain(days: int, fanout: int) -> Domain:
    par = interval_tree_parent(days, fanout)
    n = par.size
    names = [f"{it}/{j}" for it in ITEMS for j in range(n)]
    parent = np.concatenate([np.where(par >= 0, par + i * n, -1) for i in range(len(ITEMS))])
    rows = [[f"{it}/{n - days + d}" for it in ITEMS] for d in range(days)]
    return Domain.from_parent(names, parent).with_constraints("packages", RESTAURANT_B, rows)


def bench_restaurant(days_list: list[int], svd_max: int, dense_max: int, paper_max: int) -> None:
    print(
        "\n## Seed 000 restaurant problem: 5 items, binary interval trees over T days + B v_t = 0"
    )
    print(
        f"Laplace noise scale c·h/ε (c = 5, ε = {EPSILON}), equal variances; stopping rule mean |Δx| < 1e-6.\n"
    )
    print(
        "| T | values | constraints | ours lifted: iters | ours lifted s | reconcile(domain) s | "
        "paper split: iters | paper split s | SVD s | Cholesky s | sparse LU s | "
        "SVD / ours | Cholesky / ours | sparse LU / ours | max rel. diff |"
    )
    print("|---" * 15 + "|")
    rng = np.random.default_rng(0)
    for days in days_list:
        subs_l, n = restaurant_subproblems(days, 2, lifted=True)
        subs_p, _ = restaurant_subproblems(days, 2, lifted=False)
        truth, x = restaurant_noise(days, 2, rng, n)
        M = restaurant_constraints(days, 2)
        zeros = np.zeros(M.shape[0])
        t_ours, r_ours = timed(approximate, x, None, subs_l, tol=1e-6, repeat=3)
        dom = restaurant_domain(days, 2)
        xd = x  # the domain's node order is item-major, tree BFS order: same layout
        reconcile(dom, xd)  # warm the solver cache (built once per domain)
        t_dom, r_dom = timed(reconcile, dom, xd, repeat=3)
        if days <= paper_max:
            t_pap, r_pap = timed(approximate, x, None, subs_p, tol=1e-6, max_iter=100000)
        else:
            t_pap, r_pap = None, None
        t_svd = t_chol = None
        ref = None
        if days <= svd_max:
            t_svd, ref = timed(general_solution, M, zeros, x, method="dense")
        if days <= dense_max:
            t_chol, ref2 = timed(general_solution, M, zeros, x, method="dense-normal")
            ref = ref if ref is not None else ref2
        t_lu, ref3 = timed(general_solution, M, zeros, x, method="sparse-normal")
        ref = ref if ref is not None else ref3
        vals = r_ours.values
        diff = float(np.max(np.abs(vals - ref)) / np.max(np.abs(ref)))
        diff = max(diff, float(np.max(np.abs(r_dom.values - ref)) / np.max(np.abs(ref))))
        pap_it = "—" if r_pap is None else f"{r_pap.iterations}"
        print(
            f"| {days} | {n} | {M.shape[0]} | {r_ours.iterations} | {fmt_s(t_ours)} | {fmt_s(t_dom)} | "
            f"{pap_it} | {fmt_s(t_pap)} | {fmt_s(t_svd)} | {fmt_s(t_chol)} | {fmt_s(t_lu)} | "
            f"{fmt_x(t_svd, t_ours)} | {fmt_x(t_chol, t_ours)} | {fmt_x(t_lu, t_ours)} | {diff:.1e} |"
        )
        _ = truth


def bench_restaurant_weighted(days: int) -> None:
    print(
        f"\n## Restaurant, non-uniform variances (per-level noise, scale ∝ 1.5^level), T = {days}\n"
    )
    print(
        "| split | iters | seconds | residual ‖Mx‖ | max rel. diff vs weighted sparse LU | sparse LU s |"
    )
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(1)
    sizes = interval_tree_levels(days, 2)
    level_sd = np.concatenate([np.full(s, 1.5**lvl) for lvl, s in enumerate(sizes)])
    from stream_dp.consistency.general import weighted_general_solution

    for lifted in (True, False):
        subs, n = restaurant_subproblems(days, 2, lifted=lifted)
        v = np.tile(level_sd**2, 5)
        truth = restaurant_truth(rng.integers(0, 20, size=(days, 3)).astype(float))
        x = truth + rng.normal(size=n) * np.sqrt(v)
        t, r = timed(approximate, x, v, subs, tol=1e-6, max_iter=100000)
        M = restaurant_constraints(days, 2)
        t_lu, ref = timed(
            weighted_general_solution, M, np.zeros(M.shape[0]), x, v, method="sparse-normal"
        )
        diff = float(np.max(np.abs(r.values - ref)) / np.max(np.abs(ref)))
        print(
            f"| {'lifted' if lifted else 'paper (leaves)'} | {r.iterations} | {fmt_s(t)} | "
            f"{r.residual:.1e} | {diff:.1e} | {fmt_s(t_lu)} |"
        )


def bench_restaurant_large(days_list: list[int], sparse_max: int) -> None:
    print("\n## Restaurant, large T (array API, lifted split, equal variances)\n")
    print(
        "| T | values | iters | ours s | residual ‖Mx‖ | sparse LU s | sparse LU / ours | max rel. diff |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(2)
    for days in days_list:
        subs, n = restaurant_subproblems(days, 2, lifted=True)
        _, x = restaurant_noise(days, 2, rng, n)
        t, r = timed(approximate, x, None, subs, tol=1e-6)
        t_lu = None
        diff = "—"
        if days <= sparse_max:
            M = restaurant_constraints(days, 2)
            t_lu, ref = timed(general_solution, M, np.zeros(M.shape[0]), x, method="sparse-normal")
            diff = f"{float(np.max(np.abs(r.values - ref)) / np.max(np.abs(ref))):.1e}"
        print(
            f"| {days:,} | {n:,} | {r.iterations} | {fmt_s(t)} | {r.residual:.1e} | "
            f"{fmt_s(t_lu)} | {fmt_x(t_lu, t)} | {diff} |"
        )


def grid_shape(k: int, cells: int) -> tuple[int, ...]:
    base = round(cells ** (1.0 / k))
    shape = [base] * k
    i = 0
    while math.prod(shape) < cells:
        shape[i % k] += 1
        i += 1
    return tuple(shape)


def bench_grid(ks: list[int], cells_list: list[int], lsqr_max: int) -> None:
    print("\n## Seed 002 attribute grids: total + categories + cells (k 3-level trees)")
    print(
        "Laplace noise scale (k + 2)/ε on every node. `joint` = reconcile(domain) (exact joint projection, "
        "the production path); `FGMC alt.` = seed 002's per-tree FGMC alternated (seed 000), stopping rule "
        "mean |Δx| < 1e-6; random var. = independent uniform(0.5, 5) variances per node.\n"
    )
    print(
        "| k | shape | cells | joint s | FGMC alt. iters | FGMC alt. s | joint s (random var.) | "
        "FGMC alt. iters (random var.) | LSQR s | sparse LU s | LSQR / joint | LSQR / FGMC alt. | "
        "sparse LU / joint | max rel. diff joint | max rel. diff FGMC alt. |"
    )
    print("|---" * 15 + "|")
    rng = np.random.default_rng(3)
    for k in ks:
        for cells in cells_list:
            shape = grid_shape(k, cells)
            ncell = math.prod(shape)
            dom = Domain.grid({f"a{i}": [str(j) for j in range(s)] for i, s in enumerate(shape)})
            n = len(dom)
            truth_cells = rng.poisson(5.0, size=shape).astype(float)
            truth = np.concatenate(
                [[truth_cells.sum()]]
                + [truth_cells.sum(axis=tuple(a for a in range(k) if a != i)) for i in range(k)]
                + [truth_cells.ravel()]
            )
            x = truth + rng.laplace(0.0, (k + 2) / EPSILON, size=n)
            v = rng.uniform(0.5, 5.0, size=n)
            reconcile(dom, x)  # build the per-domain solver once (cached for every later tick)
            t_j, r_j = timed(reconcile, dom, x, repeat=3)
            t_f, r_f = timed(reconcile, dom, x, grid_solver="fgmc", max_iter=10000)
            t_jw, _ = timed(reconcile, dom, x, v, repeat=3)
            _, r_fw = timed(reconcile, dom, x, v, grid_solver="fgmc", max_iter=10000)
            M = dom.constraint_matrix()
            zeros = np.zeros(M.shape[0])
            t_lsqr = None
            if ncell <= lsqr_max:
                t_lsqr, _ = timed(general_solution, M, zeros, x, method="sparse-lsqr")
            t_lu, ref = timed(general_solution, M, zeros, x, method="sparse-normal")
            scale = float(np.max(np.abs(ref)))
            d_j = float(np.max(np.abs(r_j.values - ref))) / scale
            d_f = float(np.max(np.abs(r_f.values - ref))) / scale
            print(
                f"| {k} | {'×'.join(map(str, shape))} | {ncell:,} | {fmt_s(t_j)} | "
                f"{r_f.iterations} | {fmt_s(t_f)} | {fmt_s(t_jw)} | {r_fw.iterations} | "
                f"{fmt_s(t_lsqr)} | {fmt_s(t_lu)} | {fmt_x(t_lsqr, t_j)} | {fmt_x(t_lsqr, t_f)} | "
                f"{fmt_x(t_lu, t_j)} | {d_j:.1e} | {d_f:.1e} |"
            )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="small sizes only (smoke run)")
    ap.add_argument(
        "--svd-max-days", type=int, default=512, help="largest T for the SVD pseudo-inverse"
    )
    ap.add_argument(
        "--dense-max-days", type=int, default=1024, help="largest T for the dense Cholesky solution"
    )
    ap.add_argument(
        "--paper-max-days",
        type=int,
        default=1024,
        help="largest T for the paper's leaves-only split",
    )
    ap.add_argument(
        "--days",
        type=lambda s: [int(t) for t in s.split(",")],
        default=[32, 64, 128, 256, 512, 1024],
        help="comma-separated T values of the restaurant table",
    )
    ap.add_argument(
        "--only-restaurant",
        action="store_true",
        help="run the restaurant table only (e.g. with --days 1024)",
    )
    args = ap.parse_args()
    print(f"# Consistency benchmarks — {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — {machine()}")
    if args.quick:
        bench_restaurant([32, 64], 64, 64, 64)
        bench_restaurant_weighted(64)
        bench_restaurant_large([4096], 4096)
        bench_grid([3], [1000], 1000)
        return 0
    bench_restaurant(args.days, args.svd_max_days, args.dense_max_days, args.paper_max_days)
    if args.only_restaurant:
        return 0
    bench_restaurant_weighted(1024)
    bench_restaurant_large([2**14, 2**17, 10**6], 2**17)
    bench_grid([3, 4, 5], [1_000, 10_000, 100_000, 1_000_000], 1_100_000)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
