"""Per-event CPU cost of the ingest hot loop, without a broker (prints a table).

The events of ``benchmarks/service.py --only ingest`` (149-node hierarchy, each event feeds 4
nodes, markers schedule, one events partition) are encoded as Kafka record batches of 500
records, as a fetch response holds them. Timed, in one process, median of ``--repeats``:

* aiokafka's decoding into ``ConsumerRecord`` objects — what a bare consumer does per record;
* the pure-Python ingest path (``STREAM_DP_PURE_INGEST=1`` behaviour) on those records;
* the compiled scanner on aiokafka's decoded records (a compressed batch's path);
* the compiled scanner on record blocks (``agents.ingest.raw_records``: what the worker does), the
  batch decoding included.

``--shape A,B,C --active F``: instead, the traffic of ``benchmarks/service.py --only scale``
at A·B·C leaves (``r{i}/m{j}/l{k}``): clock schedule, 2 events partitions, 10 s ticks, each
tick a fresh random fraction F of the leaves with one event each (``{"key", "ts"}``, record
timestamp = the event time in ms, times spread over the first half of the tick), batches of
``--batch`` records per partition. Timed: the record-block path only (the worker's), per tick
and partition as the worker sees it, over ``--ticks`` ticks; the scanner's state (open buckets)
is the worker's between closes. ``--pure`` adds the pure-Python path on the same records. Both
wall time and this thread's CPU time are reported (on a shared machine the CPU time is the
steadier measure of the work; the first call also builds the scanner's key index, reported
apart).

Usage: python benchmarks/ingest_hot_loop.py [--events 200000] [--repeats 5]
       python benchmarks/ingest_hot_loop.py --shape 10,100,1000 --active 0.1 [--ticks 3]
           [--batch 5000] [--repeats 5] [--pure]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiokafka.consumer import fetcher  # noqa: E402
from aiokafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402
from aiokafka.structs import TopicPartition  # noqa: E402

from agents.ingest.raw_records import install, raw_records  # noqa: E402
from agents.ingest.records import RecordBlock  # noqa: E402
from agents.ingest.state import IngestState  # noqa: E402
from agents.worker.pipeline import Worker  # noqa: E402
from tests.integration import pipeline_support as ps  # noqa: E402


def _bytes(events: list[tuple[bytes, bytes]], origin: float, span: float) -> bytes:
    out = b""
    for start in range(0, len(events), 500):
        b = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 22)
        for j, (key, value) in enumerate(events[start:start + 500]):
            b.append(j, timestamp=int((origin + span * (start + j) / len(events)) * 1000),
                     key=key, value=value, headers=[])
        raw = bytearray(b.build())
        raw[0:8] = start.to_bytes(8, "big")
        out += bytes(raw)
    return out


def _timed_bytes(events: list[tuple[bytes, bytes, int]], first_offset: int, batch: int
                 ) -> bytes:
    """Record batches of ``batch`` records (key, value, timestamp in ms), offsets from
    ``first_offset``."""
    out = []
    for start in range(0, len(events), batch):
        b = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 26)
        for j, (key, value, ms) in enumerate(events[start:start + batch]):
            b.append(j, timestamp=ms, key=key, value=value, headers=[])
        raw = bytearray(b.build())
        raw[0:8] = (first_offset + start).to_bytes(8, "big")
        out.append(bytes(raw))
    return b"".join(out)


def scale_shape(args: argparse.Namespace) -> None:
    """The ``--shape`` mode (see the module docstring): µs per event of the record-block path
    at the scale benchmark's hierarchy and traffic."""
    import json
    import zlib

    import numpy as np

    a, b, c = (int(x) for x in args.shape.split(","))
    leaves = [f"r{i}/m{j}/l{k}" for i in range(a) for j in range(b) for k in range(c)]
    tick_seconds = 10.0
    partitions = 2
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        origin = 1_700_000_000.0
        s = ps.make_settings("127.0.0.1:1", Path(tmp), "hot", leaves, schedule="clock",
                             tick_seconds=tick_seconds, origin=origin, close_grace_s=0.2,
                             allowed_lateness_s=0.0, events_partitions=partitions, shards=4,
                             strategy="auto", max_events_per_tick=1_000_000)
        t0 = time.perf_counter()
        w = Worker(s)
        print(f"# {len(leaves)} leaves; worker built in {time.perf_counter() - t0:.1f} s",
              flush=True)
        part_of = [zlib.crc32(leaf.encode()) % partitions for leaf in leaves]
        # per partition: one fetched byte string per tick (its batches), and the event count
        fetched: list[list[bytes]] = [[] for _ in range(partitions)]
        pure_records: list[list[list[Any]]] = [[] for _ in range(partitions)]
        offsets = [0] * partitions
        n_events = 0
        for tick in range(args.ticks):
            chosen = rng.choice(len(leaves), int(args.active * len(leaves)), replace=False)
            ts0 = origin + tick * tick_seconds
            per: list[list[tuple[bytes, bytes, int]]] = [[] for _ in range(partitions)]
            for n, i in enumerate(chosen.tolist()):
                ts = ts0 + tick_seconds / 2 * n / len(chosen)
                ms = int(ts * 1000)
                leaf = leaves[i]
                per[part_of[i]].append((leaf.encode(), json.dumps({"key": leaf, "ts": ts})
                                        .encode(), ms))
            for p in range(partitions):
                fetched[p].append(_timed_bytes(per[p], offsets[p], args.batch))
                offsets[p] += len(per[p])
                n_events += len(per[p])
                if args.pure:
                    pure_records[p].append(_fetch(fetched[p][-1], None))

        def states(fast: bool) -> list[IngestState]:
            out = []
            for p in range(partitions):
                st = IngestState(s, w.router, p, offset=0, key=w.key, domain_id=w.domain_id)
                st.use_fast_path = fast
                st.clock = lambda: origin + tick_seconds * (args.ticks + 1)
                out.append(st)
            return out

        rows: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        # the first batch builds what the scanner builds once per worker (the key index, if
        # this version has one): timed apart, on a batch of one record
        warm = states(True)[0]
        one = _timed_bytes([(leaves[0].encode(), json.dumps({"key": leaves[0], "ts": origin})
                             .encode(), int(origin * 1000))], 0, 1)
        t0, c0 = time.perf_counter(), time.thread_time()
        warm.process_fetched(_fetch(one, raw_records))
        print(f"# first batch (one record; builds the key index if any): "
              f"{time.perf_counter() - t0:.3f} s wall, {time.thread_time() - c0:.3f} s CPU",
              flush=True)
        for _ in range(args.repeats):
            sts = states(True)
            t_all = c_all = 0.0
            for tick in range(args.ticks):
                for p in range(partitions):
                    t0, c0 = time.perf_counter(), time.thread_time()
                    items = _fetch(fetched[p][tick], raw_records)
                    sts[p].process_fetched(items)
                    t_all += time.perf_counter() - t0
                    c_all += time.thread_time() - c0
            name = ("record blocks: batch decode + compiled scanner (the worker)"
                    if RecordBlock is not None else "the pure path (no compiled module)")
            rows.setdefault(name, []).append(t_all)
            cpu.setdefault(name, []).append(c_all)
            assert sum(st.out.accepted for st in sts) == n_events, "events were rejected"
            if args.pure:
                pure = states(False)
                t_all = c_all = 0.0
                for tick in range(args.ticks):
                    for p in range(partitions):
                        t0, c0 = time.perf_counter(), time.thread_time()
                        pure[p].process_batch(pure_records[p][tick])
                        t_all += time.perf_counter() - t0
                        c_all += time.thread_time() - c0
                name = "pure-Python ingest on aiokafka's records"
                rows.setdefault(name, []).append(t_all)
                cpu.setdefault(name, []).append(c_all)
                assert [x.to_bytes() for x in pure] == [x.to_bytes() for x in sts]
        rss = next((line.split()[1] for line in Path("/proc/self/status").read_text()
                    .splitlines() if line.startswith("VmRSS:")), "?")
        print(f"# resident set at the end: {int(rss) / 1024:.0f} MiB" if rss != "?" else "")
        print(f"## ingest hot loop at {len(leaves)} leaves, {args.ticks} ticks of "
              f"{int(args.active * len(leaves))} events ({partitions} partitions, batches of "
              f"{args.batch}), {n_events} events, median of {args.repeats}")
        print("| step | µs per event (wall) | µs per event (CPU) |")
        print("|---|---:|---:|")
        for name, times in rows.items():
            print(f"| {name} | {statistics.median(times) / n_events * 1e6:.2f} | "
                  f"{statistics.median(cpu[name]) / n_events * 1e6:.2f} |")


def _fetch(raw: bytes, deserializer: Any) -> list[Any]:
    parts = fetcher.PartitionRecords(TopicPartition("t", 0), fetcher.MemoryRecords(raw), [], 0,
                                     None, deserializer, True, fetcher.READ_COMMITTED)
    return list(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shape", default="", help="A,B,C: the scale benchmark's hierarchy and "
                    "traffic at A*B*C leaves (see the module docstring)")
    ap.add_argument("--active", type=float, default=0.1,
                    help="--shape: fraction of the leaves with an event per tick")
    ap.add_argument("--ticks", type=int, default=3, help="--shape: ticks of events")
    ap.add_argument("--batch", type=int, default=5000,
                    help="--shape: records per record batch (the scale producer's batches "
                    "hold one tenth of a tick's events of a partition: 5000 at 10^6 leaves)")
    ap.add_argument("--pure", action="store_true", help="--shape: time the pure path too")
    args = ap.parse_args()
    assert install()
    if args.shape:
        scale_shape(args)
        return
    n = args.events
    leaves = ps.hierarchy_paths(4, 4, 8)
    with tempfile.TemporaryDirectory() as tmp:
        s = ps.make_settings("127.0.0.1:1", Path(tmp), "hot", leaves, events_partitions=1)
        w = Worker(s)
        span = n / 10_000
        events = [ps.event_bytes(leaves[i % len(leaves)], s.origin + span * i / n, 1.0)
                  for i in range(n)]
        raw = _bytes(events, s.origin, span)

        def state(fast: bool) -> IngestState:
            st = IngestState(s, w.router, 0, offset=0, key=w.key, domain_id=w.domain_id)
            st.use_fast_path = fast
            st.clock = lambda: s.origin + 10 * span
            return st

        rows: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            recs = _fetch(raw, None)
            rows.setdefault("aiokafka decode to ConsumerRecord (a bare consumer)", []).append(
                time.perf_counter() - t0)
            st = state(False)
            t0 = time.perf_counter()
            st.process_batch(recs)
            rows.setdefault("pure-Python ingest on those records", []).append(
                time.perf_counter() - t0)
            st_fast = state(True)
            t0 = time.perf_counter()
            st_fast.process_batch(recs)
            rows.setdefault("compiled scanner on those records", []).append(
                time.perf_counter() - t0)
            assert st_fast.to_bytes() == st.to_bytes()
            t0 = time.perf_counter()
            items = _fetch(raw, raw_records)
            st_block = state(True)
            st_block.process_fetched(items)
            rows.setdefault("record blocks: batch decode + compiled scanner (the worker)",
                            []).append(time.perf_counter() - t0)
            assert st_block.to_bytes() == st.to_bytes() and st.out.accepted == n
        print(f"## ingest hot loop, {n} events, batches of 500 records, median of "
              f"{args.repeats}")
        print("| step | µs per event |")
        print("|---|---:|")
        for name, times in rows.items():
            print(f"| {name} | {statistics.median(times) / n * 1e6:.2f} |")


if __name__ == "__main__":
    main()
