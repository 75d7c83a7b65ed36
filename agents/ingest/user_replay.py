"""Re-deciding the events since the per-person table was last written (issue #34,
:mod:`agents.ingest.user_flush`). Pure: no I/O; the ingest stage reads the records.

A restored partition has its table as of the last flush (its changelog) and the rest of its
state as of the checkpoint, which may lie later. :class:`TableReplay` is a scratch
:class:`~agents.ingest.state.IngestState` that starts at the flush point, shares the
restored partition's table, and processes the records from the flush's offset to the
checkpoint's again, following the persisted closing points only (no live closing rule, no
clock): each record meets the table and the closed ticks it met the first time, so it is
counted or refused as it was, and the table arrives where it was at the checkpoint. Its sums,
dead letters and partials are dropped: the checkpoint has them already. At the end it must
stand where the checkpoint stands (offset, next open tick, the running record digest, the
table's open period), else the events topic changed under the deployment and the restore is
refused (:class:`~agents.ingest.schedule.ScheduleMismatch`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from agents.ingest.schedule import ScheduleEntry, ScheduleMismatch
from agents.ingest.state import IngestState
from agents.ingest.user_flush import FlushPoint

__all__ = ["TableReplay"]


class TableReplay(IngestState):
    """Re-decides the records from ``point`` on into ``state``'s table (see the module)."""

    def __init__(self, state: IngestState, point: FlushPoint,
                 entries: Sequence[ScheduleEntry]) -> None:
        super().__init__(state.settings, state.router, state.partition, key=state._key,
                         domain_id=state.domain_id)
        assert state.users is not None
        self._target = state
        self._open_period = state.users.open_period  # the checkpoint's
        self.users = state.users  # the restored table, as of the flush
        self.users.open_period = point.open_period
        self.offset = point.offset
        self.next_tick = point.next_tick
        self.range_start = point.range_start
        self.digest = point.digest
        self.schedule_from = point.schedule_from
        self.load_known(entries)
        #: records refused by the worker's clock the first time, refused again (ascending)
        self._future = list(point.future)
        self._next_future = 0
        #: the worker's clock for the records being processed: +inf (no event is refused for
        #: lying in the future) except for the records in ``_future`` (-inf: refused)
        self._now = math.inf
        self.clock = lambda: self._now
        #: how many records were processed again
        self.records = 0

    @property
    def replaying(self) -> bool:
        """Always: closing points are the persisted ones, never decided anew."""
        return True

    def hand_over(self, limit: int | None = None) -> int:
        """Closed ticks' sums are in the checkpoint already: dropped, no partials built."""
        n = 0
        for first, through, _ in self.unsent:
            for tick in range(first, through + 1):
                self.buckets.pop(tick, None)
            n += through - first + 1
        self.unsent = []
        return n

    def feed(self, records: Sequence[Any]) -> None:
        """The next records of the partition, in offset order (committed ones, as the
        events consumer delivered them)."""
        i, n = 0, len(records)
        future = self._future
        while i < n:
            while self._next_future < len(future) and future[self._next_future] < \
                    records[i].offset:
                self._next_future += 1  # not delivered now: nothing to decide for it
            stop = future[self._next_future] if self._next_future < len(future) else -1
            j = i
            if stop < 0:
                j = n
            else:
                while j < n and records[j].offset < stop:
                    j += 1
            if j > i:
                self._now = math.inf
                self.process_batch(records[i:j])
            if j < n and records[j].offset == stop:
                self._now = -math.inf
                self.process_batch(records[j:j + 1])
                self._next_future += 1
                j += 1
            i = j
        self.records += n
        self.out.clear()

    def finish(self, end: int) -> None:
        """Every record before ``end`` (the checkpoint's offset) was fed: check that the
        replay stands where the checkpoint does, and leave the table there."""
        self.advance_to(end)
        self.out.clear()
        t = self._target
        assert self.users is not None
        got = (self.offset, self.next_tick, self.range_start, self.digest,
               self.users.open_period)
        want = (t.offset, t.next_tick, t.range_start, t.digest, self._open_period)
        if got != want:
            raise ScheduleMismatch(
                f"events partition {t.partition}: re-deciding the events since the per-person "
                "table was last written did not arrive where the checkpoint stands (offset, "
                f"next open tick, record digest, open period: {got[:2]} vs {want[:2]}): the "
                "events topic no longer holds the records this deployment counted. Restore "
                "the topic, or start a new deployment (stream-dp deployment new)")
