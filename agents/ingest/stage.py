"""The ingest stage of the worker pipeline (:class:`IngestStage`).

Consumes the events topic (group ``<app_id>.ingest``), runs one
:class:`agents.ingest.state.IngestState` per events partition and, at every tick close, emits
one partial per release shard, dead letters and the checkpoint in one transaction
(see :mod:`agents.worker.pipeline` for the design).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any, Protocol

from agents.ingest.digest import entry_key
from agents.ingest.records import FAST_PATH_STATUS
from agents.ingest.routing import Router
from agents.ingest.schedule import ScheduleEntry, ScheduleMismatch
from agents.ingest.state import IngestState
from agents.ingest.ticks import Schedule
from agents.kafka.batches import send_batched
from agents.kafka.checkpoint_reader import read_all, read_range
from agents.kafka.codec import dlq_key, dlq_message, encode
from agents.kafka.stage import _kafka, _Stage
from agents.kafka.stage_host import StageHost
from agents.telemetry.pipeline_metrics import PipelineMetrics

log = logging.getLogger("stream_dp.pipeline")

#: partials (ticks x release shards) one ingest step hands over and commits when a backlog of
#: closed ticks waits (IngestState.hand_over): each step is a short transaction between two
#: returns to the event loop, so a stop signal during a 474 000-tick backlog is obeyed in
#: seconds, not after the whole backlog
HAND_OVER_PARTIALS = 4096
#: seconds between two hand-over progress lines (agents.worker.pipeline.PROGRESS_EVERY_S too)
HAND_OVER_EVERY_S = 10.0
#: the events consumer's pause after empty fetches grows to this many times
#: ``empty_fetch_backoff_ms`` while no events come (agents.kafka.fetch_backoff.pace): one round
#: trip a second (1 s at the default 50 ms) instead of ~20 between bursts. A record arriving
#: after an idle spell is fetched within that long; a clock close whose closing point lies
#: ahead of the consumer wakes it, so the pause delays no tick's release, and what a tick
#: contains is decided by offsets, never by when a record was fetched. It was 4x (5 round
#: trips a second): at 10^6 streams the idle worker's biggest cost (issue #35)
INGEST_IDLE_GROWTH = 20.0

#: seconds between two reads of the topic settings checked at start-up (a DescribeConfigs
#: request: cheap), so that a retention given to an internal topic while the worker runs, or
#: an events topic switched to another timestamp type, stops it (exit status 2) before the
#: records are gone
CONFIG_RECHECK_S = 10.0
#: the re-check's admin request timeout (seconds): a stop during a broker outage waits for it
RECHECK_TIMEOUT_S = 3.0



async def _closed(admin: Any) -> None:
    """Close an admin client, if any, ignoring its errors (it is dropped either way)."""
    if admin is not None:
        with contextlib.suppress(Exception):
            await admin.close()

class IngestHost(StageHost, Protocol):
    """What the ingest stage sees of the process that runs it, besides :class:`StageHost`."""

    #: node routing of the domain (streams -> release shards)
    router: Router
    #: the noise key (the schedule digest and the close markers are keyed with it)
    key: bytes
    #: the deployment's identity (set again once the deployment nonce is adopted)
    domain_id: str
    #: the public release schedule (ticks and their deadlines)
    schedule: Schedule
    metrics: PipelineMetrics
    #: the ingest side of each tick's close, per events partition (seconds; diagnostics)
    ingest_timings: deque[dict[str, float]]
    #: records handed to the stage so far (benchmarks)
    processed: int

    def partials_committed(self) -> None:
        """Partials were committed (an in-process release stage fetches them now)."""
        ...


class IngestStage(_Stage):
    name = "ingest"
    w: IngestHost
    #: a changed log (:class:`ScheduleMismatch`) stops the worker: never retried
    fatal_restore_errors = (ScheduleMismatch,)

    def __init__(self, worker: IngestHost, topic: str, group: str, ckpt_topic: str) -> None:
        super().__init__(worker, topic, group, ckpt_topic)

    #: a consumer without a group that reads the log end offsets (read_uncommitted): the
    #: clock rule closes at the high watermark, so another producer's open transaction (which
    #: holds back the last stable offset) cannot move an honest event past the closing point
    hw: Any = None

    async def start(self) -> None:
        from agents.kafka.fetch_backoff import FETCHER_IDLE_MS, pace
        from agents.kafka.topics import check_events_topic, check_internal_topics

        await check_events_topic(self.s.bootstrap, self.s)
        # every entry point (stream-dp worker checks before it starts, too): a retention on the
        # schedule or checkpoint topics would lose the nonce, the closing points or the state
        await check_internal_topics(self.s.bootstrap, self.s)
        if self.s.privacy_unit == "user":
            from agents.ingest.users import table_status, user_bounds

            log.info("%s; privacy_unit = user: %s; each person's events are bounded per %s",
                     FAST_PATH_STATUS, table_status(user_bounds(self.s), self.s.user_field),
                     f"period of {self.s.user_period_ticks} ticks"
                     if self.s.user_period_ticks else "deployment")
        else:
            log.info("%s", FAST_PATH_STATUS)  # compiled ingest fast path, or why not
        await super().start()
        pace(self.consumer, INGEST_IDLE_GROWTH)
        k = _kafka()
        self.hw = k.AIOKafkaConsumer(
            bootstrap_servers=self.s.bootstrap, **self.w.kafka_kwargs(),
            isolation_level="read_uncommitted", enable_auto_commit=False,
            client_id=f"{self.s.app_id}-{self.name}-end-{self.s.worker_id}",
            consumer_timeout_ms=FETCHER_IDLE_MS,
        )
        await self.hw.start()

    async def run(self, stop: asyncio.Event) -> None:
        """The stage's loop, plus (clock schedule) a timer that reads the end offsets as soon
        as a tick's deadline + grace passes, not after the batch being processed: on CreateTime
        topics a busy worker would otherwise read them later, and a burst of junk could move
        an honest straggler across the closing point. On every schedule, the topic settings
        checked at start-up are read again every :data:`CONFIG_RECHECK_S` seconds."""
        tasks = [asyncio.create_task(self._recheck_configs(stop),
                                     name="stream-dp-ingest-configs")]
        if self.s.schedule == "clock":
            tasks.append(asyncio.create_task(self._clock_closes(stop),
                                             name="stream-dp-ingest-clock"))
        try:
            await super().run(stop)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task

    async def _recheck_configs(self, stop: asyncio.Event) -> None:
        """Read the events topic's timestamp type and the internal topics' retention settings
        again every :data:`CONFIG_RECHECK_S` seconds, and stop the worker (exit status 2, the
        start-up check's line) when an operator changed them under it: a retention given to
        the schedule topic while the worker runs deletes the nonce and the closing points
        before the next start could refuse it, and an events topic switched to CreateTime lets
        producers' stamps close ticks (issue #32 review). A broker that does not answer is
        tried again at the next round (the fetch loop reports an unreachable broker). One
        admin client serves every round (a new one per round cost a connection and a metadata
        request each time); it is replaced after a failure and closed at the stop."""
        from agents.kafka.topics import (
            TopicConfigMismatch,
            check_events_topic,
            check_internal_topics,
            started_admin,
        )

        admin: Any = None
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), CONFIG_RECHECK_S)
                if stop.is_set():
                    return
                try:
                    # short client timeouts: a broker that is away must not hold up a stop
                    if admin is None:
                        admin = await started_admin(self.s.bootstrap, self.s,
                                                     RECHECK_TIMEOUT_S)
                    await check_events_topic(self.s.bootstrap, self.s,
                                             timeout_s=RECHECK_TIMEOUT_S, admin=admin)
                    await check_internal_topics(self.s.bootstrap, self.s,
                                                timeout_s=RECHECK_TIMEOUT_S, admin=admin)
                except TopicConfigMismatch as exc:
                    if exc.unreported:  # a broker coming back may not report them yet
                        log.debug("ingest: topic configs not reported, trying again: %s", exc)
                        continue
                    self.w.fail(exc)
                    return
                except Exception as exc:  # unreachable broker: the next round tries again
                    log.debug("ingest: re-reading topic configs failed: %s", exc)
                    await _closed(admin)
                    admin = None
        finally:
            await _closed(admin)

    async def _clock_closes(self, stop: asyncio.Event) -> None:
        from agents.kafka.fetch_backoff import wake

        sch = self.w.schedule
        while not stop.is_set():
            now = time.time()
            due = sch.due_through(now)
            need = [p for p, st in list(self.states.items())
                    if not st.replaying and st.covered_through() < due]
            if need:
                k = _kafka()
                tps = [k.TopicPartition(self.topic, p) for p in need]
                try:
                    ends = await self.hw.end_offsets(tps)
                except Exception as exc:  # handle() reads them again on its next pass
                    log.debug("ingest: clock-close end offsets failed: %s", exc)
                    ends = {}
                ahead = False
                for tp, end_offset in ends.items():
                    state = self.states.get(tp.partition)
                    if state is not None:
                        state.schedule_close(due, int(end_offset), "clock", now)
                        ahead = ahead or int(end_offset) > int(state.offset)
                if ahead:  # records up to the closing point may wait in a fetch pause
                    wake(self.consumer)
                if ends:  # a close at the consumer's position applies without a record
                    self.wake_loop()
            # sleep until the next tick's deadline + grace (at most 1 s, to follow rebalances)
            nxt = sch.deadline(due + 1) + sch.grace - time.time()
            await asyncio.sleep(min(1.0, max(0.005, nxt)))

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            if self.hw is not None:
                with contextlib.suppress(Exception):
                    await self.hw.stop()

    async def close_clients(self) -> None:
        hw, self.hw = self.hw, None
        await super().close_clients()
        if hw is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(hw.stop(), timeout=0.2)

    #: seconds between two passes of the loop while a scheduled close waits for the consumer
    #: to reach its offset: a fetch of only a transaction's commit marker moves the position
    #: without returning a record, so no record would start the pass that applies the close
    CLOSE_POLL_S = 0.1

    def own_due_s(self, now: float) -> float:
        """A backlog of closed ticks to hand over: at once; a scheduled close not yet reached:
        :data:`CLOSE_POLL_S`; a dirty state: when its checkpoint is due (the pacing of
        :meth:`handle`); else nothing."""
        due = super().own_due_s(now)
        for p, state in list(self.states.items()):
            out = state.out
            if out.ticks_closed or len(out.dead_letters) >= 10_000 or (
                    state.unsent and not out.partials):
                return 0.0  # a commit or a hand-over step (the conditions of handle)
            if state.pending:
                due = min(due, self.CLOSE_POLL_S)
            if state.dirty:
                interval = max(self.s.commit_interval_s, 20.0 * self.encode_seconds.get(p, 0.0))
                due = min(due, self.last_commit.get(p, 0.0) + interval - now)
        return due

    def consumer_options(self) -> dict[str, Any]:
        """The events consumer yields aiokafka's decoded records as they are, without a
        ``ConsumerRecord`` per record (:mod:`agents.ingest.raw_records`; same batches, offsets and
        contents)."""
        from agents.ingest.raw_records import install, raw_records

        return {"value_deserializer": raw_records} if install() else {}

    def fetch_max_records(self) -> int:
        """With record blocks (one item per fetched batch, typically 100–500 records), one
        ``getmany`` returns at most ``max_batch / 100`` of them, so one handler call stays at
        about ``max_batch`` records (a few ms of compiled work, not the whole prefetch)."""
        from agents.ingest.records import RecordBlock

        if RecordBlock is not None:
            return max(1, int(self.s.max_batch) // 100)
        return int(self.s.max_batch)

    def new_state(self, p: int) -> IngestState:
        state = IngestState(self.s, self.w.router, p, key=self.w.key, domain_id=self.w.domain_id)
        state.hand_over_limit = max(1, HAND_OVER_PARTIALS // max(1, self.s.shards))
        if state.users is not None:  # the per-person table in its compacted changelog topic
            state.users.changelog = True
        return state

    def restore_state(self, state: Any, payload: bytes, seq: int) -> None:
        state.restore(payload, seq)

    async def seek_fresh(self, tp: Any) -> None:
        if self.s.events_start == "latest":
            await self.consumer.seek_to_end(tp)
        else:
            await self.consumer.seek_to_beginning(tp)

    async def after_restore(self, state: Any, from_checkpoint: bool) -> int | None:
        """Read back the persisted closing points of the partition and follow them.

        Without a checkpoint but with persisted points (a fresh deployment replaying a log that
        was released before), ingest starts where the first persisted range starts, so every
        decision is made again exactly as it was.
        """
        if state.users is not None and state.users.changelog:
            # the per-person table: its changelog partition to the end (committed records:
            # exactly the transactions whose checkpoint was just read, or older ones)
            changes = await read_all(self.reader, self.s.ingest_users_topic, state.partition)
            if changes and not from_checkpoint:
                raise ScheduleMismatch(
                    f"events partition {state.partition}: the per-person changelog "
                    f"{self.s.ingest_users_topic!r} holds records but the partition has no "
                    "checkpoint (a lost checkpoint topic?): counting again from the start "
                    "would give people budgets they spent; start a new deployment (stream-dp "
                    "deployment new)")
            state.load_user_changes([(r.key, r.value) for r in changes])
            point = state.flush_point
            # re-decide unless the table was written exactly here (a tick closed since, at
            # the same offset, may have forgotten a period's people: re-decided too)
            if from_checkpoint and point is not None and 0 <= point.offset <= state.offset \
                    and (point.offset, point.next_tick) != (state.offset, state.next_tick):
                await self._replay_users(state, point)

        # from the offset the checkpoint names (restore time independent of the deployment's
        # age); without a checkpoint, from the beginning
        entries = await self._entries(state.partition,
                                      state.schedule_from if from_checkpoint else 0)
        state.load_known(entries)
        if not from_checkpoint and state.known:
            first = state.known[0]
            if first.first != 1:
                raise ScheduleMismatch(
                    f"events partition {state.partition}: no checkpoint, and the persisted "
                    f"closing points start at tick {first.first}, not 1"
                )
            state.range_start = first.start_offset
            # how many entries: on a LogAppendTime backlog a record stamped past a deadline
            # closes ticks, so their number depends on where records are (operator only)
            many = f"{len(state.known)} " if self.s.metrics_event_counts else ""
            log.info("ingest partition %d: following %spersisted closing points (ticks "
                     "through %d)", state.partition, many, state.known[-1].through)
            return int(first.start_offset)
        return None

    async def _entries(self, partition: int, start: int) -> list[ScheduleEntry]:
        """The closing points persisted for ``partition`` on the schedule topic from offset
        ``start``, in write order (the deployment's nonce and settings records skipped)."""
        from agents.kafka.deployment_settings import SETTINGS_KEY
        from agents.kafka.nonce import NONCE_KEY

        records = await read_all(self.reader, self.s.schedule_topic, partition, start=start)
        key = entry_key(self.w.key)
        entries = []
        for r in records:
            if r.key in (NONCE_KEY, SETTINGS_KEY):
                continue  # the deployment nonce or settings (partition 0), not closing points
            try:
                entries.append(ScheduleEntry.decode(r.value, key))
            except ScheduleMismatch as exc:
                raise ScheduleMismatch(
                    f"schedule topic {self.s.schedule_topic!r} partition {partition}, "
                    f"offset {r.offset}: {exc}") from None
            except (ValueError, KeyError, TypeError):
                raise ScheduleMismatch(
                    f"schedule topic {self.s.schedule_topic!r} partition {partition}: "
                    f"unreadable entry at offset {r.offset}"
                ) from None
        return entries

    async def _replay_users(self, state: IngestState, point: Any) -> None:
        """The per-person table read back is as of its last write (``point``, before the
        checkpoint): re-decide the events since then into it
        (:mod:`agents.ingest.user_replay`)."""
        from agents.ingest.user_replay import TableReplay

        t0 = time.monotonic()
        replay = TableReplay(state, point, await self._entries(state.partition,
                                                               point.schedule_from))
        try:
            await read_range(self.reader, self.topic, state.partition, point.offset,
                             state.offset, replay.feed)
        except EOFError as end:
            raise self.ahead_of_log(self.topic, state.partition, state.offset,
                                    int(end.args[0]), state.seq) from None
        except LookupError:
            raise ScheduleMismatch(
                f"events partition {state.partition}: the events since the per-person table "
                "was last written are gone from the events topic (its retention shorter than "
                "the worker's lag + user_flush_interval_s + its downtime, or a deleted topic): "
                "the table cannot be brought to "
                "its checkpoint, and counting on without it would give people budgets they "
                "spent. Restore the topic, or start a new deployment (stream-dp deployment "
                "new)") from None
        replay.finish(state.offset)
        state.flushed_at = 0.0  # the re-decided table goes out with the next commit
        # how many records: a raw count (operator only, like the restore line's offsets)
        many = f"{replay.records} records " if self.s.metrics_event_counts else "the records "
        log.info("ingest partition %d: re-decided %ssince the per-person table was last "
                 "written, in %.3f s", state.partition, many, time.monotonic() - t0)

    def positioned(self, state: Any) -> None:
        if state.flush_point is None and state.users is not None and state.users.changelog:
            # no checkpoint: the table is empty here and so is its changelog (after_restore
            # checked), i.e. written as of this offset; the first commit need not write it
            state.written_empty()

    def log_positions(self) -> bool:
        # the events partition's offset and the number of ingest commits move with raw
        # counts (with one declared stream, two restarts' offsets differ by its raw count;
        # ingest commits follow the arrival of records): operator-only, like
        # stream_dp_consumer_lag_messages and stream_dp_ingest_checkpoint_seconds
        return bool(self.s.metrics_event_counts)

    async def handle(self, batch: dict[Any, list[Any]]) -> None:
        for tp, records in batch.items():
            state = self.states.get(tp.partition)
            if state is None:
                continue  # revoked meanwhile
            self.w.processed += state.process_fetched(records)
        lag = 0
        jobs = []
        clock = self.s.schedule == "clock"
        now = time.time()
        due = self.w.schedule.due_through(now) if clock else 0
        need_end: list[Any] = []
        k = _kafka()
        for p, state in list(self.states.items()):
            tp = k.TopicPartition(self.topic, p)
            try:
                pos = await self.consumer.position(tp)
            except Exception:  # not assigned any more (rebalance in progress)
                pos = None
            if pos is not None:
                if state.range_start < 0:
                    state.range_start = pos
                state.advance_to(pos)  # skips transaction markers; applies reached closes
            end = self.consumer.last_stable_offset(tp)
            if end is None:
                end = self.consumer.highwater(tp)
            if end is not None and pos is not None:
                lag += max(0, end - pos)
            if clock and not state.replaying and state.covered_through() < due:
                need_end.append(tp)
        if need_end:
            # The clock passed a deadline (+ grace): the records appended until now belong to
            # the closing ticks. Read the end offsets now, never from an older fetch response,
            # and read the high watermark (the log end), not the last stable offset: an open
            # transaction of any producer must not push honest records past the closing point.
            # Records of a transaction still open there count if it commits (their own fate);
            # the tick is released once the consumer has read up to the closing point.
            try:
                ends = await self.hw.end_offsets(need_end)
            except Exception as exc:
                log.warning("ingest: reading end offsets failed (%s); retrying", exc)
                ends = {}
            for tp, end_offset in ends.items():
                state = self.states.get(tp.partition)
                if state is not None and state.schedule_close(due, int(end_offset), "clock", now):
                    state.apply_due()
        backlog = 0
        for p, state in list(self.states.items()):
            out = state.out
            if state.unsent and not out.partials:  # a backlog of closed ticks: one more step
                state.hand_over(state.hand_over_limit)
            backlog += state.unsent_ticks
            # A large open state (10^5 open keys: ~0.1 s to encode) is checkpointed at most
            # every 20x its encoding time between tick closes: checkpoints cost <= 5% of the
            # loop, and at a tick close it is written anyway.
            interval = max(self.s.commit_interval_s, 20.0 * self.encode_seconds.get(p, 0.0))
            due_commit = time.monotonic() - self.last_commit.get(p, 0.0) >= interval
            if out.ticks_closed or len(out.dead_letters) >= 10_000 or (
                    state.dirty and due_commit):
                jobs.append(self._commit(p, state))
        self.w.metrics.set_consumer_lag(lag)
        self._report_hand_over(backlog)
        if jobs:
            await asyncio.gather(*jobs)

    #: (monotonic time of the last hand-over progress line, ticks left then)
    _hand_over_said: tuple[float, int] = (0.0, 0)

    def _report_hand_over(self, left: int) -> None:
        """While closed ticks wait to be handed over (a backlog), one line at most every
        :data:`HAND_OVER_EVERY_S` seconds saying how many are left; one line when done."""
        now = time.monotonic()
        said, before = self._hand_over_said
        if left and (not before or now - said >= HAND_OVER_EVERY_S):
            waiting = [st.unsent_ticks for st in self.states.values() if st.unsent]
            log.info("ingest: handing over closed ticks: %d ticks left (%d tick-partitions on %d "
                     "events partitions)", max(waiting, default=0), left, len(waiting))
            self._hand_over_said = (now, left)
        elif not left and before:
            log.info("ingest: every closed tick handed over")
            self._hand_over_said = (now, 0)

    async def flush_all(self) -> None:
        # a graceful stop or hand-over writes the per-person tables too: the next owner
        # re-decides nothing
        await asyncio.gather(
            *(self._commit(p, st, flush_users=True) for p, st in list(self.states.items())
              if st.dirty or st.user_unflushed())
        )

    async def _commit(self, p: int, state: IngestState, flush_users: bool = False) -> None:
        prod = self.producers.get(p)
        if prod is None:
            return
        s = self.s
        out = state.out
        t0 = time.monotonic()
        marks = [time.time()]
        # what this transaction's checkpoint says is handed over (read before the awaits)
        through = state.handed_over_through()
        # the people changed since the last commit (lost with the transaction if it fails:
        # the restore that follows reads the table back from the committed changelog)
        t_table = time.perf_counter()
        user_changes = state.user_changes() if state.users is not None and (
            state.users.changelog) and (flush_users or state.user_flush_due(
                s.user_flush_interval_s)) else []
        table_s = time.perf_counter() - t_table
        try:
            await prod.begin_transaction()
            for key, rej, raw, offset in out.dead_letters:
                msg = dlq_message(rej, raw, s.events_topic, p, offset)
                await prod.send(s.dlq_topic, encode(msg), key=dlq_key(key))
            for part in out.partials:
                await prod.send(
                    s.partials_topic, part.encode(), key=str(part.tick).encode(),
                    partition=part.shard,
                )
            entry_sends = []
            for entry in out.entries:
                entry_sends.append(await prod.send(
                    s.schedule_topic, entry.encode(state.entry_key),
                    key=f"{s.app_id}/{s.events_topic}/{p}".encode(), partition=p,
                ))
            # whole record batches: one send per person was most of a user-level worker's CPU
            await send_batched(prod, s.ingest_users_topic, p, user_changes)
            marks.append(time.time())
            await self._send_checkpoint(prod, p, state)
            # the per-person changelog is the table's part of the checkpoint and paces the
            # commits with it (~0.9 s of CPU at 10^6 people changed: one record each)
            self.encode_seconds[p] = self.encode_seconds.get(p, 0.0) + table_s
            marks.append(time.time())
            await prod.commit_transaction()
            state.mark_written(through)
            marks.append(time.time())
            if out.partials:
                self.w.partials_committed()
            if entry_sends:
                # every closing point needed after a restore from a later checkpoint lies past
                # these: the next checkpoint says where to start reading the schedule topic
                metas = await asyncio.gather(*entry_sends)
                state.schedule_from = max(state.schedule_from,
                                          max(int(m.offset) for m in metas) + 1)
            self.offsets_committed_later(p, state.offset)
            closes = {part.tick: part.closed_at for part in out.partials}
            for tick, closed_at in sorted(closes.items()):
                self.w.ingest_timings.append({
                    "tick": tick, "partition": p, "to_commit": marks[0] - closed_at,
                    "outputs": marks[1] - marks[0], "checkpoint": marks[2] - marks[1],
                    "commit": marks[3] - marks[2]})
        except Exception as exc:
            with contextlib.suppress(Exception):
                await prod.abort_transaction()
            await self._recover(p, exc)
            return
        m = self.w.metrics
        m.ingest_checkpoint_written(time.monotonic() - t0)
        if out.accepted:
            m.event_accepted(out.accepted)
        if out.late:
            m.event_late(out.late)
        if out.bounded:
            m.user_bounded(out.bounded)
        reasons: dict[str, int] = {}
        for _, rej, _, _ in out.dead_letters:
            if rej.reason not in ("late", "tick_closed"):
                reasons[rej.reason] = reasons.get(rej.reason, 0) + 1
        for reason, n in reasons.items():
            m.event_dead_lettered(reason, n)
        closed = sum(1 for _, rej, _, _ in out.dead_letters if rej.reason == "tick_closed")
        if closed:
            self.w.stats["tick_closed"] += closed
        if closed and s.metrics_event_counts:
            # whether a record reached its partition after its tick closed is a raw fact of the
            # data (one late event more or less decides it), like the event counters: the line is
            # operator-only (metrics_event_counts); by default the dead letters themselves (the
            # dead-letter topic, `stream-dp tail dlq`) say it, and replay refuses a second copy
            # of a replayed log up front (rate-limited like every warning)
            log.warning("ingest partition %d: %d events for ticks already closed (next open tick "
                        "%d) went to %s as tick_closed (%d so far): %s", p, closed,
                        state.next_tick, s.dlq_topic, self.w.stats["tick_closed"],
                        "a log replayed again into this markers deployment's topic; its ticks "
                        "are released already, nothing new is: replay into a fresh deployment"
                        if s.schedule == "markers" else
                        "records that reached the partition after their tick closed (a "
                        "producer flushing late, CreateTime stamps in the past)")
        self.w.stats["accepted"] += out.accepted
        self.w.stats["clamped"] += out.clamped
        self.w.stats["dead_letters"] += len(out.dead_letters)
        self.w.stats["partition_ticks_closed"] += out.ticks_closed
        out.clear()
        state.dirty = False
        self.last_commit[p] = time.monotonic()
