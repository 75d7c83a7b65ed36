"""Contribution bounding in log order (:class:`Bounder`): which of a person's events count.

The rule (DESIGN.md §2.8, docs/design/user-level.md §1): records arrive in log order; an event
of person ``u`` at tick ``t`` on leaf ``s`` is **counted** iff, among ``u``'s events counted
before it in the same period, fewer than K are counted, ``s`` is already one of ``u``'s counted
leaves or fewer than L leaves are (L > 0), fewer than k are counted on ``s``, and (b > 0) ``t``
is at least ``b`` after the largest tick counted for ``u`` so far (in any period). Nothing but
``u``'s own earlier events is consulted, so removing every event of one person changes no
other person's decisions — the property the tests check by brute force.

The caller decides eligibility first (a record that is dead-lettered never reaches the bounder
and never consumes a budget). Persons are opaque hashable keys: the service passes a keyed hash
of the identifier, never the identifier.

State per person: one small record per open period plus the largest counted tick. Periods
whose ticks are all closed are dropped with :meth:`Bounder.forget_before` (O(persons) at a
period boundary, not per tick; an event of a forgotten period can no longer arrive because its
ticks are closed).

>>> from stream_dp.user_level.bounds import UserBounds
>>> b = Bounder(UserBounds(max_events=2, period_ticks=10))
>>> [b.admit("ann", tick, leaf=0) for tick in (1, 1, 2, 11)]
[True, True, False, True]
>>> b.admit("bob", 2, leaf=0)
True
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_dp.user_level.bounds import UserBounds

__all__ = ["Bounder", "columns_people", "export_columns", "keep_mask"]


@dataclass
class _Period:
    """What one person has counted in one period."""

    count: int = 0
    #: counted events per leaf, only kept when a per-leaf or distinct-leaf bound applies
    per_leaf: dict[int, int] = field(default_factory=dict)


@dataclass
class _Person:
    periods: dict[int, _Period] = field(default_factory=dict)
    #: the largest tick counted for this person (any period); 0 = none yet
    last_tick: int = 0


class Bounder:
    """Log-order contribution bounding for many persons under one :class:`UserBounds`."""

    def __init__(self, bounds: UserBounds) -> None:
        self.bounds = bounds
        self._people: dict[Hashable, _Person] = {}
        self._track_leaves = bool(bounds.max_streams) or bounds.per_leaf_events < bounds.max_events

    def __len__(self) -> int:
        """Persons with state (an event counted in a period not yet forgotten)."""
        return len(self._people)

    def admit(self, person: Hashable, tick: int, leaf: int) -> bool:
        """Whether ``person``'s next event in log order, at ``tick`` (≥ 1) on ``leaf``, counts;
        records it if so. O(1)."""
        b = self.bounds
        state = self._people.get(person)
        if state is None:
            state = self._people[person] = _Person()
        sep = b.min_separation_ticks
        if sep and state.last_tick and tick < state.last_tick + sep:
            return False
        period = b.period_of(tick)
        slot = state.periods.get(period)
        if slot is None:
            slot = state.periods[period] = _Period()
        if slot.count >= b.max_events:
            return False
        if self._track_leaves:
            on_leaf = slot.per_leaf.get(leaf)
            if on_leaf is None:
                if b.max_streams and len(slot.per_leaf) >= b.max_streams:
                    return False
                on_leaf = 0
            if on_leaf >= b.per_leaf_events:
                return False
            slot.per_leaf[leaf] = on_leaf + 1
        slot.count += 1
        if tick > state.last_tick:
            state.last_tick = tick
        return True

    def forget_before(self, period: int, open_tick: int = 0) -> list[Hashable]:
        """Drop every person's state of periods ``< period`` (all their ticks closed); a person
        left with no open period and no spacing to keep is dropped whole. ``open_tick`` (≥ 1:
        no event of an earlier tick can arrive any more) also drops a person whose last counted
        tick is ``b`` or more before it: their spacing can no longer refuse anything. Returns
        the persons whose state changed (dropped whole or in part)."""
        sep = self.bounds.min_separation_ticks
        gone = []
        changed = []
        for person, state in self._people.items():
            old = [p for p in state.periods if p < period]
            for p in old:
                del state.periods[p]
            if not state.periods and (not sep or (
                    open_tick and state.last_tick + sep <= open_tick)):
                gone.append(person)
                changed.append(person)
            elif old:
                changed.append(person)
        for person in gone:
            del self._people[person]
        return changed

    def person(self, person: Hashable) -> tuple[int, list[tuple[int, int, dict[Any, int]]]] | None:
        """One person's state as in :meth:`export` (``(last tick, periods)``), or ``None``."""
        state = self._people.get(person)
        if state is None:
            return None
        return state.last_tick, [(p, slot.count, dict(slot.per_leaf))
                                 for p, slot in state.periods.items()]

    def export(self) -> list[tuple[Hashable, int, list[tuple[int, int, dict[Any, int]]]]]:
        """Every person's state, to be saved: ``(person, last counted tick, [(period, count,
        {leaf: count}), ...])`` (the per-leaf counts empty unless a per-leaf or distinct-leaf
        bound applies). :meth:`load` of it into a new bounder decides every later event
        exactly as this one would."""
        return [(person, state.last_tick,
                 [(p, slot.count, dict(slot.per_leaf)) for p, slot in state.periods.items()])
                for person, state in self._people.items()]

    def columns(self) -> dict[str, list[Any]]:
        """:meth:`export` as flat columns (few objects: cheap to save at 10^6 persons):
        ``persons``, ``last_tick`` (one each), ``periods`` (how many each), then per period
        ``period``, ``count``, ``leaves`` (how many per-leaf counts), then per leaf ``leaf``,
        ``leaf_count``. :meth:`load_columns` reads it back."""
        return export_columns(self.export())

    def load_columns(self, cols: Mapping[str, Sequence[Any]]) -> None:
        """Add the persons of :meth:`columns` (``ValueError`` for columns that do not fit
        together or counts the bounds cannot have produced)."""
        self.load(columns_people(cols))

    def load(self, people: Sequence[tuple[Hashable, int, Sequence[tuple[int, int, dict[Any, int]]]]]
             ) -> None:
        """Add the persons of :meth:`export` (``ValueError`` for counts the bounds cannot
        have produced)."""
        b = self.bounds
        for person, last_tick, periods in people:
            if person in self._people or last_tick < 0:
                raise ValueError("a person twice, or a negative last tick")
            state = self._people[person] = _Person(last_tick=last_tick)
            for p, count, per_leaf in periods:
                if not 0 <= count <= b.max_events or p in state.periods or sum(
                        per_leaf.values()) not in ((count,) if self._track_leaves else (0,)):
                    raise ValueError(f"a period's counts ({count}) the bounds cannot give")
                state.periods[p] = _Period(count=count, per_leaf=dict(per_leaf))


def export_columns(people: Iterable[tuple[Hashable, int, Sequence[tuple[int, int, Mapping[Any, int]]]]]
                   ) -> dict[str, list[Any]]:
    """:meth:`Bounder.columns` of persons listed as :meth:`Bounder.export` lists them."""
    cols: dict[str, list[Any]] = {k: [] for k in (
        "persons", "last_tick", "periods", "period", "count", "leaves", "leaf", "leaf_count")}
    persons, last, n_periods = cols["persons"], cols["last_tick"], cols["periods"]
    period, count, n_leaves = cols["period"], cols["count"], cols["leaves"]
    leaf, leaf_count = cols["leaf"], cols["leaf_count"]
    for person, last_tick, periods in people:
        persons.append(person)
        last.append(last_tick)
        n_periods.append(len(periods))
        for p, c, per_leaf in periods:
            period.append(p)
            count.append(c)
            n_leaves.append(len(per_leaf))
            if per_leaf:
                leaf.extend(per_leaf)
                leaf_count.extend(per_leaf.values())
    return cols


def columns_people(cols: Mapping[str, Sequence[Any]]
                   ) -> list[tuple[Any, Any, list[tuple[Any, Any, dict[Any, Any]]]]]:
    """The persons of :meth:`Bounder.columns` as :meth:`Bounder.export` lists them
    (``ValueError`` for columns that do not fit together; the counts are checked by
    :meth:`Bounder.load`)."""
    people = []
    it_p = iter(zip(cols["period"], cols["count"], cols["leaves"], strict=True))
    it_l = iter(zip(cols["leaf"], cols["leaf_count"], strict=True))
    try:
        for person, last_tick, n in zip(cols["persons"], cols["last_tick"], cols["periods"],
                                        strict=True):
            periods = []
            for _ in range(n):
                p, c, n_leaf = next(it_p)
                per_leaf = {}
                for _ in range(n_leaf):
                    leaf, n_on_leaf = next(it_l)
                    per_leaf[leaf] = n_on_leaf
                periods.append((p, c, per_leaf))
            people.append((person, last_tick, periods))
    except StopIteration:
        raise ValueError("columns that do not fit together") from None
    if next(it_p, None) is not None or next(it_l, None) is not None:
        raise ValueError("columns that do not fit together")
    return people


def keep_mask(events: list[tuple[Hashable, int, int]], bounds: UserBounds) -> list[bool]:
    """For ``(person, tick, leaf)`` events in log order: which ones count (the batch form)."""
    bounder = Bounder(bounds)
    return [bounder.admit(person, tick, leaf) for person, tick, leaf in events]
