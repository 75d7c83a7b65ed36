"""The threat model's arithmetic and pure-state attacks (docs/privacy.md, "Threat model").

A hostile writer of the events topic and a careless operator, on the pure ingest and release
states (no Kafka; the broker behaviours — open transactions, timestamp types, two deployments —
are attacked in tests/integration/test_adversary.py):

* forged close markers (no MAC, another key, another partition or topic, far ahead);
* a record's LogAppendTime bit on a CreateTime deployment, a far-future broker stamp;
* far-future event times on a markers deployment (memory that never closes);
* float sums that a flood of tiny values moves (now exact integers);
* every setting that decides what a tick contains changes the noise; every setting is classified.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.config.deployment import BINDING, NOT_BINDING, USER_BINDING, deployment_id
from agents.config.settings import Settings
from agents.ingest.records import Record
from agents.ingest.routing import Router
from agents.ingest.state import IngestState
from agents.kafka.codec import close_marker, marker_key
from agents.release.state import ReleaseState
from stream_dp.contributions import MAX_EVENTS_PER_TICK, clip_limit_units, to_units, value_unit
from stream_dp.counters import CounterBank
from stream_dp.domain import Domain
from stream_dp.planner import make_mechanism

KEY = bytes(range(100, 132))
ORIGIN = 1_000_000.0
L = 10.0
LEAVES = ["a/x", "a/y", "b/z"]
ROUTER = Router(Domain.from_paths(LEAVES), 1)


def _settings(**kw: Any) -> Settings:
    base: dict[str, Any] = dict(origin=ORIGIN, tick_seconds=L, allowed_lateness_s=2.0,
                                close_grace_s=0.5, domain_file="unused.toml",
                                events_partitions=1, shards=1, max_future_skew_s=30.0)
    base.update(kw)
    return Settings(**base)


def _event(key: str, ts: float, value: float = 1.0) -> bytes:
    return json.dumps({"key": key, "ts": ts, "value": value}).encode()


def _state(s: Settings, now: float, key: bytes = KEY, partition: int = 0) -> IngestState:
    st_ = IngestState(s, ROUTER, partition, offset=0, key=key)
    st_.clock = lambda: now
    return st_


def _reasons(state: IngestState) -> list[str]:
    return [r.reason for _, r, _, _ in state.out.dead_letters]


# ------------------------------------------------------------------ close markers (item 5)
def test_only_authentic_markers_close_ticks_and_never_past_the_workers_clock() -> None:
    s = _settings(schedule="markers")
    now = ORIGIN + 100.0  # ticks through 9 are due (deadline + grace passed)
    good = marker_key(KEY)
    forged = [
        close_marker(ORIGIN + 22.0, True, mac_key=marker_key(bytes(range(32))),
                     topic=s.events_topic, partition=0),  # another key
        close_marker(ORIGIN + 22.0, True, mac_key=good, topic=s.events_topic,
                     partition=1),  # copied from another partition
        close_marker(ORIGIN + 22.0, True, mac_key=good, topic="other.events",
                     partition=0),  # copied from another topic
        ([("stream-dp-close", b"1")],
         json.dumps({"schema": "dp.close.v2", "time": ORIGIN + 22.0, "final": True}).encode()),
        ([("stream-dp-close", b"1")],
         json.dumps({"schema": "dp.close.v1", "time": ORIGIN + 22.0, "final": True}).encode()),
        ([("stream-dp-close", b"1")], b"\xff not json"),
    ]
    state = _state(s, now)
    recs = [Record(0, b"k", _event("a/x", ORIGIN + 1.0), 0, 0)]
    for i, (headers, raw) in enumerate(forged, start=1):
        recs.append(Record(i, None, raw, 0, 0, headers))
    recs.append(Record(len(recs), b"k", _event("a/x", ORIGIN + 2.0), 0, 0))
    state.process_batch(recs)
    # nothing closed, both events still count in tick 1
    assert state.next_tick == 1 and not state.out.entries
    assert _reasons(state) == ["forged_marker"] * len(forged)
    assert sum(state.buckets[1].values()) == 2 * to_units(1.0, state.unit, state.cap_u)
    # an authentic marker 10^15 ticks ahead (or just past the clock) is refused at once
    for at in (ORIGIN + 1e16, now + 1.0):
        headers, raw = close_marker(at, True, mac_key=good, topic=s.events_topic, partition=0)
        state.process_batch([Record(state.offset, None, raw, 0, 0, headers)])
        assert _reasons(state)[-1] == "marker_ahead" and state.next_tick == 1
    # the authentic, due marker closes exactly where the log says
    headers, raw = close_marker(ORIGIN + 22.0, True, mac_key=good, topic=s.events_topic,
                                partition=0)
    state.process_batch([Record(state.offset, None, raw, 0, 0, headers)])
    assert state.next_tick == 4 and [(e.first, e.through) for e in state.out.entries] == [(1, 3)]


def test_markers_schedule_refuses_event_times_beyond_the_workers_clock() -> None:
    """Item 10: a far-future event time on a markers deployment would open a bucket that no
    marker may ever close; it is dead-lettered as ``future`` by the worker's clock."""
    s = _settings(schedule="markers")
    now = ORIGIN + 100.0
    state = _state(s, now)
    state.process_batch([Record(0, b"k", _event("a/x", ts), 0, 0)
                         for ts in (ORIGIN + 1.0, now + 29.0, now + 31.0, 4e9, 1e300)])
    assert _reasons(state) == ["future", "future", "future"]
    assert sorted(state.buckets) == [1, 13]


# ------------------------------------------------------------------ timestamp types (item 4)
def test_a_forged_log_append_time_bit_is_not_trusted_on_a_create_time_deployment() -> None:
    """On a CreateTime deployment a record claiming LogAppendTime with a far-future stamp
    used to close ~200 000 ticks in one loop; now the rule is off (the topic's own setting
    decides, checked at start-up) and its own event is judged like any other."""
    s = _settings(events_timestamp_type="CreateTime")
    state = _state(s, ORIGIN + 100.0)
    far = int((ORIGIN + 2e6) * 1000)
    state.process_batch([Record(0, b"k", _event("a/x", ORIGIN + 1.0), far, 1),
                         Record(1, b"k", _event("a/x", ORIGIN + 2.0),
                                int((ORIGIN + 3.0) * 1000), 0)])
    assert state.next_tick == 1 and not state.out.entries
    assert _reasons(state) == ["late"]  # its own arrival claim makes only itself late


def test_log_append_time_closes_never_past_the_workers_clock() -> None:
    s = _settings()  # LogAppendTime
    now = ORIGIN + 55.0  # due through tick 5 (deadline 52 + grace 0.5 ≤ 55)
    state = _state(s, now)
    far = int((ORIGIN + 1e9) * 1000)  # a broker clock years ahead
    state.process_batch([Record(0, b"k", _event("a/x", ORIGIN + 1.0), int(ORIGIN * 1000) + 5, 1),
                         Record(1, b"k", _event("a/x", ORIGIN + 1.0), far, 1)])
    assert [(e.first, e.through) for e in state.out.entries] == [(1, 5)]
    assert state.next_tick == 6


# ------------------------------------------------------------------ exact sums (item 9)
def test_a_flood_of_tiny_values_cannot_move_a_victims_contribution() -> None:
    """Issue #23 item 9: 10^5 tiny attacker values after one victim event of value 1 moved a
    float64 sum by 1.0000466. Integer units: the victim changes the sum by exactly its own
    contribution (at most cap), whatever else arrives."""
    s = _settings(events_timestamp_type="CreateTime", max_events_per_tick=200_000)
    arrival = int((ORIGIN + 3.0) * 1000)
    tiny = [Record(i + 1, b"k", _event("a/x", ORIGIN + 1.0, 1e-7 * (1 + i % 7)), arrival, 0)
            for i in range(100_000)]
    victim = Record(0, b"k", _event("a/x", ORIGIN + 1.0, 1.0), arrival, 0)

    def total(records: list[Record]) -> int:
        state = _state(s, ORIGIN + 1000.0)
        state.process_batch([r._replace(offset=i) for i, r in enumerate(records)])
        state.schedule_close(1, len(records), "clock", 0.0)
        state.apply_due()
        leaf = ROUTER.domain.names.index("a/x")
        return sum(c for p in state.out.partials if p.tick == 1
                   for i, c in zip(p.idx, p.counts, strict=True)
                   if ROUTER.shard_nodes[p.shard][i] == leaf)

    with_v, without = total([victim, *tiny]), total(tiny)
    unit = value_unit(s.cap)
    assert (with_v - without) * unit == 1.0


@hsettings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(0, 1e6, allow_nan=False), max_size=30),
       victim=st.floats(0, 1e6, allow_nan=False), cap=st.sampled_from([1.0, 0.1, 3.0, 1e5]))
def test_one_event_moves_an_exact_sum_by_its_own_units_at_most_cap(
        values: list[float], victim: float, cap: float) -> None:
    unit = value_unit(cap)
    cap_u = math.floor(cap / unit)
    base = sum(to_units(v, unit, cap_u) for v in values)
    moved = sum(to_units(v, unit, cap_u) for v in [*values[:3], victim, *values[3:]]) - base
    assert moved == to_units(victim, unit, cap_u)
    assert 0 <= moved * unit <= cap
    assert (base + moved) * unit == float(base + moved) * unit  # exact as a float


def test_the_clip_keeps_every_count_an_exact_float() -> None:
    for cap in (1.0, 0.1, 7.5, 2.0**40, 1e-9):
        assert clip_limit_units(cap, MAX_EVENTS_PER_TICK) < 2**53
    with pytest.raises(ValueError):
        clip_limit_units(1.0, MAX_EVENTS_PER_TICK + 1)


# ------------------------------------------------------------------ clipping (item 1)
def _release(s: Settings, counts: list[list[int]]) -> ReleaseState:
    router = Router(Domain.flat(["s0", "s1"]), 1)
    mech = make_mechanism(s.strategy, s.p, s.horizon, s.privacy, s.cap)
    bank = CounterBank(mech, router.shard_names(0), KEY,
                       domain_id=deployment_id(s, router.domain_id), epoch=s.epoch)
    rs = ReleaseState(s, router, 0, bank, key=KEY, mechanism=mech)
    from agents.ingest.routing import Partial

    for t, per_source in enumerate(counts, start=1):
        for src, c in enumerate(per_source):
            rs.add(rs.offset if rs.offset >= 0 else 0, Partial(t, src, 0, (0, 1), (c, 0), 0.0))
        rs.step()
    return rs


@pytest.mark.parametrize("strategy,p", [("binary-tree", 0.999), ("dmfda", 1.0), ("naive", 0.9)])
def test_clipping_keeps_releasing_and_never_raises_the_sensitivity(strategy: str, p: float
                                                                   ) -> None:
    """Bursts far beyond any strategy's range (10^9 events in one tick, split over sources)
    never stop the releases; neighbouring inputs (one event of size cap added to a tick at,
    below or above the clip) change the count fed to the mechanism by at most cap."""
    s = _settings(strategy=strategy, p=p, horizon=1023, events_partitions=2,
                  max_events_per_tick=20, epsilon=1.0)
    unit_cap = clip_limit_units(s.cap, 1)  # one event of value cap, in units
    clip = clip_limit_units(s.cap, s.max_events_per_tick)
    burst = [[10**9 * unit_cap, 5 * unit_cap], [0, 0], [clip - unit_cap, 0], [clip, clip]]
    rs = _release(s, burst)
    assert rs.bank.tick == 4 and rs.clipped == 2  # ticks 1 and 4 (tick 3 stays below)
    for tick in range(4):
        for src in range(2):
            neighbour = [list(row) for row in burst]
            neighbour[tick][src] += unit_cap
            a, b = _fed(s, burst), _fed(s, neighbour)
            assert np.all(np.abs(b - a) <= s.cap) and np.all(b >= a)


def _fed(s: Settings, counts: list[list[int]]) -> np.ndarray:
    """The per-tick counts the release stage feeds its bank (value units), stream 0."""
    out = []
    for per_source in counts:
        units = 0
        clip = clip_limit_units(s.cap, s.max_events_per_tick)
        for c in per_source:
            units = min(units + min(c, clip), clip)
        out.append(units * value_unit(s.cap))
    return np.array(out)


# ------------------------------------------------------------------ noise binding (item 3)
def _other_value(name: str, value: Any) -> Any:
    """A different valid value of a setting."""
    special: dict[str, Any] = {
        "events_timestamp_type": "CreateTime", "schedule": "markers", "events_start": "latest",
        "strategy": "naive", "privacy_model": "zcdp", "p": 0.5, "log_level": "debug",
        "attribute_bootstrap_fraction": 0.3,
        "bootstrap": "127.0.0.1:9093",  # host:port is checked (value + "-x" is refused)
    }
    if name in special:
        return special[name]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 + 1.0
    if isinstance(value, str):
        return value + "-x"
    raise AssertionError(f"no other value for {name}")


def test_every_setting_is_classified() -> None:
    """A setting added later must be bound to the noise or say why it cannot change a tick."""
    names = {f.name for f in dataclasses.fields(Settings)}
    assert set(BINDING) | set(USER_BINDING) | set(NOT_BINDING) == names
    assert len(BINDING) + len(USER_BINDING) + len(NOT_BINDING) == len(names)


@pytest.mark.parametrize("name", BINDING)
def test_every_setting_that_decides_a_ticks_content_changes_the_noise(name: str) -> None:
    """Two deployments with one key that differ in any binding setting (allowed lateness,
    grace, app id, events topic, value limits, …) draw unrelated noise: the same counts give
    releases that differ at every tick."""
    s = _settings(strategy="dmfda", p=0.9, horizon=63)
    other = s.replace(**{name: _other_value(name, getattr(s, name))})
    d = ROUTER.domain_id
    assert deployment_id(s, d) != deployment_id(other, d)
    mech = make_mechanism("dmfda", 0.9, 63, s.privacy, s.cap)
    a = CounterBank(mech, ["x"], KEY, domain_id=deployment_id(s, d), epoch=0)
    b = CounterBank(mech, ["x"], KEY, domain_id=deployment_id(other, d), epoch=0)
    for _ in range(5):
        ra, rb = a.step(np.array([3.0])), b.step(np.array([3.0]))
        assert ra[0] != rb[0]


def test_the_deployment_id_ignores_settings_that_cannot_change_a_tick(tmp_path: Path) -> None:
    s = _settings()
    d = ROUTER.domain_id
    for name in ("web_port", "log_level", "max_batch", "counts_topic", "bootstrap"):
        other = s.replace(**{name: _other_value(name, getattr(s, name))})
        assert deployment_id(other, d) == deployment_id(s, d), name


# ------------------------------------------------------------------ review findings (F7–F9)
def test_huge_values_are_clamped_before_they_become_units() -> None:
    """F8: with a very large max_event_value, value 1e308 made ``value / unit`` overflow and
    crashed ingest on every restart; it is clamped to cap first."""
    s = _settings(events_timestamp_type="CreateTime", max_event_value=1.7e308)
    state = _state(s, ORIGIN + 100.0)
    arrival = int((ORIGIN + 3.0) * 1000)
    state.process_batch([Record(0, b"k", _event("a/x", ORIGIN + 1.0, 1e308), arrival, 0),
                         Record(1, b"k", b'{"key": "a/y", "ts": 1000001.0, "value": 1.5e308}',
                                arrival, 0)])
    assert state.out.accepted == 2 and state.out.clamped == 2
    assert sorted(state.buckets[1].values()) == [state.cap_u, state.cap_u]
    assert to_units(1e308, value_unit(1.0), 5) == 5


def test_unknown_keys_are_not_cached_and_long_keys_take_the_validating_path() -> None:
    """F7: misses were cached (a writer's random keys filled ~1.3 GB); F9: the fast path
    accepted declared keys longer than decode_event's 1024-character limit."""
    grid = Router(Domain.grid({"a": ["x", "y"], "b": ["u", "v"]}), 1)
    for i in range(1000):
        assert grid.nodes(f"nope-{i}") is None
    assert len(grid._cache) == 0
    long_leaf = "a/" + "z" * 1100
    router = Router(Domain.from_paths([long_leaf, "a/x"]), 1)
    assert long_leaf not in router.declared and "a/x" in router.declared


def test_nonce_records_are_sealed_to_the_deployment_and_key() -> None:
    from agents.kafka.nonce import nonce_record, parse_nonce

    s = _settings()
    d = ROUTER.domain_id
    nonce = "ab" * 32
    rec = nonce_record(s, d, KEY, nonce)
    assert parse_nonce(s, d, KEY, rec) == nonce
    assert parse_nonce(s, d, bytes(range(32)), rec) is None  # another key
    assert parse_nonce(s.replace(app_id="other"), d, KEY, rec) is None  # another deployment
    forged = bytearray(rec)
    forged[-40] ^= 1
    assert parse_nonce(s, d, KEY, bytes(forged)) is None
    assert parse_nonce(s, d, KEY, b'{"v": 1, "nonce": "' + b"cd" * 32 + b'"}') is None
    assert deployment_id(s, d, nonce) != deployment_id(s, d, "cd" * 32) != deployment_id(s, d)


def test_a_forged_create_time_stamp_years_ahead_opens_no_bucket() -> None:
    """Review F5: on CreateTime a writer set the record timestamp and ts years ahead: every
    such record opened a bucket that closed only years later (memory, checkpoint size). Event
    times beyond the worker's clock + max_future_skew_s are ``future``."""
    s = _settings(events_timestamp_type="CreateTime")
    now = ORIGIN + 100.0
    state = _state(s, now)
    recs = [Record(i, b"k", _event("a/x", now + 1e6 * (i + 1)), int((now + 1e6 * (i + 1)) * 1000), 0)
            for i in range(50)]
    recs.append(Record(50, b"k", _event("a/y", ORIGIN + 95.0), int((ORIGIN + 96.0) * 1000), 0))
    state.process_batch(recs)
    assert _reasons(state) == ["future"] * 50
    assert sorted(state.buckets) == [10]


def test_the_checkpoint_names_where_to_read_the_schedule_topic_from() -> None:
    """Issue #24 (restore time): a restored ingest partition reads the schedule topic from the
    offset its checkpoint names, not from the start; the offset survives the checkpoint."""
    s = _settings()
    state = _state(s, ORIGIN + 100.0)
    state.schedule_from = 12345
    twin = _state(s, ORIGIN + 100.0)
    twin.restore(state.to_bytes(), 1)
    assert twin.schedule_from == 12345
