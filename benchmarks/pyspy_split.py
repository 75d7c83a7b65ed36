"""Where a worker's CPU goes, from a py-spy raw profile (``py-spy record -f raw``).

py-spy samples only threads that are running (not waiting in ``select`` or on a lock) unless
``--idle`` is given, so sample shares are shares of CPU time. Each sample's stack is put into
the first part (in the order of :data:`PARTS`) one of whose markers occurs in one of its frames;
multiply a share by the measured CPU seconds per tick (``benchmarks/service.py --only scale``
prints them; ``--profile PATH`` writes the profile of its phase 1) for seconds per tick.

    python benchmarks/pyspy_split.py PROFILE.raw [PROFILE2.raw ...] [--top 25]

``--top N`` also lists the N leaf functions (file:function) with the most samples.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

#: (part, markers): a sample belongs to the first part with a marker in one of its frames
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("benchmark bookkeeping (subtracted in the CPU figures)",
     ("scale_bench.<locals>.sample", "_tree_rss_mb", "_proc_usage")),
    ("dashboard (agents/dashboard)", ("dashboard/app.py",)),
    ("reconcile side agent (agents/reconcile/)", ("reconcile/agent.py", "reconcile/ticks.py",
                                                   "reconcile/tables.py", "consistency/")),
    ("/metrics exposition", ("generate_latest", "Metrics.exposition")),
    ("ingest checkpoint encoding (IngestState.to_bytes)", ("IngestState.to_bytes",)),
    ("ingest tick sums at close", ("tick_sums", "_close_tick", "close_ticks", "apply_due")),
    ("ingest: compiled scan and the Python around it", ("process_batch", "process_block")),
    ("ingest stage, other (commit, transactions, end offsets)", ("IngestStage",)),
    ("CounterBank.step", ("CounterBank.step",)),
    ("release stage (records, checkpoints, transactions)", ("ReleaseStage", "release/state.py",
                                                             "release/attributes.py")),
    ("aiokafka: fetch requests / responses", ("fetcher.py",)),
    ("aiokafka: producer", ("aiokafka/producer",)),
    ("aiokafka: connections, protocol", ("aiokafka/",)),
    ("web server (aiohttp)", ("aiohttp/",)),
    ("asyncio event loop itself", ("asyncio/",)),
)

_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")


def parts_of(paths: list[Path]) -> tuple[Counter[str], Counter[str], int]:
    """(samples per part, samples per leaf frame, total samples) over ``paths``."""
    parts: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for path in paths:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            m = _LINE.match(line)
            if not m:
                continue
            n = int(m["count"])
            frames = m["stack"].split(";")
            total += n
            name = "other"
            for part, markers in PARTS:
                if any(mark in f for f in frames for mark in markers):
                    name = part
                    break
            parts[name] += n
            leaf = frames[-1]
            leaves[re.sub(r":\d+\)$", ")", leaf)] += n
    return parts, leaves, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profiles", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=0)
    args = ap.parse_args()
    parts, leaves, total = parts_of(args.profiles)
    print(f"{total} samples (running threads only)")
    print("| part | samples | share |")
    print("|---|---:|---:|")
    for name, n in parts.most_common():
        print(f"| {name} | {n} | {n / max(total, 1):.1%} |")
    if args.top:
        print(f"\n| leaf frame (top {args.top}) | samples | share |")
        print("|---|---:|---:|")
        for name, n in leaves.most_common(args.top):
            print(f"| `{name}` | {n} | {n / max(total, 1):.1%} |")


if __name__ == "__main__":
    main()
