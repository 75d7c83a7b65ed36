"""Adversarial review of user-level privacy (issue #34) by a reviewer who had not seen it: the
compiled ingest path's per-person table and its changelog against independent oracles.

* the changelog written by :meth:`UserState.take_changes` (compact table, its dirty list, the
  move to the ``Bounder`` on a state it cannot hold, period closes) replayed as a compacted
  topic (last record per person, a tombstone deletes) is the live table after every commit,
  and the kept digest is the whole-table sum of :class:`TableDigest` over what was written;
* one person, written in every JSON spelling the two parsers share (escapes, whitespace, an
  escaped field name, the field twice), gets one budget on the compiled and the pure path,
  against a model written here from the rule (stdlib ``json``, UTF-8 bytes, first K per
  period in log order).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from agents.ingest import records as ingest_records
from agents.ingest.records import FAST_PATH_STATUS
from agents.ingest.user_digest import TableDigest, table_digest_key
from agents.ingest.users import UserState, record_bytes
from stream_dp.user_level import Bounder
from tests.unit.agents.ingest.test_user_level import KEY, _settings

fast = pytest.importorskip("agents.ingest._fastingest", reason="the compiled fast path did not build")
pytestmark = pytest.mark.skipif(ingest_records._fastingest is None, reason=FAST_PATH_STATUS)

TICK_MAX = (1 << 31) - 1


def _state(**kw: Any) -> UserState:
    st = UserState(_settings(**kw), 0, KEY)
    st.changelog = True
    return st


def _replay(topic: dict[bytes, bytes], changes: list[tuple[bytes, bytes | None]]) -> None:
    for person, value in changes:
        if value is None:
            topic.pop(person, None)
        else:
            topic[person] = value


def _live(st: UserState) -> dict[bytes, bytes]:
    return {p: record_bytes((lt, per)) for p, lt, per in st.bounder.export()}


def _whole(topic: dict[bytes, bytes]) -> int:
    oracle = TableDigest(table_digest_key(KEY), record_bytes)
    total = 0
    for person, value in topic.items():
        total += oracle.term(person, value)
    return total % (1 << 256)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kw", [
    dict(user_max_events=3, user_period_ticks=2),
    dict(user_max_events=2, user_period_ticks=1, user_min_separation_ticks=1),
    dict(user_max_events=4, user_period_ticks=3, user_min_separation_ticks=2),
])
def test_the_changelog_is_the_table_across_every_move(seed: int, kw: dict[str, int]) -> None:
    """Random traffic on a compact table in changelog form, with commits at random points
    (also in the middle of a period, with persons counted and not yet taken), period closes,
    and a move to the ``Bounder`` forced by one person's tick past 2^31 − 1 or a third open
    period at a random point: after every commit the replayed changelog is the live table
    and the digest is the whole sum of the records written."""
    rng = random.Random(seed)
    st = _state(**kw)
    assert type(st.bounder) is fast.UserTable
    topic: dict[bytes, bytes] = {}
    tick = 1
    move_at = rng.randrange(200, 1500)
    moved = False
    for i in range(2500):
        if rng.random() < 0.03:
            tick += rng.randint(1, 2)
            st.closed_before(tick)
        if i == move_at:  # one person forces the move (a far-future tick, or a third period)
            far = TICK_MAX + 1 if seed % 2 else tick + 2 * max(kw["user_period_ticks"], 1) * 3
            for at in (tick, tick + kw["user_period_ticks"] + 2, far):
                st.decide_obj({"user": "mover"}, at, 0)
            moved = type(st.bounder) is Bounder
        who = f"p{rng.randrange(60)}"
        st.decide_obj({"user": who}, tick + rng.randrange(3), 0)
        if rng.random() < 0.02:
            changes = st.take_changes()
            _replay(topic, changes)
            assert topic == _live(st), i
            assert st.digest.total == _whole(topic), i
    _replay(topic, st.take_changes())
    assert topic == _live(st)
    assert st.digest.total == _whole(topic)
    assert moved


def _identity_model(values: list[bytes], k: int, field: str = "user") -> dict[bytes, int]:
    """Counted events per identifier under the rule (no period change in the test: one tick):
    the stdlib's reading of the JSON (the last member of a name wins), the identifier's UTF-8
    bytes, the first K in log order."""
    seen: dict[bytes, int] = {}
    for v in values:
        ident = json.loads(v.decode("utf-8")).get(field).encode("utf-8")
        seen[ident] = min(k, seen.get(ident, 0) + 1)
    return seen


def _spellings(ident: str, other: str, ts: float) -> list[bytes]:
    """One event of ``ident`` in every spelling the JSON grammar allows for it (and two with
    the field given twice: the last one names the person)."""
    esc = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else c for c in ident)
    raw = json.dumps(ident, ensure_ascii=False)[1:-1]
    asc = json.dumps(ident)[1:-1]  # \uXXXX escapes, surrogate pairs for astral characters
    t = repr(ts)
    return [s.encode("utf-8") for s in (
        f'{{"key": "a/x", "ts": {t}, "user": "{raw}"}}',
        f'{{"key":"a/x","ts":{t},"user":"{raw}"}}',
        f' \n{{ "user" :\t"{raw}" , "ts" : {t} ,"key" : "a/x" }}\r\n',
        f'{{"key": "a/x", "ts": {t}, "user": "{asc}"}}',
        f'{{"key": "a/x", "ts": {t}, "user": "{esc}"}}',
        f'{{"key": "a/x", "ts": {t}, "\\u0075ser": "{raw}"}}',
        f'{{"key": "a/x", "ts": {t}, "us\\u0065r": "{raw}", "value": 1}}',
        f'{{"key": "a/x", "ts": {t}, "user": "{other}", "user": "{raw}"}}',
        f'{{"user": "{raw}", "key": "a/x", "ts": {t}, "user": "{other}"}}',
        f'{{"key": "a\\/x", "ts": {t}, "user": "{raw}"}}',
    )]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("base", ["ann", "é-\u0301e", "😀x", "a/b\\c\"d"])
def test_one_person_in_every_spelling_has_one_budget(compiled: bool, base: str) -> None:
    """Every spelling of one identifier (raw UTF-8, ``\\u`` escapes, surrogate pairs, an
    escaped field name, whitespace, the field twice) counts against one budget of K, on the
    compiled and on the pure path, exactly as the model from the rule says; a person named
    only as the first of two fields is not charged."""
    from agents.ingest.records import Record
    from agents.ingest.state import IngestState
    from tests.unit.agents.ingest.test_user_level import NOW, ORIGIN, ROUTER, _home

    k = 4
    s = _settings(user_max_events=k, user_period_ticks=0)
    ident = _home(0, base)
    other = _home(0, "bob")
    ts = ORIGIN + 1.0
    values = _spellings(ident, other, ts) * 3
    random.Random(5).shuffle(values)
    state = IngestState(s, ROUTER, 0, offset=0, key=KEY)
    state.clock = lambda: NOW
    state.use_fast_path = compiled
    assert state.users is not None
    if not compiled:
        state.users.compact = False
        state.users.bounder = Bounder(state.users.bounds)
    state.process_batch([Record(i, ident.encode(), v, int((ts + 0.1) * 1000), 0)
                         for i, v in enumerate(values)])
    want = _identity_model(values, k)
    assert set(want) == {ident.encode(), other.encode()}
    assert [r.reason for _, r, _, _ in state.out.dead_letters] == []
    units = sum(sum(b.values()) for b in state.buckets.values())
    assert want[ident.encode()] == k  # 27 events of one person in 9 spellings: K count
    assert units // state.cap_u == sum(want.values())
    assert state.out.bounded == len(values) - sum(want.values())
    assert len(state.users.bounder) == 2


def _run_log(values: list[tuple[bytes, float]], compiled: bool) -> Any:
    from agents.ingest.records import Record
    from agents.ingest.state import IngestState
    from tests.unit.agents.ingest.test_user_level import NOW, ROUTER

    s = _settings(user_max_events=3, user_period_ticks=1)
    state = IngestState(s, ROUTER, 0, offset=0, key=KEY)
    state.clock = lambda: NOW
    state.use_fast_path = compiled
    state.users.changelog = True  # type: ignore[union-attr]
    for lo in range(0, len(values), 37):  # batches of 37: the move lands inside one
        state.process_batch([Record(state.offset + i, b"k", v, int(at * 1000), 0)
                             for i, (v, at) in enumerate(values[lo:lo + 37])])
    return state


@pytest.mark.parametrize("seed", range(4))
def test_a_person_who_forces_the_move_to_the_bounder_changes_nothing_else(seed: int) -> None:
    """A person whose events open a third period (periods of one tick, events for the next
    ticks within the future skew) moves the partition's table to the ``Bounder`` and every
    later record to the pure path. Against the same log without that person (which stays on
    the compiled table): every other person's decisions, dead letters and counts are the
    same, and the buckets differ by exactly that person's first K per period, per the rule
    (an oracle written here)."""
    from tests.unit.agents.ingest.test_user_level import LEAVES, ORIGIN, L, _event, _home

    rng = random.Random(seed)
    others = [_home(0, f"o{seed}-{i}") for i in range(25)] + [_home(1, f"w{seed}")]
    mover = _home(0, f"mover{seed}")
    log: list[tuple[str, bytes, float, int, str]] = []
    for _ in range(400):
        who = rng.choice(others + [mover] * 5)
        tick = rng.randint(1, 2) if who != mover else rng.randint(1, 4)
        # every record arrives early in tick 1: later ticks are its future, up to the skew
        # of 30 s (tick 4 only in its first 0.4 s)
        ts = ORIGIN + (tick - 1) * L + rng.uniform(0.0, 0.4 if tick == 4 else L - 0.01)
        at = ORIGIN + 0.5
        leaf = rng.choice(LEAVES)
        log.append((who, _event(leaf, ts, who), at, tick, leaf))
    with_mover = [(v, at) for _, v, at, _, _ in log]
    without = [(v, at) for who, v, at, _, _ in log if who != mover]
    for compiled in (True, False):
        a, b = _run_log(with_mover, compiled), _run_log(without, compiled)
        if compiled:
            assert type(a.users.bounder) is Bounder  # the mover moved it
            assert type(b.users.bounder) is fast.UserTable
        # the mover's counted events by the rule: first 3 per period (= tick), in log order
        kept: dict[tuple[int, str], int] = {}
        per_period: dict[int, int] = {}
        for who, _, _, tick, leaf in log:
            if who == mover and per_period.get(tick, 0) < 3:
                per_period[tick] = per_period.get(tick, 0) + 1
                kept[(tick, leaf)] = kept.get((tick, leaf), 0) + 1
        leaf_index = _leaf_index()
        diff: dict[tuple[int, int], int] = {}
        for tick in set(a.buckets) | set(b.buckets):
            ba, bb = a.buckets.get(tick, {}), b.buckets.get(tick, {})
            for leaf in set(ba) | set(bb):
                d = ba.get(leaf, 0) - bb.get(leaf, 0)
                if d:
                    diff[(tick, leaf)] = d // a.cap_u
        assert diff == {(t, leaf_index[lf]): n for (t, lf), n in kept.items()}
        dead_a = [(r.reason, r.detail, v) for _, r, v, _ in a.out.dead_letters]
        dead_b = [(r.reason, r.detail, v) for _, r, v, _ in b.out.dead_letters]
        assert dead_a == dead_b  # the mover's records are all on their partition and valid
        assert not any(r == "future" for r, _, _ in dead_a)
        assert a.out.bounded - b.out.bounded == sum(1 for w, *_ in log if w == mover) - sum(
            kept.values())


def _leaf_index() -> dict[str, int]:  # the test domain: leaf key -> bucket key
    from tests.unit.agents.ingest.test_user_level import ROUTER

    return dict(ROUTER.declared)
