"""Accuracy of ``stream-dp marginals`` (issue #13) against two baselines, side by side.

Data: :class:`simulators.attributes.AttributeEvents` (clusters of dependent attributes, sparse
1-rates, drifting cluster rates), m = 32 by default. At the last tick T we compare, for random
3-way and 5-way queries (distinct attributes, uniformly drawn), the total-variation distance
``½ Σ |p̂ − p|`` between the estimated and the exact *decayed* distribution of the query's cells
(each normalised by its own sum; negative cells clipped), averaged over queries and key seeds:

* **method** — ``run_offline``: charged bootstrap, capped Chow–Liu clusters + bridges, decayed
  counters, GLS consistency, junction-tree estimator (the code path of ``stream-dp marginals``);
* **service (live)** — :class:`stream_dp.attributes.live.LiveMarginals`, the code path of a
  ``stream-dp worker`` with a binary domain: no look-ahead; the first structure epoch uses
  fixed groups of attributes, each later one the tables chosen from the previous epoch's
  bootstrap (``--epoch-ticks``), the consistent model carried across;
* **model error only** — the method's tables, exact (no noise), through the same estimator:
  what is left is the error of assuming away dependence the tables do not capture;
* **(a) independence** — product of the *exact* (non-private) one-way decayed marginals;
* **PriView-style views** — Qardaji, Yang, Li (SIGMOD 2014): views of ``--view-size`` attributes
  (default 8) forming a greedy covering design of all pairs, each measured with the same counters
  at ε / #views (no bootstrap), made consistent with the same GLS code, each query answered by the
  maximum-entropy distribution (IPF) matching every view's marginal on the query attributes it
  holds (two or more), non-negative like the method's;
* **(b) all 2-way** — all C(m, 2) pair tables measured with the same counters at ε/C(m, 2) each
  (one event touches one cell of each), made consistent with the same GLS code, each query
  answered by the maximum-entropy distribution (iterative proportional fitting, 500 sweeps) that
  matches the query's C(α, 2) consistent pair tables, each made non-negative like the method's.

Usage: python benchmarks/marginals.py [--m 32] [--ticks 300] [--rate 300] [--epsilon 1]
       [--p 0.99] [--queries 200] [--reps 3] [--seed 0] [--epoch-ticks 100]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import platform
import time
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from simulators.attributes import AttributeEvents, TreeAttributes
from stream_dp.attributes.consistency import make_consistent
from stream_dp.attributes.live import LiveConfig, LiveMarginals
from stream_dp.attributes.model import JunctionTreeModel, _nonnegative
from stream_dp.attributes.release import MarginalRelease, run_offline
from stream_dp.attributes.tables import cell_index, count_table, marginalize

F64 = NDArray[np.float64]


def tv(est: F64, exact: F64) -> float:
    e = np.clip(est, 0.0, None)
    e = e / e.sum() if e.sum() > 0 else np.full(e.shape, 1.0 / e.size)
    return float(0.5 * np.abs(e - exact / exact.sum()).sum())


def independence(one_way: F64, q: Sequence[int]) -> F64:
    probs = np.ones(1)
    for a in q:
        pa = one_way[a]
        probs = np.outer(probs, np.array([1 - pa, pa])).reshape(-1)
    return probs


def ipf(q: Sequence[int], pair_tables: dict[tuple[int, int], F64], sweeps: int = 500) -> F64:
    """Max-entropy distribution over q's cells matching the pair tables (clipped, normalised)."""
    k = len(q)
    grid = ((np.arange(1 << k)[:, None] >> np.arange(k - 1, -1, -1)) & 1).astype(np.uint8)
    probs = np.full(1 << k, 1.0 / (1 << k))
    targets = []
    for i, j in itertools.combinations(range(k), 2):
        a, b = q[i], q[j]
        t = pair_tables[(min(a, b), max(a, b))]
        t = marginalize(t, (min(a, b), max(a, b)), (a, b))
        t = _nonnegative(t, "normsub")  # the method's own non-negativity step, for fairness
        t = t / t.sum() if t.sum() > 0 else np.full(4, 0.25)
        targets.append((cell_index(grid, (i, j)), t))
    for _ in range(sweeps):
        for idx, t in targets:
            cur = np.bincount(idx, weights=probs, minlength=4)
            ratio = np.where(cur > 0, t / np.where(cur > 0, cur, 1.0), 0.0)
            probs = probs * ratio[idx]
    return probs


def covering_views(m: int, size: int) -> list[tuple[int, ...]]:
    """Greedy covering design: views of ``size`` attributes until every pair lies in one."""
    uncovered = set(itertools.combinations(range(m), 2))
    views: list[tuple[int, ...]] = []
    while uncovered:
        view = list(min(uncovered))
        while len(view) < min(size, m):
            gain = [(sum((min(a, x), max(a, x)) in uncovered for x in view), -a)
                     for a in range(m) if a not in view]
            best = max(gain)
            view.append(-best[1])
        t = tuple(sorted(view))
        uncovered -= set(itertools.combinations(t, 2))
        views.append(t)
    return views


def ipf_views(q: Sequence[int], views: Sequence[tuple[int, ...]], tables: Sequence[F64],
              sweeps: int = 300) -> F64:
    """Max-entropy distribution over q's cells matching each view's marginal on q ∩ view."""
    k = len(q)
    grid = ((np.arange(1 << k)[:, None] >> np.arange(k - 1, -1, -1)) & 1).astype(np.uint8)
    targets = []
    for v, t in zip(views, tables, strict=True):
        common = [a for a in q if a in v]
        if len(common) < 2:
            continue
        mt = _nonnegative(marginalize(t, v, common), "normsub")
        mt = mt / mt.sum() if mt.sum() > 0 else np.full(mt.size, 1.0 / mt.size)
        targets.append((cell_index(grid, [q.index(a) for a in common]), mt, mt.size))
    probs = np.full(1 << k, 1.0 / (1 << k))
    for _ in range(sweeps):
        for idx, t, n in targets:
            cur = np.bincount(idx, weights=probs, minlength=n)
            ratio = np.where(cur > 0, t / np.where(cur > 0, cur, 1.0), 0.0)
            probs = probs * ratio[idx]
    return probs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--rate", type=float, default=300.0)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--p", type=float, default=0.99)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-cluster", type=int, default=4)
    ap.add_argument("--bootstrap-fraction", type=float, default=0.2)
    ap.add_argument("--view-size", type=int, default=8, help="PriView-style view size")
    ap.add_argument("--epoch-ticks", type=int, default=100,
                    help="structure epoch of the service (live) row, ticks")
    ap.add_argument(
        "--data",
        choices=("clusters", "tree"),
        default="clusters",
        help="clusters: AttributeEvents (sparse); tree: TreeAttributes (dense, robustness check)",
    )
    args = ap.parse_args()

    gen: AttributeEvents | TreeAttributes
    if args.data == "tree":
        gen = TreeAttributes(m=args.m, ticks=args.ticks, rate=args.rate, seed=args.seed)
    else:
        gen = AttributeEvents(m=args.m, ticks=args.ticks, rate=args.rate, seed=args.seed)
    bits, tick0, _ = gen.generate()
    ticks = tick0 + 1
    last = int(ticks.max())
    w = args.p ** (last - ticks).astype(np.float64)
    one_way = (bits * w[:, None]).sum(axis=0) / w.sum()
    rng = np.random.default_rng([args.seed, 99])
    queries = {
        a: [
            tuple(int(x) for x in rng.choice(args.m, a, replace=False)) for _ in range(args.queries)
        ]
        for a in (3, 5)
    }
    exact = {a: [count_table(bits, q, w) for q in qs] for a, qs in queries.items()}
    print(
        f"# {gen.describe()}: {bits.shape[0]} events; decayed total at tick {last}: {w.sum():.0f}"
    )
    print(f"# true {'tree edges' if args.data == 'tree' else 'clusters'}: {gen.clusters}")
    print(
        f"# ε = {args.epsilon}, p = {args.p}, {args.queries} queries per α, {args.reps} key seeds; "
        f"machine: {platform.machine()} {platform.processor() or ''} python "
        f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    names = (
        "method",
        "service (live)",
        "method's tables, exact (model error only)",
        "independence (exact 1-way)",
        "PriView-style views",
        "all 2-way tables",
    )
    errs: dict[str, dict[int, list[float]]] = {n: {3: [], 5: []} for n in names}
    for a in (3, 5):
        for q, ex in zip(queries[a], exact[a], strict=True):
            errs["independence (exact 1-way)"][a].append(tv(independence(one_way, q), ex))
    pairs = list(itertools.combinations(range(args.m), 2))
    structures = []
    t_method = t_base = t_live = 0.0
    live_tables: list[int] = []
    for rep in range(args.reps):
        key = hashlib.sha256(f"bench-marginals/{rep}".encode()).digest()
        t0 = time.perf_counter()
        res = run_offline(
            bits,
            ticks,
            epsilon=args.epsilon,
            p=args.p,
            key=key,
            description=f"bench/{rep}",
            bootstrap_fraction=args.bootstrap_fraction,
            max_cluster=args.max_cluster,
        )
        t_method += time.perf_counter() - t0
        structures.append(res.structure)
        noiseless = JunctionTreeModel(
            res.structure.tables, [count_table(bits, t, w) for t in res.structure.tables]
        )
        for a in (3, 5):
            for q, ex in zip(queries[a], exact[a], strict=True):
                errs["method"][a].append(tv(res.model.answer(q), ex))
                errs["method's tables, exact (model error only)"][a].append(
                    tv(noiseless.answer(q), ex)
                )
        t0 = time.perf_counter()
        live = LiveMarginals(
            LiveConfig(args.m, args.epsilon, args.p, args.epoch_ticks, args.bootstrap_fraction,
                       args.max_cluster), key, f"bench-live/{rep}")
        pats = (bits.astype(np.uint64) << np.arange(args.m, dtype=np.uint64)).sum(axis=1)
        for t in range(1, last + 1):
            u, c = np.unique(pats[ticks == t], return_counts=True)
            released = live.step(u, c.astype(np.float64))
        live_model = released.model()  # the tables the service releases at the last tick
        live_tables.append(len(released.tables))
        t_live += time.perf_counter() - t0
        for a in (3, 5):
            for q, ex in zip(queries[a], exact[a], strict=True):
                errs["service (live)"][a].append(tv(live_model.answer(q), ex))
        views = covering_views(args.m, args.view_size)
        pv = MarginalRelease(views, args.p, last, args.epsilon / len(views), key, f"priview/{rep}")
        order = np.argsort(ticks, kind="stable")
        pv_ids = pv.cell_ids(bits)[order]
        bounds = np.searchsorted(ticks[order], np.arange(1, last + 2))
        for t in range(1, last + 1):
            pv.step_ids(pv_ids[bounds[t - 1] : bounds[t]])
        pv_tables = make_consistent(views, pv.released(), tol=1e-7)
        for a in (3, 5):
            for q, ex in zip(queries[a], exact[a], strict=True):
                errs["PriView-style views"][a].append(tv(ipf_views(list(q), views, pv_tables), ex))
        t0 = time.perf_counter()
        base = MarginalRelease(pairs, args.p, last, args.epsilon / len(pairs), key, f"base/{rep}")
        order = np.argsort(ticks, kind="stable")
        ids = base.cell_ids(bits)[order]
        bounds = np.searchsorted(ticks[order], np.arange(1, last + 2))
        for t in range(1, last + 1):
            base.step_ids(ids[bounds[t - 1] : bounds[t]])
        consistent = make_consistent(pairs, base.released(), tol=1e-7)
        tables = dict(zip(pairs, consistent, strict=True))
        for a in (3, 5):
            for q, ex in zip(queries[a], exact[a], strict=True):
                errs["all 2-way tables"][a].append(tv(ipf(q, tables), ex))
        t_base += time.perf_counter() - t0
    s = structures[0]
    print(f"# structure (key seed 0): {len(s.tables)} tables: {[list(t) for t in s.tables]}")
    print(f"# run time: method {t_method / args.reps:.1f} s, service (live) "
          f"{t_live / args.reps:.1f} s, all-2-way {t_base / args.reps:.1f} s")
    print()
    print("| estimator | tables measured | mean TV, 3-way | mean TV, 5-way |")
    print("|---|---|---|---|")
    n_tab = {
        "method": f"{np.mean([len(x.tables) for x in structures]):.1f} (+ bootstrap)",
        "service (live)": f"{np.mean(live_tables):.1f} at the last tick (+ a bootstrap "
                          f"per {args.epoch_ticks} ticks)",
        "method's tables, exact (model error only)": "same (exact, not private)",
        "independence (exact 1-way)": "— (exact, not private)",
        "all 2-way tables": str(len(pairs)),
        "PriView-style views": f"{len(covering_views(args.m, args.view_size))} views of "
                               f"{args.view_size}",
    }
    for name, e in errs.items():
        print(f"| {name} | {n_tab[name]} | {np.mean(e[3]):.4f} | {np.mean(e[5]):.4f} |")


if __name__ == "__main__":
    main()
