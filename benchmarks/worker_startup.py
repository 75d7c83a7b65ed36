"""A worker's start-up at large domains, in this process (no broker): the CPU of each piece.

What a ``stream-dp worker`` does before and right after it joins its groups, measured piece by
piece on a 3-level hierarchy of about ``--streams`` nodes (10 × 100 × c: the shape of
``benchmarks/service.py --only scale``), one release shard per 250 000 streams, compact
output, ``strategy = auto``, horizon 4095:

* ``load_domain`` — the domain file (a TOML ``paths`` array) read and checked;
* ``Worker.__init__`` — router, shard checks, deployment identity;
* a release shard's restore from its checkpoint (what every rebalance does for each shard it
  gets): the state the stage builds, the checkpoint's bank restored into it;
* the histogram's node manifest records (the reconcile leader, once per leadership).

CPU seconds (``time.process_time``) and the process's RSS after each piece. A profile of the
same in a live run: ``benchmarks/service.py --only scale --profile``.

    python benchmarks/worker_startup.py --streams 2000000 10000000

``--tree DIR`` measures another checkout's code (e.g. a ``git worktree`` of an earlier commit
with its compiled modules copied in) with this script.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _rss_gb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 1e9


def measure(n_streams: int, tmp: Path) -> dict[str, Any]:
    """Every piece's CPU seconds (and RSS after it) at about ``n_streams`` nodes."""
    from tests.integration import pipeline_support as ps

    # benchmarks/service.py's shape: 10 × 100 × c leaves
    a, b, c = 10, 100, max(1, round(n_streams / 1000))
    leaves = [f"r{i}/m{j}/l{k}" for i in range(a) for j in range(b) for k in range(c)]
    s = ps.make_settings("127.0.0.1:9", tmp, "startup", leaves, compact_topic="startup.compact",
                         counts_json=0, histograms_json=0, tick_seconds=60.0, schedule="clock",
                         shards=max(4, -(-n_streams // 250_000)), strategy="auto",
                         horizon=4095, max_events_per_tick=1_000_000,
                         release_checkpoint_every=10)
    del leaves
    gc.collect()
    out: dict[str, Any] = {"streams": n_streams}

    def timed(label: str, fn: Any) -> Any:
        t = time.process_time()
        result = fn()
        out[label] = (time.process_time() - t, _rss_gb())
        print(f"  {label}: {out[label][0]:.2f} s CPU, RSS {out[label][1]:.2f} GB", flush=True)
        return result

    from agents.config.domain import load_domain
    from agents.worker.pipeline import Worker

    domain = timed("load_domain", lambda: load_domain(s.domain_file))
    out["nodes"] = len(domain.names)
    worker = timed("Worker.__init__", lambda: Worker(s, domain=domain))
    stage = worker.release
    shard = 1
    first = timed("release state, fresh (first shard: plans the mechanism)",
                  lambda: stage.new_state(0))
    del first
    state = stage.new_state(shard)
    blob = state.to_bytes()
    del state
    gc.collect()
    build = getattr(stage, "state_to_restore", stage.new_state)

    def restore() -> Any:
        st = build(shard)
        st.restore(blob, 1, worker.key)
        return st

    out["shard streams"] = len(worker.router.shard_names(shard))
    timed("release shard restore", restore)
    from stream_dp.compact import manifest_hash

    names = tuple(domain.names)
    import stream_dp

    if (Path(stream_dp.__file__).parent / "node_manifest.py").exists():
        from stream_dp.node_manifest import encode_node_manifest

        records = timed("node manifest records", lambda: encode_node_manifest(names))
    else:  # an earlier tree: one record
        from stream_dp.compact import encode_manifest

        records = timed("node manifest records",
                        lambda: [("histogram", encode_manifest("histogram", names))])
    out["manifest records"] = len(records)
    out["manifest largest MB"] = max(len(v) for _, v in records) / 1e6
    manifest_hash(names)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--tree", default="", help="measure the code of this checkout")
    args = parser.parse_args(argv)
    tree = Path(args.tree).resolve() if args.tree else ROOT
    sys.path.insert(0, str(tree))
    rows = []
    for n in args.streams:
        print(f"{n} streams ({tree}):", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(measure(n, Path(tmp)))
    labels = [k for k in rows[0] if isinstance(rows[0][k], tuple)]
    print("\n| piece | " + " | ".join(f"{r['nodes']:,} nodes" for r in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for label in labels:
        print(f"| {label} | " + " | ".join(f"{r[label][0]:.2f} s (RSS {r[label][1]:.2f} GB)"
                                          for r in rows) + " |")
    print("| streams in the restored shard | " + " | ".join(
        f"{r['shard streams']:,}" for r in rows) + " |")
    print("| node manifest: records, largest | " + " | ".join(
        f"{r['manifest records']}, {r['manifest largest MB']:.1f} MB" for r in rows) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
