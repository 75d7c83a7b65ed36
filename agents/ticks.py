"""Tick arithmetic and the per-partition event-time clock (pure; no I/O, no Kafka).

Tick ``n`` (1-based) covers event times ``[origin + (n−1)·L, origin + n·L)`` with ``L`` the tick
length in seconds. Each events partition keeps its own :class:`PartitionClock`:

* its **event time** is the largest event timestamp seen (monotone), or ``origin`` before any;
* **idle timeout**: once ``idle_timeout`` wall-clock seconds have passed since the last event,
  event time advances with wall time *from the last event's time*:
  ``event_time = max(event_time, last_ts + (wall − last_wall))``. Silence therefore still closes
  ticks, and replaying an old log does not jump to "now";
* the **watermark** is ``event_time − allowed_lateness``; tick ``n`` closes once the watermark
  reaches its end, i.e. all ticks ``≤ floor((watermark − origin) / L)`` are closed;
* an event whose tick is already closed is **late** (it goes to the dead-letter topic).

Whether an event is late is decided by comparing tick *numbers* (never end times), so the same
floating-point formula :func:`tick_of` decides both the bucket and lateness.

>>> c = PartitionClock(origin=1000.0, tick_seconds=10.0, lateness=2.0, idle_timeout=5.0, wall=0.0)
>>> c.tick_of(1000.0), c.tick_of(1009.999), c.tick_of(1010.0)
(1, 1, 2)
>>> c.observe(1013.0, wall=1.0); c.closable_through(wall=1.0)   # watermark 1011: tick 1 closes
1
>>> c.close_through(1); c.is_late(1005.0), c.is_late(1012.0)
(True, False)
>>> c.closable_through(wall=5.9)      # idle for 4.9 s < 5 s: event time stays at 1013
1
>>> c.closable_through(wall=10.0)     # idle 9 s: event time 1013 + 9 = 1022, watermark 1020
2
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["PartitionClock", "tick_bounds", "tick_of"]


def tick_of(ts: float, origin: float, tick_seconds: float) -> int:
    """The 1-based tick containing event time ``ts`` (≤ 0 for times before ``origin``)."""
    return math.floor((ts - origin) / tick_seconds) + 1


def tick_bounds(tick: int, origin: float, tick_seconds: float) -> tuple[float, float]:
    """``(start, end)`` of ``tick`` in Unix seconds."""
    return origin + (tick - 1) * tick_seconds, origin + tick * tick_seconds


@dataclass
class PartitionClock:
    """Event-time clock and watermark of one events partition (mutable; see module docstring).

    ``next_tick`` is the first tick not yet closed. Units: seconds (event time and wall time are
    both Unix seconds; wall time may be any monotone clock).
    """

    origin: float
    tick_seconds: float
    lateness: float
    idle_timeout: float
    wall: float
    next_tick: int = 1
    event_time: float = math.nan
    last_ts: float = math.nan

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tick_seconds) and self.tick_seconds > 0):
            raise ValueError(f"tick_seconds must be a finite number > 0, got {self.tick_seconds!r}")
        if not (math.isfinite(self.lateness) and self.lateness >= 0):
            raise ValueError(f"lateness must be a finite number >= 0, got {self.lateness!r}")
        if not (math.isfinite(self.idle_timeout) and self.idle_timeout > 0):
            raise ValueError(f"idle_timeout must be a finite number > 0, got {self.idle_timeout!r}")
        if math.isnan(self.event_time):
            self.event_time = self.origin
        if math.isnan(self.last_ts):
            self.last_ts = self.event_time
        self.last_wall = self.wall

    def tick_of(self, ts: float) -> int:
        """The tick containing ``ts``."""
        return tick_of(ts, self.origin, self.tick_seconds)

    def is_late(self, ts: float) -> bool:
        """True if ``ts`` falls in a tick that is already closed."""
        return self.tick_of(ts) < self.next_tick

    def observe(self, ts: float, wall: float) -> None:
        """Record an accepted event with time ``ts`` arriving at wall time ``wall``."""
        if ts > self.event_time:
            self.event_time = ts
        self.last_ts = self.event_time
        self.last_wall = wall

    def busy(self, wall: float) -> None:
        """The partition still has unread records at wall time ``wall``: it is not idle.

        Idleness means *silence* (the consumer is caught up), not a slow or starved consumer
        working through a backlog; this restarts the idle timer without moving event time.
        """
        self.last_wall = wall

    def current_event_time(self, wall: float) -> float:
        """Event time at wall time ``wall``, including the idle-timeout advance (no mutation)."""
        idle = wall - self.last_wall
        if idle >= self.idle_timeout:
            return max(self.event_time, self.last_ts + idle)
        return self.event_time

    def watermark(self, wall: float) -> float:
        return self.current_event_time(wall) - self.lateness

    def closable_through(self, wall: float) -> int:
        """The last tick that may be closed at wall time ``wall`` (``next_tick − 1`` if none)."""
        last = math.floor((self.watermark(wall) - self.origin) / self.tick_seconds)
        return max(last, self.next_tick - 1)

    def close_through(self, tick: int, wall: float | None = None) -> None:
        """Mark every tick ``≤ tick`` closed; with ``wall``, also fix the idle advance so far."""
        if wall is not None:
            self.event_time = self.current_event_time(wall)
        if tick >= self.next_tick:
            self.next_tick = tick + 1

    # ------------------------------------------------------------------ checkpoint form
    def to_dict(self) -> dict[str, Any]:
        """The persistent part (wall times are not persisted: they restart with the process)."""
        return {"next_tick": self.next_tick, "event_time": self.event_time}

    @classmethod
    def from_dict(
        cls,
        data: dict[str, Any],
        *,
        origin: float,
        tick_seconds: float,
        lateness: float,
        idle_timeout: float,
        wall: float,
    ) -> PartitionClock:
        return cls(
            origin=origin,
            tick_seconds=tick_seconds,
            lateness=lateness,
            idle_timeout=idle_timeout,
            wall=wall,
            next_tick=int(data["next_tick"]),
            event_time=float(data["event_time"]),
        )
