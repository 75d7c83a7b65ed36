"""agents.raw_records: the ingest consumer gets aiokafka's decoded records as they are; every
attribute ingest reads equals the ``ConsumerRecord`` aiokafka would have built, and ingest
state is identical either way. Other consumers still get ``ConsumerRecord`` objects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiokafka")

from aiokafka.consumer import fetcher
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord, TopicPartition

from agents.config import Settings
from agents.ingest import IngestState, Router
from agents.raw_records import install, raw_records
from stream_dp.domain import Domain

ATTRS = ("offset", "key", "value", "timestamp", "timestamp_type", "headers")
ORIGIN = 1_000_000.0


def _batch(base: int, n: int) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for i in range(n):
        ts = ORIGIN + i
        value = json.dumps({"key": ["a/x", "a/y", "nope"][i % 3], "ts": ts, "value": 1.0})
        headers = [("x-trace", b"%d" % i)] if i % 4 == 3 else []
        b.append(i, timestamp=int(ts * 1000) + 500, key=None if i % 5 == 0 else b"k",
                 value=value.encode() if i % 7 else b"{bad", headers=headers)
    return bytes(b.build())


def _records(value_deserializer: Any) -> list[Any]:
    assert install()
    tp = TopicPartition("t", 0)
    raw = _batch(0, 40)
    parts = fetcher.PartitionRecords(tp, MemoryRecords(raw), [], 0, None, value_deserializer,
                                     True, fetcher.READ_COMMITTED)
    return list(parts)


def test_raw_records_carry_what_ingest_reads() -> None:
    plain = _records(None)
    raw = _records(raw_records)
    assert all(type(r) is ConsumerRecord for r in plain)  # other consumers: unchanged
    assert not any(type(r) is ConsumerRecord for r in raw)
    assert len(raw) == len(plain) == 40
    for a, b in zip(raw, plain, strict=True):
        assert tuple(getattr(a, k) for k in ATTRS[:5]) == tuple(getattr(b, k) for k in ATTRS[:5])
        assert list(a.headers) == list(b.headers)


@pytest.mark.parametrize("schedule", ["markers", "clock"])
def test_ingest_state_is_identical_on_raw_records(tmp_path: Path, schedule: str) -> None:
    s = Settings(origin=ORIGIN, tick_seconds=10.0, allowed_lateness_s=2.0, close_grace_s=0.5,
                 domain_file=str(tmp_path / "d.toml"), events_partitions=1, shards=2,
                 schedule=schedule, events_timestamp_type="CreateTime")
    router = Router(Domain.from_paths(["a/x", "a/y", "b/z"]), 2)
    states = []
    for recs in (_records(None), _records(raw_records)):
        st = IngestState(s, router, 0, offset=0)
        st.clock = lambda: ORIGIN + 100.0
        st.schedule_close(1, 15, "clock", ORIGIN + 12.5)
        st.process_batch(recs)
        states.append(st)
    a, b = states
    assert a.out.accepted > 0
    assert (a.to_bytes(), a.out.partials, a.out.entries, a.out.accepted) == (
        b.to_bytes(), b.out.partials, b.out.entries, b.out.accepted)
    assert [(k, r, v, o) for k, r, v, o in a.out.dead_letters] == [
        (k, r, v, o) for k, r, v, o in b.out.dead_letters]
