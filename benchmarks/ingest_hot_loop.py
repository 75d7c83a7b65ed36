"""Cost per event of the ingest hot loop (``IngestState.process_batch``), without Kafka.

Times the pure ingest state over synthetic records shaped like aiokafka's ``ConsumerRecord``
(a 1 011-node hierarchy, 4-node paths, LogAppendTime stamps inside tick 1, the noise key set),
in batches of ``--batch`` records, and prints a table of µs per event, wall and CPU time (best
and median of ``--repeat`` runs; CPU time is the steadier figure on a shared machine). Run it from two checkouts side by side to compare versions, e.g.::

    python benchmarks/ingest_hot_loop.py --events 200000
    (cd ../old && python benchmarks/ingest_hot_loop.py --events 200000)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Rec(NamedTuple):
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    timestamp_type: int
    headers: tuple[Any, ...]


def _records(n: int, origin: float, leaves: list[str]) -> list[Rec]:
    out = []
    for i in range(n):
        k = leaves[(i * 7919) % len(leaves)]
        ts = origin + 0.5 + (i % 1000) * 1e-4
        value = json.dumps({"key": k, "ts": ts, "value": 1.0 if i % 3 else 0.37}).encode()
        out.append(Rec(i, k.encode(), value, int(origin * 1000) + 600, 1, ()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    from agents.config import Settings
    from agents.ingest import IngestState, Router
    from stream_dp.domain import Domain

    leaves = [f"r{a}/s{b}/l{c}" for a in range(10) for b in range(10) for c in range(10)]
    router = Router(Domain.from_paths(leaves), 3)
    origin = 1_700_000_000.0
    s = Settings(origin=origin, tick_seconds=60.0, allowed_lateness_s=5.0, domain_file="x.toml",
                 events_partitions=1, shards=3, max_events_per_tick=1_000_000)
    recs = _records(args.events, origin, leaves)
    key = bytes(range(32))
    per_event, cpu_per_event = [], []
    for _ in range(args.repeat):
        state = IngestState(s, router, 0, offset=0, key=key)
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(0, len(recs), args.batch):
            state.process_batch(recs[i : i + args.batch])
        per_event.append((time.perf_counter() - t0) / len(recs) * 1e6)
        cpu_per_event.append((time.process_time() - c0) / len(recs) * 1e6)
        assert state.out.accepted == len(recs), state.out.dead_letters[:3]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    print(f"commit {commit}, {platform.python_version()}, {args.events} events, "
          f"batches of {args.batch}")
    print("| wall µs/event (best) | wall µs/event (median) | CPU µs/event (best) | "
          "CPU µs/event (median) | runs |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| {min(per_event):.3f} | {statistics.median(per_event):.3f} | "
          f"{min(cpu_per_event):.3f} | {statistics.median(cpu_per_event):.3f} | "
          f"{len(per_event)} |")


if __name__ == "__main__":
    main()
