"""User-level worker settings for a simulation with people (``stream-dp simulate --people N
--settings-out FILE``; issue #34).

The file ``--settings-out`` writes then says ``privacy_unit = "user"`` with the person's field,
a period and a bound K, so that ``stream-dp worker`` runs the simulated log at user level with
no hand edits. K is **suggested from the simulated distribution**: the
:data:`QUANTILE` quantile (nearest rank) of the number of events one person has in one period,
over every (person, period) pair with at least one event — most people keep all their events,
the heaviest lose the excess. That is fine for synthetic data; on real data a K read off the
data is itself a release about the people in it: choose it from public knowledge (or a DP
quantile) instead (docs/guide.md, "People").

Plain Python (no library, no Kafka): ticks numbered as the worker numbers them, from integer
milliseconds like :func:`simulators.person_bound.bound_drops`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from simulators.logfile import Event

__all__ = ["QUANTILE", "UserSuggestion", "default_period_ticks", "suggest", "user_settings_toml"]

#: the quantile of events per person and period that K is set to
QUANTILE = 0.99
#: seconds in the default period (a day)
DAY_S = 86_400.0


def default_period_ticks(tick_seconds: float) -> int:
    """Ticks in a day of ``tick_seconds``-long ticks (at least 1): the default period."""
    return max(1, round(DAY_S / tick_seconds))


@dataclass(frozen=True)
class UserSuggestion:
    """K for one period length, and what it would drop (every simulated event is eligible)."""

    period_ticks: int
    max_events: int
    events: int
    dropped: int
    #: (person, period) pairs with at least one event
    slots: int

    def describe(self) -> str:
        """The part of the command's output line that states K and where it came from."""
        share = 100.0 * self.dropped / self.events if self.events else 0.0
        return (f"K = {self.max_events} events per person per {self.period_ticks} ticks, the "
                f"{QUANTILE * 100:g}th percentile of events per person and period in this "
                f"simulation: the bound drops {self.dropped:,} of {self.events:,} events "
                f"({share:.1f} %)")


def suggest(events: Iterable[Event], *, period_ticks: int, origin: float,
            tick_seconds: float) -> UserSuggestion:
    """K = the :data:`QUANTILE` quantile (nearest rank: the smallest count that at least that
    share of the (person, period) pairs do not exceed) of events per person per period of
    ``period_ticks`` ticks; tick of an event at ``ts``: ``⌊(ts − origin)/tick_seconds⌋ + 1``
    (milliseconds, as the worker). Events must carry a person (``ValueError`` otherwise)."""
    if period_ticks < 1:
        raise ValueError(f"period_ticks must be >= 1, got {period_ticks}")
    tick_ms = round(tick_seconds * 1000)
    origin_ms = round(origin * 1000)
    per_slot: Counter[tuple[str, int]] = Counter()
    n = 0
    for n, event in enumerate(events, start=1):
        if event.user is None:
            raise ValueError(f"event {n} has no person: simulate with --people N")
        tick0 = (round(event.ts * 1000) - origin_ms) // tick_ms
        per_slot[(event.user, tick0 // period_ticks)] += 1
    counts = sorted(per_slot.values())
    k = counts[max(0, math.ceil(QUANTILE * len(counts)) - 1)] if counts else 1
    dropped = sum(c - k for c in counts if c > k)
    return UserSuggestion(period_ticks, max(1, k), n, dropped, len(counts))


def user_settings_toml(user_field: str, suggestion: UserSuggestion) -> str:
    """The lines the settings file gets for user-level privacy (appended to the event-level
    ones: every other setting is the same)."""
    return "\n".join([
        "# user-level privacy (docs/privacy.md): the unit is a person, named by the event field",
        "# user_field; each person's first K events per period (log order) are counted",
        'privacy_unit = "user"',
        f"user_field = {json.dumps(user_field)}",
        f"user_period_ticks = {suggestion.period_ticks}",
        f"# K: the {QUANTILE * 100:g}th percentile of events per person and period in this "
        "simulation;",
        "# on real data choose K from public knowledge, not from the data",
        f"user_max_events = {suggestion.max_events}",
        "",
    ])
