"""Tick arithmetic and the per-partition watermark/idle clock, against brute-force oracles."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.ticks import PartitionClock, tick_bounds, tick_of


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


def clock(**kw: float) -> PartitionClock:
    args = {"origin": 0.0, "tick_seconds": 10.0, "lateness": 3.0, "idle_timeout": 5.0, "wall": 0.0}
    args.update(kw)
    return PartitionClock(**args)  # type: ignore[arg-type]


def test_watermark_closes_ticks_after_lateness() -> None:
    c = clock()
    assert c.closable_through(0.0) == 0
    c.observe(12.9, wall=0.1)
    assert c.closable_through(0.1) == 0  # watermark 9.9 < 10
    c.observe(13.0, wall=0.2)
    assert c.closable_through(0.2) == 1  # watermark 10
    c.close_through(1)
    assert c.is_late(9.99) and not c.is_late(10.0)
    # event time never goes backwards on an out-of-order event
    c.observe(11.0, wall=0.3)
    assert c.event_time == 13.0


def test_idle_timeout_advances_from_last_event_not_to_now() -> None:
    c = clock(origin=1_000_000.0, wall=500.0)  # wall clock far from event time
    c.observe(1_000_004.0, wall=500.0)
    assert c.current_event_time(504.9) == 1_000_004.0
    assert c.current_event_time(505.0) == 1_000_009.0
    assert c.closable_through(509.0) == 1  # event time 1_000_013, watermark 1_000_010
    c.close_through(1, wall=509.0)
    assert c.event_time == 1_000_013.0
    # a new event resets the idle timer; event time stays monotone
    c.observe(1_000_011.0, wall=510.0)
    assert c.current_event_time(512.0) == 1_000_013.0


def test_silence_from_start_closes_ticks_with_wall_time() -> None:
    c = clock(wall=100.0)
    assert c.closable_through(104.0) == 0
    assert c.closable_through(113.0) == 1  # event time origin + 13, watermark 10


def test_checkpoint_round_trip_keeps_ticks_and_event_time() -> None:
    c = clock()
    c.observe(35.0, wall=1.0)
    c.close_through(c.closable_through(1.0))
    d = c.to_dict()
    r = PartitionClock.from_dict(
        d, origin=0.0, tick_seconds=10.0, lateness=3.0, idle_timeout=5.0, wall=1000.0
    )
    assert r.next_tick == c.next_tick == 4 and r.event_time == 35.0
    assert r.closable_through(1004.0) == 3  # the idle timer restarts with the process
    assert r.closable_through(1005.0) == 3  # 40 - 3 = 37 < 40


@given(st.lists(st.tuples(st.floats(0, 200), st.floats(0, 3)), max_size=40))
def test_brute_force_oracle(events: list[tuple[float, float]]) -> None:
    """Closed ticks never exceed what the oracle watermark allows; lateness by tick number."""
    c = clock()
    wall = 0.0
    seen_max = 0.0
    for ts, dt in events:
        wall += dt
        closable = c.closable_through(wall)
        idle = wall - c.last_wall
        et = max(c.event_time, c.last_ts + idle) if idle >= 5.0 else c.event_time
        assert closable == max(c.next_tick - 1, math.floor((et - 3.0) / 10.0))
        c.close_through(closable, wall=wall)
        assert c.is_late(ts) == (math.floor(ts / 10.0) + 1 < c.next_tick)
        if not c.is_late(ts):
            c.observe(ts, wall)
            seen_max = max(seen_max, ts)
        assert c.event_time >= seen_max


def test_invalid_parameters_raise() -> None:
    for kw, name in [({"tick_seconds": 0.0}, "tick_seconds"), ({"lateness": -1.0}, "lateness"),
                     ({"idle_timeout": math.inf}, "idle_timeout")]:
        with pytest.raises(ValueError, match=name):
            clock(**kw)


def test_busy_partition_is_not_idle() -> None:
    c = clock(wall=0.0)
    c.observe(4.0, wall=0.0)
    c.busy(9.0)  # records still unread at wall 9: no idle advance
    assert c.current_event_time(9.0) == 4.0
    assert c.current_event_time(14.0) == 4.0 + 5.0  # silent since the backlog cleared
