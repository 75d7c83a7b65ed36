"""CPU of an idle worker with and without the client-side backoff on empty fetches.

An in-process ``Worker`` (clock schedule, no events) against the embedded broker, which answers
empty fetches at once: CPU seconds per wall second of this process (the worker's consumers and
producers) and of the broker process, over ``--seconds`` after a warm-up, for each
``empty_fetch_backoff_ms`` value, side by side in one run.

Usage: python benchmarks/idle_fetch.py [--seconds 10] [--backoffs 0,50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.kafka.embedded_broker import EmbeddedBroker  # noqa: E402
from agents.worker.pipeline import Worker  # noqa: E402
from tests.integration import pipeline_support as ps  # noqa: E402


def _proc_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and all its descendants (the broker runs in a child process)."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return total


async def idle(bootstrap: str, tmp: Path, backoff_ms: int, seconds: float, broker_pid: int
               ) -> tuple[float, float]:
    s = ps.live_settings(bootstrap, tmp, f"idle-{backoff_ms}", ps.hierarchy_paths(2, 2, 2),
                         empty_fetch_backoff_ms=backoff_ms, tick_seconds=3600.0)
    await ps.create_topics(s)
    stop = asyncio.Event()
    w = Worker(s)
    task = asyncio.create_task(w.run(stop))
    while not w.ready:
        await asyncio.sleep(0.1)
    await asyncio.sleep(2.0)  # warm-up: joins, restores
    c0, b0, t0 = time.process_time(), _proc_cpu(broker_pid), time.perf_counter()
    await asyncio.sleep(seconds)
    c1, b1, t1 = time.process_time(), _proc_cpu(broker_pid), time.perf_counter()
    stop.set()
    await task
    return (c1 - c0) / (t1 - t0), (b1 - b0) / (t1 - t0)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--backoffs", default="0,50")
    args = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
          f"{os.cpu_count()} cores, python {platform.python_version()}")
    print("| empty_fetch_backoff_ms | worker CPU (s per s) | broker CPU (s per s) |")
    print("|---|---|---|")
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        for b in [int(x) for x in args.backoffs.split(",")]:
            w, k = await idle(broker.bootstrap, Path(tmp), b, args.seconds, broker.proc.pid)
            print(f"| {b} | {w:.3f} | {k:.3f} |")


if __name__ == "__main__":
    asyncio.run(main())
