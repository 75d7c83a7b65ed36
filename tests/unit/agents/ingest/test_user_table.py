"""The compact per-person table (``agents.ingest._fastingest.UserTable``, 32 bytes a person)
against the library's :class:`~stream_dp.user_level.Bounder`, which is authoritative: decision
by decision, pruning by pruning, export by export, over many persons, every bound it takes (K,
the period, b; leaf bounds stay with the ``Bounder``), period boundaries and save/load at any
point — and the service's :class:`~agents.ingest.users.UserState` over either gives the same
changelog records and checkpoint bytes. Also: bytes per active person (the ≤ 64 B target of
issue #34)."""

from __future__ import annotations

import hashlib
import random
import tracemalloc
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.ingest import records as ingest_records
from agents.ingest.records import FAST_PATH_STATUS
from agents.ingest.users import UserState, person_table
from stream_dp.user_level import Bounder, UserBounds

fast = pytest.importorskip("agents.ingest._fastingest", reason="the compiled fast path did not build")
pytestmark = pytest.mark.skipif(ingest_records._fastingest is None, reason=FAST_PATH_STATUS)

U32 = (1 << 32) - 1
#: the largest tick the compact table holds (the top bit of its u32 marks a changed person)
TICK_MAX = (1 << 31) - 1


def _person(i: int) -> bytes:
    return hashlib.blake2b(str(i).encode(), digest_size=16).digest()


def _table(bounds: UserBounds) -> Any:
    return fast.UserTable(bounds.max_events, bounds.period_ticks, bounds.min_separation_ticks)


def _holds(bounder: Bounder, person: bytes, tick: int) -> bool:
    """Whether the compact table can hold ``person``'s state after an event at ``tick``: at
    most two open periods, ticks below 2^31 (it may answer ``None`` only otherwise)."""
    if not 1 <= tick <= TICK_MAX:
        return False
    got = bounder.person(person)
    if got is None:
        return True
    periods = {p for p, _, _ in got[1]}
    return len(periods | {bounder.bounds.period_of(tick)}) <= 2


def _run(bounds: UserBounds, seed: int, n_people: int, n_events: int, window: int,
         save_every: int) -> int:
    """Random traffic (a few heavy persons and many light ones, events on the open ticks of a
    window that moves, pruning as the service prunes) through both tables; every decision,
    every pruning and every export must agree. Returns the decisions compared."""
    rng = random.Random(seed)
    ref = Bounder(bounds)
    table = _table(bounds)
    people = [_person(seed * 100_003 + i) for i in range(n_people)]
    tick = 1
    compared = 0
    for i in range(n_events):
        if rng.random() < 0.05:  # ticks close: the service prunes what can no longer change
            tick += rng.randint(1, 3)
            open_period = bounds.period_of(tick)
            assert sorted(table.forget_before(open_period, open_tick=tick)) == sorted(
                ref.forget_before(open_period, open_tick=tick)), i  # type: ignore[type-var]
            assert len(table) == len(ref)
        heavy = rng.random() < 0.3
        person = people[rng.randrange(min(3, n_people) if heavy else n_people)]
        at = tick + rng.randrange(window)  # any open tick, late or early in the window
        got = table.admit(person, at, 0)
        if got is None:  # only for a state it cannot hold, and nothing changed
            assert not _holds(ref, person, at), i
            assert table.person(person) == ref.person(person)
            continue
        assert got is ref.admit(person, at, 0), (i, at)
        assert table.person(person) == ref.person(person), i
        compared += 1
        if save_every and i % save_every == 0:
            again = _table(bounds)
            again.load(table.export())
            table = again
    assert table.export() == sorted(ref.export())  # type: ignore[type-var]
    assert len(table) == len(ref)
    return compared


@pytest.mark.parametrize("k,t,b", [
    (1, 0, 0), (3, 0, 0), (2, 1, 0), (5, 4, 0), (10, 7, 0), (3, 5, 1), (4, 3, 2), (2, 10, 5),
    (65535, 3, 0), (1, 1, 3),
])
def test_decides_as_the_bounder_with_many_people(k: int, t: int, b: int) -> None:
    bounds = UserBounds(max_events=k, period_ticks=t, min_separation_ticks=b)
    compared = 0
    for seed in range(3):
        compared += _run(bounds, seed, n_people=2000, n_events=20_000, window=3,
                         save_every=997 if seed else 0)
    assert compared > 40_000  # the test compares decisions, not only refusals


@given(k=st.integers(1, 5), t=st.integers(0, 5), b=st.integers(0, 4), seed=st.integers(0, 10**6),
       window=st.integers(1, 4), people=st.integers(1, 40), save=st.integers(0, 30))
@hsettings(max_examples=300, deadline=None)
def test_decides_as_the_bounder_property(k: int, t: int, b: int, seed: int, window: int,
                                         people: int, save: int) -> None:
    _run(UserBounds(max_events=k, period_ticks=t, min_separation_ticks=b), seed, people, 400,
         window, save)


def test_a_table_that_grows_and_shrinks_keeps_every_person() -> None:
    bounds = UserBounds(max_events=2, period_ticks=10)
    table, ref = _table(bounds), Bounder(bounds)
    for i in range(50_000):  # grows from 16 slots through many rebuilds
        p = _person(i)
        assert table.admit(p, 1 + i % 10, 0) is ref.admit(p, 1 + i % 10, 0) is True
    assert len(table) == 50_000 and table.export() == sorted(ref.export())  # type: ignore[type-var]
    for i in range(0, 50_000, 2):  # half of them move on to period 1
        p = _person(i)
        assert table.admit(p, 11, 0) is ref.admit(p, 11, 0) is True
    assert sorted(table.forget_before(1, open_tick=11)) == sorted(
        ref.forget_before(1, open_tick=11))  # type: ignore[type-var]
    assert len(table) == 25_000 and table.nbytes < 25_000 * 64  # shrunk with them
    assert table.export() == sorted(ref.export())  # type: ignore[type-var]


def test_states_it_cannot_hold_change_nothing() -> None:
    bounds = UserBounds(max_events=3, period_ticks=1)
    table = _table(bounds)
    p = _person(1)
    assert table.admit(p, 1, 0) and table.admit(p, 2, 0)
    before = table.export()
    assert table.admit(p, 3, 0) is None  # a third open period
    assert table.admit(p, TICK_MAX + 1, 0) is None and table.admit(p, 0, 0) is None
    assert table.admit(_person(2), 1 << 70, 0) is None
    assert table.export() == before and len(table) == 1


def test_the_changed_mark_never_shows_and_each_person_is_listed_once() -> None:
    bounds = UserBounds(max_events=3, period_ticks=0)
    table, ref = _table(bounds), Bounder(bounds)
    table.tracking = True
    p, q = _person(1), _person(2)
    for person, tick in ((p, TICK_MAX - 1), (p, TICK_MAX), (q, 5), (p, TICK_MAX)):
        assert table.admit(person, tick, 0) is ref.admit(person, tick, 0)
    assert table.export() == sorted(ref.export())  # type: ignore[type-var]
    assert sorted(table.take_dirty()) == sorted([p, q]) and table.take_dirty() == []
    assert table.admit(q, 6, 0) and table.take_dirty() == [q]
    table.tracking = False
    assert table.admit(q, 7, 0) is True  # not listed: not tracking
    assert table.admit(q, 8, 0) is False and table.admit(p, 1, 0) is False  # K = 3 reached
    assert table.take_dirty() == []
    assert {row[0]: row[1] for row in table.export()} == {p: TICK_MAX, q: 7}


@pytest.mark.parametrize("people", [
    [(_person(1), 3, [(0, 1, {})]), (_person(1), 4, [(0, 1, {})])],  # a person twice
    [(_person(1), -1, [(0, 1, {})])],  # a negative last tick
    [(_person(1), 3, [(0, 4, {})])],  # more than K
    [(_person(1), 3, [(0, -1, {})])],
    [(_person(1), 3, [(0, 1, {}), (0, 2, {})])],  # one period twice
    [(_person(2), 3, [(0, 1, {})]), (_person(1), 3, [(2, 1, {}), (2, 1, {}), (3, 1, {})])],
])
def test_loading_what_the_bounds_cannot_give_is_refused_as_the_bounder_refuses(
        people: list[Any]) -> None:
    bounds = UserBounds(max_events=3, period_ticks=4)
    with pytest.raises(ValueError) as want:
        Bounder(bounds).load(people)
    with pytest.raises(ValueError) as got:
        _table(bounds).load(people)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("people", [
    [(_person(1), 3, [(0, 1, {}), (1, 1, {}), (2, 1, {})])],  # three periods
    [(_person(1), 3, [(0, 0, {})])],  # a count of 0 (load accepts it, admit never makes it)
    [(_person(1), 0, [])],  # nothing at all
    [(_person(1), TICK_MAX + 1, [(0, 1, {})])],
    [(_person(1), 3, [(U32 + 1, 1, {})])],
    [(_person(1), 3, [(0, 1, {7: 0})])],  # a per-leaf count
    [(b"short", 3, [(0, 1, {})])],
])
def test_states_the_table_cannot_hold_are_left_to_the_bounder(people: list[Any]) -> None:
    bounds = UserBounds(max_events=3, period_ticks=4)
    with pytest.raises(OverflowError):
        _table(bounds).load(people)
    Bounder(bounds).load(people)  # valid: UserState keeps a Bounder then


class _Settings:
    """What :class:`UserState` reads of the settings."""

    def __init__(self, **kw: int) -> None:
        self.user_field = "user"
        self.events_partitions = 1
        self.user_max_events = kw.get("k", 3)
        self.user_period_ticks = kw.get("t", 4)
        self.user_max_streams = kw.get("l", 0)
        self.user_max_events_per_stream = 0
        self.user_min_separation_ticks = kw.get("b", 0)


def _states(changelog: bool, **kw: int) -> tuple[UserState, UserState]:
    compact = UserState(_Settings(**kw), 0, None)
    ref = UserState(_Settings(**kw), 0, None)
    ref.bounder = Bounder(ref.bounds)
    compact.changelog = ref.changelog = changelog
    return compact, ref


def test_leaf_bounds_stay_with_the_bounder() -> None:
    assert type(person_table(UserBounds(max_events=3, period_ticks=4, max_streams=2))) is Bounder
    assert type(person_table(UserBounds(max_events=3, period_ticks=4,
                                        max_events_per_stream=2))) is Bounder
    assert type(person_table(UserBounds(max_events=1 << 16, period_ticks=4))) is Bounder
    assert type(person_table(UserBounds(max_events=3, period_ticks=4))) is fast.UserTable


@pytest.mark.parametrize("kw", [{}, {"b": 2}, {"t": 1}, {"t": 0, "k": 5}])
def test_user_state_writes_the_same_changelog_and_checkpoint_over_either_table(
        kw: dict[str, int]) -> None:
    rng = random.Random(7)
    for changelog in (True, False):
        compact, ref = _states(changelog, **kw)
        assert type(compact.bounder) is fast.UserTable
        log: list[tuple[bytes, bytes | None]] = []
        tick = 1
        for i in range(6000):
            if rng.random() < 0.02:
                tick += rng.randint(1, 2)
                compact.closed_before(tick)
                ref.closed_before(tick)
            obj = {"user": f"p{rng.randrange(300)}"}
            at = tick + rng.randrange(3)
            assert compact.decide_obj(obj, at, 0) == ref.decide_obj(obj, at, 0), i
            if i % 500 == 0:
                changes = compact.take_changes()
                assert changes == ref.take_changes()
                log += changes
                assert compact.to_doc() == ref.to_doc()
        changes = compact.take_changes()
        assert changes == ref.take_changes()
        log += changes
        assert compact.to_doc() == ref.to_doc()
        # restored from the checkpoint (and the changelog): the same table, the same bytes
        again, _ = _states(changelog, **kw)
        again.restore(compact.to_doc())
        if changelog:
            again.load_changes(log)
        assert sorted(again.bounder.export()) == sorted(ref.bounder.export())  # type: ignore[type-var]
        assert again.to_doc() == ref.to_doc()
        if kw.get("t") == 1:  # three open periods at once: moved to the Bounder, still equal
            assert type(compact.bounder) is Bounder
        else:
            assert type(compact.bounder) is fast.UserTable


@pytest.mark.parametrize("n", [200_000])
def test_an_active_person_costs_at_most_64_bytes(n: int) -> None:
    """tracemalloc sees the table's slots (PyMem_RawCalloc): ≤ 64 B per active person at any
    fill (a dict Bounder holds ~570)."""
    people = [_person(i) for i in range(n)]
    bounds = UserBounds(max_events=10, period_ticks=1440)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        table = person_table(bounds)
        for i, p in enumerate(people):
            table.admit(p, 1 + i % 1440, 0)
            if i in (1000, n // 3, n // 2):
                assert tracemalloc.get_traced_memory()[0] - before <= 64 * (i + 1)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(table) == n and used <= 64 * n, used / n
