"""What a bound of K events per person per period would drop, per person (the operator's view).

For simulated events with people (:mod:`simulators.people`): the worker's user-level rule with
only K and the period (docs/design/user-level.md §1) counts, for each person and period, the
person's first K events in log order and drops the rest. :func:`bound_drops` replays that rule
over a log so the demo (or an operator sizing K) can say how many events, and whose, a bound
would drop before any worker runs. Plain Python, no numpy and no library: the library's
``stream_dp.user_level.Bounder`` is the authoritative rule, and the tests hold this one to it.

Every event is taken as eligible (a simulated log has no late or malformed events); a worker
drops only among the events that pass its event-level checks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from simulators.logfile import Event

__all__ = ["BoundDrops", "bound_drops"]


@dataclass
class BoundDrops:
    """Per person: events kept and dropped by the bound (identifiers as in the events)."""

    max_events: int
    period_ticks: int
    kept: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)

    @property
    def events(self) -> int:
        """Events seen."""
        return sum(self.kept.values()) + sum(self.dropped.values())

    @property
    def total_dropped(self) -> int:
        """Events the bound drops."""
        return sum(self.dropped.values())

    @property
    def people(self) -> int:
        """People seen (every person keeps at least one event)."""
        return len(self.kept)

    @property
    def people_bounded(self) -> int:
        """People who lose at least one event."""
        return len(self.dropped)

    def summary(self, top: int = 3) -> str:
        """One line for an operator, e.g. ``K = 10 per 1440 ticks drops 41 230 of 100 000
        events (41.2 %) of 312 of 9 866 people; most: u1 10 107, u2 5 052, u3 3 380``."""
        period = "the epoch" if self.period_ticks == 0 else f"{self.period_ticks} ticks"
        share = 100.0 * self.total_dropped / self.events if self.events else 0.0
        line = (f"K = {self.max_events} per {period} drops {self.total_dropped:,} of "
                f"{self.events:,} events ({share:.1f} %) of {self.people_bounded:,} of "
                f"{self.people:,} people")
        most = self.dropped.most_common(top)
        if most:
            line += "; most: " + ", ".join(f"{p} {n:,}" for p, n in most)
        return line


def bound_drops(events: Iterable[Event], *, max_events: int, period_ticks: int, origin: float,
                tick_seconds: float) -> BoundDrops:
    """Apply "at most ``max_events`` counted events per person per period" to ``events`` in
    their order (log order).

    Ticks as the worker numbers them: an event at time ``ts`` (seconds) is in tick
    ``⌊(ts − origin) / tick_seconds⌋ + 1``; period ``P`` holds ticks ``P·T + 1 … (P+1)·T``
    (``T = period_ticks``; 0 = one period, the whole epoch). Every event must carry a person
    (``ValueError`` otherwise, naming the event's position).
    """
    if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
        raise ValueError(f"max_events must be an integer >= 1, got {max_events!r}")
    if isinstance(period_ticks, bool) or not isinstance(period_ticks, int) or period_ticks < 0:
        raise ValueError(f"period_ticks must be an integer >= 0 (0 = the epoch), got "
                         f"{period_ticks!r}")
    tick_ms = round(tick_seconds * 1000)
    if tick_ms < 1:
        raise ValueError(f"tick_seconds must be at least 0.001, got {tick_seconds}")
    origin_ms = round(origin * 1000)
    out = BoundDrops(max_events, period_ticks)
    counted: dict[tuple[str, int], int] = {}
    for i, event in enumerate(events, start=1):
        if event.user is None:
            raise ValueError(f"event {i} has no person: simulate with --people N")
        ms = round(event.ts * 1000)
        if ms < origin_ms:
            raise ValueError(f"event {i} at {event.ts} is before the origin {origin}")
        tick0 = (ms - origin_ms) // tick_ms  # = tick − 1
        slot = (event.user, tick0 // period_ticks if period_ticks else 0)
        n = counted.get(slot, 0)
        if n < max_events:
            counted[slot] = n + 1
            out.kept[event.user] += 1
        else:
            out.dropped[event.user] += 1
    return out
