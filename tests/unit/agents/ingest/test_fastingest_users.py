"""The compiled ingest path at user level (``privacy_unit = "user"``: the scanner reads the
identifier, checks its partition, hashes it and asks the compact ``UserTable`` in the same pass)
against the pure path over the library's ``Bounder``, which is authoritative: record by record
(batches of any size down to one record) the same decisions, dead letters (reasons, details,
offsets), metric counts (accepted, clamped, late, bounded), buckets, digest, checkpoint bytes
and changelog records, for the nastiest person we can build — thousands of events on every
stream in one tick, duplicates, late events, events across period boundaries, records on the
wrong partition, an identifier given twice or escaped, invalid identifiers of every kind —
with restarts from a checkpoint (and its changelog) in the middle."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from agents.config.settings import Settings
from agents.ingest import records as ingest_records
from agents.ingest.records import _NO_STOP, FAST_PATH_STATUS, Record
from agents.ingest.state import IngestState
from agents.ingest.users import table_status, user_bounds
from agents.kafka.partitioner import key_partition as kafka_partition
from stream_dp.user_level import Bounder
from tests.unit.agents.ingest.test_user_level import (
    BOUNDS,
    LEAVES,
    NOW,
    ORIGIN,
    ROUTER,
    L,
    _event,
    _home,
    _log,
    _nastier,
    _settings,
)

fast = pytest.importorskip("agents.ingest._fastingest", reason="the compiled fast path did not build")
pytestmark = pytest.mark.skipif(ingest_records._fastingest is None, reason=FAST_PATH_STATUS)

KEY = bytes(range(7, 39))


def _new(s: Settings, p: int, compiled: bool, changelog: bool) -> IngestState:
    state = IngestState(s, ROUTER, p, offset=0, key=KEY)
    state.clock = lambda: NOW
    state.use_fast_path = compiled
    assert state.users is not None
    state.users.changelog = changelog
    if not compiled:  # the authoritative side: the pure path over the library's Bounder
        state.users.compact = False
        state.users.bounder = Bounder(state.users.bounds)
    return state


def _sized(n: int, partition: int, fill: str = "y") -> bytes:
    """An identifier of ``n`` UTF-8 bytes on ``partition`` (of 2)."""
    for i in range(10_000):
        cand = (fill * n).encode()[: n - len(str(i))] + str(i).encode()
        if kafka_partition(cand, 2) == partition:
            return cand
    raise AssertionError("no identifier")


def _raw(ts: float, user: bytes) -> bytes:
    return b'{"key": "a/x", "ts": %r, "user": "%s"}' % (ts, user)


def _invalid(ts: float, nasty: str) -> list[bytes]:
    """Identifiers the scanner must leave to the pure path (its dead letters and texts)."""
    raw = _event("a/x", ts, nasty)
    return [
        b'{"key": "a/x", "ts": %r}' % ts,  # missing
        b'{"key": "a/x", "ts": %r, "user": null}' % ts,
        _event("a/x", ts, ""), _event("a/x", ts, "é" * 128 + "z"),  # empty, 257 bytes
        _event("a/x", ts, 7), _event("a/x", ts, {"id": nasty}), _event("a/x", ts, True),
        b'{"key": "a/x", "ts": %r, "user": "\\ud800"}' % ts,  # a lone surrogate
        b'{"key": "a/x", "ts": %r, "user": "\xed\xa0\x80"}' % ts,  # a surrogate in UTF-8
        b'{"key": "a/x", "ts": %r, "user": "\xc3"}' % ts,  # not UTF-8
        b'{"key": "a/x", "ts": %r, "user": "a\\u0000b"}' % ts,  # NUL, escaped
        raw.replace(nasty.encode(), nasty.encode() + b"\x01"),  # a control character, raw
        _event("a/x", ts, "x" * 256), _event("a/x", ts, "é" * 128),  # 256 bytes: valid
        _raw(ts, _sized(257, 0)), _raw(ts, _sized(256, 0)), _raw(ts, _sized(255, 0, "é")),
        _raw(ts, _sized(257, 0, "é")),  # raw UTF-8 (no escapes: the scanner reads them)
        b'{"user": "%s", "key": "a/y", "ts": %r, "user": "%s"}' % (
            nasty.encode(), ts, _home(1, "twice").encode()),  # twice: the last one's
    ]


def _nastiest(seed: int, nasty: str) -> list[list[tuple[int, bytes, float]]]:
    """:func:`_nastier`'s log plus, in tick 3, a flood of 3000 of the person's events over
    every stream (duplicates among them) and invalid identifiers sprinkled everywhere."""
    rng = random.Random(seed)
    log = _nastier(_log(seed, nasty), nasty, _home(0, "other0"), seed)
    start = ORIGIN + 2 * L
    flood = []
    for _ in range(3000):
        ts = start + rng.uniform(0.0, L - 0.01)
        v = _event(rng.choice(LEAVES), ts, nasty, value=rng.choice([1.0, 2.5, 0.5]))
        flood.append((0, v, ts + 0.1))
        if rng.random() < 0.1:
            flood.append((0, v, ts + 0.1))
    log[2] = log[2] + flood
    for tick, seg in enumerate(log, start=1):
        ts = ORIGIN + (tick - 1) * L + 1.0
        for v in _invalid(ts, nasty):
            seg.insert(rng.randrange(len(seg) + 1), (rng.randrange(2), v, ts + 0.1))
    return log


def _snap(state: IngestState) -> dict[str, Any]:
    out = state.out
    assert state.users is not None
    return {
        "offset": state.offset, "next_tick": state.next_tick, "digest": state.digest,
        "buckets": {t: dict(b) for t, b in state.buckets.items()},
        "dead": [(k, r.reason, r.detail, v, o) for k, r, v, o in out.dead_letters],
        "partials": [(p.tick, list(p.idx), list(p.counts)) for p in out.partials],
        "counters": (out.accepted, out.clamped, out.late, out.bounded, out.ticks_closed),
        "checkpoint": state.to_bytes(), "people": len(state.users.bounder),
    }


def _agree(s: Settings, log: list[list[tuple[int, bytes, float]]], seed: int,
           changelog: bool) -> dict[str, int]:
    """Both paths through ``log`` on both partitions, compared after every batch (random sizes,
    many of one record) and every commit; a restart from the last commit now and then. Returns
    totals of what was compared (so that the test can check it exercised something)."""
    rng = random.Random(seed)
    totals = {"bounded": 0, "accepted": 0, "dead": 0, "changes": 0, "restarts": 0}
    for p in (0, 1):
        recs: list[Record] = []
        closes: dict[int, int] = {}
        for tick, seg in enumerate(log, start=1):
            for q, v, at in seg:
                if q == p:
                    recs.append(Record(len(recs), b"k", v, int(at * 1000), 0))
            closes[len(recs)] = tick
        states = [_new(s, p, True, changelog), _new(s, p, False, changelog)]
        topics: list[list[tuple[bytes, bytes | None]]] = [[], []]
        committed: list[tuple[bytes, int]] = [(st_.to_bytes(), 0) for st_ in states]
        i = 0
        while i < len(recs):
            n = rng.choice([1, 1, 2, 5, 17, 200])
            end = min(len(recs), i + n)
            for k in sorted(c for c in closes if i < c <= end):  # a tick closes at its end
                end = k
                break
            for st_ in states:
                st_.process_batch(recs[i:end])
            i = end
            if i in closes:
                for st_ in states:
                    if closes[i] >= st_.next_tick:  # (after a restart it may be closed)
                        st_.schedule_close(closes[i], i, "clock", NOW)
                        st_.apply_due()
            a, b = (_snap(st_) for st_ in states)
            assert a == b, (p, i)
            if rng.random() < 0.3 or i in closes:  # a commit
                changes = [st_.user_changes() if changelog else [] for st_ in states]
                assert changes[0] == changes[1], (p, i)
                totals["changes"] += len(changes[0])
                for k, st_ in enumerate(states):
                    topics[k].extend(changes[k])
                    committed[k] = (st_.to_bytes(), len(topics[k]))
                    out = st_.out
                    if k == 0:
                        totals["bounded"] += out.bounded
                        totals["accepted"] += out.accepted
                        totals["dead"] += len(out.dead_letters)
                    out.clear()
                    out.accepted = out.clamped = out.late = out.bounded = 0
            elif rng.random() < 0.05:  # kill -9: back to the last commit, records again
                totals["restarts"] += 1
                fresh = []
                for k in range(len(states)):
                    again = _new(s, p, k == 0, changelog)
                    again.restore(committed[k][0], seq=1)
                    if changelog:
                        del topics[k][committed[k][1]:]
                        again.load_user_changes(list(topics[k]))
                    fresh.append(again)
                states = fresh
                i = states[0].offset
                assert states[1].offset == i
    return totals


@pytest.mark.parametrize("changelog", [False, True], ids=["checkpoint", "changelog"])
@pytest.mark.parametrize("bounds", [*BOUNDS, dict(user_max_events=4, user_period_ticks=1)],
                         ids=lambda b: "-".join(f"{v}" for v in b.values()))
@pytest.mark.parametrize("seed", [11, 12])
def test_compiled_and_pure_paths_agree_at_user_level(bounds: dict[str, int], changelog: bool,
                                                     seed: int) -> None:
    s = _settings(**bounds)
    totals = _agree(s, _nastiest(seed, _home(0, "nasty")), seed, changelog)
    assert totals["bounded"] > 1000 and totals["accepted"] > 30 and totals["dead"] > 50
    assert totals["changes"] > 0 or not changelog


def test_the_scanner_bounds_persons_in_the_same_pass() -> None:
    """The fast path is really taken at user level: plain records of valid people on their
    partition are all handled by the scanner (counted or bounded), none left to the pure path;
    a record the pure path must judge stops it."""
    s = _settings(user_max_events=2, user_period_ticks=4)
    state = _new(s, 0, True, changelog=True)
    scanner = state._fast_scanner()
    assert scanner is not None and state.users is not None
    people = [_home(0, f"p{i}") for i in range(50)]
    ts = ORIGIN + 1.0
    recs = [Record(i, b"k", _event(LEAVES[i % 3], ts, people[i % 50]), int((ts + 0.1) * 1000), 0)
            for i in range(400)]
    buckets: dict[int, dict[Any, int]] = {}
    table = state.users.bounder
    end, _digest, accepted, _clamped, bounded = scanner.scan(
        recs, 0, 1, _NO_STOP, math.inf, False, buckets, ROUTER.declared, None, table)
    assert (end, accepted, bounded) == (400, 100, 300)  # K = 2 of each person's 8
    assert len(table) == 50 and table.tracking  # changelog form: it lists whom it counted
    assert len(table.take_dirty()) == 50 and table.take_dirty() == []
    wrong = Record(400, b"k", _event("a/x", ts, _home(1, "q")), int((ts + 0.1) * 1000), 0)
    end, *_ = scanner.scan([*recs, wrong], 400, 1, _NO_STOP, math.inf, False, buckets,
                           ROUTER.declared, None, table)
    assert end == 400  # wrong_partition: the pure path says it


def test_event_level_parser_skips_a_user_member() -> None:
    """At event level the person's identifier is just another member, which the pure path
    ignores: the compiled parser skips it too (it once sent every such event down the pure
    path, half the event-level speed of the benchmark's log)."""
    raw = b'{"key": "a/x", "ts": 1, "user": "ann"}'
    assert fast.parse_event(raw) == ("a/x", 1.0, 1.0)
    assert json.loads(raw)["key"] == "a/x"


@pytest.mark.parametrize("field", ["u\x01", "id\t", "é" * 200, "x" * 256],
                         ids=["control", "tab", "400-bytes", "256-bytes"])
def test_a_user_field_the_compiled_parser_cannot_match_raw_leaves_it_to_the_pure_path(
        field: str) -> None:
    """``user_field`` is 1 to 256 *characters*: a name with a control character (raw in a
    record, Python's json refuses it: ``malformed_json``; the compiled parser matched its bytes
    and counted the event) or of more than 256 UTF-8 bytes (the compiled scanner refused to
    start: a traceback on the first batch) is decided by the pure path alone, alike."""
    s = _settings(user_field=field)
    fb = field.encode()
    ts = ORIGIN + 1.0
    user = _home(0, "ann").encode()
    values = [b'{"key": "a/x", "ts": %r, "%s": "%s"}' % (ts, fb, user),
              b'{"key": "a/x", "ts": %r, "%s": "%s"}' % (ts, json.dumps(field)[1:-1].encode(),
                                                          user)]
    recs = [Record(i, b"k", v, int((ts + 0.1) * 1000), 0) for i, v in enumerate(values)]
    snaps = []
    for compiled in (True, False):
        state = _new(s, 0, compiled, True)
        state.process_batch(recs)
        snaps.append(_snap(state))
    assert snaps[0] == snaps[1]
    # (the escaped spelling is always a valid record: one of the two counts)
    assert snaps[1]["counters"][0] >= 1
    compiled = table_status(user_bounds(s), field).startswith("the compiled scanner")
    assert compiled == (field == "x" * 256)
