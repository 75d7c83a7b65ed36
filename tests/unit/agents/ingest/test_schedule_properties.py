"""The release schedule's privacy properties on the pure ingest state (no Kafka).

P1 — no event moves the schedule: for a random log and one added record ``e`` (any payload, event
time and record timestamp), every other event lands in the same (stream, tick) or is rejected for
the same reason, the same ticks close, and the released partial sums differ only by ``e``'s own
clamped contribution on ``e``'s nodes.
P2 — deterministic replay: any batch split, a checkpoint/restore in the middle, and a run that
follows the persisted closing points give the same partials and closing points.
P4 — a changed log is refused when persisted closing points are followed.

The log model: records are appended to a partition in order of their real arrival; the clock
rule closes tick n at the end offset observed at ``deadline(n) + grace``, i.e. at the number of
records that arrived before then (a moment no event can move).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.config.settings import Settings
from agents.ingest.digest import _UNKEYED
from agents.ingest.records import Record
from agents.ingest.routing import Router
from agents.ingest.schedule import ScheduleMismatch
from agents.ingest.state import IngestState
from agents.ingest.ticks import Schedule
from agents.kafka.codec import close_marker, marker_key
from stream_dp.contributions import to_units
from stream_dp.domain import Domain

ORIGIN = 1_000_000.0
#: the noise key of the deployment under test (markers are signed with a key derived from it)
NOISE_KEY = b"k" * 32
MARKER_KEY = marker_key(NOISE_KEY)
#: what an attacker without the noise key can sign with
FORGED_KEY = marker_key(b"f" * 32)
TOPIC = "dp.events.v1"  # Settings' default events topic
L = 10.0
LEAVES = ["a/x", "a/y", "b/z"]
N_TICKS = 8


def _settings(tmp: Path, **kw: Any) -> Settings:
    base: dict[str, Any] = dict(
        origin=ORIGIN, tick_seconds=L, allowed_lateness_s=2.0, close_grace_s=0.5,
        domain_file=str(tmp / "d.toml"), events_partitions=1, shards=2, cap=1.0,
        max_future_skew_s=30.0,
    )
    base.update(kw)
    return Settings(**base)


_ROUTER = Router(Domain.from_paths(LEAVES), 2)


def _marker(at: float, final: bool, partition: int = 0) -> tuple[list[tuple[str, bytes]], bytes]:
    """An authentic close marker for the unkeyed test states (default events topic)."""
    return close_marker(at, final, mac_key=marker_key(_UNKEYED), topic="dp.events.v1",
                        partition=partition)

# one record: (real arrival, producer timestamp or None = same as arrival, key, ts, value)
_honest = st.tuples(
    st.floats(ORIGIN, ORIGIN + N_TICKS * L + 5), st.none(), st.sampled_from(LEAVES),
    st.floats(-3.0, 1.0), st.sampled_from([1.0, 0.5, 3.0]),
)


def _payload(key: Any, ts: Any, value: Any) -> bytes:
    return json.dumps({"key": key, "ts": ts, "value": value}).encode()


@st.composite
def _nasty(draw: st.DrawFn) -> tuple[float, float | None, bytes, list[tuple[str, bytes]]]:
    """The added record: any arrival, any producer timestamp, any payload (or a fake marker)."""
    arrival = draw(st.floats(ORIGIN - 50, ORIGIN + N_TICKS * L + 50))
    stamp = draw(st.one_of(st.none(), st.floats(0, 4e9), st.sampled_from([-1.0, 9.9e12 / 1000])))
    kind = draw(st.sampled_from(["event", "future", "past", "malformed", "unknown", "marker",
                                 "huge"]))
    headers: list[tuple[str, bytes]] = []
    if kind == "event":
        raw = _payload(draw(st.sampled_from(LEAVES)), arrival - draw(st.floats(-40, 40)), 1.0)
    elif kind == "future":
        raw = _payload(LEAVES[0], arrival + draw(st.floats(0, 1e9)), 1.0)
    elif kind == "past":
        raw = _payload(LEAVES[1], draw(st.floats(0, ORIGIN)), 1.0)
    elif kind == "malformed":
        raw = draw(st.sampled_from([b"", b"{", b"\xff\xfe", b'{"key": 1}', b"[]"]))
    elif kind == "unknown":
        raw = _payload("nope", arrival, 1.0)
    elif kind == "marker":
        headers, raw = _marker(ORIGIN + 1e6, True)
    else:
        raw = _payload(LEAVES[2], arrival, 1e6)
    return arrival, stamp, raw, headers


def _log(records: list[tuple[float, float | None, bytes, list[tuple[str, bytes]]]],
         ts_type: int) -> list[Record]:
    ordered = sorted(records, key=lambda r: r[0])  # appended in order of real arrival
    out = []
    for off, (arrival, stamp, raw, headers) in enumerate(ordered):
        if ts_type == 1:
            ms = math.floor(arrival * 1000)  # the broker's clock
        else:
            ms = math.floor((arrival if stamp is None else stamp) * 1000)
        out.append(Record(off, b"k", raw, ms, ts_type, headers))
    return out


def _closes(log: list[Record], arrivals: list[float], sch: Schedule) -> list[tuple[int, int]]:
    """Clock rule: tick n closes at the number of records that arrived before deadline + grace."""
    out = []
    for n in range(1, N_TICKS + 8):  # past the last arrival, like a clock that keeps running
        moment = sch.deadline(n) + sch.grace
        out.append((n, sum(1 for a in arrivals if a < moment)))
    return out


def _run(s: Settings, log: list[Record], closes: list[tuple[int, int]], splits: list[int]
         ) -> IngestState:
    state = IngestState(s, _ROUTER, 0, offset=0)
    for n, end in closes:
        state.schedule_close(n, end, "clock", 0.0)
    i = 0
    for size in [*splits, len(log)]:
        state.process_batch(log[i : i + size])
        i += size
        if i >= len(log):
            break
    state.advance_to(len(log))
    return state


def _sums(state: IngestState) -> dict[tuple[int, int], int]:
    """Released partial sums per (tick, node), in exact integer units."""
    out: dict[tuple[int, int], int] = defaultdict(int)
    for p in state.out.partials:
        for i, c in zip(p.idx, p.counts, strict=True):
            out[(p.tick, _ROUTER.shard_nodes[p.shard][i])] += c
    return out


@hsettings(max_examples=300, deadline=None)
@given(
    base=st.lists(_honest, min_size=0, max_size=40),
    e=_nasty(),
    ts_type=st.sampled_from([0, 1]),
    splits=st.lists(st.integers(1, 7), max_size=6),
)
def test_p1_one_added_record_moves_nothing_else(
    tmp_path_factory: pytest.TempPathFactory, base: list[Any], e: Any, ts_type: int,
    splits: list[int],
) -> None:
    s = _settings(tmp_path_factory.getbasetemp())
    sch = Schedule(s.origin, s.tick_seconds, s.allowed_lateness_s, s.close_grace_s)
    records = [(arr, stamp, _payload(k, arr + dts, v), []) for arr, stamp, k, dts, v in base]
    without = _log(records, ts_type)
    with_e = _log([*records, e], ts_type)
    arr_without = sorted(r[0] for r in records)
    arr_with = sorted([*arr_without, e[0]])
    a = _run(s, without, _closes(without, arr_without, sch), splits)
    b = _run(s, with_e, _closes(with_e, arr_with, sch), splits)

    # the same ticks closed, in the same steps
    assert [(x.first, x.through) for x in a.out.entries] == [
        (x.first, x.through) for x in b.out.entries]
    assert a.next_tick == b.next_tick == N_TICKS + 8
    # every other record met the same fate
    e_value = e[2]
    fate_a = sorted((r.reason, raw) for _, r, raw, _ in a.out.dead_letters)
    fate_b = sorted((r.reason, raw) for _, r, raw, _ in b.out.dead_letters if raw != e_value)
    assert fate_a == fate_b
    # releases differ only by e's own clamped contribution on e's nodes
    sa, sb = _sums(a), _sums(b)
    diff = {k: sb.get(k, 0) - sa.get(k, 0) for k in set(sa) | set(sb)}
    diff = {k: v for k, v in diff.items() if v != 0}
    e_accepted = b.out.accepted - a.out.accepted
    assert e_accepted in (0, 1)
    if e_accepted == 0:
        assert diff == {}
    else:
        body = json.loads(e_value)
        tick = sch.tick_of(body["ts"])
        nodes = _ROUTER.nodes(body["key"]) or ()
        own = to_units(body.get("value", 1.0), b.unit, b.cap_u)
        assert own * b.unit <= s.cap
        want = {(tick, n): own for n in nodes}
        if tick >= b.next_tick:  # e's tick is still open: nothing of it released yet
            want = {}
            assert b.buckets[tick] != a.buckets.get(tick)
        assert diff == want  # exactly: integer sums, whatever else arrived


def _honest_log(seed: int, n: int = 60) -> list[Record]:
    import random

    rng = random.Random(seed)
    recs = []
    for _ in range(n):
        arr = rng.uniform(ORIGIN, ORIGIN + N_TICKS * L)
        recs.append((arr, None, _payload(rng.choice(LEAVES), arr - rng.uniform(0, 3), 1.0), []))
    return _log(recs, 1)


def test_p2_batches_and_restarts_give_identical_partials_and_points(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    log = _honest_log(3)
    ref = _run(s, log, [], [])  # LogAppendTime closes only
    assert ref.next_tick > 3
    for splits in ([1] * 60, [7, 3, 11], [59]):
        other = _run(s, log, [], splits)
        assert [p.encode() for p in other.out.partials] == [p.encode() for p in ref.out.partials]
        assert other.out.entries == ref.out.entries
    # crash after 25 records: restore the checkpoint, go on
    first = IngestState(s, _ROUTER, 0, offset=0)
    first.process_batch(log[:25])
    blob, before = first.to_bytes(), list(first.out.partials)
    second = IngestState(s, _ROUTER, 0)
    second.restore(blob, 1)
    second.process_batch(log[25:])
    assert [p.encode() for p in before + second.out.partials] == [
        p.encode() for p in ref.out.partials]


def test_p2_p4_following_persisted_points_reproduces_or_refuses(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    log = _honest_log(5)
    ref = _run(s, log, [], [4])
    entries = list(ref.out.entries)
    assert len(entries) >= 3
    # a fresh run following the persisted points reproduces everything
    again = IngestState(s, _ROUTER, 0, offset=0)
    again.range_start = 0
    again.load_known(entries)
    again.process_batch(log)
    assert [p.encode() for p in again.out.partials] == [p.encode() for p in ref.out.partials]
    assert again.out.entries == []  # followed points are not written again
    assert again.next_tick == ref.next_tick and not again.replaying
    # one changed byte anywhere in the covered range is refused
    changed = list(log)
    victim = changed[len(log) // 2]
    changed[len(log) // 2] = victim._replace(value=victim.value.replace(b"1.0", b"1.5"))
    third = IngestState(s, _ROUTER, 0, offset=0)
    third.range_start = 0
    third.load_known(entries)
    with pytest.raises(ScheduleMismatch, match="differ"):
        third.process_batch(changed)
    # a removed record too
    fourth = IngestState(s, _ROUTER, 0, offset=0)
    fourth.range_start = 0
    fourth.load_known(entries)
    shifted = [r._replace(offset=i) for i, r in enumerate(log[:10] + log[11:])]
    with pytest.raises(ScheduleMismatch):
        fourth.process_batch(shifted)
    # persisted points of another schedule are refused outright
    other = IngestState(_settings(tmp_path, allowed_lateness_s=3.0), _ROUTER, 0, offset=0)
    with pytest.raises(ScheduleMismatch, match="schedule"):
        other.load_known(entries)


def test_markers_schedule_closes_only_at_markers(tmp_path: Path) -> None:
    s = _settings(tmp_path, schedule="markers")
    recs = [Record(i, b"k", _payload("a/x", ORIGIN + 1 + 3 * i, 1.0), 0, 0) for i in range(10)]
    headers, raw = _marker(ORIGIN + 22.0, False)  # deadlines of ticks 1, 2 passed by then
    recs.append(Record(10, None, raw, 0, 0, headers))
    recs.append(Record(11, b"k", _payload("a/x", ORIGIN + 5, 1.0), 0, 0))  # tick 1: closed
    headers, raw = _marker(ORIGIN + 31.0, True)  # final: closes tick 4 (contains 31)
    recs.append(Record(12, None, raw, 0, 0, headers))
    state = IngestState(s, _ROUTER, 0, offset=0)
    state.process_batch(recs)
    assert [(e.first, e.through, e.rule) for e in state.out.entries] == [
        (1, 2, "marker"), (3, 4, "marker")]
    assert [r.reason for _, r, _, _ in state.out.dead_letters] == ["tick_closed"]
    sums = _sums(state)
    leaf = _ROUTER.domain.names.index("a/x")
    assert [sums.get((t, leaf), 0) * state.unit for t in (1, 2, 3, 4)] == [3.0, 4.0, 3.0, 0.0]


def test_a_second_replay_into_a_markers_deployment_is_dead_lettered_and_committed(
    tmp_path: Path,
) -> None:
    """The same log replayed again into the same topic (issue #24): its events fall in ticks
    the first copy's final marker closed (dead letters ``tick_closed``) and its markers close
    nothing. The records must still make the state dirty (its offset moved, dead letters wait):
    a batch ending with a marker that closed nothing left it clean, so the worker never
    committed the dead letters nor the offset and ignored the copy in silence."""
    s = _settings(tmp_path, schedule="markers")

    def copy(first: int) -> list[Record]:
        recs = [Record(first + i, b"k", _payload("a/x", ORIGIN + 1 + 3 * i, 1.0), 0, 0)
                for i in range(10)]
        headers, raw = _marker(ORIGIN + 31.0, True)  # final: closes through tick 4
        return [*recs, Record(first + 10, None, raw, 0, 0, headers)]

    state = IngestState(s, _ROUTER, 0, offset=0)
    state.process_batch(copy(0))
    assert state.next_tick == 5 and state.dirty and not state.out.dead_letters
    state.out.clear()  # what the worker's commit does
    state.dirty = False
    state.process_batch(copy(11))
    assert state.next_tick == 5 and not state.out.entries  # nothing closes again
    assert [r.reason for _, r, _, _ in state.out.dead_letters] == ["tick_closed"] * 10
    assert state.offset == 22 and state.dirty  # committed with the next transaction


def test_clock_rule_ignores_markers(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    headers, raw = _marker(ORIGIN + 1e6, True)
    state = IngestState(s, _ROUTER, 0, offset=0)
    state.process_batch([Record(0, None, raw, int(ORIGIN * 1000), 0, headers)])
    assert state.next_tick == 1 and not state.out.entries
    assert [r.reason for _, r, _, _ in state.out.dead_letters] == ["unexpected_marker"]


def test_sealed_ingest_checkpoints_refuse_tampering_another_key_or_configuration(
    tmp_path: Path,
) -> None:
    from stream_dp.integrity import IntegrityError

    s = _settings(tmp_path)
    key = bytes(range(32))
    state = IngestState(s, _ROUTER, 0, offset=0, key=key, domain_id="d1")
    state.process_batch(_honest_log(9)[:20])
    blob = state.to_bytes()
    twin = IngestState(s, _ROUTER, 0, key=key, domain_id="d1")
    twin.restore(blob, 1)
    assert twin.buckets == state.buckets and twin.digest == state.digest
    for i in (0, len(blob) // 2, len(blob) - 1):  # any changed byte
        forged = bytearray(blob)
        forged[i] ^= 1
        with pytest.raises(IntegrityError):
            IngestState(s, _ROUTER, 0, key=key, domain_id="d1").restore(bytes(forged), 1)
    with pytest.raises(IntegrityError):  # another key
        IngestState(s, _ROUTER, 0, key=bytes(range(1, 33)), domain_id="d1").restore(blob, 1)
    for other in (IngestState(s, _ROUTER, 0, key=key, domain_id="d2"),
                  IngestState(s.replace(cap=2.0), _ROUTER, 0, key=key, domain_id="d1"),
                  IngestState(s.replace(tick_seconds=5.0), _ROUTER, 0, key=key, domain_id="d1")):
        with pytest.raises(IntegrityError, match="configuration"):
            other.restore(blob, 1)


def _backlog_state(s: Settings, log: list[Record], limit: int | None) -> IngestState:
    """Every record processed with no tick closed yet, then one clock closing point far ahead
    (a backlog: ticks 1..N_TICKS + 40 at once), handed over ``limit`` ticks per step."""
    state = IngestState(s, _ROUTER, 0, offset=0)
    state.hand_over_limit = limit
    state.process_batch(log)
    state.schedule_close(N_TICKS + 40, len(log), "clock", ORIGIN + 999.25)
    state.apply_due()
    return state


def test_p2_a_backlog_is_handed_over_in_steps_with_the_same_partials(tmp_path: Path) -> None:
    """Closing a backlog is one decision (next tick, schedule entry) but its partials are handed
    over ``hand_over_limit`` ticks per step (agents/ingest/, IngestState.hand_over), so the
    worker can commit and return to its event loop in between (a SIGTERM during a 474 000-tick
    backlog). Oracle: the same state handing everything over at once. A checkpoint taken in the
    middle of the hand-over resumes it exactly (the ticks not handed over are in it)."""
    s = _settings(tmp_path, events_timestamp_type="CreateTime")
    # CreateTime records: the clock rule alone closes ticks
    log = [r._replace(timestamp_type=0) for r in _honest_log(11)]
    ref = _backlog_state(s, log, None)
    total = N_TICKS + 40
    assert ref.next_tick == total + 1 and not ref.unsent
    assert {p.tick for p in ref.out.partials} == set(range(1, total + 1))
    assert sum(c for p in ref.out.partials for c in p.counts) > 0  # events in the backlog
    want = [p.encode() for p in ref.out.partials]

    for limit in (1, 3, 7):
        step = _backlog_state(s, log, limit)
        assert step.next_tick == total + 1  # closed at once ...
        assert step.out.entries == ref.out.entries  # ... with the same closing point
        assert {p.tick for p in step.out.partials} == set(range(1, limit + 1))  # one step
        assert step.unsent_ticks == total - limit and step.handed_over_through() == limit
        got = [p.encode() for p in step.out.partials]
        while step.unsent:
            assert step.hand_over(limit) <= limit
            got += [p.encode() for p in step.out.partials[len(got):]]
        assert got == want and step.handed_over_through() == total

    # a restart in the middle of the hand-over (checkpoint with ticks still to hand over)
    first = _backlog_state(s, log, 5)
    first.hand_over(5)
    blob, before = first.to_bytes(), [p.encode() for p in first.out.partials]
    assert first.unsent_ticks == total - 10
    second = IngestState(s, _ROUTER, 0)
    second.restore(blob, 1)
    assert second.unsent == first.unsent and second.buckets == first.buckets
    second.hand_over(None)
    assert before + [p.encode() for p in second.out.partials] == want
