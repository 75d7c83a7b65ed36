"""A stage's health checks (:class:`StageHealth`, mixed into :class:`agents.kafka.stage._Stage`):
input partitions that no member works on (leave and rejoin the group, at most once per
``stall_timeout_s``), and owned partitions whose processing stopped while records keep arriving
(one warning line each; a log that ends before the state is refused).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from agents.config.settings import Settings
from agents.kafka.checkpoints import CheckpointRefused
from agents.kafka.groups import leave_group
from agents.kafka.stage_host import StageHost

log = logging.getLogger("stream_dp.pipeline")


class StageHealth:
    """The health checks of a stage; :class:`~agents.kafka.stage._Stage` sets every attribute
    declared here."""

    name: str
    topic: str
    group: str
    s: Settings
    w: StageHost
    consumer: Any
    states: dict[int, Any]
    restoring: bool
    #: partition -> (last committed offset seen, monotonic time it was first seen)
    _progress: dict[int, tuple[int, float]]
    _next_owner_check: float
    _rejoin_after: float
    #: partition -> (state offset, end offset then, since when, last warned): liveness
    _liveness: dict[int, tuple[int, int, float, float]]
    _next_liveness: float

    async def check_ownership(self) -> None:
        """Find input partitions nobody works on, and rejoin the group if there are any.

        A partition not assigned here whose committed offset has not moved for
        ``stall_timeout_s`` while records wait behind it has no working owner (noida-db was seen
        to re-run an assignment without a new generation after a kill -9 of the group leader,
        leaving partitions unassigned; real Kafka would expire or fence the owner).
        """
        now = time.monotonic()
        if now < self._next_owner_check or self.consumer is None or self.restoring:
            return
        self._next_owner_check = now + max(0.5, self.s.stall_timeout_s / 4)
        import aiokafka as k

        parts = self.consumer.partitions_for_topic(self.topic) or set()
        mine = {tp.partition for tp in self.consumer.assignment()}
        others = [k.TopicPartition(self.topic, p) for p in sorted(parts) if p not in mine]
        if not others:
            self._progress.clear()
            return
        ends = await self.consumer.end_offsets(others)
        stalled = []
        for tp in others:
            committed = await self.consumer.committed(tp)
            committed = -1 if committed is None else int(committed)
            last = self._progress.get(tp.partition)
            if last is None or last[0] != committed:
                self._progress[tp.partition] = (committed, now)
                continue
            if int(ends.get(tp, 0)) > max(committed, 0) and now - last[1] >= self.s.stall_timeout_s:
                stalled.append(tp.partition)
        if stalled:
            await self.rejoin(f"partitions {stalled} of {self.topic} made no progress for "
                              f"{self.s.stall_timeout_s:g} s with records waiting")

    async def rejoin(self, why: str) -> None:
        """Leave the group and join again as a new member (at most once per stall timeout)."""
        now = time.monotonic()
        if now < self._rejoin_after or self.consumer is None:
            return
        self._rejoin_after = now + self.s.stall_timeout_s
        self._progress.clear()
        self.w.stats["ownership_recoveries"] += 1
        log.warning("%s: %s; leaving and rejoining the group so they are assigned again",
                    self.name, why)
        coord = getattr(self.consumer, "_coordinator", None)
        if coord is None:
            return
        await leave_group(self.s.bootstrap, self.group, str(coord.member_id or ""),
                          self.w.security)
        coord.reset_generation()

    async def check_liveness(self) -> None:
        """Name every owned partition whose processing stopped while records keep arriving.

        Every ``stall_timeout_s / 2`` seconds: a partition whose state offset (what the next
        checkpoint records) has not moved for ``stall_timeout_s`` while its end offset grew
        meanwhile is stalled: one warning line naming the stage, the partition, both offsets
        and for how long (again at most once per ``stall_timeout_s``), and
        ``Worker.stats["stalled_partitions"]`` counts it. (Seen once: an events partition made
        no progress after a restart, no checkpoint, no error, while the others went on.)"""
        now = time.monotonic()
        if now < self._next_liveness or self.restoring or not self.states:
            return
        self._next_liveness = now + max(0.5, self.s.stall_timeout_s / 2)
        import aiokafka as k

        parts = sorted(self.states)
        tps = [k.TopicPartition(self.topic, p) for p in parts]
        ends = await self.consumer.end_offsets(tps)
        for tp in tps:
            state = self.states.get(tp.partition)
            if state is None:
                continue
            end, offset = int(ends.get(tp, 0)), int(state.offset)
            if 0 <= end < offset and tp in ends:
                # the log ends before what this worker has consumed of it: the broker lost
                # records it had acknowledged (a development broker killed with kill -9)
                self.w.release_error("checkpoint_refused")
                self.w.fail(CheckpointRefused(
                    f"{self.name} partition {tp.partition}: the state is ahead of the log: it "
                    f"has consumed {tp.topic} up to offset {offset}, but the partition now ends "
                    f"at {end}. The broker lost records it had acknowledged (a development "
                    "broker killed with kill -9 can: docs/operations.md); the state cannot be "
                    "continued. Start a new deployment (stream-dp deployment new), or restore "
                    "the broker's data"))
                return
            seen = self._liveness.get(tp.partition)
            if seen is None or seen[0] != offset or end <= offset:
                self._liveness[tp.partition] = (offset, end, now, 0.0)
                continue
            since, first_end, warned = seen[2], seen[1], seen[3]
            if end > first_end and now - since >= self.s.stall_timeout_s and (
                    now - warned >= self.s.stall_timeout_s):
                self._liveness[tp.partition] = (offset, first_end, since, now)
                self.w.stats["stalled_partitions"] += 1
                log.warning(
                    "%s partition %d makes no progress: its offset stays at %d for %.0f s "
                    "while the partition grew from %d to %d records", self.name,
                    tp.partition, offset, now - since, first_end, end)
