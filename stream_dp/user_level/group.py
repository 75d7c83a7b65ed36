"""A person's budget where one event's cost is a single pure-DP figure over every output
(:class:`GroupBudget`): the binary-attribute path (the service's tables and
``stream-dp marginals``), which is pure ε-DP *per event over all tables* (an event touches one
cell of every table and the bootstrap; the costs add up to the exact ``spent`` ≤ ε).

Bounded by :class:`~stream_dp.user_level.bounding.Bounder`, two logs that differ by every
record of one person differ, after bounding, by at most K of that person's counted events per
period and by nothing else (no other person's fate). Group privacy of a pure ε-DP mechanism
then gives ``K·spent`` per person per period, over every table together (the largest L1 change
of every table and of the bootstrap is K times one event's; L and k cannot lower it, since each
counted event reaches every table), and ``Y·K·spent`` over Y periods (sequential composition).
Both are **upper bounds**: the group figure is reached only when every one of the person's
counted events moves every measurement in the same direction to its full sensitivity, which the
cell clip (``max_events_per_tick``) and a strategy's grid slack can prevent; nothing here
claims it is reached. All figures are exact rationals (the caller's ``spent`` is one), and
:func:`float_up` rounds them to the float at or above, so a printed bound is never below the
rational one.

>>> from stream_dp.user_level.bounds import UserBounds
>>> g = GroupBudget(Fraction(1, 2), UserBounds(max_events=10, period_ticks=1440))
>>> g.per_period, g.over_periods(3), g.periods_in(2881)
(Fraction(5, 1), Fraction(15, 1), 3)
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from stream_dp.user_level.bounds import UserBounds
from stream_dp.user_level.rounding import float_up, format_up

__all__ = ["GroupBudget", "float_up", "format_up"]


@dataclass(frozen=True)
class GroupBudget:
    """One person's pure-DP budget from the exact per-event cost ``per_event`` (ε over every
    output one event reaches) and the person's ``bounds`` (only K and the period matter)."""

    per_event: Fraction
    bounds: UserBounds

    def __post_init__(self) -> None:
        if not isinstance(self.per_event, Fraction) or self.per_event <= 0:
            raise ValueError(f"per_event must be a Fraction > 0, got {self.per_event!r}")

    @property
    def per_period(self) -> Fraction:
        """ε one person's counted events of one period spend in total (an upper bound):
        ``K · per_event``."""
        return self.bounds.max_events * self.per_event

    def over_periods(self, periods: int) -> Fraction:
        """ε over ``periods`` periods (sequential composition; an upper bound)."""
        if isinstance(periods, bool) or not isinstance(periods, int) or periods < 1:
            raise ValueError(f"periods must be an integer >= 1, got {periods!r}")
        return periods * self.per_period

    def periods_in(self, ticks: int) -> int:
        """How many periods the ticks ``1 … ticks`` (≥ 1) touch: ``⌈ticks / T⌉``, 1 for
        ``T = 0`` (one period, the whole run)."""
        if isinstance(ticks, bool) or not isinstance(ticks, int) or ticks < 1:
            raise ValueError(f"ticks must be an integer >= 1, got {ticks!r}")
        t = self.bounds.period_ticks
        return 1 if t == 0 else -(-ticks // t)

    def report(self, tick_seconds: float) -> dict[str, Any]:
        """The figures as JSON-able numbers: per period and over a year of periods
        (:func:`~stream_dp.user_level.accounting.year_periods`), floats rounded up, both upper
        bounds."""
        from stream_dp.exact_budget import exact_decimal
        from stream_dp.user_level.accounting import year_periods

        year = year_periods(self.bounds.period_ticks, tick_seconds)
        return {"per_event_exact": exact_decimal(self.per_event),
                "period": float_up(self.per_period), "period_exact": exact_decimal(self.per_period),
                "year": float_up(self.over_periods(year)), "year_periods": year, "exact": False}

    def summary(self, tick_seconds: float) -> list[str]:
        """Human-readable lines (``stream-dp plan`` and the worker's start-up log)."""
        b = self.bounds
        r = self.report(tick_seconds)
        period = f"{b.period_ticks} ticks" if b.period_ticks else "the whole epoch"
        return [
            "unit of privacy:         one person",
            f"period:                  {period}",
            f"bounds per period:       K = {b.max_events} events (the first in log order)",
            f"total per person:        ε = {r['period']!r} per period over every table "
            f"(K × ε {float_up(self.per_event)!r} per event; an upper bound)",
            f"over a year:             ε = {r['year']!r} ({r['year_periods']} periods; "
            "an upper bound)",
        ]
