"""The declared contribution bounds of one person (:class:`UserBounds`), per public period.

A period is an aligned block of ticks: period ``P`` holds ticks ``P·T + 1 … (P+1)·T`` for
``period_ticks = T`` (ticks are numbered from 1, as everywhere in the service), or every tick
when ``T = 0`` (one period: the whole epoch). Within one period, a person's counted events are
bounded by:

* ``max_events`` (K): events counted per person (≥ 1);
* ``max_streams`` (L): distinct leaves (released streams an event is keyed to) per person
  (``0``: no bound beyond K);
* ``max_events_per_stream`` (k): events counted per person and leaf (``0``: K);
* ``min_separation_ticks`` (b): a counted event's tick is at least ``b`` after every tick
  counted before it for the same person (``0``: several events may count in one tick).

The bounds are public (part of the deployment's identity, like every setting that decides what a
tick contains); validation rejects booleans, non-integers and negative values.

>>> b = UserBounds(max_events=10, period_ticks=1440, max_streams=3)
>>> b.per_leaf_events, b.per_node_events(leaves_below=2), b.per_node_events(leaves_below=10**6)
(10, 10, 10)
>>> UserBounds(max_events=10, period_ticks=0, max_streams=2, max_events_per_stream=3).per_node_events(
...     leaves_below=5)
6
>>> b.period_of(1), b.period_of(1440), b.period_of(1441)
(0, 0, 1)
>>> UserBounds(max_events=0, period_ticks=60)
Traceback (most recent call last):
...
ValueError: max_events must be an integer >= 1, got 0
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UserBounds"]

#: the largest value any bound may take (a tick count or an event count that fits a u32)
_MAX = (1 << 32) - 1


def _check(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= _MAX:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class UserBounds:
    """One person's contribution bounds per period (all counts in events, periods in ticks)."""

    max_events: int
    period_ticks: int
    max_streams: int = 0
    max_events_per_stream: int = 0
    min_separation_ticks: int = 0

    def __post_init__(self) -> None:
        _check("max_events", self.max_events, 1)
        _check("period_ticks", self.period_ticks, 0)
        _check("max_streams", self.max_streams, 0)
        _check("max_events_per_stream", self.max_events_per_stream, 0)
        _check("min_separation_ticks", self.min_separation_ticks, 0)

    @property
    def per_leaf_events(self) -> int:
        """Events one person can have counted on one leaf in one period: ``min(K, k)``."""
        k = self.max_events_per_stream or self.max_events
        return min(self.max_events, k)

    def per_node_events(self, leaves_below: int) -> int:
        """Events one person can have counted in one period on a node that ``leaves_below``
        leaves feed (1 for a leaf): ``min(K, min(L, leaves)·min(K, k))``."""
        if isinstance(leaves_below, bool) or not isinstance(leaves_below, int) or leaves_below < 1:
            raise ValueError(f"leaves_below must be an integer >= 1, got {leaves_below!r}")
        reachable = min(self.max_streams, leaves_below) if self.max_streams else leaves_below
        return min(self.max_events, reachable * self.per_leaf_events)

    def period_of(self, tick: int) -> int:
        """The period of ``tick`` (≥ 1): ``(tick − 1) // T``, or 0 when ``T = 0``."""
        if self.period_ticks == 0:
            return 0
        return (tick - 1) // self.period_ticks
