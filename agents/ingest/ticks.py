"""The public release schedule: tick arithmetic and closing rules (pure; no I/O, no Kafka).

Tick ``n`` (1-based) covers event times ``[origin + (n−1)·L, origin + n·L)`` with ``L`` the tick
length in seconds. Its **deadline** is ``origin + n·L + lateness``. Nothing in this module looks
at more than one event: which tick an event lands in, and whether it is late, follows from *that
event's own record* (its event time and its Kafka record timestamp) and from the schedule's
*closing points*, which no event can move (DESIGN.md §2.1):

* **clock** schedule (live deployments, the default). Tick ``n`` of an events partition closes
  once the worker's clock has passed ``deadline(n) + grace``: the worker then reads the partition's
  end offset ``E`` and every record before ``E`` belongs to the tick (if its own record allows,
  below); every record from ``E`` on whose tick is ``≤ n`` is dead-lettered (``tick_closed``).
  ``E`` counts the records appended before a moment fixed by the public clock, so adding one event
  never moves another event across it. On topics with ``message.timestamp.type=LogAppendTime``
  (what ``stream-dp topics`` creates) the first record stamped by the broker at or after
  ``deadline(n)`` is also a closing point for tick ``n``: that lets a backlog of past ticks be
  released at processing speed. It selects exactly the same events (every record from it on
  carries a broker time past the deadline, so it is late by its own record anyway).
* **markers** schedule (replays of historical logs). Ticks close only at *close markers* that
  ``stream-dp replay`` writes into every events partition after the events they follow; the log
  itself is the schedule, and record timestamps are not consulted. A progress marker at ``T``
  closes the ticks whose deadline is ``≤ T``, a final marker every tick up to the one holding ``T``.

Per record (clock schedule): its *arrival* is its Kafka record timestamp (broker time on
LogAppendTime topics, the producer's claim on CreateTime topics). An event is ``late`` if it
arrived at or after its tick's deadline, ``future`` if its event time is more than
``max_future_skew`` ahead of its arrival, ``too_old`` if it arrived more than ``max_event_age``
after its event time. Closing points, once decided, are persisted with the release (the schedule
topic), so restarts and replays make the same decisions without consulting a clock.

>>> s = Schedule(origin=1000.0, tick_seconds=10.0, lateness=2.0, grace=1.0)
>>> s.tick_of(1000.0), s.tick_of(1009.999), s.tick_of(1010.0)
(1, 1, 2)
>>> s.deadline(1)
1012.0
>>> s.due_through(1012.999), s.due_through(1013.0), s.due_through(1033.0)
(0, 1, 3)
>>> s.closed_by_arrival(1021.999), s.closed_by_arrival(1022.0)
(1, 2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Schedule", "tick_bounds", "tick_of"]


def tick_of(ts: float, origin: float, tick_seconds: float) -> int:
    """The 1-based tick containing event time ``ts`` (≤ 0 for times before ``origin``)."""
    return math.floor((ts - origin) / tick_seconds) + 1


def tick_bounds(tick: int, origin: float, tick_seconds: float) -> tuple[float, float]:
    """``(start, end)`` of ``tick`` in Unix seconds."""
    return origin + (tick - 1) * tick_seconds, origin + tick * tick_seconds


@dataclass(frozen=True)
class Schedule:
    """The public tick schedule of a deployment (seconds, Unix time).

    ``lateness`` is the allowed lateness (an event may arrive up to this long after its tick's
    end); ``grace`` the extra wall-clock margin a worker waits past a deadline before it reads
    end offsets (covers clock skew between producers, brokers and workers).
    """

    origin: float
    tick_seconds: float
    lateness: float
    grace: float = 0.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.origin):
            raise ValueError(f"origin must be a finite number, got {self.origin!r}")
        if not (math.isfinite(self.tick_seconds) and self.tick_seconds > 0):
            raise ValueError(f"tick_seconds must be a finite number > 0, got {self.tick_seconds!r}")
        for name in ("lateness", "grace"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")

    def tick_of(self, ts: float) -> int:
        """The tick containing event time ``ts``."""
        return math.floor((ts - self.origin) / self.tick_seconds) + 1

    def bounds(self, tick: int) -> tuple[float, float]:
        """``(start, end)`` of ``tick``."""
        return tick_bounds(tick, self.origin, self.tick_seconds)

    def deadline(self, tick: int) -> float:
        """Arrival deadline of ``tick``: its end plus the allowed lateness."""
        return self.origin + tick * self.tick_seconds + self.lateness

    def closed_by_arrival(self, arrival: float) -> int:
        """The last tick whose deadline is ``≤ arrival`` (an event arriving then is late there)."""
        return math.floor((arrival - self.lateness - self.origin) / self.tick_seconds)

    def is_late(self, tick: int, arrival: float) -> bool:
        """True if an event of ``tick`` arriving at ``arrival`` missed the tick's deadline.

        Decided by comparing tick numbers from one formula, never end times computed two ways,
        so a boundary case cannot fall on different sides in two places.
        """
        return tick <= self.closed_by_arrival(arrival)

    def due_through(self, now: float) -> int:
        """The last tick a worker may close at clock time ``now`` (deadline + grace passed)."""
        return math.floor((now - self.grace - self.lateness - self.origin) / self.tick_seconds)

    def closed_by_marker(self, marker_time: float, final: bool) -> int:
        """The last tick a close marker closes.

        A progress marker at ``T`` closes every tick whose deadline (end + lateness) is ``≤ T``,
        so events up to ``lateness`` out of order in a paced replay still count; a *final* marker
        (end of the replayed log) closes every tick up to the one containing ``T``.
        """
        if final:
            return self.tick_of(marker_time)
        return self.closed_by_arrival(marker_time)
