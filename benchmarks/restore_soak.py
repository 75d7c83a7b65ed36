"""Restore time and memory after many ticks: does a worker restored after 4× as many ticks
become ready as fast? (issue #24, "Restore time grows with age").

For each tick count N (``--ticks``, default 500 and 2000), a fresh deployment (its own topics on
one embedded broker) on the clock schedule with short ticks (``--tick-seconds``, default 0.05)
releases N ticks live, one closing point per tick and events partition on its schedule topic
(an event per tick), is stopped, and is restarted ``--restarts`` times; each restart's time from start to ready (state restored, schedule topic read) and the
worker's RSS are printed in a table, with the command, machine and date.

    python benchmarks/restore_soak.py --ticks 500 2000 --restarts 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEY_HEX = "8d3a61f0c47e25b9a1e6d0937f4c28b5e0a9173dc62f8b4e5d17a0c39b6e2f84"


def _settings(bootstrap: str, tmp: Path, name: str, tick_seconds: float) -> object:
    from agents.config.settings import Settings

    dom = tmp / f"{name}.toml"
    dom.write_text('name = "soak"\nkind = "hierarchy"\nroot = "all"\n'
                   'paths = ["a/x", "a/y", "b/z"]\n', encoding="utf-8")
    key = tmp / f"{name}.key"
    key.write_text(KEY_HEX, encoding="utf-8")
    key.chmod(0o600)
    topics = {t: f"{name}.{t}" for t in ("events", "counts", "histograms", "dlq", "partials",
                                          "ckpt.ingest", "ckpt.release", "schedule", "leader")}
    return Settings(
        bootstrap=bootstrap, app_id=name, worker_id="w0", events_topic=topics["events"],
        counts_topic=topics["counts"], histograms_topic=topics["histograms"],
        dlq_topic=topics["dlq"], partials_topic=topics["partials"],
        ingest_checkpoints_topic=topics["ckpt.ingest"],
        release_checkpoints_topic=topics["ckpt.release"], schedule_topic=topics["schedule"],
        leader_topic=topics["leader"], domain_file=str(dom), key_file=str(key),
        events_partitions=2, shards=2, schedule="clock", tick_seconds=tick_seconds,
        origin=time.time() + 3.0, allowed_lateness_s=0.0, close_grace_s=0.0,
        strategy="naive", p=0.9, epsilon=1.0, horizon=255,
        session_timeout_s=6.0, transaction_timeout_s=10.0, commit_interval_s=0.5,
        max_future_skew_s=1e9)


async def _released_through(s: object, ticks: int, worker: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = list(worker.release.states.values())  # type: ignore[attr-defined]
        if states and min(st.next_tick for st in states) > ticks:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"ticks 1..{ticks} not released in {timeout} s")


async def _run(bootstrap: str, tmp: Path, ticks: int, restarts: int, tick_seconds: float
               ) -> list[dict[str, float]]:
    from agents.kafka.topics import ensure_topics
    from agents.worker.pipeline import Worker

    s = _settings(bootstrap, tmp, f"soak{ticks}-{int(time.time())}", tick_seconds)
    await ensure_topics(bootstrap, s)  # type: ignore[arg-type]
    rows = []
    for i in range(restarts + 1):
        stop = asyncio.Event()
        w = Worker(s)  # type: ignore[arg-type]
        t0 = time.monotonic()
        task = asyncio.create_task(w.run(stop))
        while not w.ready:
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        ready = time.monotonic() - t0
        if i == 0:  # live: an event per tick while the ticks go by
            from aiokafka import AIOKafkaProducer

            prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1)
            await prod.start()
            while time.time() < s.origin + ticks * tick_seconds:  # type: ignore[attr-defined]
                await prod.send(s.events_topic, json.dumps(  # type: ignore[attr-defined]
                    {"key": "a/x", "ts": time.time()}).encode(), key=b"a/x")
                await asyncio.sleep(tick_seconds)
            await prod.stop()
        await _released_through(s, ticks, w, timeout=600)
        await asyncio.sleep(1.0)
        stop.set()
        await task
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if i:  # the first run released the backlog; the rest are restores
            rows.append({"ready_s": ready, "rss_mib": rss})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ticks", type=int, nargs="+", default=[500, 2000])
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--tick-seconds", type=float, default=0.05)
    args = ap.parse_args()
    from agents.kafka.embedded_broker import EmbeddedBroker

    print(f"command: python benchmarks/restore_soak.py --ticks {' '.join(map(str, args.ticks))} "
          f"--restarts {args.restarts} --tick-seconds {args.tick_seconds}")
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          "commit " + subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                     capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory() as d, EmbeddedBroker() as broker:
        results = {}
        for n in args.ticks:
            print(f"... {n} ticks: releasing the backlog, then {args.restarts} restarts",
                  flush=True)
            results[n] = asyncio.run(_run(broker.bootstrap, Path(d), n, args.restarts,
                                          args.tick_seconds))
    print("| ticks released | restore to ready, median (s) | each restore (s) | max RSS (MiB) |")
    print("|---:|---:|---|---:|")
    for n, rows in results.items():
        med = statistics.median(r["ready_s"] for r in rows)
        each = ", ".join(f"{r['ready_s']:.2f}" for r in rows)
        print(f"| {n} | {med:.2f} | {each} | {max(r['rss_mib'] for r in rows):.0f} |")


if __name__ == "__main__":
    main()
