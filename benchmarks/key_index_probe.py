"""Worst-case probing of the compiled scanner's key index (agents.ingest._fastingest.KeyIndex).

An adversarial-review measurement (branch ``advs``): a writer of the events topic chooses
record keys. The index hashes key bytes with CPython's keyed SipHash (``_Py_HashBytes``, the
same function as ``hash(bytes)``), so only someone who knows the process's hash seed can aim
at long probe sequences. This script *is* such an attacker (it runs in the process, so it
knows the seed): it rebuilds the index's slot layout from ``hash(key_bytes)``, draws
``--candidates`` undeclared keys and keeps those with the longest probe sequence, then times
``KeyIndex.get`` (wall-clock ns per lookup, best of ``--reps``) for declared keys, random
undeclared keys and the worst undeclared keys, next to what the pure path spends on one
record with an undeclared key (``IngestState.process_batch``: the scanner hands such a
record to the pure path, which dead-letters it).

``--probes P`` keys per timed set (default 1000: they stay in the caches between repetitions;
100000 and more spread over the index's ~56 MB at 10^6 keys, so every lookup misses the caches,
as a worker's lookups do). ``key_hash`` says which build ran (``agents.ingest._fastingest.key_hash``
must equal ``hash(bytes)``; a build that cuts it to 32 bits, issue 38, says so).

Usage: python benchmarks/key_index_probe.py [--keys N] [--candidates M] [--reps R] [--probes P]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from agents.config.settings import Settings
from agents.ingest import _fastingest
from agents.ingest.records import Record
from agents.ingest.routing import Router
from agents.ingest.state import IngestState
from stream_dp.domain import Domain


def _time_get(ix: object, keys: list[bytes], reps: int) -> float:
    """Best-of-``reps`` wall ns per ``ix.get`` over ``keys``."""
    get = ix.get  # type: ignore[attr-defined]
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for k in keys:
            get(k)
        best = min(best, (time.perf_counter_ns() - t0) / len(keys))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--candidates", type=int, default=2_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--probes", type=int, default=1000)
    a = ap.parse_args()
    leaves = [f"r{i % 97}/s{i}" for i in range(a.keys)]
    router = Router(Domain.from_paths(leaves), 1)
    declared = router.declared
    ix = _fastingest.KeyIndex(declared)
    size = 8
    while size < 2 * len(declared):
        size <<= 1
    mask = size - 1
    occupied = bytearray(size)
    for k in declared:  # the index inserts in dict order with linear probing
        i = hash(k.encode()) & mask
        while occupied[i]:
            i = (i + 1) & mask
        occupied[i] = 1
    # probe length of a miss whose home slot is i: slots read up to the first empty one
    dist = [0] * size
    run = 0
    for i in range(2 * size - 1, -1, -1):  # twice round: runs that wrap past the end
        j = i & mask
        run = run + 1 if occupied[j] else 0
        if i < size:
            dist[j] = run + 1
    cands = [f"zz/{n}".encode() for n in range(a.candidates)]
    scored = sorted(cands, key=lambda c: dist[hash(c) & mask], reverse=True)
    worst = scored[:a.probes]
    rnd = cands[:a.probes]
    dec = [k.encode() for k in list(declared)[:a.probes]]
    full = all(_fastingest.key_hash(k) == hash(k) for k in rnd[:100])
    print(f"Python {sys.version.split()[0]}, key_hash "
          f"{'= hash(bytes), 64 bits' if full else '!= hash(bytes): cut to 32 bits'}")
    probes = {"declared": dec, "random undeclared": rnd, "worst undeclared": worst}
    print(f"keys {len(declared)}, slots {size}, longest run {max(dist) - 1}, "
          f"mean probe (worst {len(worst)} of {a.candidates}) "
          f"{sum(dist[hash(c) & mask] for c in worst) / len(worst):.1f} slots, "
          f"(random) {sum(dist[hash(c) & mask] for c in rnd) / len(rnd):.2f} slots")
    for name, keys in probes.items():
        print(f"KeyIndex.get, {name}: {_time_get(ix, keys, a.reps):.0f} ns")
    # the pure path's cost of one record with an undeclared key (what the scanner hands it)
    with tempfile.TemporaryDirectory() as tmp:
        s = Settings(origin=1_000_000.0, tick_seconds=10.0, domain_file=str(Path(tmp) / "d"),
                     events_partitions=1, shards=1, cap=1.0, schedule="markers")
        recs = [Record(i, None, json.dumps({"key": c.decode(), "ts": 1_000_001.0}).encode(),
                       -1, 0, ()) for i, c in enumerate(worst)]
        best = math.inf
        for _ in range(a.reps):
            st = IngestState(s, router, 0, offset=0)
            st.clock = lambda: 1_000_100.0
            t0 = time.perf_counter_ns()
            st.process_batch(recs)
            best = min(best, (time.perf_counter_ns() - t0) / len(recs))
        print(f"process_batch, one record with a worst undeclared key (pure path decides): "
              f"{best:.0f} ns")


if __name__ == "__main__":
    main()
