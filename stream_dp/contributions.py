"""Exact per-tick sums: event values as integers on a power-of-two grid, per-tick clipping.

A mechanism's sensitivity assumes that adding one event changes one tick's count by at most
``cap``. Float sums in arrival order break that: with ``10^5`` tiny values summed after it, one
event of value 1 can move a float64 sum by ``1.0000466`` (rounding of every later addition
depends on it). So every sum that feeds a mechanism is kept in **integer units**:

* the unit is ``u = 2^(e − 24)`` with ``2^(e−1) ≤ cap < 2^e`` (:func:`value_unit`), so ``cap``
  is between ``2^23`` and ``2^24`` units and values have 24 significant bits of resolution;
* one event contributes ``min(round(value / u), floor(cap / u))`` units (:func:`to_units`;
  ``value / u`` is exact, a power-of-two scaling; rounding is half to even) — at most ``cap``,
  whatever the value;
* sums of units are exact integers in any order; a tick's count is ``units · u``, an exact
  float as long as ``units < 2^53`` — which :func:`clip_units` guarantees.

**Clipping.** A stream's count in one tick is clipped to ``cap × max_events_per_tick``
(:func:`clip_limit_units`): ``min(x, c)`` is 1-Lipschitz, so one event still changes the
clipped count by at most ``cap`` (clipping never raises the sensitivity), and the count never
leaves the strategy's numeric range, so a release never depends on a true count except through
the noisy value (no error, no stop: docs/privacy.md, "Threat model"). Clipping each events
partition's partial and again their sum keeps the same bound (a composition of 1-Lipschitz maps
of sums that one event enters once).

>>> u = value_unit(1.0)
>>> u == 2.0 ** -23, to_units(1.0, u, cap_units(1.0, u)), to_units(5.0, u, cap_units(1.0, u))
(True, 8388608, 8388608)
>>> to_units(0.1, value_unit(0.1), cap_units(0.1, value_unit(0.1))) * value_unit(0.1) <= 0.1
True
"""

from __future__ import annotations

import math

__all__ = [
    "MAX_EVENTS_PER_TICK",
    "cap_units",
    "clip_limit_units",
    "to_units",
    "value_unit",
]

#: bits of resolution of a value below ``cap`` (cap is 2^23 … 2^24 units)
_CAP_BITS = 24
#: the largest ``max_events_per_tick``: ``cap × max_events_per_tick`` stays below 2^53 units,
#: where every integer is an exact float64
MAX_EVENTS_PER_TICK = 1 << (53 - _CAP_BITS)


def value_unit(cap: float) -> float:
    """The unit (value units per integer unit) for contribution bound ``cap`` (> 0, finite):
    the power of two ``2^(e − 24)`` with ``2^(e−1) ≤ cap < 2^e``."""
    if not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > 0):
        raise ValueError(f"cap must be a finite number > 0, got {cap!r}")
    _, e = math.frexp(float(cap))
    return math.ldexp(1.0, e - _CAP_BITS)


def cap_units(cap: float, unit: float) -> int:
    """The largest contribution of one event in units: ``floor(cap / unit)`` (≤ cap in value)."""
    return math.floor(float(cap) / unit)


def to_units(value: float, unit: float, cap_u: int) -> int:
    """One event's contribution in units: ``min(round(value / unit), cap_u)`` (half to even).

    ``value`` must be a finite number ≥ 0 (validated by the caller); values far beyond the cap
    (even ``1e308``, whose quotient overflows to ``inf``) give ``cap_u``."""
    q = value / unit
    if q >= cap_u:
        return cap_u
    return round(q)


def clip_limit_units(cap: float, max_events_per_tick: int) -> int:
    """The per-stream, per-tick clip in units: ``cap_units × max_events_per_tick`` (< 2^53)."""
    if isinstance(max_events_per_tick, bool) or not isinstance(max_events_per_tick, int) or not (
            1 <= max_events_per_tick <= MAX_EVENTS_PER_TICK):
        raise ValueError(
            f"max_events_per_tick must be an integer in [1, {MAX_EVENTS_PER_TICK}], "
            f"got {max_events_per_tick!r}")
    unit = value_unit(cap)
    return cap_units(cap, unit) * max_events_per_tick
