"""Release/ingest stage state without Kafka: message bytes, fixed-order sums, checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as settings_h
from hypothesis import strategies as st

from agents.config.deployment import deployment_id
from agents.config.settings import Settings
from agents.ingest.routing import Partial, Router, shard_of
from agents.ingest.state import IngestState
from agents.kafka.codec import Event, Rejection, count_message, decode_event, encode, validate
from agents.release.state import Release, ReleaseState
from stream_dp.counters import CounterBank
from stream_dp.domain import Domain
from stream_dp.planner import make_mechanism

KEY = b"0123456789abcdef0123456789abcdef"


def settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings(origin=1000.0, tick_seconds=10.0, domain_file=str(tmp_path / "d.toml"),
                    events_partitions=2, shards=2, epsilon=1e4, p=0.5, strategy="naive",
                    horizon=63, allowed_lateness_s=0.0, **kw)  # type: ignore[arg-type]


def test_messages_are_byte_identical_to_the_reference_encoder(tmp_path: Path) -> None:
    s = settings(tmp_path)
    rel = Release(tick=3, tick_start=1020.0, tick_end=1030.0, shard=0,
                  streams=("a", 'q"uote/é'), values=np.array([-0.0, 1e-300]), stderr=0.125,
                  strategy="naive", closed_at=0.0)
    privacy = s.privacy.as_dict()
    got = rel.messages(s, dict(privacy))
    for (key, value), name, v in zip(got, rel.streams, [-0.0, 1e-300], strict=True):
        ref = encode(count_message(stream=name, tick=3, tick_start=1020.0, tick_end=1030.0,
                                   value=v, stderr=0.125, strategy="naive", p=0.5,
                                   privacy=dict(privacy), cap=1.0, horizon=63))
        assert value == ref and key == name.encode()
        validate("dp.counts.v1", json.loads(value))


def test_the_compact_record_holds_exactly_the_json_messages(tmp_path: Path) -> None:
    """One ``dp.counts.block.v1`` record per shard and tick (docs/formats.md) decodes, with the
    shard's manifest, into exactly the ``dp.counts.v1`` messages of the same release."""
    from stream_dp.compact import decode_block, decode_manifest

    s = settings(tmp_path)
    rel = Release(tick=3, tick_start=1020.0, tick_end=1030.0, shard=1,
                  streams=("a", 'q"uote/é', "z"), values=np.array([-0.0, 1e-300, 7.25]),
                  stderr=0.125, strategy="naive", closed_at=0.0)
    privacy = s.privacy.as_dict()
    manifest = decode_manifest(rel.manifest())
    assert manifest.shard == "shard-1" and manifest.streams == rel.streams
    block = decode_block(rel.compact(s, dict(privacy)))
    validate("dp.counts.block.v1", block.header)
    assert block.header["epoch"] == s.epoch
    got = [encode(m) for m in block.records(manifest)]
    assert got == [value for _, value in rel.messages(s, dict(privacy))]
    assert np.array_equal(block.values.view(np.int64), rel.values.view(np.int64))


def test_ingest_to_release_end_to_end_without_kafka(tmp_path: Path) -> None:
    s = settings(tmp_path)
    dom = Domain.from_paths(["x/a", "x/b", "y/c"])
    router = Router(dom, 2)
    assert sorted(i for sh in router.shard_nodes for i in sh) == list(range(dom.size))
    assert all(router.node_shard[i] == shard_of(n, 2) for i, n in enumerate(dom.names))
    ing = [IngestState(s, router, p, offset=0) for p in range(2)]
    events = [("x/a", 1001.0, 1.0), ("y/c", 1002.0, 3.0), ("x/b", 1015.0, 0.5), ("x/a", 1031.0, 1)]
    for i, (k, ts, v) in enumerate(events):
        raw = json.dumps({"key": k, "ts": ts, "value": v}).encode()
        ing[i % 2].process(i // 2, k.encode(), raw, timestamp=int(ts * 1000) + 5)
    # restore one ingest state from its checkpoint and check it is the same
    copy = IngestState(s, router, 1)
    copy.restore(ing[1].to_bytes(), 1)
    assert copy.buckets == ing[1].buckets and copy.offset == ing[1].offset
    assert copy.digest == ing[1].digest and copy.next_tick == ing[1].next_tick
    for state in ing:
        # the clock passed tick 3's deadline when the partition's end offset was 2
        assert state.schedule_close(3, 2, "clock", 1031.0)
        assert state.apply_due() == 3
        assert [e.through for e in state.out.entries] == [3]
    partials = [p for state in ing for p in state.out.partials]
    assert len(partials) == 3 * 2 * 2  # ticks × sources × shards, empty ones included
    mech = make_mechanism("naive", 0.5, 63, s.privacy)
    rel_states = [ReleaseState(s, router, sh,
                               CounterBank(mech, router.shard_names(sh), KEY,
                                           domain_id=deployment_id(s, dom.digest()),
                                           epoch=s.epoch), key=KEY)
                  for sh in range(2)]
    for off, part in enumerate(partials):
        rel_states[part.shard].add(off, Partial.decode(part.encode()))
    values: dict[tuple[str, int], float] = {}
    for rs in rel_states:
        while rs.ready():
            r = rs.step()
            values.update({(n, r.tick): v for n, v in zip(r.streams, r.values, strict=True)})
    exact = {("x/a", 1): 1.0, ("x", 1): 1.0, ("y", 1): 1.0, ("all", 1): 2.0,
             ("x/b", 2): 0.5, ("x", 2): 1.0, ("all", 3): 0.5 * (0.5 * 2.0 + 0.5)}  # the 1031 event is in tick 4
    for key, want in exact.items():
        assert values[key] == pytest.approx(want, abs=1e-3)
    assert len(values) == dom.size * 3
    # checkpoint round trip of a release shard reproduces the next release bit for bit
    st = rel_states[0]
    blob = st.to_bytes()
    twin = ReleaseState(s, router, 0, None)
    twin.restore(blob, 5, KEY)
    assert twin.next_tick == st.next_tick == 4 and twin.bank.tick == 3
    for sh_state in (st, twin):
        for src in range(2):
            sh_state.add(sh_state.offset, Partial(4, src, 0, (), (), 0.0))
    a, b = st.step(), twin.step()
    assert a.values.tobytes() == b.values.tobytes()


_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)


@settings_h(max_examples=400, deadline=None)
@given(
    key=st.one_of(st.sampled_from(["x/a", "y/c", "x", "nope", ""]), _values),
    ts=st.one_of(st.floats(1000.0, 1e6), _values),
    value=st.one_of(st.floats(0, 10), _values),
    drop=st.sampled_from(["", "key", "ts", "value"]),
    pad=st.sampled_from(["", " ", "\n", "é"]),
)
def test_fast_path_agrees_with_decode_event(
    tmp_path_factory: pytest.TempPathFactory, key: object, ts: object, value: object, drop: str,
    pad: str,
) -> None:
    s = settings(tmp_path_factory.getbasetemp())
    router = Router(Domain.from_paths(["x/a", "x/b", "y/c"]), 2)
    body = {"key": key, "ts": ts, "value": value, "note": pad}
    body.pop(drop, None)
    raw = (pad + json.dumps(body) + pad).encode()
    st_ = IngestState(s, router, 0, offset=0)
    arrival = 5e5  # record timestamp, seconds
    st_.process(0, b"k", raw, timestamp=int(arrival * 1000))
    ref = decode_event(raw, s.max_message_bytes, s.max_event_value)
    in_range = (isinstance(ref, Event) and s.origin <= ref.ts <= arrival + s.max_future_skew_s
                and ref.ts >= arrival - s.allowed_lateness_s - ((arrival - s.origin) % s.tick_seconds))
    if isinstance(ref, Event) and router.nodes(ref.key) is not None and in_range:
        assert st_.out.accepted == 1 and not st_.out.dead_letters
        tick = math.floor((ref.ts - s.origin) / s.tick_seconds) + 1
        nodes = router.nodes(ref.key) or ()
        assert st_.buckets[tick] == {router.bucket_key(nodes): min(ref.value, s.cap)}
    else:
        assert st_.out.accepted == 0 and len(st_.out.dead_letters) == 1
        if isinstance(ref, Rejection):
            assert st_.out.dead_letters[0][1] == ref


def test_naive_int_in_the_service_counts_whole_values_and_releases_integers(
    tmp_path: Path,
) -> None:
    s = settings(tmp_path).replace(strategy="naive-int", cap=2.0, epsilon=50.0)
    with pytest.raises(ValueError, match="whole number"):
        s.replace(cap=1.5)
    dom = Domain.from_paths(["x/a", "y/c"])
    router = Router(dom, 1)
    s = s.replace(shards=1, events_partitions=1)
    ing = IngestState(s, router, 0, offset=0)
    for i, v in enumerate([1, 3, 0.5, 2.0]):
        raw = json.dumps({"key": "x/a", "ts": 1001.0 + i, "value": v}).encode()
        ing.process(i, b"k", raw, timestamp=1_001_500 + 1000 * i)
    assert [r.reason for _, r, _, _ in ing.out.dead_letters] == ["value_not_integer"]
    assert ing.schedule_close(1, 4, "clock", 1012.0) and ing.apply_due() == 1
    mech = make_mechanism("naive-int", s.p, s.horizon, s.privacy, s.cap)
    rel = ReleaseState(s, router, 0, CounterBank(mech, router.shard_names(0), KEY))
    for off, part in enumerate(ing.out.partials):
        rel.add(off, part)
    out = rel.step()
    leaf = out.streams.index("x/a")
    assert out.values[leaf] == round(out.values[leaf])  # whole numbers on the integer grid
    assert abs(out.values[leaf] - 5.0) <= 2.0  # 1 + min(3, cap 2) + 2; noise sd ≈ 0.06 at ε = 50


def test_a_shard_too_large_for_compact_records_is_refused_at_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agents.kafka.topics as topics

    dom = Domain.from_paths([f"x/{i}" for i in range(200)])
    monkeypatch.setattr(topics, "_COMPACT_MAX_BYTES", 6000)
    with pytest.raises(ValueError, match="raise shards"):
        topics.check_compact_size(dom, Router(dom, 1))
    topics.check_compact_size(dom, Router(dom, 4))  # smaller shards fit


def test_a_shard_too_large_for_one_partial_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from agents.kafka import topics

    dom = Domain.from_paths([f"x/{i}" for i in range(200)])  # 201 nodes
    monkeypatch.setattr(topics, "MAX_SHARD_NODES", 150)
    with pytest.raises(ValueError, match="raise shards"):
        topics.check_shard_size(Router(dom, 1))
    topics.check_shard_size(Router(dom, 2))  # ~100 nodes per shard fit
    specs = {t.name: dict(t.configs) for t in topics.topic_specs(Settings(origin=0.0))}
    assert int(specs[Settings(origin=0.0).partials_topic]["max.message.bytes"]) >= 16 << 20
