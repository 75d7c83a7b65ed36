"""Where the per-person table was last written to its changelog (:class:`FlushPoint`), for
``privacy_unit = "user"`` (issue #34, docs/design/user-level.md §3). Pure: no I/O.

Writing the table with every commit costs one changelog record per person changed per
commit: on a log where a person's events lie far apart that is about one record per event,
most of a user-level worker's CPU. So the table is written (*flushed*) at most every
``user_flush_interval_s``, and at every graceful stop or hand-over; the commits in between
carry the offsets and sums as always, and in their checkpoint the flush point. A restore reads
the table as of the flush from the changelog, then **re-decides** the events from the flush's
offset to the checkpoint's (:mod:`agents.ingest.user_replay`): the same records, the same
closing points (persisted on the schedule topic), the same table, so the same decisions.

One decision of the ingest path does not follow from the record and the closing points: an
event whose time lies more than ``max_future_skew_s`` past the worker's clock is refused as
``future``, by the clock at the time. The flush point therefore lists the offsets of the
records refused so since the flush (at most :data:`MAX_FUTURE` before a flush is forced), and
the re-decision refuses exactly those.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

__all__ = ["MAX_FUTURE", "FlushPoint"]

#: the most records refused by the worker's clock that a checkpoint lists (8 bytes or so
#: each in the checkpoint): a flush is forced at the next commit beyond it
MAX_FUTURE = 4096


@dataclass(frozen=True)
class FlushPoint:
    """The ingest state of one events partition when its table was last written.

    ``offset`` the next events offset to process then, ``next_tick`` the first open tick,
    ``range_start`` and ``digest`` the running record digest's range and value (what the next
    persisted closing point checks), ``schedule_from`` the schedule-topic offset from which
    later closing points lie, ``open_period`` the table's first open period, and ``future``
    the offsets (≥ ``offset``, ascending) of the records refused since then because their
    event time was past the worker's clock.
    """

    offset: int
    next_tick: int
    range_start: int
    digest: int
    schedule_from: int
    open_period: int
    future: tuple[int, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        """JSON-able form (inside the sealed ingest checkpoint)."""
        return {"offset": self.offset, "next_tick": self.next_tick,
                "range_start": self.range_start, "digest": f"{self.digest:032x}",
                "schedule_from": self.schedule_from, "open_period": self.open_period,
                "future": list(self.future)}

    @classmethod
    def from_doc(cls, doc: Any, offset: int, next_tick: int) -> FlushPoint:
        """The point of :meth:`to_doc`, checked against the checkpoint's own ``offset`` and
        ``next_tick`` (a flush lies at or before them); ``ValueError`` otherwise."""
        try:
            point = cls(int(doc["offset"]), int(doc["next_tick"]), int(doc["range_start"]),
                        int(doc["digest"], 16), int(doc["schedule_from"]),
                        int(doc["open_period"]), tuple(int(x) for x in doc["future"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"ingest checkpoint: unreadable flush point ({exc})") from None
        fut = point.future
        if not (point.offset <= offset and 1 <= point.next_tick <= next_tick
                and point.schedule_from >= 0 and point.open_period >= 0
                and 0 <= point.digest < 1 << 128
                and all(a < b for a, b in pairwise(fut))
                and all(point.offset <= x < offset for x in fut)):
            raise ValueError("ingest checkpoint: the per-person table's flush point lies "
                             "past the checkpoint, or lists offsets outside it")
        return point
