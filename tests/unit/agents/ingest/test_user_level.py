"""The person as unit of privacy on the pure ingest path (issue #34, docs/design/user-level.md
§1–3, :mod:`agents.ingest.users`), through the real :class:`IngestState`:

* the identifier's edge cases (missing, null, empty, 257 bytes, a number, an object, a lone
  surrogate, NUL bytes, two spellings that normalise alike, a Kafka key that disagrees);
* ``wrong_partition``; a dead-lettered record never consumes a budget;
* the neighbouring-person property: two logs that differ by every record of one nasty person
  give per-tick node sums that differ by exactly that person's bounded contribution (the
  library's rescanning oracle), and the same dead letters apart from that person's;
* exactly once: checkpoint and restore at any point (records delivered again) give the same
  partials, dead letters and table as one uninterrupted run; slots of closed periods are gone.
"""

from __future__ import annotations

import json
import random
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Hashable
from typing import Any

import pytest

from agents.config.settings import Settings
from agents.ingest.records import Record
from agents.ingest.routing import Router
from agents.ingest.state import IngestState
from agents.ingest.users import user_bounds
from agents.kafka.partitioner import key_partition as kafka_partition
from stream_dp.domain import Domain
from stream_dp.integrity import IntegrityError
from stream_dp.user_level import keep_mask

KEY = bytes(range(7, 39))
ORIGIN = 1_000_000.0
L = 10.0
LATENESS = 2.0
LEAVES = ["a/x", "a/y", "b/z"]
ROUTER = Router(Domain.from_paths(LEAVES), 1)
NOW = ORIGIN + 10_000.0


def _settings(**kw: Any) -> Settings:
    base: dict[str, Any] = dict(
        origin=ORIGIN, tick_seconds=L, allowed_lateness_s=LATENESS, close_grace_s=0.5,
        domain_file="unused.toml", events_partitions=2, shards=1, max_future_skew_s=30.0,
        events_timestamp_type="CreateTime", max_events_per_tick=1_000_000,
        privacy_unit="user", user_period_ticks=4, user_max_events=3)
    base.update(kw)
    return Settings(**base)


def _state(s: Settings, partition: int = 0, key: bytes | None = KEY) -> IngestState:
    st_ = IngestState(s, ROUTER, partition, offset=0, key=key)
    st_.clock = lambda: NOW
    return st_


def _home(partition: int, prefix: str = "person", partitions: int = 2) -> str:
    """An identifier that Kafka's default partitioner puts on ``partition``."""
    i = 0
    while kafka_partition(f"{prefix}-{i}".encode(), partitions) != partition:
        i += 1
    return f"{prefix}-{i}"


def _event(key: str, ts: float, user: Any = None, field: str = "user", **extra: Any) -> bytes:
    doc: dict[str, Any] = {"key": key, "ts": ts, **extra}
    if user is not None:
        doc[field] = user
    return json.dumps(doc).encode()


def _feed(state: IngestState, values: list[bytes], arrival: float | None = None,
          key: bytes | None = b"k") -> None:
    recs: list[Record] = []
    for v in values:
        at = ORIGIN + 1.5 if arrival is None else arrival
        recs.append(Record(state.offset + len(recs), key, v, int(at * 1000), 0))
    state.process_batch(recs)


def _counted(state: IngestState) -> int:
    units = sum(sum(b.values()) for b in state.buckets.values())
    return units // state.cap_u


def _reasons(state: IngestState) -> list[str]:
    return [r.reason for _, r, _, _ in state.out.dead_letters]


# ------------------------------------------------------------------ the identifier
def test_identifier_edge_cases_are_dead_lettered_and_never_counted() -> None:
    s = _settings(user_max_events=100)
    state = _state(s, partition=0)
    t = ORIGIN + 1.0
    long_ok = _home(0, "x" * 240)
    assert len(long_ok.encode()) <= 256
    cases = [
        (b'{"key": "a/x", "ts": %r}' % t, "invalid_user"),  # missing
        (_event("a/x", t, None, extra_field=1).replace(b"}", b', "user": null}'),
         "invalid_user"),
        (_event("a/x", t, ""), "invalid_user"),  # empty
        (_event("a/x", t, "é" * 128 + "z"), "invalid_user"),  # 257 UTF-8 bytes
        (_event("a/x", t, 12345), "invalid_user"),  # a number
        (_event("a/x", t, {"id": _home(0)}), "invalid_user"),  # an object
        (_event("a/x", t, [_home(0)]), "invalid_user"),  # a list
        (_event("a/x", t, True), "invalid_user"),  # a boolean
        (b'{"key": "a/x", "ts": %r, "user": "\\ud800"}' % t, "invalid_user"),  # lone surrogate
    ]
    _feed(state, [v for v, _ in cases])
    assert _reasons(state) == [r for _, r in cases]
    assert _counted(state) == 0 and not len(state.users.bounder)  # type: ignore[union-attr]
    for _, rej, _, _ in state.out.dead_letters:  # the detail never repeats an identifier
        assert _home(0) not in rej.detail and "é" not in rej.detail
    # 256 bytes, NUL bytes: valid identifiers (bytes are the identity)
    nul = next(f"n\x00{i}" for i in range(1000) if kafka_partition(f"n\x00{i}".encode(), 2) == 0)
    _feed(state, [_event("a/x", t, long_ok), _event("a/x", t, nul)])
    assert _counted(state) == 2 and len(state.out.dead_letters) == len(cases)


def test_spellings_that_normalise_alike_are_two_people_and_the_json_field_decides() -> None:
    """Nothing is normalised (docs): NFC and NFD spellings are two identifiers; the Kafka
    record key plays no part (only the JSON field is read)."""
    s = _settings(user_max_events=1)
    nfc = next(f"Zoë{i}" for i in range(10_000)
               if kafka_partition(f"Zoë{i}".encode(), 2) == 0
               and kafka_partition(unicodedata.normalize("NFD", f"Zoë{i}").encode(), 2) == 0)
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfc != nfd and unicodedata.normalize("NFC", nfd) == nfc
    state = _state(s)
    t = ORIGIN + 1.0
    _feed(state, [_event("a/x", t, nfc), _event("a/x", t, nfd)], key=b"some other key")
    assert _counted(state) == 2  # K = 1 each: two people
    _feed(state, [_event("a/y", t, nfc)], key=nfd.encode())  # the record key disagrees
    assert _counted(state) == 2 and state.out.bounded == 1 and not state.out.dead_letters


def test_a_custom_field_and_wrong_partition() -> None:
    s = _settings(user_field="device")
    state0, state1 = _state(s, 0), _state(s, 1)
    who = _home(0)
    t = ORIGIN + 1.0
    _feed(state0, [_event("a/x", t, who, field="device")])
    _feed(state1, [_event("a/x", t, who, field="device"), _event("a/x", t, who)])
    assert _counted(state0) == 1 and _counted(state1) == 0
    assert _reasons(state1) == ["wrong_partition", "invalid_user"]
    detail = state1.out.dead_letters[0][1].detail
    assert "partition 0" in detail and who not in detail


def test_a_dead_lettered_record_never_consumes_a_budget() -> None:
    """Late, unknown-key, malformed and wrong-partition records of a person come first; the
    person's K = 3 on-time events all count afterwards."""
    s = _settings(user_max_events=3)
    state = _state(s)
    who = _home(0)
    t = ORIGIN + 1.0
    bad = [_event("nope", t, who), _event("a/x", t, who).replace(b'"ts"', b'"tz"'),
           _event("a/x", t, who, value=-1.0)]
    _feed(state, bad)
    _feed(state, [_event("a/x", t, who)], arrival=t + L + LATENESS + 1.0)  # late
    assert _reasons(state) == ["unknown_key", "invalid_schema", "negative_value", "late"]
    _feed(state, [_event("a/x", t, who)] * 4)
    assert _counted(state) == 3 and state.out.bounded == 1


def test_bounds_per_stream_streams_and_spacing_through_the_state() -> None:
    s = _settings(user_max_events=10, user_max_streams=2, user_max_events_per_stream=2,
                  user_min_separation_ticks=0)
    state = _state(s)
    who = _home(0)
    t = ORIGIN + 1.0
    _feed(state, [_event(k, t, who) for k in ("a/x", "a/x", "a/x", "a/y", "b/z", "a/y", "a/y")])
    assert _counted(state) == 4 and state.out.bounded == 3  # k = 2 on a/x and a/y; L = 2
    spaced = _state(_settings(user_max_events=10, user_min_separation_ticks=2))
    _feed(spaced, [_event("a/x", ORIGIN + 1.0, who), _event("a/x", ORIGIN + 11.0, who),
                   _event("a/x", ORIGIN + 21.0, who), _event("a/x", ORIGIN + 22.0, who)])
    assert sorted(spaced.buckets) == [1, 3]


def test_event_level_states_have_no_table_and_unchanged_checkpoints() -> None:
    ev = _state(_settings(privacy_unit="event", user_period_ticks=-1, user_max_events=0))
    assert ev.users is None
    _feed(ev, [_event("a/x", ORIGIN + 1.0, "anyone")])
    assert _counted(ev) == 1 and not ev.out.dead_letters  # the field is just ignored
    doc = json.loads(_state(_settings(privacy_unit="event", user_period_ticks=-1,
                                      user_max_events=0), key=None).to_bytes())
    assert doc["v"] == 5 and "users" not in doc
    assert b"users" not in ev.context()


# ------------------------------------------------------------------ neighbouring people
BOUNDS = [
    dict(user_max_events=3, user_period_ticks=4),
    dict(user_max_events=5, user_period_ticks=3, user_max_streams=2,
         user_max_events_per_stream=2),
    dict(user_max_events=4, user_period_ticks=0, user_min_separation_ticks=2),
    dict(user_max_events=2, user_period_ticks=1, user_min_separation_ticks=1,
         user_max_streams=1),
]


def _log(seed: int, nasty: str | None, ticks: int = 9) -> list[list[tuple[int, bytes, float]]]:
    """Per tick, the records ``(partition, value, arrival)`` appended while it is open, then
    the tick closes. Others: people on their home partition (some also on the other), a few
    invalid records; the nasty person (when given): many events on every stream, duplicates,
    late records, records on the wrong partition, every tick (so across period boundaries)."""
    rng = random.Random(seed)  # the others: the same draws with or without the person
    rng_n = random.Random(seed + 1000)
    others = [_home(i % 2, f"other{i}") for i in range(8)]
    segments = []
    for tick in range(1, ticks + 1):
        start = ORIGIN + (tick - 1) * L
        seg: list[tuple[int, bytes, float]] = []
        for _ in range(rng.randrange(5, 25)):
            who = rng.choice(others)
            home = kafka_partition(who.encode(), 2)
            part = home if rng.random() < 0.9 else 1 - home
            ts = start + rng.uniform(0.0, L - 0.01)
            roll = rng.random()
            if roll < 0.05:
                seg.append((part, _event("a/x", ts), ts + 0.1))  # no identifier
            elif roll < 0.1 and tick > 1:
                seg.append((part, _event(rng.choice(LEAVES), ts - L, who), ts + 0.1))  # late
            else:
                seg.append((part, _event(rng.choice(LEAVES), ts, who), ts + 0.1))
        n_others = len(seg)
        if nasty is not None:
            mine = []
            for _ in range(rng_n.randrange(20, 60)):
                ts = start + rng_n.uniform(0.0, L - 0.01)
                v = _event(rng_n.choice(LEAVES), ts, nasty, value=rng_n.choice([1.0, 5.0, 0.5]))
                roll = rng_n.random()
                if roll < 0.15:
                    mine.append((1, v, ts + 0.1))  # wrong partition
                elif roll < 0.3 and tick > 1:
                    late = _event(rng_n.choice(LEAVES), ts - L, nasty)
                    mine.append((0, late, ts + 0.1))  # late (its tick's deadline passed)
                else:
                    mine.append((0, v, ts + 0.1))
                    if rng_n.random() < 0.2:
                        mine.append((0, v, ts + 0.1))  # a duplicate
            # interleave the person's records with the others' (their relative order kept)
            slots = sorted(rng_n.sample(range(n_others + len(mine)), len(mine)))
            merged: list[tuple[int, bytes, float]] = []
            it_o, it_m = iter(seg), iter(mine)
            for i in range(n_others + len(mine)):
                merged.append(next(it_m) if slots and slots[0] == i else next(it_o))
                if slots and slots[0] == i:
                    slots.pop(0)
            seg = merged
        segments.append(seg)
    return segments


def _run(s: Settings, segments: list[list[tuple[int, bytes, float]]],
         checkpoint_every: int = 0) -> tuple[dict[tuple[int, int], int], list[Any], list[Any]]:
    """Both partitions through the log; per (tick, node) the summed partials (units), the
    dead letters ``(partition, reason, value)`` in log order per partition, and the states.
    ``checkpoint_every`` > 0: every that many records, the partition's state is written,
    restored into a new state and fed the records again from the start of its segment (a
    restart, with records delivered again)."""
    states = [_state(s, 0), _state(s, 1)]
    sums: dict[tuple[int, int], int] = defaultdict(int)
    dead: list[Any] = []
    fed = [0, 0]
    for tick, seg in enumerate(segments, start=1):
        for p in (0, 1):
            recs = [Record(0, b"k", v, int(at * 1000), 0) for q, v, at in seg if q == p]
            base = states[p].offset
            recs = [Record(base + i, r.key, r.value, r.timestamp, r.timestamp_type)
                    for i, r in enumerate(recs)]
            if not checkpoint_every:
                states[p].process_batch(recs)
            else:
                for i, r in enumerate(recs):
                    states[p].process_batch([r])
                    fed[p] += 1
                    if fed[p] % checkpoint_every == 0:
                        again = _state(s, p)
                        again.restore(states[p].to_bytes(), seq=1)
                        again.out = states[p].out  # what is not committed yet goes on
                        states[p] = again
                        states[p].process_batch(recs[: i + 1])  # re-delivered: skipped
            states[p].schedule_close(tick, states[p].offset, "clock", NOW)
            states[p].apply_due()
            for part in states[p].out.partials:
                for node, c in zip(part.idx, part.counts, strict=True):
                    sums[(part.tick, int(node))] += int(c)
            dead.extend((p, r.reason, v) for _, r, v, _ in states[p].out.dead_letters)
            states[p].out.clear()
    return dict(sums), dead, states


def _expected_contribution(s: Settings, segments: list[list[tuple[int, bytes, float]]],
                           nasty: str, cap_u: int) -> dict[tuple[int, int], int]:
    """The oracle: the nasty person's eligible records (home partition, on time, valid) in log
    order through :func:`stream_dp.user_level.keep_mask`; each kept event adds ``cap_u``
    (values ≥ cap clamp to cap; 0.5 = half) to its leaf and every ancestor."""
    bounds = user_bounds(s)
    events: list[tuple[Hashable, int, int]] = []
    units = []
    for tick, seg in enumerate(segments, start=1):
        for p, v, at in seg:
            doc = json.loads(v)
            if p != 0 or doc.get("user") != nasty:
                continue
            ev_tick = int((doc["ts"] - ORIGIN) // L) + 1
            if at >= ORIGIN + ev_tick * L + LATENESS or ev_tick < tick:
                continue  # late, or its tick closed before the record (tick_closed)
            leaf = ROUTER.declared[doc["key"]]
            events.append((nasty, ev_tick, leaf))
            units.append(cap_u if doc.get("value", 1.0) >= 1.0 else cap_u // 2)
    out: dict[tuple[int, int], int] = defaultdict(int)
    for (_, tick, leaf), u, kept in zip(events, units, keep_mask(events, bounds), strict=True):
        if kept:
            for node in ROUTER.expand(leaf):
                out[(tick, node)] += u
    return dict(out)


@pytest.mark.parametrize("bounds", BOUNDS, ids=lambda b: "-".join(f"{v}" for v in b.values()))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_removing_every_record_of_one_person_changes_only_their_bounded_contribution(
        bounds: dict[str, int], seed: int) -> None:
    s = _settings(**bounds)
    nasty = _home(0, "nasty")
    with_p, dead_with, states = _run(s, _log(seed, nasty))
    without, dead_without, _ = _run(s, _log(seed, None))
    diff = {k: with_p.get(k, 0) - without.get(k, 0) for k in set(with_p) | set(without)}
    diff = {k: d for k, d in diff.items() if d}
    cap_u = states[0].cap_u
    assert diff == _expected_contribution(s, _log(seed, nasty), nasty, cap_u)
    # within the bounds: per leaf per period at most min(K, k)·cap, per node n_node·cap
    b = user_bounds(s)
    per: Counter[tuple[int, int]] = Counter()
    for (tick, node), d in diff.items():
        assert d > 0
        per[(b.period_of(tick), node)] += d
    leaves = set(ROUTER.declared.values())
    for (_, node), d in per.items():
        below = 1 if node in leaves else sum(1 for leaf in leaves if node in ROUTER.expand(leaf))
        assert d <= b.per_node_events(below) * cap_u
    # dead letters: the same, apart from the person's own records
    assert [x for x in dead_with if nasty.encode() not in x[2]] == dead_without
    assert any(r == "wrong_partition" for p, r, v in dead_with if nasty.encode() in v)
    assert any(r in ("late", "tick_closed") for p, r, v in dead_with if nasty.encode() in v)


# ------------------------------------------------------------------ exactly once
@pytest.mark.parametrize("bounds", BOUNDS[1:3], ids=["L-k", "b-epoch"])
@pytest.mark.parametrize("every", [1, 7])
def test_restarts_from_any_checkpoint_give_the_same_run(bounds: dict[str, int],
                                                        every: int) -> None:
    """A restart restores the table with the offsets (sealed checkpoint, records delivered
    again): bit-identical partials and dead letters, nothing counted twice."""
    s = _settings(**bounds)
    log = _log(5, _home(0, "nasty"))
    straight = _run(s, log)
    restarted = _run(s, log, checkpoint_every=every)
    assert restarted[0] == straight[0] and restarted[1] == straight[1]
    for a, b in zip(straight[2], restarted[2], strict=True):
        assert a.users.to_doc() == b.users.to_doc()


def test_closed_periods_are_pruned_and_checkpoints_stay_small() -> None:
    s = _settings(user_max_events=2, user_period_ticks=2)
    state = _state(s)
    people = [_home(0, f"p{i}") for i in range(50)]
    _feed(state, [_event("a/x", ORIGIN + 1.0, who) for who in people])
    assert len(state.users.bounder) == 50  # type: ignore[union-attr]
    state.schedule_close(1, state.offset, "clock", NOW)
    state.apply_due()
    assert len(state.users.bounder) == 50  # type: ignore[union-attr]
    state.schedule_close(2, state.offset, "clock", NOW)
    state.apply_due()
    assert len(state.users.bounder) == 0  # type: ignore[union-attr]  # period 0 closed
    assert json.loads(IngestState(s, ROUTER, 0, key=None).to_bytes())["users"]["hashes"] == ""


def test_a_checkpoint_under_other_bounds_or_unit_is_refused() -> None:
    s = _settings()
    state = _state(s)
    _feed(state, [_event("a/x", ORIGIN + 1.0, _home(0))])
    data = state.to_bytes()
    for other in (s.replace(user_max_events=4), s.replace(user_period_ticks=5),
                  s.replace(user_field="device"), s.replace(user_min_separation_ticks=1)):
        with pytest.raises(IntegrityError):
            _state(other).restore(data, seq=1)
    event = s.replace(privacy_unit="event", user_period_ticks=-1, user_max_events=0)
    with pytest.raises(IntegrityError):
        _state(event).restore(data, seq=1)
    # unsealed (pure states of tests): the version and the table must come together
    plain = _state(s, key=None)
    _feed(plain, [_event("a/x", ORIGIN + 1.0, _home(0))])
    with pytest.raises(ValueError, match="per-person table"):
        _state(event, key=None).restore(plain.to_bytes(), seq=1)
    ev_state = _state(event, key=None)
    with pytest.raises(ValueError, match="per-person table"):
        _state(s, key=None).restore(ev_state.to_bytes(), seq=1)


# ------------------------------------------------------------------ the identifier stays inside
def test_the_table_holds_only_a_keyed_hash_never_the_identifier() -> None:
    """Slots are keyed by SipHash-2-4-128 under a key derived from the noise key (checked
    here against this test's own pure-Python SipHash, itself checked against the reference
    vectors in test_siphash.py): without the key nobody can choose two identifiers that share
    a slot; the identifier itself is in no checkpoint."""
    from agents.ingest.siphash import siphash128_py
    from stream_dp.integrity import derive_key

    who = _home(0, "secret-person")
    states = [_state(_settings(), key=k) for k in (KEY, bytes(range(50, 82)), None)]
    for state in states:
        _feed(state, [_event("a/x", ORIGIN + 1.0, who)])
    hashes = [state.users.to_doc()["hashes"] for state in states]  # type: ignore[union-attr]
    assert len(set(hashes)) == 3
    want = siphash128_py(derive_key(KEY, "user id siphash-2-4-128")[:16], who.encode())
    assert hashes[0] == want.hex()
    plain = states[2].to_bytes()  # unsealed: the payload in clear
    assert who.encode() not in plain and who.encode().hex().encode() not in plain


def test_the_bounded_events_metric_is_operator_only() -> None:
    from agents.telemetry.metrics import EVENT_COUNT_METRICS, Metrics

    assert "stream_dp_user_bounded_events_total" in EVENT_COUNT_METRICS
    hidden, shown = Metrics(process=False, event_counts=False), Metrics(process=False)
    hidden.user_bounded(3)
    shown.user_bounded(3)
    assert b"user_bounded" not in hidden.exposition()
    assert b"stream_dp_user_bounded_events_total 3.0" in shown.exposition()
    state = _state(_settings(user_max_events=1))
    _feed(state, [_event("a/x", ORIGIN + 1.0, _home(0))] * 3)
    assert state.out.bounded == 2 and not state.out.dead_letters  # dropped, not dead-lettered


# ------------------------------------------------------------------ the changelog form (worker)
def _crashy_partition(s: Settings, segments: list[list[tuple[int, bytes, float]]], p: int,
                      seed: int, flush: float = 1.0
                      ) -> tuple[dict[tuple[int, int], int], list[Any], IngestState]:
    """One partition as the worker runs it: the table in a changelog (records taken, sealed,
    with a share ``flush`` of the commits: the others carry the flush point), outputs kept only
    when a commit succeeds, and crashes at random points between commits that restore the last
    commit (checkpoint + changelog up to it), re-decide the records since the table's last
    write into it (agents.ingest.user_replay, following the persisted closing points) and feed
    every record since the commit again."""
    from agents.ingest.user_replay import TableReplay

    rng = random.Random(seed)
    recs: list[Record] = []
    closes: dict[int, int] = {}  # offset -> tick through which ticks close before it
    for tick, seg in enumerate(segments, start=1):
        for q, v, at in seg:
            if q == p:
                recs.append(Record(len(recs), b"k", v, int(at * 1000), 0))
        closes[len(recs)] = tick

    def fresh() -> IngestState:
        state = _state(s, p)
        assert state.users is not None
        state.users.changelog = True
        state.written_empty()  # as the worker positions a partition without a checkpoint
        return state

    state = fresh()
    topic: list[tuple[bytes, bytes | None]] = []
    schedule: list[Any] = []  # the closing points persisted (the schedule topic)
    committed: tuple[bytes, int, int] | None = None  # checkpoint, lengths of both topics
    sums: dict[tuple[int, int], int] = defaultdict(int)
    dead: list[Any] = []
    crashes = replays = 0

    def commit() -> None:
        nonlocal committed
        if rng.random() < flush:
            topic.extend(state.user_changes())
        schedule.extend(state.out.entries)
        committed = (state.to_bytes(), len(topic), len(schedule))
        for part in state.out.partials:
            for node, c in zip(part.idx, part.counts, strict=True):
                sums[(part.tick, int(node))] += int(c)
        dead.extend((p, r.reason, v) for _, r, v, _ in state.out.dead_letters)
        state.out.clear()

    while True:
        o = state.offset
        if o in closes and closes[o] >= state.next_tick:
            state.schedule_close(closes[o], o, "clock", NOW)
            state.apply_due()
            commit()  # a tick close always commits
        if o >= len(recs):
            break
        state.process_batch([recs[o]])
        roll = rng.random()
        if roll < 0.15:
            commit()
        elif roll < 0.25:  # kill -9: what is not committed is gone
            crashes += 1
            state = fresh()
            if committed is None:
                continue
            del topic[committed[1]:]  # an aborted transaction's records are never read
            del schedule[committed[2]:]
            state.restore(committed[0], seq=1)
            state.load_user_changes(list(topic))
            point = state.flush_point
            assert point is not None
            if (point.offset, point.next_tick) != (state.offset, state.next_tick):
                replays += 1
                replay = TableReplay(state, point, list(schedule))
                replay.feed(recs[point.offset:state.offset])
                replay.finish(state.offset)
    assert crashes > 3 and (replays > 3 or flush == 1.0)
    return dict(sums), dead, state


def _clock_future(segments: list[list[tuple[int, bytes, float]]], who: str
                  ) -> list[list[tuple[int, bytes, float]]]:
    """``segments`` with a few records of ``who`` per tick whose event time lies past the
    worker's clock (NOW) + max_future_skew_s, stamped as they arrive (so only the clock
    refuses them; a restore re-deciding at another clock must refuse them too)."""
    out = []
    for i, seg in enumerate(segments):
        seg = list(seg)
        for j in range(3):
            ts = NOW + 31.0 + 50.0 * i + j
            seg.insert((j * len(seg)) // 3, (0, _event("a/x", ts, who), ts))
        out.append(seg)
    return out


@pytest.mark.parametrize("flush", [1.0, 0.2], ids=["every-commit", "lazy"])
@pytest.mark.parametrize("bounds", BOUNDS, ids=lambda b: "-".join(f"{v}" for v in b.values()))
def test_the_changelog_form_survives_crashes_between_commits(bounds: dict[str, int],
                                                             flush: float) -> None:
    """Crashes between commits, with the table written with every commit or with one in five
    (a restore then re-decides the records since its last write): the same sums, dead letters
    and table as a run without crashes — also for records only the worker's clock refused."""
    s = _settings(**bounds)
    nasty = _home(0, "nasty")
    log = _clock_future(_log(9, nasty), nasty)
    want_sums, want_dead, straight = _run(s, log)
    assert sum(1 for _, reason, _ in want_dead if reason == "future") >= 27
    sums: dict[tuple[int, int], int] = defaultdict(int)
    dead: list[Any] = []
    for p in (0, 1):
        got_sums, got_dead, state = _crashy_partition(s, log, p, seed=p + 40, flush=flush)
        for k, v in got_sums.items():
            sums[k] += v
        dead.extend(got_dead)
        assert state.users is not None and straight[p].users is not None
        assert sorted(state.users.bounder.export()) == sorted(straight[p].users.bounder.export())
    assert dict(sums) == want_sums
    assert sorted(dead) == sorted(want_dead)


def test_changelog_records_are_sealed_and_the_checkpoint_says_its_form() -> None:
    s = _settings()
    state = _state(s)
    assert state.users is not None
    state.users.changelog = True
    who = _home(0)
    _feed(state, [_event("a/x", ORIGIN + 1.0, who)])
    changes = state.user_changes()
    assert len(changes) == 1 and who.encode() not in changes[0][1]  # type: ignore[operator]
    assert state.user_changes() == []  # taken once
    data = state.to_bytes()
    again = _state(s)
    assert again.users is not None
    again.users.changelog = True
    again.restore(data, seq=1)
    forged = bytearray(changes[0][1])  # type: ignore[arg-type]
    forged[-5] ^= 1
    with pytest.raises(IntegrityError):
        again.load_user_changes([(changes[0][0], bytes(forged))])
    with pytest.raises(IntegrityError):  # a record moved to another person's key
        again.load_user_changes([(bytes(16), changes[0][1])])
    again.load_user_changes(changes)
    assert again.users.bounder.export() == state.users.bounder.export()
    with pytest.raises(ValueError, match="changelog"):
        _state(s).restore(data, seq=1)  # a table-form state refuses a changelog checkpoint


def test_a_lost_changelog_is_refused_not_trusted() -> None:
    """A changelog topic deleted or re-created under a live checkpoint would restart every
    person's budget: the checkpoint says how many people the table holds, and a restore that
    finds another number refuses (a fatal ScheduleMismatch, the worker stops)."""
    from agents.ingest.schedule import ScheduleMismatch

    s = _settings()
    state = _state(s)
    assert state.users is not None
    state.users.changelog = True
    _feed(state, [_event("a/x", ORIGIN + 1.0, _home(0, f"p{i}")) for i in range(5)])
    changes = state.user_changes()
    data = state.to_bytes()
    for lost in ([], changes[:3]):
        again = _state(s)
        assert again.users is not None
        again.users.changelog = True
        again.restore(data, seq=1)
        with pytest.raises(ScheduleMismatch, match="changelog holds"):
            again.load_user_changes(lost)
    again = _state(s)
    assert again.users is not None
    again.users.changelog = True
    again.restore(data, seq=1)
    again.load_user_changes(changes)
    assert len(again.users.bounder) == 5


def _nastier(log: list[list[tuple[int, bytes, float]]], nasty: str, other: str,
             seed: int) -> list[list[tuple[int, bytes, float]]]:
    """The nasty person's records of ``log`` (adversarial review of issue 34) also taking the
    full decoding path on purpose (a ``NaN`` in an extra field: the fast parser refuses it, the
    authoritative one accepts it, so one person's events reach the table through both paths),
    with the identifier twice (another person's first, theirs last: the last one is the
    person's), escaped (``\\u`` spellings of the same bytes), and records dead-lettered for
    their value or time (future, too old): the others' records unchanged."""
    rng = random.Random(seed + 5000)
    out = []
    for seg in log:
        new = []
        for p, v, at in seg:
            doc = json.loads(v)
            if doc.get("user") == nasty:
                roll = rng.random()
                if roll < 0.25:
                    v = v[:-1] + b', "junk": NaN}'
                elif roll < 0.4:
                    v = b'{"user": "%s", ' % other.encode() + v[1:]  # theirs wins (last)
                elif roll < 0.5:
                    v = v.replace(b'"user": "n', b'"user": "\\u006e')
                elif roll < 0.55:
                    v = v[:-1] + b', "value": 1e300}'  # value_out_of_range (the last value)
                elif roll < 0.6:
                    doc["ts"] = at + 3600.0  # future
                    v = json.dumps(doc).encode()
            new.append((p, v, at))
        out.append(new)
    return out


@pytest.mark.parametrize("bounds", BOUNDS, ids=lambda b: "-".join(f"{v}" for v in b.values()))
@pytest.mark.parametrize("seed", [4, 5])
def test_one_person_through_both_decoding_paths_duplicate_fields_and_escapes(
        bounds: dict[str, int], seed: int) -> None:
    """Adversarial review (issue 34): the person's events reach the table through the fast and
    the full decoding path alike (the same leaf, the same identity bytes), an identifier given
    twice is the last one's on both paths, an escaped spelling is the same person; removing
    every record of the person still changes exactly their bounded contribution, and the
    dead letters only in their own records."""
    s = _settings(**bounds)
    nasty = _home(0, "nasty")
    other = _home(0, "other0")
    log = _nastier(_log(seed, nasty), nasty, other, seed)
    with_p, dead_with, states = _run(s, log)
    without, dead_without, _ = _run(s, _log(seed, None))
    diff = {k: with_p.get(k, 0) - without.get(k, 0) for k in set(with_p) | set(without)}
    diff = {k: d for k, d in diff.items() if d}
    # the oracle: the person's records that no event-level check dead-letters
    eligible = [[(p, v, at) for p, v, at in seg
                 if b"1e300" not in v and json.loads(v)["ts"] < at + 30.0] for seg in log]
    assert diff == _expected_contribution(s, eligible, nasty, states[0].cap_u)
    mine = (nasty.encode(), nasty.encode().replace(b"n", b"\\u006e", 1))
    assert [x for x in dead_with if not any(m in x[2] for m in mine)] == dead_without
    reasons = {r for _, r, v in dead_with if any(m in v for m in mine)}
    assert {"future", "value_out_of_range", "wrong_partition"} <= reasons


def test_a_restore_between_writes_re_decides_exactly_and_refuses_a_changed_log() -> None:
    """The table written at one commit, not at the next: a restore from the second reads the
    table as of the first and re-decides the records in between (agents.ingest.user_replay) —
    to the very table of the run that did not stop. The same restore over records that differ
    from the ones counted (one value changed) is refused, as is a checkpoint whose flush point
    lies past it."""
    from agents.ingest.schedule import ScheduleMismatch
    from agents.ingest.user_replay import TableReplay

    s = _settings(user_max_events=2)
    people = [_home(0, f"p{i}") for i in range(6)]
    state = _state(s)
    assert state.users is not None
    state.users.changelog = True
    values = [_event(LEAVES[i % 3], ORIGIN + 1.0 + i * 0.01, people[i % 6]) for i in range(40)]
    recs = [Record(i, b"k", v, int((ORIGIN + 1.5) * 1000), 0) for i, v in enumerate(values)]
    state.process_batch(recs[:10])
    topic = list(state.user_changes())  # the table written here (offset 10) ...
    state.process_batch(recs[10:30])
    checkpoint = state.to_bytes()  # ... and not here (offset 30)
    want = sorted(state.users.bounder.export())

    def restored() -> IngestState:
        again = _state(s)
        assert again.users is not None
        again.users.changelog = True
        again.restore(checkpoint, seq=1)
        again.load_user_changes(topic)
        return again

    again = restored()
    assert again.users is not None and again.flush_point is not None
    assert again.flush_point.offset == 10 and again.offset == 30
    assert sorted(again.users.bounder.export()) != want  # the table as of offset 10
    replay = TableReplay(again, again.flush_point, [])
    replay.feed(recs[10:30])
    replay.finish(30)
    assert sorted(again.users.bounder.export()) == want
    # on from there, both decide alike
    state.process_batch(recs[30:])
    again.process_batch(recs[30:])
    assert sorted(again.users.bounder.export()) == sorted(state.users.bounder.export())
    assert again.buckets == state.buckets

    changed = list(recs[10:30])
    changed[5] = Record(15, b"k", values[15].replace(b'"ts": ', b'"value": 2.0, "ts": '),
                        changed[5].timestamp, 0)
    again = restored()
    assert again.flush_point is not None
    replay = TableReplay(again, again.flush_point, [])
    replay.feed(changed)
    with pytest.raises(ScheduleMismatch, match="no longer holds the records"):
        replay.finish(30)
    missing = restored()
    assert missing.flush_point is not None
    replay = TableReplay(missing, missing.flush_point, [])
    replay.feed(recs[10:25])  # records of the range lost
    with pytest.raises(ScheduleMismatch):
        replay.finish(30)
    from agents.ingest.user_flush import FlushPoint

    doc = replay._target.flush_point.to_doc()  # type: ignore[union-attr]
    assert FlushPoint.from_doc(doc, 30, 1).offset == 10
    for bad in (dict(doc, offset=31), dict(doc, next_tick=2), dict(doc, future=[9]),
                dict(doc, future=[12, 11]), dict(doc, digest="zz")):
        with pytest.raises(ValueError, match="flush point"):
            FlushPoint.from_doc(bad, 30, 1)
