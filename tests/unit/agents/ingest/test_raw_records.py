"""agents.ingest.raw_records: the ingest consumer gets aiokafka's decoded records as they are; every
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

from agents.config.settings import Settings
from agents.ingest.raw_records import install, raw_records
from agents.ingest.records import RecordBlock
from agents.ingest.routing import Router
from agents.ingest.state import IngestState
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


# ---------------------------------------------------------------------------- record blocks

needs_blocks = pytest.mark.skipif(RecordBlock is None, reason="no compiled fast path (not built, "
                                  "or STREAM_DP_PURE_INGEST=1)")

from hypothesis import HealthCheck, given  # noqa: E402
from hypothesis import settings as hsettings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.unit.agents.ingest import test_fastingest as tf  # noqa: E402


def _kafka_bytes(log: list[Any], sizes: list[int], log_append: list[bool]) -> bytes:
    """The log as a fetch response's record bytes: batches of ``sizes`` records (base offset
    patched in, as the broker assigns it), some flagged LogAppendTime (the broker's max
    timestamp then stands for every record's)."""
    out = b""
    i = 0
    k = 0
    while i < len(log):
        size = sizes[k % len(sizes)] if sizes else len(log)
        chunk = log[i:i + size]
        b = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 22)
        for j, r in enumerate(chunk):
            b.append(j, timestamp=max(r.timestamp, 0), key=r.key, value=r.value,
                     headers=list(r.headers))
        raw = bytearray(b.build())
        raw[0:8] = chunk[0].offset.to_bytes(8, "big")
        if log_append[k % len(log_append)]:
            raw[22] |= 0x08  # the timestamp-type bit of the attributes (CRC not checked here)
        out += bytes(raw)
        i += size
        k += 1
    return out


def _fetch(raw: bytes, fetch_offset: int, raw_consumer: bool) -> list[Any]:
    assert install()
    parts = fetcher.PartitionRecords(TopicPartition("dp.events.v1", 0), fetcher.MemoryRecords(raw),
                                     [], fetch_offset, None,
                                     raw_records if raw_consumer else None, False,
                                     fetcher.READ_COMMITTED)
    return list(parts)


@needs_blocks
@hsettings(max_examples=30, deadline=None,
           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_blocks_hold_the_records_aiokafka_decodes(data: st.DataObject) -> None:
    log = [data.draw(tf._record(i, False))[0] for i in range(30)]
    raw = _kafka_bytes(log, [7, 1, 12], [False, True])
    for fetch_offset in (0, 5, 8, 29, 30):
        plain = _fetch(raw, fetch_offset, raw_consumer=False)
        items = _fetch(raw, fetch_offset, raw_consumer=True)
        assert (items and all(type(it) is RecordBlock for it in items)) or not plain
        flat = [it[j] for it in items for j in range(len(it))]
        assert [tuple(getattr(r, k) for k in ATTRS[:5]) for r in flat] == [
            tuple(getattr(r, k) for k in ATTRS[:5]) for r in plain]
        assert [list(r.headers) for r in flat] == [list(r.headers) for r in plain]
        assert [it.offset for it in items] == [
            max(r.offset for r in plain if r.offset <= it.offset) for it in items]


@needs_blocks
@hsettings(max_examples=int(tf.EXAMPLES / 2), deadline=None,
           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=tf._case(), sizes=st.lists(st.integers(1, 20), max_size=3),
       log_append=st.lists(st.booleans(), min_size=1, max_size=3))
def test_blocks_on_the_fast_path_and_records_on_the_pure_path_leave_identical_state(
        case: dict[str, Any], sizes: list[int], log_append: list[bool],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The log as Kafka batch bytes: the fast path reads record blocks, the pure path reads
    aiokafka's decoding of the same bytes; the state must be identical."""
    s = tf._settings(tmp_path_factory.getbasetemp(), **case["cfg"])
    if not case["log"]:
        return
    raw = _kafka_bytes(case["log"], sizes, log_append)
    plain = _fetch(raw, 0, raw_consumer=False)
    items = _fetch(raw, 0, raw_consumer=True)
    states = []
    for use_fast, got in ((False, plain), (True, items)):
        st_ = IngestState(s, tf._ROUTER, 0, offset=0)
        st_.use_fast_path = use_fast
        st_.clock = lambda: case["clock"]
        for n, end in case["closes"]:
            st_.schedule_close(n, end, "clock", tf.ORIGIN + n * tf.L)
        try:
            assert st_.process_fetched(got) == len(plain)
            st_.advance_to(len(case["log"]))
            tag: Any = "ok"
        except tf.ScheduleMismatch as exc:
            tag = str(exc)
        snap = tf._snapshot(st_)
        del snap["dirty"]  # a commit hint that depends on the batch split (one call per block)
        states.append((tag, snap))
    assert states[1] == states[0]


def _as_the_fetcher_yields(records: list[Any], fetch_offset: int) -> list[Any]:
    """aiokafka's fetcher (``PartitionRecords``) skips a record below its running next offset:
    the fetch position, then the last yielded record's offset + 1."""
    out, nxt = [], fetch_offset
    for r in records:
        if r.offset < nxt:
            continue
        out.append(r)
        nxt = r.offset + 1
    return out


@needs_blocks
@hsettings(max_examples=300, deadline=None,
           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), n=st.integers(1, 12),
       edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
       cut=st.integers(0, 64))
def test_a_damaged_batch_is_refused_or_read_as_aiokafka_reads_it(
        data: st.DataObject, n: int, edits: list[tuple[int, int]], cut: int) -> None:
    """Any bytes (edited, truncated): ``RecordBlock`` raises ValueError (aiokafka then decodes
    the batch itself) or holds exactly the records aiokafka decodes from the same bytes."""
    log = [data.draw(tf._record(i, False))[0] for i in range(n)]
    raw = bytearray(_kafka_bytes(log, [n], [False]))
    for at, byte in edits:
        raw[at % len(raw)] = byte
    raw = raw[:len(raw) - cut] if cut < len(raw) else raw
    try:
        block = RecordBlock(bytes(raw), 0, 0)
    except ValueError:
        return
    try:
        batch = MemoryRecords(bytes(raw)).next_batch()
        theirs = [] if batch is None else list(batch)
    except Exception:  # aiokafka refuses these bytes (its CRC check would refuse them first)
        return
    theirs = _as_the_fetcher_yields(theirs, 0)
    mine = [block[j] for j in range(len(block))]
    assert [tuple(getattr(r, k) for k in ATTRS[:5]) for r in mine] == [
        tuple(getattr(r, k) for k in ATTRS[:5]) for r in theirs]
    assert [list(r.headers) for r in mine] == [list(r.headers) for r in theirs]


@needs_blocks
def test_a_record_attributes_byte_with_the_varint_continuation_bit_reads_as_aiokafka_reads_it(
        ) -> None:
    """Found by the property test above in CI: aiokafka reads a record's attributes as a
    varint, so an attributes byte of 0x80 (a hostile writer's) shifts every later field of the
    record; the compiled block skipped one byte and read the record as if it were honest."""
    values = [b'{"key": "a/x", "ts": 999980.0, "value": 1.0}'] * 4 + [
        '{"key": "é/ü", "ts": 999980.0, "value": 1.0}'.encode()] * 2
    log = [tf.Record(i, b"k", v, 999_980_000, 0, []) for i, v in enumerate(values)]
    raw = bytearray(_kafka_bytes(log, [6], [False]))
    raw[218] = 0x80  # record 3's attributes (its length varint is at 217)
    batch = MemoryRecords(bytes(raw)).next_batch()
    assert batch is not None
    decoded = list(batch)
    assert (decoded[3].offset, decoded[3].key) == (1, None)  # what aiokafka makes of it
    theirs = [(r.offset, r.key, r.value, r.timestamp)
              for r in _as_the_fetcher_yields(decoded, 0)]
    try:
        block = RecordBlock(bytes(raw), 0, 0)
    except ValueError:
        return  # refused: aiokafka decodes the batch itself
    mine = [(block[j].offset, block[j].key, block[j].value, block[j].timestamp)
            for j in range(len(block))]
    assert mine == theirs



@needs_blocks
def test_offsets_that_go_back_inside_a_batch_are_skipped_as_the_fetcher_skips_them() -> None:
    """A hostile batch's offset deltas need not increase: aiokafka's fetcher yields a record only
    at or past the last yielded offset + 1; so does the block (CI's property test, edit (479, 1):
    an offset delta of -1)."""
    values = [b'{"key": "a/x", "ts": 999980.0, "value": 1.0}'] * 5
    log = [tf.Record(i, b"k", v, 999_980_000, 0, []) for i, v in enumerate(values)]
    b = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 22)
    for j, delta in enumerate([0, 1, 2, 1, 0]):  # deltas 1 and 0 again: at or below the last
        b.append(delta, timestamp=999_980_000 + j, key=b"k", value=log[j].value, headers=[])
    raw = bytes(b.build())
    decoded = list(MemoryRecords(raw).next_batch())
    assert [r.offset for r in decoded] == [0, 1, 2, 1, 0]
    for fetch_offset in (0, 1, 2, 3):
        block = RecordBlock(raw, 0, fetch_offset)
        mine = [(block[j].offset, block[j].timestamp) for j in range(len(block))]
        assert mine == [(r.offset, r.timestamp)
                        for r in _as_the_fetcher_yields(decoded, fetch_offset)], fetch_offset


@needs_blocks
def test_a_batch_claiming_more_records_than_its_bytes_hold_is_refused_before_allocating() -> None:
    """Adversarial review (branch advs): a writer's batch may claim any record count up to its
    length in bytes. Every record takes at least 7 bytes (seven one-byte varints: length,
    attributes, timestamp delta, offset delta, key length, value length, header count), so a
    larger count cannot be read by aiokafka either; the block used to allocate 56 bytes per
    *claimed* record first (65 MB traced for a 1 MB batch) and only then find out."""
    import tracemalloc

    b = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 24)
    b.append(0, timestamp=1000, key=None, value=b"x" * 1_000_000, headers=[])
    raw = bytearray(b.build())
    claimed = int.from_bytes(raw[8:12], "big")  # one record per byte of the batch
    raw[57:61] = claimed.to_bytes(4, "big")
    blob = bytes(raw)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError):
            RecordBlock(blob, 0, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(blob), peak  # nothing per claimed record (was 65x the batch)


@needs_blocks
def test_a_batch_of_minimal_seven_byte_records_is_still_read() -> None:
    """The bound of the test above is tight, not stricter than aiokafka: 60 records of 7 bytes
    each (no key, no value, no headers, deltas below 64) fill their batch exactly and are all
    read, as aiokafka reads them."""
    b = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for j in range(60):
        b.append(j, timestamp=1000, key=None, value=None, headers=[])
    raw = bytes(b.build())
    assert int.from_bytes(raw[8:12], "big") - 49 == 7 * 60  # records of 7 bytes exactly
    block = RecordBlock(raw, 0, 0)
    theirs = list(MemoryRecords(raw).next_batch())
    assert [(block[j].offset, block[j].value) for j in range(len(block))] == [
        (r.offset, r.value) for r in theirs]
    assert len(block) == 60


@needs_blocks
@hsettings(max_examples=max(20, int(tf.EXAMPLES / 4)), deadline=None,
           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), n=st.integers(0, 24), at=st.integers(0, 24), sizes=st.lists(
    st.integers(1, 12), max_size=3), cfg=st.sampled_from([
        {"schedule": "markers"}, {"schedule": "clock"}, {"schedule": "clock", "cap": 0.3},
        {"schedule": "markers", "strategy": "naive-int", "cap": 2.0}]))
def test_one_added_record_moves_the_compiled_sums_by_at_most_its_clipped_contribution(
        data: st.DataObject, n: int, at: int, sizes: list[int], cfg: dict[str, Any],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Adversarial review (branch advs), the threat model through the compiled path: two logs
    that differ by one record (any key bytes, any value bytes from the hostile payloads of
    test_fastingest, any timestamp), read as Kafka batches by record blocks, the key index and
    the look-ahead scanner. The open buckets differ in at most one (tick, leaf), by at most
    the cap in units, and each tick's per-node sums (``Router.tick_sums``, what the partials
    carry) only on that leaf's nodes, by at most that much. No closing points: the added
    record shifts later offsets, and a marker deployment's closing points are offsets."""
    s = tf._settings(tmp_path_factory.getbasetemp(), **cfg)
    markers = cfg["schedule"] == "markers"
    base = [data.draw(tf._record(i, markers))[0]._replace(headers=[]) for i in range(n)]
    extra, arrival = data.draw(tf._record(0, markers))
    if data.draw(st.booleans()):
        extra = extra._replace(value=data.draw(tf._payload(arrival)))
    extra = extra._replace(headers=[], key=data.draw(st.one_of(st.none(), st.binary(max_size=8))))
    at = min(at, n)
    logs = [base, [*base[:at], extra, *base[at:]]]
    got = []
    for log in logs:
        log = [r._replace(offset=i) for i, r in enumerate(log)]
        st_ = IngestState(s, tf._ROUTER, 0, offset=0)
        st_.clock = lambda: tf.ORIGIN + 200.0
        if log:
            raw = _kafka_bytes(log, sizes, [False])
            pos = 0
            while pos < len(raw):  # each batch as a record block, as the consumer hands them
                st_.process_batch(RecordBlock(raw, pos, 0))
                pos += 12 + int.from_bytes(raw[pos + 8:pos + 12], "big")
        got.append(st_)
    a, b = got
    cap_u, clip = a.cap_u, a.clip
    cells = {(t, k) for st_ in got for t, bk in st_.buckets.items() for k in bk}
    diff = {c: b.buckets.get(c[0], {}).get(c[1], 0) - a.buckets.get(c[0], {}).get(c[1], 0)
            for c in cells}
    moved = {c: d for c, d in diff.items() if d}
    assert len(moved) <= 1, moved
    assert all(0 < d <= cap_u for d in moved.values()), moved
    for t in set(a.buckets) | set(b.buckets):
        sa = tf._ROUTER.tick_sums(a.buckets.get(t, {}), clip)
        sb = tf._ROUTER.tick_sums(b.buckets.get(t, {}), clip)
        for shard in range(tf._ROUTER.shards):
            na, nb = dict(zip(*sa[shard], strict=True)), dict(zip(*sb[shard], strict=True))
            for idx in set(na) | set(nb):
                d = nb.get(idx, 0) - na.get(idx, 0)
                if d:
                    (tick, leaf), = moved  # only the moved leaf's nodes, in its tick
                    node = tf._ROUTER.shard_nodes[shard][idx]
                    assert tick == t and node in tf._ROUTER.expand(leaf), (t, node, leaf)
                    assert 0 < d <= cap_u
