"""Soak: thousands of short ticks with worker restarts in between — are the worker's memory,
its restore time and the tick latency flat over the run? (issue #24, "Long runs").

One deployment on one embedded broker, clock schedule with short ticks (``--tick-seconds``,
default 0.1 s), a few events per tick on every run (``--events-per-tick``). The worker is a real
``stream-dp worker`` process, run for ``--segment-s`` seconds, stopped with SIGTERM and started
again, ``--segments`` times; the clock (and the events) go on while it is down. Per segment:

* **restore** — seconds from the process start to ``/readyz`` 200 (imports, state restored,
  schedule topic read; what an operator waits for after a restart);
* **RSS** — the worker's resident memory (MiB, ``/proc/PID/status`` VmRSS) at the end of the
  segment, and the most seen during it (sampled every second);
* **tick latency** — for each tick that closed while the worker was ready (at least 1 s after
  ``/readyz``): seconds from the tick's closing moment on the clock (``origin + n·tick_seconds +
  allowed_lateness_s + close_grace_s``) until the last of its releases (every stream) is
  visible to a ``read_committed`` consumer of the counts topic; p50, p99 and max;
* **catch-up** — ticks that fell due while the worker was down, and the seconds after
  ``/readyz`` until the last of them was visible.

    python benchmarks/soak.py --segments 7 --segment-s 60 --tick-seconds 0.1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KEY_HEX = "5e2a9c41d07f38b6a1c4e92d0f7b35a8c6e1d49f2b70a3c85d6e1f04a9b27c3d"
LEAVES = ["a/x", "a/y", "b/z", "b/w"]


def _env(bootstrap: str, tmp: Path, name: str, port: int, tick_s: float, origin: float
         ) -> dict[str, str]:
    dom = tmp / "domain.toml"
    dom.write_text('name = "soak"\nkind = "hierarchy"\nroot = "all"\n'
                   f"paths = {json.dumps(LEAVES)}\n", encoding="utf-8")
    key = tmp / "noise.key"
    key.write_text(KEY_HEX, encoding="utf-8")
    key.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    env.update({
        "STREAM_DP_BOOTSTRAP": bootstrap, "STREAM_DP_APP_ID": name, "STREAM_DP_WORKER_ID": "w0",
        "STREAM_DP_DOMAIN_FILE": str(dom), "STREAM_DP_KEY_FILE": str(key),
        "STREAM_DP_ORIGIN": repr(origin), "STREAM_DP_TICK_SECONDS": repr(tick_s),
        "STREAM_DP_ALLOWED_LATENESS_S": "0.05", "STREAM_DP_CLOSE_GRACE_S": "0.05",
        "STREAM_DP_EVENTS_PARTITIONS": "2", "STREAM_DP_SHARDS": "2",
        "STREAM_DP_COUNTS_PARTITIONS": "2", "STREAM_DP_SESSION_TIMEOUT_S": "6",
        "STREAM_DP_WEB_PORT": str(port), "STREAM_DP_STRATEGY": "naive", "STREAM_DP_P": "0.9",
        "STREAM_DP_HORIZON": "255", "STREAM_DP_REPLAY_HISTORY": str(tmp / "history.json"),
        "PYTHONUNBUFFERED": "1",
    })
    for t in ("events", "counts", "histograms", "dlq", "partials", "schedule", "leader"):
        env[f"STREAM_DP_{t.upper()}_TOPIC"] = f"{name}.{t}"
    env["STREAM_DP_INGEST_CHECKPOINTS_TOPIC"] = f"{name}.ckpt-ingest"
    env["STREAM_DP_RELEASE_CHECKPOINTS_TOPIC"] = f"{name}.ckpt-release"
    return env


def _rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (VmRSS), 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


class Counts:
    """Reads the counts topic (read_committed) and keeps, per tick, how many releases were
    seen and when (wall clock, s) the last one arrived."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.seen: dict[int, int] = {}
        self.last: dict[int, float] = {}

    async def run(self, stop: asyncio.Event) -> None:
        from aiokafka import AIOKafkaConsumer

        c = AIOKafkaConsumer(self.topic, bootstrap_servers=self.bootstrap, group_id=None,
                             auto_offset_reset="earliest", isolation_level="read_committed")
        await c.start()
        try:
            while not stop.is_set():
                batch = await c.getmany(timeout_ms=100)
                now = time.time()
                for records in batch.values():
                    for r in records:
                        tick = int(json.loads(r.value)["tick"])
                        self.seen[tick] = self.seen.get(tick, 0) + 1
                        self.last[tick] = now
        finally:
            await c.stop()


async def _events(bootstrap: str, topic: str, per_tick: int, tick_s: float,
                  stop: asyncio.Event) -> None:
    """``per_tick`` events per tick, each stamped now, on random leaves, for the whole run."""
    from aiokafka import AIOKafkaProducer

    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1)
    await prod.start()
    rng = random.Random(7)
    try:
        while not stop.is_set():
            leaf = rng.choice(LEAVES)
            await prod.send(topic, json.dumps({"key": leaf, "ts": time.time()}).encode(),
                            key=leaf.encode())
            await asyncio.sleep(tick_s / per_tick)
    finally:
        await prod.stop()


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _soak(args: argparse.Namespace, bootstrap: str, tmp: Path) -> list[dict[str, Any]]:
    from agents.kafka.embedded_broker import free_port

    tick_s = float(args.tick_seconds)
    name = f"soak-{int(time.time())}"
    port = free_port()
    origin = time.time() + 5.0
    env = _env(bootstrap, tmp, name, port, tick_s, origin)
    created = subprocess.run([sys.executable, "-m", "agents.cli", "topics", "create"], env=env,
                             capture_output=True, text=True, cwd=ROOT)
    if created.returncode != 0:
        raise SystemExit(created.stderr)
    n_streams = 1 + len({leaf.split("/")[0] for leaf in LEAVES}) + len(LEAVES)
    close_at = float(env["STREAM_DP_ALLOWED_LATENESS_S"]) + float(env["STREAM_DP_CLOSE_GRACE_S"])
    stop = asyncio.Event()
    counts = Counts(bootstrap, f"{name}.counts")
    reader = asyncio.create_task(counts.run(stop))
    producer = asyncio.create_task(_events(bootstrap, f"{name}.events", args.events_per_tick,
                                           tick_s, stop))
    rows: list[dict[str, Any]] = []
    down_since = time.time()
    log = open(tmp / "worker.log", "ab")  # noqa: SIM115 - kept open for every segment
    log_pos = 0
    try:
        for seg in range(args.segments):
            t0 = time.time()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agents.cli", "worker", "--no-dashboard", env=env,
                cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=log)
            while not _ready(port):
                if proc.returncode is not None:
                    raise SystemExit(f"worker exited with {proc.returncode}; see worker.log")
                await asyncio.sleep(0.05)
            ready_at = time.time()
            # the worker's own restore lines ("... restored (checkpoint seq S, offset O) in X s",
            # one per partition and stage): state and schedule read, without the interpreter's
            # start-up, which dominates the start → ready time on a loaded machine
            log.flush()
            text = (tmp / "worker.log").read_bytes()[log_pos:].decode(errors="replace")
            log_pos += len(text.encode())
            own = [float(x) for x in re.findall(r"restored \(checkpoint seq [^)]*\) in ([0-9.]+) s",
                                                text)]
            rss_max = 0.0
            while time.time() < ready_at + args.segment_s:
                rss_max = max(rss_max, _rss_mib(proc.pid))
                await asyncio.sleep(1.0)
            rss_end = _rss_mib(proc.pid)
            stop_at = time.time()
            proc.send_signal(signal.SIGTERM)
            code = await proc.wait()
            # let the reader catch up with what the worker committed before it stopped
            await asyncio.sleep(1.0)
            first = max(1, int((down_since - origin - close_at) / tick_s) + 1)
            last = int((stop_at - origin - close_at) / tick_s)
            steady, backlog, missing = [], [], 0
            for n in range(first, last + 1):
                closed = origin + n * tick_s + close_at
                if counts.seen.get(n, 0) < n_streams:
                    missing += 1
                    continue
                if closed < ready_at:
                    backlog.append(counts.last[n] - ready_at)
                elif closed >= ready_at + 1.0:
                    steady.append(counts.last[n] - closed)
            rows.append({
                "segment": seg + 1, "ticks_so_far": last,
                "ticks_before": max(0, int((t0 - origin - close_at) / tick_s)),
                "restore_s": ready_at - t0, "own_restore_max_s": max(own, default=float("nan")),
                "own_restore_sum_s": sum(own),
                "rss_end_mib": rss_end, "rss_max_mib": rss_max,
                "lat_p50_s": _pct(steady, 0.50), "lat_p99_s": _pct(steady, 0.99),
                "lat_max_s": max(steady) if steady else float("nan"), "ticks_timed": len(steady),
                "catch_up_ticks": len(backlog),
                "catch_up_s": max(backlog) if backlog else 0.0, "unreleased": missing,
                "exit": code,
            })
            r = rows[-1]
            print(f"segment {r['segment']}: ticks 1..{r['ticks_so_far']}, restore "
                  f"{r['restore_s']:.2f} s (own lines: max {r['own_restore_max_s']:.3f} s, sum "
                  f"{r['own_restore_sum_s']:.3f} s), RSS {r['rss_end_mib']:.0f} MiB (max "
                  f"{r['rss_max_mib']:.0f}), latency p50 {r['lat_p50_s']:.3f} s p99 "
                  f"{r['lat_p99_s']:.3f} s over {r['ticks_timed']} ticks, catch-up "
                  f"{r['catch_up_ticks']} ticks in {r['catch_up_s']:.2f} s, unreleased "
                  f"{missing}, exit {code}", flush=True)
            down_since = stop_at
        # the last segment's releases have had time to appear; every tick up to its end must
        # have been released exactly (a tick cut off by a stop is released by the next start)
        await asyncio.sleep(2.0)
        end = rows[-1]["ticks_so_far"] if rows else 0
        never = [n for n in range(1, end) if counts.seen.get(n, 0) < n_streams]
        print(f"ticks 1..{end - 1}: {len(never)} without every release"
              + (f" (first: {never[:10]})" if never else ""), flush=True)
    finally:
        stop.set()
        for t in (producer, reader):
            try:
                await t
            except Exception as exc:  # report it and go on stopping
                print(f"({t.get_name()}: {exc})", file=sys.stderr)
        log.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--segments", type=int, default=7, help="worker runs (restarts + 1)")
    ap.add_argument("--segment-s", type=float, default=60.0,
                    help="seconds each worker run lasts after it is ready")
    ap.add_argument("--tick-seconds", type=float, default=0.1)
    ap.add_argument("--events-per-tick", type=int, default=4)
    args = ap.parse_args()
    from agents.kafka.embedded_broker import EmbeddedBroker

    print(f"command: python benchmarks/soak.py --segments {args.segments} --segment-s "
          f"{args.segment_s:g} --tick-seconds {args.tick_seconds:g} --events-per-tick "
          f"{args.events_per_tick}")
    print(f"machine: {platform.node()}, nproc {os.cpu_count()}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, Python "
          f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          "commit " + subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                     capture_output=True, text=True).stdout.strip(), flush=True)
    with tempfile.TemporaryDirectory() as d, EmbeddedBroker() as broker:
        rows = asyncio.run(_soak(args, broker.bootstrap, Path(d)))
    print(f"finished {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    print("| segment | ticks before / at end | restore (s) | own restore lines max / sum (s) | RSS end / max (MiB) | latency p50 / p99 / max "
          "(s) | ticks timed | catch-up ticks (s) | unreleased | exit |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['segment']} | {r['ticks_before']} / {r['ticks_so_far']} | "
              f"{r['restore_s']:.2f} | {r['own_restore_max_s']:.3f} / {r['own_restore_sum_s']:.3f} | "
              f"{r['rss_end_mib']:.0f} / {r['rss_max_mib']:.0f} | {r['lat_p50_s']:.3f} / "
              f"{r['lat_p99_s']:.3f} / {r['lat_max_s']:.3f} | {r['ticks_timed']} | "
              f"{r['catch_up_ticks']} ({r['catch_up_s']:.2f}) | {r['unreleased']} | "
              f"{r['exit']} |")
    restores = [r["restore_s"] for r in rows[1:]]
    if len(rows) >= 5:
        base = rows[1]
        later = [r for r in rows[2:] if r["ticks_before"] >= 4 * base["ticks_before"]]
        print(f"\nrestore after {base['ticks_before']} ticks (segment 2): "
              f"{base['restore_s']:.2f} s; after >= 4x as many ticks: "
              + ", ".join(f"{r['restore_s']:.2f} s ({r['ticks_before']} ticks)" for r in later)
              + f"; bound 1.5x + 1 s = {1.5 * base['restore_s'] + 1:.2f} s")
    if restores:
        print(f"restores: median {statistics.median(restores):.2f} s, max {max(restores):.2f} s")


if __name__ == "__main__":
    main()
