"""Tick arithmetic and the public schedule's rules, against brute-force oracles."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.ingest.ticks import Schedule, tick_bounds, tick_of


@given(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.floats(0.001, 1e4, allow_nan=False),
    st.integers(-1000, 100000),
)
def test_tick_of_inverts_tick_bounds(origin: float, length: float, n: int) -> None:
    start, end = tick_bounds(n, origin, length)
    mid = start + (end - start) / 2
    assert tick_of(mid, origin, length) == n


def test_boundaries_belong_to_the_next_tick() -> None:
    assert tick_of(10.0, 0.0, 10.0) == 2
    assert tick_of(9.999999, 0.0, 10.0) == 1
    assert tick_of(-0.5, 0.0, 10.0) == 0


def _oracle_last_with(limit: Fraction, offset: Fraction, L: Fraction) -> int:
    """Largest n (brute force) with offset + n·L <= limit."""
    n = -2000  # below any answer for the drawn ranges
    while offset + (n + 1) * L <= limit:
        n += 1
    return n


@given(
    origin=st.integers(0, 1000), tick=st.integers(1, 20), lateness=st.integers(0, 15),
    grace=st.integers(0, 3), t=st.integers(0, 1400),
)
def test_deadline_rules_match_brute_force(origin: int, tick: int, lateness: int, grace: int,
                                          t: int) -> None:
    """On an integer grid (exact floats): deadlines, due ticks and lateness by enumeration."""
    s = Schedule(float(origin), float(tick), float(lateness), float(grace))
    o, L, lat, g, now = (Fraction(x) for x in (origin, tick, lateness, grace, t))
    assert s.due_through(float(t)) == _oracle_last_with(now - g - lat, o, L)
    assert s.closed_by_arrival(float(t)) == _oracle_last_with(now - lat, o, L)
    for n in range(max(1, s.closed_by_arrival(float(t)) - 1), s.closed_by_arrival(float(t)) + 3):
        assert s.is_late(n, float(t)) == (now >= o + n * L + lat)
        assert s.deadline(n) == float(o + n * L + lat)
    # a tick is never due before its deadline + grace, and always right after
    n = s.due_through(float(t))
    assert s.deadline(n) + grace <= t < s.deadline(n + 1) + grace


def test_markers_close_ended_ticks_or_the_final_one() -> None:
    s = Schedule(100.0, 10.0, 2.0)
    assert s.closed_by_marker(121.9, final=False) == 1  # tick 2's deadline is 122
    assert s.closed_by_marker(122.0, final=False) == 2
    assert s.closed_by_marker(119.9, final=True) == 2  # the tick containing the last event
    assert s.closed_by_marker(120.0, final=True) == 3


def test_invalid_parameters_raise() -> None:
    for kw, name in [({"tick_seconds": 0.0}, "tick_seconds"), ({"lateness": -1.0}, "lateness"),
                     ({"grace": math.inf}, "grace"), ({"origin": math.nan}, "origin")]:
        args: dict[str, float] = {"origin": 0.0, "tick_seconds": 10.0, "lateness": 3.0}
        args.update(kw)
        with pytest.raises(ValueError, match=name):
            Schedule(**args)
