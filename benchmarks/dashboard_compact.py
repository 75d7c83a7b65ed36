"""CPU of the in-process dashboard per tick at 10^6 streams (no broker): the compact records of
``--shards`` shards of ``--streams`` / shards streams each, stored as the dashboard stores them.

* ``messages``: the per-stream path it had (each followed stream's ``dp.counts.v1`` view from
  ``Block.records``, then ``DashboardState.add_counts``);
* ``columns``: the path it has (``_compact_columns`` + ``DashboardState.add_columns``).

Mean process CPU seconds per tick over ``--ticks`` ticks after 10 warm-up ticks (the series
fill to their bound first), each path in a fresh state, alternating.

Usage: python benchmarks/dashboard_compact.py [--streams 1000000] [--shards 4] [--ticks 30]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.dashboard import app as dash
from agents.dashboard.state import DashboardState
from stream_dp.compact import decode_block, decode_manifest, encode_block, encode_manifest


class _Rec:
    def __init__(self, value: bytes) -> None:
        self.value = value


async def run(path: str, streams: int, shards: int, ticks: int) -> float:
    per = streams // shards
    mans = {str(s): decode_manifest(encode_manifest(str(s), [f"r{s}/m/l{i}" for i in range(per)]))
            for s in range(shards)}
    config = dash.DashboardConfig(bootstrap="127.0.0.1:1", compact_topic="c", shards=shards)
    state = DashboardState()
    follow = max(1, dash.COMPACT_STREAMS // shards)
    cpu = 0.0
    for tick in range(1, ticks + 11):
        rng = np.random.default_rng(tick)
        recs = [_Rec(encode_block(
            shard=s, tick=tick, tick_start=0.0, tick_end=10.0 * tick, epoch=0, strategy="naive",
            p=0.9, privacy={"model": "pure", "epsilon": 1.0}, cap=1.0, horizon=4095,
            manifest=m.sha256, values=rng.normal(size=per), stderr=np.ones(per)))
            for s, m in mans.items()]
        c0 = time.process_time()
        if path == "messages":
            msgs: list[dict[str, Any]] = []
            for r in recs:
                b = decode_block(r.value)
                msgs += itertools.islice(b.records(mans[str(b.header["shard"])]), follow)
            state.add_counts(msgs)
        else:
            for cols in await dash._compact_columns(config, recs, mans):
                state.add_columns(*cols, None)
        if tick > 10:
            cpu += time.process_time() - c0
    return cpu / ticks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, nproc {os.cpu_count()}, "
          f"load {os.getloadavg()[0]:.2f}")
    print("| round | path | CPU seconds per tick |")
    print("|---|---|---:|")
    for rnd in range(args.rounds):
        for path in ("messages", "columns"):
            cpu = asyncio.run(run(path, args.streams, args.shards, args.ticks))
            print(f"| {rnd + 1} | {path} | {cpu:.4f} |", flush=True)


if __name__ == "__main__":
    main()
