"""Per-event CPU cost of the ingest hot loop, without a broker (prints a table).

The events of ``benchmarks/service.py --only ingest`` (149-node hierarchy, each event feeds 4
nodes, markers schedule, one events partition) are encoded as Kafka record batches of 500
records, as a fetch response holds them. Timed, in one process, median of ``--repeats``:

* aiokafka's decoding into ``ConsumerRecord`` objects — what a bare consumer does per record;
* the pure-Python ingest path (``STREAM_DP_PURE_INGEST=1`` behaviour) on those records;
* the compiled scanner on aiokafka's decoded records (a compressed batch's path);
* the compiled scanner on record blocks (``agents.raw_records``: what the worker does), the
  batch decoding included.

Usage: python benchmarks/ingest_hot_loop.py [--events 200000] [--repeats 5]
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

from agents.ingest import IngestState  # noqa: E402
from agents.pipeline import Worker  # noqa: E402
from agents.raw_records import install, raw_records  # noqa: E402
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


def _fetch(raw: bytes, deserializer: Any) -> list[Any]:
    parts = fetcher.PartitionRecords(TopicPartition("t", 0), fetcher.MemoryRecords(raw), [], 0,
                                     None, deserializer, True, fetcher.READ_COMMITTED)
    return list(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    assert install()
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
