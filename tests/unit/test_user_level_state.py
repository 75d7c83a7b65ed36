"""The bounder's saved state (:meth:`Bounder.export` / :meth:`Bounder.load`) and its pruning
(:meth:`Bounder.forget_before` with ``open_tick``): a bounder saved and loaded at any point, or
pruned of closed periods and of spacing that can no longer bind, decides every later event
exactly as one that kept everything (what the service's ingest checkpoint relies on)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from stream_dp.user_level import Bounder, UserBounds

bounds_st = st.builds(
    UserBounds, max_events=st.integers(1, 4), period_ticks=st.integers(0, 4),
    max_streams=st.integers(0, 3), max_events_per_stream=st.integers(0, 3),
    min_separation_ticks=st.integers(0, 3))
# (person, steps of the first open tick ≥ 0, leaf)
events_st = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.integers(0, 3)),
                     max_size=80)


@given(bounds_st, events_st, st.integers(1, 10))
@hsettings(max_examples=300, deadline=None)
def test_save_load_and_pruning_never_change_a_decision(bounds: UserBounds,
                                                       events: list[tuple[int, int, int]],
                                                       every: int) -> None:
    whole = Bounder(bounds)
    saved = Bounder(bounds)
    tick = 1
    for i, (person, step, leaf) in enumerate(events):
        if step:  # the ticks before the new one close: what the service prunes then
            tick += step
            saved.forget_before(bounds.period_of(tick), open_tick=tick)
        # an event of an open tick: the first open one or the next (never a closed one: the
        # service dead-letters those before the bound, tick_closed)
        at = tick + (leaf + i) % 2
        assert whole.admit(person, at, leaf) == saved.admit(person, at, leaf), i
        if i % every == 0:
            again = Bounder(bounds)
            if i % 2:
                again.load(saved.export())
            else:
                again.load_columns(saved.columns())
            assert again.export() == saved.export() and again.columns() == saved.columns()
            saved = again


def test_pruning_drops_people_whose_spacing_no_longer_binds() -> None:
    b = Bounder(UserBounds(max_events=5, period_ticks=2, min_separation_ticks=3))
    assert b.admit("ann", 1, 0) and b.admit("bob", 2, 0)
    b.forget_before(b.bounds.period_of(4), open_tick=4)  # ann: 1 + 3 <= 4; bob: 2 + 3 > 4
    assert [p for p, _, _ in b.export()] == ["bob"]
    b.forget_before(b.bounds.period_of(5), open_tick=5)
    assert len(b) == 0


def test_columns_that_do_not_fit_together_are_refused() -> None:
    b = Bounder(UserBounds(max_events=3, period_ticks=2, max_streams=2))
    assert b.admit("ann", 1, 0) and b.admit("ann", 3, 1) and b.admit("bob", 1, 0)
    cols = b.columns()
    assert cols["persons"] == ["ann", "bob"] and cols["periods"] == [2, 1]
    for name, change in (("periods", [2, 2]), ("leaves", [1, 1, 2]), ("leaf", [0, 1])):
        with pytest.raises(ValueError):
            Bounder(b.bounds).load_columns({**cols, name: change})


def test_load_refuses_counts_the_bounds_cannot_give() -> None:
    bounds = UserBounds(max_events=2, period_ticks=0, max_events_per_stream=1)
    for bad in ([("a", 1, [(0, 3, {0: 1, 1: 1, 2: 1})])],  # over K
                [("a", 1, [(0, 2, {0: 1})])],  # leaf counts that do not add up
                [("a", 1, []), ("a", 2, [])],  # a person twice
                [("a", -1, [])]):
        with pytest.raises(ValueError):
            Bounder(bounds).load(bad)  # type: ignore[arg-type]
