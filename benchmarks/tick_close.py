"""CPU of the per-tick work between a closed ingest bucket and the release stage's counter
input at 10^6 streams (issue #25): ``Router.tick_sums`` (each events partition's closed bucket
→ per-shard node sums) → ``Partial.encode`` → ``Partial.decode`` → ``ReleaseState.gather``
(the partials of every source summed into one int64 count per stream of the shard).

Domain: 10 × 100 × 1000 hierarchy (1,001,011 nodes), 4 release shards, 2 events partitions,
each with a closed bucket of 50 000 distinct random leaves (the 10^5 events of a tick, split);
sums are random integer units up to 2 × cap_units (one or two events of value <= cap).

"old" is the code before issue #25's change, copied here verbatim (tuples of Python ints,
per-element generators); "new" is the current code (int64 arrays end to end). They run
alternately, ``--rounds`` rounds of ``--reps`` process-CPU timings each; the medians of each
stage and of the whole tick are printed per round and overall, and the partials' bytes and the
gathered counts are checked to be identical. ``--profile`` prints a cProfile of the new path.

Usage: python benchmarks/tick_close.py [--rounds 5] [--reps 11] [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents.config.settings import Settings
from agents.ingest.records import _fast_dumps, _fast_loads
from agents.ingest.routing import Partial, Router
from agents.release.state import ReleaseState
from stream_dp.contributions import cap_units, value_unit
from stream_dp.domain import Domain

STAGES = ("tick_sums", "encode", "decode", "gather")


# ------------------------------------------------------------------ the old code, verbatim
def old_tick_sums(self: Router, bucket: dict[int, int], clip: int
                  ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``Router.tick_sums`` before issue #25 (e1d22fe)."""
    n_leaves = len(bucket)
    if not n_leaves:
        return [((), ()) for _ in range(self.shards)]
    arrays = self._arrays()
    parent, node_shard, local = arrays
    keys = np.fromiter(bucket.keys(), dtype=np.int64, count=n_leaves)
    vals = np.fromiter((v if v < clip else clip for v in bucket.values()), dtype=np.int64,
                       count=n_leaves)
    cur = keys
    levels = [cur]
    if parent.size:
        while True:
            up = np.where(cur >= 0, parent[np.maximum(cur, 0)], -1)
            if not (up >= 0).any():
                break
            levels.append(up)
            cur = up
    paths = np.stack(levels, axis=1).ravel()
    weights = np.repeat(vals, len(levels))
    keep = paths >= 0
    idx, w = paths[keep], weights[keep]
    if int(vals.max()) * n_leaves < (1 << 62):  # no int64 overflow possible
        sums = np.zeros(len(node_shard), dtype=np.int64)
        np.add.at(sums, idx, w)
    else:  # pathological bursts: exact Python integers (object array)
        sums = np.zeros(len(node_shard), dtype=object)
        for i, x in zip(idx.tolist(), w.tolist(), strict=True):
            sums[i] += x
    seen = np.zeros(len(node_shard), dtype=bool)
    seen[idx] = True
    touched = np.flatnonzero(seen)
    shard_of_node = node_shard[touched]
    out = []
    for shard in range(self.shards):
        mine = touched[shard_of_node == shard]
        got = [v if v < clip else clip for v in sums[mine].tolist()]
        out.append((tuple(local[mine].tolist()), tuple(int(v) for v in got)))
    return out


def old_encode(p: Partial) -> bytes:
    doc = {"v": 2, "tick": p.tick, "src": p.source, "shard": p.shard,
           "idx": p.idx, "counts": p.counts, "closed_at": p.closed_at}
    return _fast_dumps(doc)


def old_decode(raw: bytes) -> Partial:
    d = _fast_loads(raw)
    if d.get("v") != 2:
        raise ValueError("a partial of an older version")
    counts = d["counts"]
    if not all(type(c) is int and c >= 0 for c in counts):
        raise ValueError("a partial whose counts are not integer units >= 0")
    return Partial(int(d["tick"]), int(d["src"]), int(d["shard"]),
                   tuple(int(i) for i in d["idx"]), tuple(counts), float(d["closed_at"]))


def old_gather(state: ReleaseState, slot: dict[int, Partial]) -> Any:
    clip = state.clip
    units = np.zeros(len(state.names), dtype=np.int64)
    for src in range(state.sources):
        part = slot[src]
        if part.idx:
            units[np.asarray(part.idx, dtype=np.int64)] += np.asarray(part.counts,
                                                                      dtype=np.int64)
            np.minimum(units, clip, out=units)
    return units


# ------------------------------------------------------------------ one tick, either way
def tick(router: Router, states: list[ReleaseState], buckets: list[dict[int, int]], clip: int,
         old: bool, times: dict[str, float]) -> tuple[list[bytes], list[Any]]:
    """One tick close → counter input; adds each stage's process CPU (s) to ``times``."""
    clock = time.process_time
    t0 = clock()
    sums = [old_tick_sums(router, b, clip) if old else router.tick_columns(b, clip)
            for b in buckets]
    t1 = clock()
    parts = [Partial(7, src, shard, idx, counts, 123.5)
             for src, per in enumerate(sums) for shard, (idx, counts) in enumerate(per)]
    raws = [old_encode(p) if old else p.encode() for p in parts]
    t2 = clock()
    decoded = [old_decode(r) if old else Partial.decode(r) for r in raws]
    t3 = clock()
    units = []
    for st in states:
        slot = {p.source: p for p in decoded if p.shard == st.shard}
        units.append(old_gather(st, slot) if old else st.gather(slot))
    t4 = clock()
    for k, dt in zip(STAGES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
        times[k] = times.get(k, 0.0) + dt
    return raws, units


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--leaves", type=int, default=50_000, help="per events partition")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()

    t = time.perf_counter()
    dom = Domain.from_paths([f"r{i}/m{j}/l{k}" for i in range(10) for j in range(100)
                             for k in range(1000)])
    s = Settings(origin=1000.0, shards=4, events_partitions=2)
    router = Router(dom, s.shards)
    states = [ReleaseState(s, router, sh, None) for sh in range(s.shards)]
    clip = states[0].clip
    cap_u = cap_units(s.cap, value_unit(s.cap))
    rng = np.random.default_rng(25)
    leaves = np.array(sorted(router.declared.values()))
    buckets = [{int(k): int(v) for k, v in zip(rng.choice(leaves, size=a.leaves, replace=False),
                                                rng.integers(1, 2 * cap_u, size=a.leaves),
                                                strict=True)}
               for _ in range(s.events_partitions)]
    router._arrays()
    print(f"{len(dom.names):,} nodes, {s.shards} shards, {s.events_partitions} events "
          f"partitions x {a.leaves:,} leaves; set-up {time.perf_counter() - t:.1f} s")

    raws_old, units_old = tick(router, states, buckets, clip, True, {})
    raws_new, units_new = tick(router, states, buckets, clip, False, {})
    same = raws_old == raws_new and all(np.array_equal(x, y) for x, y in
                                        zip(units_old, units_new, strict=True))
    entries = sum(len(_fast_loads(r)["idx"]) for r in raws_new)
    print(f"partials: {len(raws_new)}, {entries:,} (node, sum) entries, "
          f"{sum(map(len, raws_new)):,} bytes; old and new bytes and counts identical: {same}")
    if not same:
        raise SystemExit("old and new paths disagree")

    if a.profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.reps):
            tick(router, states, buckets, clip, False, {})
        pr.disable()
        pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
        return

    med: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    for rnd in range(a.rounds):
        line = []
        for label in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
            samples: dict[str, list[float]] = {k: [] for k in (*STAGES, "total")}
            for _ in range(a.reps):
                times: dict[str, float] = {}
                tick(router, states, buckets, clip, label == "old", times)
                for k in STAGES:
                    samples[k].append(times[k])
                samples["total"].append(sum(times.values()))
            for k, xs in samples.items():
                med[label].setdefault(k, []).append(statistics.median(xs))
            line.append(f"{label} " + ", ".join(
                f"{k} {statistics.median(samples[k]) * 1e3:.1f}" for k in (*STAGES, "total")))
        print(f"round {rnd + 1} (ms CPU per tick): " + " | ".join(line))
    print("median over rounds (ms CPU per tick):")
    for k in (*STAGES, "total"):
        o, n = statistics.median(med["old"][k]), statistics.median(med["new"][k])
        print(f"  {k:10s} old {o * 1e3:7.1f}  new {n * 1e3:7.1f}  ({o / n:.1f}x)")


if __name__ == "__main__":
    main()
