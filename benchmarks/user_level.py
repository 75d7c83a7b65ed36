"""User-level privacy in the service (issue #34): what bounding each person costs.

``python benchmarks/user_level.py [--people 1000000] [--events N] [--partitions 4]
[--restore-people 10000000]`` starts an embedded broker and, in one run:

1. **Ingest, same data**: ``--events`` events (default 2 per person) of ``--people`` distinct
   people, every one valid, keyed by the person's identifier (each on its person's partition
   under Kafka's default partitioner, ``agents/kafka/partitioner.py``) over ``--ticks`` ticks of
   ``--tick-seconds``, preloaded into two deployments' events topics (``schedule = "markers"``,
   a final close marker per partition, as ``stream-dp replay`` leaves a log). For each, ``stream-dp
   worker --no-dashboard`` runs as its own process (``python -m agents.cli worker``) with the
   settings in its environment: ``privacy_unit = "event"``, then ``privacy_unit = "user"`` with
   ``user_max_events`` = ``--user-max-events`` per ``user_period_ticks`` = ``--user-period-ticks``
   (a day of 60 s ticks; every event is within its person's bound, so both count the same
   events). Rate = events counted, read from the worker's ``/metrics``
   (``stream_dp_events_total{result="accepted"}`` + ``stream_dp_user_bounded_events_total``, which
   move only when an ingest transaction has committed; ``metrics_event_counts = 1``, the
   operator's setting that exports them), sampled every 0.25 s, between the first samples at or
   past 10 % and 90 % of the events; and from the first sample that saw a commit to the last
   event committed, with the worker's CPU per event over the same span (from ``/proc``; the
   steadier figure on a shared machine). Ratio = user / event (issue #34's target: ≥ 0.8).
2. **Memory per person**: the user-level worker's RSS after its ingest minus the event-level
   worker's RSS after the same ingest, over the people; and, as a cross-check, tracemalloc of
   the per-person table alone (:class:`agents.ingest.users.UserState`, in this process) over
   ``--tracemalloc-people`` people.
3. **Checkpoint bytes per tick**: the bytes (key + value) of the committed records on the
   per-person changelog (``ingest_users_topic``) and on the ingest checkpoint topic of each
   deployment, in total and per tick of the data.
4. **Restore after kill -9**: the user-level worker (everything committed) is killed with
   SIGKILL and started again: seconds from the process start to ``/readyz`` 200 (state restored,
   the changelog read to its end and the events since the table's last write re-decided; the
   interpreter's start-up included, as
   ``benchmarks/soak.py`` measures a restore), the worker's own ``ingest partition P restored
   ... in X s`` lines (longest; they include the changelog read), and its RSS once ready.
   With ``--restore-people N`` the same for a second user-level deployment of N people, one
   event each (its ingest rate and RSS are printed as well). By default 10^7 people when the
   figures of this run project that to fit in half the available memory and ten minutes
   (printed either way), else skipped.

Prints the command, the machine and the date, then the tables (Markdown). The machine is the
one the workers share with the broker and this process (a preload of 10^7 events takes minutes
here and is not timed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.kafka.embedded_broker import EmbeddedBroker, free_port  # noqa: E402
from benchmarks.idle_worker import _ready, _scrape, pid_cpu, spawn_worker  # noqa: E402
from benchmarks.service import _produce_pending, _rss_mb, _shipped  # noqa: E402
from tests.integration import pipeline_support as ps  # noqa: E402

ACCEPTED = 'stream_dp_events_total{result="accepted"}'
BOUNDED = "stream_dp_user_bounded_events_total"
DEAD = 'stream_dp_events_total{result="dead_lettered"}'
LATE = 'stream_dp_events_total{result="late"}'
ORIGIN = 1_700_000_000.0


def make_events(people: int, events: int, ticks: int, tick_seconds: float,
                leaves: list[str]) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` of ``events`` valid events: event ``e`` is person ``e mod people``'s
    (identifier ``u<9 digits>``, the key), on leaf ``leaves[person mod len]``, at event time
    spread evenly over ``ticks`` ticks from :data:`ORIGIN` (so a person's events are in
    different ticks and every tick holds every partition's share)."""
    span = ticks * tick_seconds
    out = []
    n_leaves = len(leaves)
    for e in range(events):
        person = e % people
        uid = f"u{person:09d}"
        ts = ORIGIN + span * (e + 0.5) / events
        out.append((uid.encode(), json.dumps(
            {"key": leaves[person % n_leaves], "ts": round(ts, 3), "user": uid}).encode()))
    return out


def deployment(bootstrap: str, tmp: Path, name: str, leaves: list[str], args: Any,
               unit: str) -> Any:
    """Settings of one deployment as a user would set them for a replayed log: markers
    schedule, the shipped commit interval and timeouts, raw counts exported to the operator
    (``metrics_event_counts``), the web server on a free port."""
    work = tmp / name
    work.mkdir(parents=True, exist_ok=True)
    user: dict[str, Any] = {}
    if unit == "user":
        user = {"privacy_unit": "user", "user_max_events": args.user_max_events,
                "user_period_ticks": args.user_period_ticks,
                "ingest_users_topic": f"{name}.ingest-users"}
        if args.user_flush_interval_s is not None:
            user["user_flush_interval_s"] = args.user_flush_interval_s
    timings = _shipped("commit_interval_s", "session_timeout_s", "transaction_timeout_s")
    return ps.make_settings(bootstrap, work, name, leaves, events_partitions=args.partitions,
                            shards=2, tick_seconds=args.tick_seconds, origin=ORIGIN,
                            allowed_lateness_s=0.0, metrics_event_counts=1,
                            max_events_per_tick=10_000_000, web_host="127.0.0.1",
                            web_port=free_port(), **user, **timings)


async def preload(s: Any, events: list[tuple[bytes, bytes]], ticks: int, txn: str) -> None:
    """The events on their keys' partitions and a final close marker through ``ticks``, in one
    committed transaction."""
    await ps.create_topics(s)
    publish = await _produce_pending(s, events, ticks, txn, by_key=True)
    await publish()


def _counted(m: dict[str, float]) -> float:
    return m.get(ACCEPTED, 0.0) + m.get(BOUNDED, 0.0)


class Run:
    """One ``stream-dp worker`` process of a deployment, watched through its ``/metrics``."""

    def __init__(self, s: Any, log_path: Path) -> None:
        self.s, self.log_path = s, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        env = ps.settings_env(self.s)
        env["OPENBLAS_NUM_THREADS"] = "1"
        t0 = time.time()
        self.proc = spawn_worker(env, self.log_path)
        return t0

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the worker stopped (exit {self.proc.returncode}):\n"
                               + self.log_path.read_text(errors="replace")[-3000:])

    async def until_ready(self, timeout_s: float) -> float:
        """Time (Unix s) ``/readyz`` first answered 200 (polled every 0.1 s)."""
        give_up = time.time() + timeout_s
        while not _ready(self.s.web_port):
            self._check_alive()
            if time.time() > give_up:
                raise TimeoutError(f"not ready after {timeout_s:.0f} s")
            await asyncio.sleep(0.1)
        return time.time()

    async def drain(self, n_events: int, timeout_s: float) -> dict[str, Any]:
        """Sample the counted events (and the worker's CPU) every 0.25 s from the start until
        all ``n_events`` are committed. The rates do not start at ``/readyz``: on a loaded
        machine a worker can commit most of a backlog before its web server (on the same event
        loop) first answers. ``whole`` and ``cpu_us_per_event`` run from the first sample that
        saw a commit to the last; ``steady`` from the first samples at or past 10 % and 90 %."""
        t_start = self.start()
        assert self.proc is not None
        t_ready = 0.0
        #: (time, events counted, worker CPU seconds)
        samples: list[tuple[float, float, float]] = []
        give_up = time.time() + timeout_s
        m: dict[str, float] = {}
        while True:
            self._check_alive()
            if not t_ready and _ready(self.s.web_port):
                t_ready = time.time()
            m = _scrape(self.s.web_port)
            now = time.time()
            got = _counted(m)
            if m:
                samples.append((now, got, pid_cpu(self.proc.pid)))
            if got >= n_events and t_ready:
                break
            if now > give_up:
                raise TimeoutError(f"{got:.0f} of {n_events} events committed after "
                                   f"{timeout_s:.0f} s")
            await asyncio.sleep(0.25)
        t10, n10, _ = next(x for x in samples if x[1] >= 0.1 * n_events)
        t90, n90, _ = next(x for x in samples if x[1] >= 0.9 * n_events)
        steady = (n90 - n10) / (t90 - t10) if t90 > t10 else float("nan")
        t_first, n_first, cpu_first = next(x for x in samples if x[1] > 0)
        t_last, n_last, cpu_last = next(x for x in samples if x[1] >= n_events)
        # one commit held (nearly) everything: no rate (more events make one)
        few = n_last - n_first < 0.5 * n_events
        await asyncio.sleep(2.0)  # settle: the last commit's buffers, a release in flight
        return {"steady": steady,
                "whole": float("nan") if few else (n_last - n_first) / (t_last - t_first),
                "ready_s": t_ready - t_start, "rss_mib": _rss_mb(self.proc.pid),
                "cpu_s": pid_cpu(self.proc.pid),
                "cpu_us_per_event": (float("nan") if few else
                                     (cpu_last - cpu_first) / (n_last - n_first) * 1e6),
                "accepted": m.get(ACCEPTED, 0.0),
                "bounded": m.get(BOUNDED, 0.0), "dead": m.get(DEAD, 0.0),
                "late": m.get(LATE, 0.0)}

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    async def restore(self, timeout_s: float) -> dict[str, Any]:
        """kill -9, start again: seconds to ready, the worker's own restore lines, RSS."""
        self.kill9()
        mark = self.log_path.stat().st_size
        t0 = self.start()
        t_ready = await self.until_ready(timeout_s)
        await asyncio.sleep(1.0)
        assert self.proc is not None
        rss = _rss_mb(self.proc.pid)
        with open(self.log_path, "rb") as f:
            f.seek(mark)
            text = f.read().decode(errors="replace")
        own = [float(x) for x in re.findall(
            r"ingest partition \d+ restored \([^)]*\) in ([0-9.]+) s", text)]
        # the part of it re-deciding the events since the table's last write (user_flush)
        again = [(float(n), float(x)) for n, x in re.findall(
            r"re-decided ([0-9]+) records since the per-person table was last written, in "
            r"([0-9.]+) s", text)]
        return {"ready_s": t_ready - t0, "own_max_s": max(own, default=float("nan")),
                "own_lines": len(own), "rss_mib": rss,
                "replayed": sum(n for n, _ in again),
                "replay_max_s": max((x for _, x in again), default=0.0)}


async def topic_bytes(bootstrap: str, topic: str) -> tuple[int, int, int]:
    """``(records, key + value bytes, offsets)`` of ``topic``: its committed records now — both
    topics are compacted, so the broker may have removed older records of a key already — and
    the sum of its partitions' end offsets (every record written, plus one transaction marker
    per transaction and partition)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    recs = await ps.read_topic(bootstrap, topic, timeout_s=1800.0)
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    try:
        await c.topics()
        tps = [TopicPartition(topic, q) for q in sorted(c.partitions_for_topic(topic) or ())]
        offsets = sum((await c.end_offsets(tps)).values()) if tps else 0
    finally:
        await c.stop()
    return len(recs), sum(len(r.key or b"") + len(r.value or b"") for r in recs), offsets


def table_memory(people: int, args: Any) -> float:
    """Bytes per person of the per-person table alone (tracemalloc, this process): a
    :class:`UserState` fed one counted event of each of ``people`` people."""
    import tracemalloc

    from agents.ingest.users import UserState
    from agents.kafka.partitioner import key_partition

    s = ps.make_settings("127.0.0.1:1", Path(tempfile.mkdtemp()), "tm", ["a/b/c"],
                         events_partitions=1, privacy_unit="user",
                         user_max_events=args.user_max_events,
                         user_period_ticks=args.user_period_ticks)
    assert key_partition(b"x", 1) == 0
    objs = [{"key": "a/b/c", "ts": 0.0, "user": f"u{i:09d}"} for i in range(people)]
    tracemalloc.start()
    state = UserState(s, 0, b"k" * 32)
    before = tracemalloc.get_traced_memory()[0]
    for obj in objs:
        state.decide_obj(obj, 1, 0)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(state.bounder) == people
    return (after - before) / people


def _mem_available() -> int:
    """The machine's available memory (bytes, ``/proc/meminfo``)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def project(args: Any, res: dict[str, dict[str, Any]], byt: dict[Any, tuple[int, int]],
            people: int) -> tuple[float, float]:
    """``(bytes, seconds)`` a user-level run of ``people`` people (one event each) is projected
    to need from this run's figures, linearly: the worker's memory per person, and in the
    embedded broker (which keeps every topic in memory) an event and a changelog record per
    person; the ingest at this run's user-level rate, the preload at ~20 µs per event."""
    us, ev = res["user"], res["event"]
    per_person = max(us["rss_mib"] - ev["rss_mib"], 0.0) * 2**20 / args.people
    n_log, b_log, _ = byt["user", "log"]
    per_record = b_log / max(n_log, 1)
    need = people * (per_person + per_record + 200)
    return need, people / us["whole"] + people * 20e-6


async def run(args: Any) -> None:
    load0 = os.getloadavg()
    leaves = ps.hierarchy_paths(4, 4, 8)
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t0 = time.time()
        events = make_events(args.people, args.events, args.ticks, args.tick_seconds, leaves)
        tag = f"{args.people}-{int(time.time())}"
        deps = {unit: deployment(broker.bootstrap, tmp, f"ul-{unit}-{tag}", leaves, args, unit)
                for unit in ("event", "user")}
        for unit, s in deps.items():
            await preload(s, events, args.ticks, f"ul-preload-{unit}-{tag}")
        del events
        print(f"preloaded {args.events:,} events twice in {time.time() - t0:.0f} s", flush=True)
        runs = {unit: Run(s, tmp / f"{unit}.log") for unit, s in deps.items()}
        res: dict[str, dict[str, Any]] = {}
        try:
            for unit in ("event", "user"):
                res[unit] = await runs[unit].drain(args.events, args.timeout)
                print(f"{unit}: {res[unit]}", flush=True)
                if unit == "event":
                    runs[unit].stop()
            byt = {}
            for unit, s in deps.items():
                byt[unit, "ckpt"] = await topic_bytes(broker.bootstrap,
                                                      s.ingest_checkpoints_topic)
            byt["user", "log"] = await topic_bytes(broker.bootstrap,
                                                   deps["user"].ingest_users_topic)
            rest = await runs["user"].restore(args.timeout)
            print(f"restore: {rest}", flush=True)
        finally:
            for r in runs.values():
                r.stop()
        tm = table_memory(args.tracemalloc_people, args) if args.tracemalloc_people else None
        report(args, res, byt, rest, tm, (load0, os.getloadavg()))
        if args.restore_people < 0:  # default: 10^7 if it fits in memory and ~10 minutes
            need, secs = project(args, res, byt, 10_000_000)
            free = _mem_available()
            fits = need < 0.5 * free and secs < 600
            print(f"\n10^7 people projected from these figures: {need / 2**30:.1f} GiB (the "
                  f"worker's table, the events and the changelog in the broker), "
                  f"{secs / 60:.0f} minutes of preload and ingest; available memory "
                  f"{free / 2**30:.1f} GiB: "
                  + ("run" if fits else "skipped (more than half the available memory or 10 "
                     "minutes; --restore-people N runs it)"), flush=True)
            args.restore_people = 10_000_000 if fits else 0
        if args.restore_people:
            big: dict[str, Any] = {}
            n = args.restore_people
            t0 = time.time()
            events = make_events(n, n, args.ticks, args.tick_seconds, leaves)
            s = deployment(broker.bootstrap, tmp, f"ul-big-{n}-{int(time.time())}", leaves,
                           args, "user")
            await preload(s, events, args.ticks, f"ul-preload-big-{n}")
            del events
            print(f"preloaded {n:,} events in {time.time() - t0:.0f} s", flush=True)
            r = Run(s, tmp / "big.log")
            try:
                big["drain"] = await r.drain(n, args.timeout)
                print(f"big: {big['drain']}", flush=True)
                big["restore"] = await r.restore(args.timeout)
                print(f"big restore: {big['restore']}", flush=True)
            finally:
                r.stop()
            report_big(args, big, res["event"], (load0, os.getloadavg()))


def _flush_interval(args: Any) -> float:
    """The user-level deployments' ``user_flush_interval_s`` (given, else the shipped one)."""
    if args.user_flush_interval_s is not None:
        return float(args.user_flush_interval_s)
    from agents.config.settings import Settings

    return float(Settings.__dataclass_fields__["user_flush_interval_s"].default)


def report(args: Any, res: dict[str, dict[str, Any]], byt: dict[Any, tuple[int, int]],
           rest: dict[str, Any], tm: float | None,
           load: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    from agents.ingest.records import FAST_PATH_STATUS

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    print("\ncommand: python benchmarks/user_level.py " + " ".join(sys.argv[1:]))
    print(f"machine: {platform.machine()}, nproc {os.cpu_count()}, Python "
          f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"commit {commit}; load average (1/5/15 min) at the start "
          f"{'/'.join(f'{x:.2f}' for x in load[0])}, at the end "
          f"{'/'.join(f'{x:.2f}' for x in load[1])}")
    print(f"{FAST_PATH_STATUS}; which path each unit takes is the code's choice "
          "(agents/ingest/processing.py, _fast_scanner)")
    print(f"\n## ingest, {args.events:,} events of {args.people:,} people, {args.partitions} "
          f"partitions, {args.ticks} ticks of {args.tick_seconds:g} s, user_max_events "
          f"{args.user_max_events} per {args.user_period_ticks} ticks, user_flush_interval_s "
          f"{_flush_interval(args):g}")
    print("| privacy_unit | events/s (committed, 10 % → 90 %) | events/s (first commit → all "
          "committed) | worker CPU per event, first commit → all committed (µs) | start to ready (s) | "
          "worker CPU in all (s) | RSS after ingest (MiB) | counted | dropped by the bound | "
          "dead letters |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for unit in ("event", "user"):
        r = res[unit]
        print(f"| {unit} | {r['steady']:,.0f} | {r['whole']:,.0f} | "
              f"{r['cpu_us_per_event']:.1f} | {r['ready_s']:.1f} | "
              f"{r['cpu_s']:.1f} | {r['rss_mib']:,.0f} | {r['accepted']:,.0f} | "
              f"{r['bounded']:,.0f} | {r['dead'] + r['late']:,.0f} |")
    ev, us = res["event"], res["user"]

    def ratio(a: float, b: float) -> float:  # a run too short for a figure: nan, not a crash
        return a / b if b else float("nan")

    print(f"\nratio user / event: {ratio(us['steady'], ev['steady']):.2f} (10 % → 90 %), "
          f"{ratio(us['whole'], ev['whole']):.2f} (whole drain), "
          f"{ratio(ev['cpu_us_per_event'], us['cpu_us_per_event']):.2f} (event / user worker "
          "CPU per event: what the ratio would be with a core each); target ≥ 0.8")
    per = (us["rss_mib"] - ev["rss_mib"]) * 2**20 / args.people
    print(f"\nmemory per person: (user RSS − event RSS) / people = "
          f"({us['rss_mib']:,.0f} − {ev['rss_mib']:,.0f}) MiB / {args.people:,} = "
          f"**{per:,.0f} B**" + (f"; cross-check, tracemalloc of the table alone "
                                 f"(UserState in-process, {args.tracemalloc_people:,} people): "
                                 f"{tm:,.0f} B" if tm is not None else ""))
    print(f"\n## checkpoint bytes ({args.ticks} ticks of data; key + value)")
    print("Both topics are compacted: 'now' is what the broker holds after compacting; "
          "'written' ≈ the offsets used less one transaction marker per ingest transaction "
          "(each writes one checkpoint record and one marker on its checkpoint partition: "
          "transactions ≈ checkpoint offsets / 2), at the bytes per record now.")
    print("| topic | records now | bytes now | bytes per record | offsets used | ≈ records "
          "written | ≈ bytes written | ≈ bytes written per tick |")
    print("|---|---|---|---|---|---|---|---|")
    for (unit, kind), (n, b, offs) in byt.items():
        name = {"ckpt": "ingest checkpoints", "log": "per-person changelog"}[kind]
        txns = byt[unit, "ckpt"][2] / 2
        # never fewer than the records still there (the changelog has markers only from the
        # transactions that wrote the table: none, between writes)
        written = max(offs - txns, n)
        per = b / max(n, 1)
        print(f"| {name} ({unit} level) | {n:,} | {b:,} | {per:,.0f} | {offs:,} | "
              f"{written:,.0f} | {written * per:,.0f} | {written * per / args.ticks:,.0f} |")
    print("\n## restore after kill -9 (user level, everything committed)")
    print("| people | start to /readyz 200 (s) | longest own restore line (s) | events "
          "re-decided (since the tables' last writes) | longest re-decision (s) | RSS once "
          "ready (MiB) |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.people:,} | {rest['ready_s']:.1f} | {rest['own_max_s']:.1f} | "
          f"{rest['replayed']:,.0f} | {rest['replay_max_s']:.1f} | {rest['rss_mib']:,.0f} |")


def report_big(args: Any, big: dict[str, Any], ev: dict[str, Any],
               load: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    b, dr = big["restore"], big["drain"]
    print(f"\n## restore after kill -9 at {args.restore_people:,} people (user level, one event "
          f"each; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average at the "
          f"end {'/'.join(f'{x:.2f}' for x in load[1])})")
    print("| people | start to /readyz 200 (s) | longest own restore line (s) | events "
          "re-decided | longest re-decision (s) | RSS once ready (MiB) |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.restore_people:,} | {b['ready_s']:.1f} | {b['own_max_s']:.1f} | "
          f"{b['replayed']:,.0f} | {b['replay_max_s']:.1f} | {b['rss_mib']:,.0f} |")
    print(f"\ningest: {dr['steady']:,.0f} events/s (committed, 10 % → 90 %), "
          f"{dr['whole']:,.0f} (first commit → all committed), worker CPU "
          f"{dr['cpu_us_per_event']:.1f} µs per event (the same span); RSS "
          f"after ingest {dr['rss_mib']:,.0f} MiB; (that − the event-level worker's RSS above) "
          f"/ people = {(dr['rss_mib'] - ev['rss_mib']) * 2**20 / args.restore_people:,.0f} "
          "B per person")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Details: the module docstring (benchmarks/"
                                 "user_level.py); results: benchmarks/RESULTS.md.")
    ap.add_argument("--people", type=int, default=1_000_000, help="distinct people (1e6)")
    ap.add_argument("--events", type=int, default=0,
                    help="events in both deployments (default: 2 per person)")
    ap.add_argument("--partitions", type=int, default=4, help="events partitions (4)")
    ap.add_argument("--ticks", type=int, default=10, help="ticks the events span (10)")
    ap.add_argument("--tick-seconds", type=float, default=60.0, help="tick length (60)")
    ap.add_argument("--user-max-events", type=int, default=10,
                    help="user_max_events, K (10; ≥ a person's events: every event counted)")
    ap.add_argument("--user-period-ticks", type=int, default=1440,
                    help="user_period_ticks (1440: a day of 60 s ticks)")
    ap.add_argument("--restore-people", type=int, default=-1,
                    help="people of the second restore run (default: 10^7 if this run's "
                    "figures project it into half the available memory and 10 minutes, "
                    "else skipped; 0: skipped)")
    ap.add_argument("--tracemalloc-people", type=int, default=200_000,
                    help="people of the in-process tracemalloc cross-check (0: skipped)")
    ap.add_argument("--user-flush-interval-s", type=float, default=None,
                    help="user_flush_interval_s of the user-level deployments (default: the "
                    "shipped setting; 0: the table written with every commit)")
    ap.add_argument("--timeout", type=float, default=3600.0,
                    help="seconds to wait for a drain or a restore (3600)")
    args = ap.parse_args()
    if not args.events:
        args.events = 2 * args.people
    if args.events < args.people:
        ap.error("--events must be at least --people (every person has an event)")
    if args.events > args.user_max_events * args.people:
        ap.error("--events over --user-max-events per person: the bound would drop events")
    print("command: python benchmarks/user_level.py " + " ".join(sys.argv[1:]), flush=True)
    # SIGTERM unwinds like Ctrl-C: the workers and the embedded broker are stopped on the way
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        asyncio.run(run(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
