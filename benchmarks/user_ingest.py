"""Ingest at user level against event level, in process, without a broker (prints a table).

Issue #34's targets: the compiled ingest path with ``privacy_unit = "user"`` at ≥ 0.8× the
events/s of event level on the same traffic with 10^6 distinct people, and ≤ 64 bytes per active
person in the per-person table.

The traffic: ``--events`` events over ``--people`` distinct people (event ``j`` is person
``j mod people``'s, so every person is active), on ``--leaves`` leaves, spread over the first
ticks (60 s ticks, clock schedule, records stamped just after their event time: all on time),
one events partition, encoded as Kafka record batches of ``--batch`` records and read as record
blocks (the worker's path: ``agents.ingest.raw_records``, installed as the worker does). The
same events, in the same order,
twice: at event level ``{"key", "ts"}`` (what an event-level deployment's producers send), at
user level ``{"key", "ts", "user"}`` with ``user_max_events`` high enough that every event
counts (the same buckets: the table's work is what differs) — or ``--max-events`` lower, to
time the drops too. At user level twice: every event a new person's (the table grows to 10^6
people as it goes: the worst case), and the same events again after them (every person already
in the table: a period's later events). Timed: wall and this thread's CPU, median of ``--repeats`` fresh states.

Memory: the compact table's own size (``UserTable.nbytes``) per person at the end, and
tracemalloc's count of what a table of ``--people`` persons allocates (the compact one, and the
library's dict ``Bounder`` on a tenth of them, for comparison).

The table is in changelog form, as the worker keeps it (the scanner collects the persons counted
for the next commit; that commit's take-and-seal is timed apart), unless ``--no-changelog``.

Usage: python benchmarks/user_ingest.py [--people 1000000] [--events 2000000] [--repeats 3]
           [--leaves 100] [--batch 5000] [--max-events 100] [--pure] [--no-changelog]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.config.settings import Settings  # noqa: E402
from agents.ingest.raw_records import install, raw_records  # noqa: E402
from agents.ingest.records import RecordBlock  # noqa: E402
from agents.ingest.routing import Router  # noqa: E402
from agents.ingest.state import IngestState  # noqa: E402
from agents.ingest.users import person_table  # noqa: E402
from benchmarks.ingest_hot_loop import _fetch, _timed_bytes  # noqa: E402
from stream_dp.domain import Domain  # noqa: E402
from stream_dp.user_level import Bounder, UserBounds  # noqa: E402

ORIGIN = 1_700_000_000.0
TICK = 60.0
KEY = bytes(range(32))


def _settings(tmp: Path, user: bool, max_events: int) -> Settings:
    kw: dict[str, Any] = dict(
        origin=ORIGIN, tick_seconds=TICK, allowed_lateness_s=5.0, close_grace_s=0.5,
        domain_file=str(tmp / "d.toml"), events_partitions=1, shards=1,
        max_future_skew_s=30.0, events_timestamp_type="CreateTime",
        max_events_per_tick=10_000_000)
    if user:
        kw.update(privacy_unit="user", user_period_ticks=1440, user_max_events=max_events)
    return Settings(**kw)


def _traffic(args: argparse.Namespace, leaves: list[str]) -> tuple[bytes, bytes, bytes]:
    """The record batches of the events at event level and at user level, and the user-level
    ones again at the next offsets (the same people a second time)."""
    ev: list[tuple[bytes, bytes, int]] = []
    us: list[tuple[bytes, bytes, int]] = []
    span = 3 * TICK  # ticks 1..3
    for j in range(args.events):
        leaf = leaves[(j * 7919) % len(leaves)]
        ts = ORIGIN + span * j / args.events
        ms = int((ts + 0.05) * 1000)
        person = f"person-{j % args.people:07d}"
        ev.append((leaf.encode(), json.dumps({"key": leaf, "ts": ts}).encode(), ms))
        us.append((person.encode(), json.dumps({"key": leaf, "ts": ts, "user": person})
                   .encode(), ms))
    return (_timed_bytes(ev, 0, args.batch), _timed_bytes(us, 0, args.batch),
            _timed_bytes(us, len(us), args.batch))


def _run(s: Settings, router: Router, raw: bytes, fast: bool, changelog: bool,
         before: bytes = b"") -> tuple[float, float, IngestState]:
    """Time ``raw`` through a fresh state (after ``before``, untimed)."""
    state = IngestState(s, router, 0, offset=0, key=KEY)
    state.use_fast_path = fast
    if state.users is not None:
        state.users.changelog = changelog
    state.clock = lambda: ORIGIN + 4 * TICK
    if before:
        state.process_fetched(_fetch(before, raw_records if fast else None))
        if state.users is not None:
            state.user_changes()  # committed
        state.out.clear()
    items = _fetch(raw, raw_records if fast else None)
    t0, c0 = time.perf_counter(), time.thread_time()
    state.process_fetched(items)
    return time.perf_counter() - t0, time.thread_time() - c0, state


def _traced(make: Any, people: int) -> float:
    """Bytes per person that tracemalloc sees a table of ``people`` persons allocate."""
    persons = [hashlib.blake2b(str(i).encode(), digest_size=16).digest() for i in range(people)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        table = make()
        for i, p in enumerate(persons):
            table.admit(p, 1 + i % 1440, 0)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(table) == people
    return used / people


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--people", type=int, default=1_000_000)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--leaves", type=int, default=100)
    ap.add_argument("--batch", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-events", type=int, default=100)
    ap.add_argument("--pure", action="store_true", help="also time the pure-Python path")
    ap.add_argument("--no-changelog", action="store_true", help="the table in the checkpoint "
                    "(tests' form), not in the changelog (the worker's: the persons counted are "
                    "collected for the next commit)")
    args = ap.parse_args()
    if RecordBlock is None or not install():  # record blocks: the worker's fetch path
        sys.exit("user_ingest: the compiled ingest path is not built (pip install -e .)")
    leaves = [f"r{i // 10}/l{i % 10}" for i in range(args.leaves)]
    router = Router(Domain.from_paths(leaves), 1)
    t0 = time.perf_counter()
    ev_raw, us_raw, us_again = _traffic(args, leaves)
    print(f"# {args.events} events, {args.people} people, {args.leaves} leaves; encoded in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    rows: dict[str, tuple[list[float], list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        s_ev = _settings(Path(tmp), False, 0)
        s_us = _settings(Path(tmp), True, args.max_events)
        paths = [("compiled, event level", s_ev, ev_raw, True, b""),
                 ("compiled, user level", s_us, us_raw, True, b""),
                 ("compiled, user level, people already in the table", s_us, us_again, True,
                  us_raw)]
        if args.pure:
            paths += [("pure, event level", s_ev, ev_raw, False, b""),
                      ("pure, user level", s_us, us_raw, False, b"")]
        last: dict[str, IngestState] = {}
        for _ in range(args.repeats):
            for name, s, raw, fast, before in paths:
                wall, cpu, state = _run(s, router, raw, fast, not args.no_changelog, before)
                got = state.out.accepted + state.out.bounded
                assert got == args.events, (name, got, len(state.out.dead_letters))
                rows.setdefault(name, ([], []))[0].append(wall)
                rows[name][1].append(cpu)
                last[name] = state
                print(f"# {name}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
    final = last["compiled, user level"]
    user = final.users
    assert user is not None
    t0, c0 = time.perf_counter(), time.thread_time()
    changes = final.user_changes() if user.changelog else []
    took = (time.perf_counter() - t0, time.thread_time() - c0)
    table = user.bounder
    bounded = last["compiled, user level"].out.bounded
    print(f"## ingest at user level vs event level: {args.events} events, {args.people} "
          f"people (K = {args.max_events}: {bounded} dropped), {args.leaves} leaves, record "
          f"blocks of {args.batch}, median of {args.repeats}")
    print("| path | events/s (wall) | events/s (CPU) | × event level (CPU) |")
    print("|---|---:|---:|---:|")
    for name, (walls, cpus) in rows.items():
        base = "compiled, event level" if name.startswith("compiled") else "pure, event level"
        ratio = statistics.median(rows[base][1]) / statistics.median(cpus)
        print(f"| {name} | {args.events / statistics.median(walls):,.0f} | "
              f"{args.events / statistics.median(cpus):,.0f} | {ratio:.2f} |")
    if user.changelog:
        size = sum(len(k) + len(v or b"") for k, v in changes)
        print(f"\nchangelog at the commit after the run (not timed above): {len(changes)} "
              f"records, {size / 1e6:.1f} MB, taken and sealed in {took[0]:.2f} s wall, "
              f"{took[1]:.2f} s CPU")
    bounds = UserBounds(max_events=args.max_events, period_ticks=1440)
    print()
    print("| per-person table | bytes per active person |")
    print("|---|---:|")
    print(f"| compact table after the run ({type(table).__name__}.nbytes / {len(table)} people)"
          f" | {table.nbytes / len(table):.1f} |" if hasattr(table, "nbytes") else
          f"| the run's table: {type(table).__name__} | - |")
    print(f"| compact table, tracemalloc, {args.people} people | "
          f"{_traced(lambda: person_table(bounds), args.people):.1f} |")
    tenth = max(1, args.people // 10)
    print(f"| dict Bounder (library), tracemalloc, {tenth} people | "
          f"{_traced(lambda: Bounder(bounds), tenth):.1f} |")


if __name__ == "__main__":
    main()
