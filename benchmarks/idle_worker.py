"""An idle ``stream-dp worker`` process: CPU per second between ticks, CPU per tick (issue #35).

``python benchmarks/service.py --only idle`` runs it (or this module on its own, same options).
For each code tree given (``--idle-trees before=PATH,after=.``: the worker runs as ``python -m
agents.cli worker --no-dashboard`` with that tree first on ``sys.path``, so two versions of the
code are measured side by side against one embedded broker in one run) and each tick length
(``--idle-ticks 10,20``): a fresh deployment of about ``--streams`` streams (the scale
benchmark's 3-level hierarchy, compact output only, 4 release shards, 2 events partitions,
clock schedule, the shipped commit interval and session timeouts), **no events at all**.

* **idle CPU per second**: CPU seconds (user + system, from ``/proc/PID/stat``) of the worker
  process over windows between ticks — from 1 s after a tick's histogram was published (its
  release and reconcile are done) to 0.3 s before the next tick's deadline — summed over
  ``--idle-windows`` ticks, divided by their wall seconds. Nothing polls the worker inside a
  window (releases are seen through its ``/metrics`` only between windows).
* **CPU per tick**: the worker's CPU from one tick's deadline to the deadline
  ``--idle-windows`` ticks later, per tick (the tick's release of every stream, the reconcile
  side agent's histogram and the idle time between).
* ``--idle-profile DIR``: a py-spy raw profile (``-f raw``, 500 Hz, only running threads) of one
  window per tree and tick length, and the leaf functions with the most samples.

``/proc`` counts CPU in clock ticks (10 ms): over windows of ~15 s a rate of 0.001 s/s is
within a tick or two of zero; the sum over several windows narrows it.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

_CLK_TCK = float(os.sysconf("SC_CLK_TCK"))


def pid_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def pid_switches(pid: int) -> tuple[int, int, float, float]:
    """``(context switches of all its threads, threads, user CPU s, system CPU s)`` of ``pid``:
    a thread that sleeps and is woken counts one voluntary switch per wake-up."""
    n = threads = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue
        threads += 1
        for line in status.splitlines():
            if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
                n += int(line.split()[1])
    fields = Path(f"/proc/{pid}/stat").read_text()
    fields_ = fields[fields.rfind(")") + 2:].split()
    return n, threads, int(fields_[11]) / _CLK_TCK, int(fields_[12]) / _CLK_TCK


def _scrape(port: int) -> dict[str, float]:
    """The counters of the worker's ``/metrics`` (name -> value; a labelled one as
    ``name{label="value"}``, as the exposition writes it); {} if down."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(stream_dp_[a-z_]+_total(?:\{[^}]*\})?) ([0-9.e+]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def spawn_worker(env: dict[str, str], log_path: Path, tree: Path = ROOT,
                 dashboard: bool = False) -> subprocess.Popen[bytes]:
    """``python -m agents.cli worker [--no-dashboard]`` (what ``stream-dp worker`` runs) from
    ``tree`` with the settings in ``env`` (:func:`tests.integration.pipeline_support.
    settings_env`), its output appended to ``log_path``; it dies with this process."""
    from agents.kafka.processes import dying_with_parent

    with open(log_path, "ab") as log:
        cmd = [sys.executable, "-m", "agents.cli", "worker"] + ([] if dashboard else
                                                                ["--no-dashboard"])
        return subprocess.Popen(dying_with_parent(cmd), env=env, cwd=str(tree), stdout=log,
                                stderr=subprocess.STDOUT)


def _top_leaves(raw: Path, n: int = 12) -> list[tuple[str, int]]:
    """The ``n`` frames with the most samples as the innermost frame of a py-spy raw profile,
    plus a few aggregate lines (samples whose stack passes through a marker)."""
    leaves: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        total += k
        # the innermost frame outside the event loop's own machinery: who woke it, for what
        frames = [f for f in stack.split(";") if not re.search(
            r"asyncio/|selectors\.py|threading\.py|<module>|runners\.py", f)] or stack.split(";")
        leaves[re.sub(r" \(.*/", " (", frames[-1])] += k
    return [("(all samples)", total), *leaves.most_common(n)]


async def idle_run(broker: Any, tmp: Path, label: str, tree: Path, n_streams: int,
                   tick_seconds: float, windows: int, profile_dir: str = "",
                   dashboard: bool = False) -> dict[str, Any]:
    """One worker process from ``tree``, idle, ``windows`` ticks measured (see the module)."""
    from agents.kafka.embedded_broker import free_port
    from benchmarks.service import _hierarchy_shape, _shipped
    from tests.integration import pipeline_support as ps

    a, b, c = _hierarchy_shape(n_streams)
    leaves = [f"r{i}/m{j}/l{k}" for i in range(a) for j in range(b) for k in range(c)]
    app = f"bench-idle-{label}-{int(tick_seconds)}"
    work = tmp / app
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # the first tick ends a few start-ups from now: the worker is ready before its deadline
    origin = float(int(time.time()))
    timings = _shipped("commit_interval_s", "session_timeout_s", "transaction_timeout_s",
                       "empty_fetch_backoff_ms")
    s = ps.make_settings(broker.bootstrap, work, app, leaves, compact_topic=f"{app}.compact",
                         counts_json=0, histograms_json=0, tick_seconds=tick_seconds,
                         origin=origin, schedule="clock", close_grace_s=0.2,
                         allowed_lateness_s=0.0, events_partitions=2, shards=4,
                         counts_partitions=4, strategy="auto", horizon=4095,
                         max_events_per_tick=1_000_000, release_checkpoint_every=10,
                         web_host="127.0.0.1", web_port=port, max_backlog_ticks=1000,
                         **timings)
    await ps.create_topics(s)
    env = ps.settings_env(s)
    env["PYTHONPATH"] = str(tree)
    env["OPENBLAS_NUM_THREADS"] = "1"
    log_path = work / "worker.log"
    proc = spawn_worker(env, log_path, tree, dashboard)
    try:
        t_start = time.time()
        while not _ready(port):
            if proc.poll() is not None:
                raise RuntimeError(f"{label}: the worker stopped:\n"
                                   + log_path.read_text()[-3000:])
            await asyncio.sleep(1.0)
        ready_s = time.time() - t_start

        def deadline(k: int) -> float:
            return origin + k * tick_seconds

        async def released(k: int) -> None:
            """Wait until tick ``k`` was released by every shard and its histogram published."""
            give_up = time.time() + 20 * tick_seconds + 120
            while time.time() < give_up:
                m = _scrape(port)
                if (m.get("stream_dp_ticks_released_total", 0.0) >= 4 * k
                        and m.get("stream_dp_histograms_published_total", 0.0) >= k):
                    return
                if proc.poll() is not None:
                    raise RuntimeError(f"{label}: the worker stopped:\n"
                                       + log_path.read_text()[-3000:])
                await asyncio.sleep(0.25)
            raise RuntimeError(f"{label}: tick {k} was not released in time")

        async def until(t: float) -> None:
            await asyncio.sleep(max(0.0, t - time.time()))

        # steady state: the backlog of ticks due at start-up released, then one more tick
        k = int((time.time() - origin) // tick_seconds) + 1
        await released(k - 1)
        while time.time() > deadline(k) - 0.5:  # caught up with the tick in progress
            k += 1
            await released(k - 1)
        k += 1
        await until(deadline(k))
        first = k
        cpu_at: dict[int, float] = {k: pid_cpu(proc.pid)}
        idle_cpu = idle_wall = user = system = 0.0
        switches = threads = 0
        per_window: list[float] = []
        profile: list[tuple[str, int]] = []
        for i in range(windows):
            await released(k)
            await asyncio.sleep(1.0)
            end = deadline(k + 1) - 0.3
            prof = None
            if profile_dir and i == windows - 1:
                raw = Path(profile_dir) / f"{app}.raw"
                spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
                prof = (subprocess.Popen([spy, "record", "-r", "500", "-f", "raw",
                                          "--nonblocking", "-d",
                                          str(max(1, int(end - time.time() - 0.5))), "-o",
                                          str(raw), "--pid", str(proc.pid)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                        raw)
            c0, t0, x0 = pid_cpu(proc.pid), time.time(), pid_switches(proc.pid)
            await until(end)
            c1, t1, x1 = pid_cpu(proc.pid), time.time(), pid_switches(proc.pid)
            switches += x1[0] - x0[0]
            user += x1[2] - x0[2]
            system += x1[3] - x0[3]
            threads = x1[1]
            if prof is not None:
                prof[0].wait(60)
                if prof[1].exists():
                    profile = _top_leaves(prof[1])
            idle_cpu += c1 - c0
            idle_wall += t1 - t0
            per_window.append((c1 - c0) / (t1 - t0))
            k += 1
            await until(deadline(k))
            cpu_at[k] = pid_cpu(proc.pid)
        ticks = k - first
        return {
            "label": label, "tick_seconds": tick_seconds, "ready_s": ready_s,
            "nodes": len(leaves) + a * b + a + 1, "windows": windows,
            "idle_cpu_per_s": idle_cpu / idle_wall, "idle_wall_s": idle_wall,
            "idle_per_window": per_window, "threads": threads,
            "switches_per_s": switches / idle_wall, "user_s": user, "system_s": system,
            "cpu_per_tick": (cpu_at[k] - cpu_at[first]) / ticks,
            "profile": profile,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def idle_bench(broker: Any, tmp: Path, trees: list[tuple[str, Path]], n_streams: int,
                     tick_lengths: list[float], windows: int, profile_dir: str = "",
                     dashboard: bool = False) -> list[dict[str, Any]]:
    """:func:`idle_run` for every tree and tick length, tick lengths outermost, trees in the
    order given within each."""
    rows = []
    for tick in tick_lengths:
        for label, tree in trees:
            rows.append(await idle_run(broker, tmp, label, tree, n_streams, tick, windows,
                                       profile_dir, dashboard))
    return rows


def print_idle(rows: list[dict[str, Any]], load: tuple[tuple[float, ...], tuple[float, ...]],
               dashboard: bool = False) -> None:
    import platform

    flag = "" if dashboard else " --no-dashboard"
    print(f"\n## idle worker (no events), {rows[0]['nodes']:,} nodes, `stream-dp worker"
          f"{flag}` next to the embedded broker")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, nproc "
          f"{os.cpu_count()}, python {platform.python_version()}, load average (1/5/15 min) at "
          f"the start {'/'.join(f'{x:.2f}' for x in load[0])}, at the end "
          f"{'/'.join(f'{x:.2f}' for x in load[1])}")
    print("| code | tick (s) | start-up to ready (s) | idle CPU between ticks (s per s) | "
          "per window | of it system (kernel) | thread wake-ups per s (threads) | "
          "worker CPU per tick (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        both = r["user_s"] + r["system_s"]
        print(f"| {r['label']} | {r['tick_seconds']:g} | {r['ready_s']:.0f} | "
              f"**{r['idle_cpu_per_s']:.4f}** (over {r['idle_wall_s']:.0f} s) | "
              f"{', '.join(f'{x:.4f}' for x in r['idle_per_window'])} | "
              f"{r['system_s'] / both if both else 0.0:.0%} | "
              f"{r['switches_per_s']:.0f} ({r['threads']}) | {r['cpu_per_tick']:.3f} |")
    for r in rows:
        if r["profile"]:
            print(f"\npy-spy, {r['label']}, {r['tick_seconds']:g} s ticks, one idle window "
                  "(innermost frames, samples at 500 Hz): "
                  + "; ".join(f"{name} {n}" for name, n in r["profile"]))


async def main() -> None:
    import argparse
    import tempfile

    sys.path.insert(0, str(ROOT))
    from agents.kafka.embedded_broker import EmbeddedBroker

    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=1_000_000)
    ap.add_argument("--idle-ticks", default="10,20")
    ap.add_argument("--idle-windows", type=int, default=3)
    ap.add_argument("--idle-trees", default="")
    ap.add_argument("--idle-profile", default="")
    ap.add_argument("--idle-dashboard", action="store_true",
                    help="with the worker's in-process dashboard (default: --no-dashboard)")
    args = ap.parse_args()
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        load0 = os.getloadavg()
        rows = await idle_bench(broker, Path(tmp), parse_trees(args.idle_trees), args.streams,
                                [float(x) for x in args.idle_ticks.split(",")],
                                args.idle_windows, args.idle_profile, args.idle_dashboard)
        print_idle(rows, (load0, os.getloadavg()), args.idle_dashboard)


def parse_trees(spec: str) -> list[tuple[str, Path]]:
    """``label=path,label=path`` (default: this tree, labelled ``this``)."""
    if not spec:
        return [("this", ROOT)]
    out = []
    for item in spec.split(","):
        label, _, path = item.partition("=")
        out.append((label, Path(path or ".").resolve()))
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    asyncio.run(main())
