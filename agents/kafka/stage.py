"""The machinery both pipeline stages share (:class:`_Stage`).

A group consumer, one transactional producer per assigned partition, checkpoint restore
and seek on assignment, fencing, liveness and ownership checks, background offset
commits. The exactly-once design is described in :mod:`agents.worker.pipeline`; the two
stages are :mod:`agents.ingest.stage` and :mod:`agents.release.stage`. A stage sees of the
process that runs it only a :class:`StageHost` (each stage adds the few members it needs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

from agents.kafka.checked_producer import TransactionRecordFailed, _CheckedProducer
from agents.kafka.checkpoint_reader import read_latest_with_progress
from agents.kafka.checkpoints import CheckpointRefused, Progress, chunk_messages
from agents.kafka.fetch_backoff import FETCHER_IDLE_MS
from agents.kafka.groups import leave_group
from agents.kafka.stage_health import StageHealth
from agents.kafka.stage_host import StageHost
from stream_dp.integrity import IntegrityError

log = logging.getLogger("stream_dp.pipeline")

#: the longest a stage's loop waits for records while nothing of its own is due (seconds). It runs
#: when records come, at its own next deadline (:meth:`_Stage.next_due_s`: a commit, a health
#: check, a restore to retry, a close waiting for its offset), when woken
#: (:meth:`_Stage.wake_loop`: a clock close, an assignment, a failure, a stop), and after this
#: long at the latest. It used to wait 0.1 s at most: an idle worker's two stages ran their
#: loops 20 times a second whatever the tick length (issue #35)
IDLE_WAIT_MAX_S = 5.0
#: ... and the shortest (seconds): work due at once (a backlog's next step) still lets the
#: loop wait this long for records, so a condition that stays due cannot spin it
IDLE_WAIT_MIN_S = 0.01

#: a commit that fails this many times in a row on one partition with the same non-Kafka error
#: (a bug in a step or an encoder: the restore repeats it) stops the worker
BUG_RETRIES = 3


def _maybe_transient(exc: BaseException) -> bool:
    """An error that is not a Kafka error but may still come from the network or the client
    (an outage, a shutdown): an OSError or timeout, or one raised inside aiokafka. Never counted
    as a bug that stops the worker."""
    if isinstance(exc, OSError | TimeoutError | asyncio.TimeoutError):
        return True
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and "aiokafka" in last.tb_frame.f_code.co_filename


class CommitBug(RuntimeError):
    """One partition's commit failed :data:`BUG_RETRIES` times in a row with the same non-Kafka
    error; the worker stops (one line; the warning before it carries the traceback)."""

# ---------------------------------------------------------------------- Kafka plumbing
def _kafka() -> Any:
    import aiokafka

    return aiokafka


def _listener(stage: _Stage) -> Any:
    """A rebalance listener forwarding to ``stage`` (aiokafka awaits these coroutines)."""
    from aiokafka.abc import ConsumerRebalanceListener

    class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        async def on_partitions_revoked(self, revoked: Iterable[Any]) -> None:
            await stage.revoked(list(revoked))

        async def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
            await stage.assigned(list(assigned))

    return _Listener()


class _Stage(StageHealth):
    """Common machinery: group consumer, per-partition transactional producers, restore."""

    name = "stage"
    #: errors of a restore that stop the process at once instead of being retried (besides a
    #: refused checkpoint); the ingest stage's changed log, for one
    fatal_restore_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, worker: StageHost, topic: str, group: str, ckpt_topic: str) -> None:
        self.w = worker
        self.s = worker.settings
        self.topic = topic
        self.group = group
        self.ckpt_topic = ckpt_topic
        self.lock = asyncio.Lock()
        self.states: dict[int, Any] = {}
        self.producers: dict[int, Any] = {}
        self.last_commit: dict[int, float] = {}
        self.encode_seconds: dict[int, float] = {}
        #: per partition: the last unexpected (non-Kafka) commit failure and how many times in a
        #: row it happened; reset by a committed transaction
        self._bug_failures: dict[int, tuple[str, int]] = {}
        #: when each partition's consumed offset was last committed (monotonic s)
        self._offsets_at: dict[int, float] = {}
        self._offset_tasks: set[asyncio.Future[None]] = set()
        #: partition -> (state, producer) revoked by a rebalance in progress
        self.parked: dict[int, tuple[Any, Any]] = {}
        self.restoring = True
        self._retry_at = 0.0
        self.consumer: Any = None
        self.reader: Any = None
        self.member_id = ""
        #: partition -> (last committed offset seen, monotonic time it was first seen)
        self._progress: dict[int, tuple[int, float]] = {}
        self._next_owner_check = 0.0
        self._rejoin_after = 0.0
        #: partition -> (state offset, end offset then, since when, last warned): liveness
        self._liveness: dict[int, tuple[int, int, float, float]] = {}
        self._next_liveness = 0.0
        #: assignments handled and partitions restored (sought) so far: a fetch that began
        #: before one may hold records from before the seek
        self.repositioned = 0
        #: set to end the loop's wait for records (:meth:`wake_loop`)
        self._woken = asyncio.Event()
        #: the loop's waits for records that ended without records (idle passes; tests and
        #: benchmarks compare them, nothing exports them)
        self.idle_passes = 0

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        k = _kafka()
        s = self.s
        session_ms = int(s.session_timeout_s * 1000)
        self.reader = k.AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap,
            **self.w.kafka_kwargs(),
            isolation_level="read_committed",
            enable_auto_commit=False,
            client_id=f"{s.app_id}-{self.name}-ckpt-{s.worker_id}",
            consumer_timeout_ms=FETCHER_IDLE_MS,
            fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
        )
        await self.reader.start()
        self.consumer = k.AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap,
            **self.w.kafka_kwargs(),
            group_id=self.group,
            group_instance_id=s.worker_id,
            client_id=f"{s.app_id}-{self.name}-{s.worker_id}",
            consumer_timeout_ms=FETCHER_IDLE_MS,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=max(100, session_ms // 10),
            rebalance_timeout_ms=max(session_ms, 30000),
            max_poll_records=s.max_batch,
            max_partition_fetch_bytes=4 * 1024 * 1024,
            **self.consumer_options(),
        )
        await self._check_partitions()
        self.consumer.subscribe([self.topic], listener=_listener(self))
        await self.consumer.start()

    async def _check_partitions(self) -> None:
        """Refuse to start if the input or checkpoint topic has an unexpected partition count.

        Ingest checkpoints and release shards are tied to partition numbers, so a mismatch
        would mix up state (run ``stream-dp topics`` or fix the settings).
        """
        await self.reader.topics()
        for topic in (self.topic, self.ckpt_topic):
            parts = self.reader.partitions_for_topic(topic)
            if not parts:
                raise RuntimeError(
                    f"topic {topic!r} does not exist; create the topics first (stream-dp topics)"
                )
            if len(parts) != self.expected_partitions:
                raise ValueError(
                    f"topic {topic!r} has {len(parts)} partitions, the settings expect "
                    f"{self.expected_partitions}"
                )

    @property
    def expected_partitions(self) -> int:
        return self.s.events_partitions if self.name == "ingest" else self.s.shards

    async def stop(self) -> None:
        async with self.lock:
            with contextlib.suppress(Exception):
                await self.flush_all()
            for p in list(self.states):
                await self._drop(p)
            for _, prod in self.parked.values():
                with contextlib.suppress(Exception):
                    await prod.stop()
            self.parked = {}
        coord = getattr(self.consumer, "_coordinator", None)
        self.member_id = str(getattr(coord, "member_id", "") or "")
        try:
            if self.consumer is not None:
                with contextlib.suppress(Exception):
                    await self.consumer.stop()
        finally:  # the reader too, whatever happened to the consumer's stop
            if self.reader is not None:
                with contextlib.suppress(Exception):
                    await self.reader.stop()
        await leave_group(self.s.bootstrap, self.group, self.member_id, self.w.security)

    async def close_clients(self) -> None:
        """Close every Kafka client of the stage without waiting for the broker (a stop that
        ran out of time): aiokafka marks a client closed before its first await, so no
        'Unclosed AIOKafka...' warnings follow, and the half-done close is abandoned."""
        clients = [self.consumer, self.reader, *self.producers.values(),
                   *(prod for _, prod in self.parked.values())]
        self.producers, self.parked, self.states = {}, {}, {}
        for client in clients:
            if client is None:
                continue
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(client.stop(), timeout=0.2)

    async def flush_all(self) -> None:
        """Commit pending work of every partition (graceful shutdown)."""

    # -- rebalance ------------------------------------------------------------------------
    async def revoked(self, tps: list[Any]) -> None:
        """Before a rebalance: commit pending work, then park the revoked partitions' state.

        With the eager protocol every rebalance revokes everything first; a partition that
        comes straight back in :meth:`assigned` keeps its in-memory state and producer (no
        other worker can have owned it in between), the others are closed.
        """
        self.restoring = True
        self.w.update_ready()
        async with self.lock:
            with contextlib.suppress(Exception):
                await self.flush_all()
            for tp in tps:
                p = tp.partition
                if p in self.states and p in self.producers:
                    self.parked[p] = (self.states.pop(p), self.producers.pop(p))
                else:
                    await self._drop(p)

    async def assigned(self, tps: list[Any]) -> None:
        async with self.lock:
            wanted = {tp.partition: tp for tp in tps}
            parked, self.parked = self.parked, {}
            for p, (state, prod) in parked.items():
                if p in wanted and p not in self.states:
                    self.states[p] = state
                    self.producers[p] = prod
                    if state.offset >= 0:
                        self.consumer.seek(wanted[p], state.offset)
                else:
                    with contextlib.suppress(Exception):
                        await prod.stop()
            for p, tp in sorted(wanted.items()):
                if p not in self.states:
                    await self._try_restore(tp)
            self.repositioned += 1
            self.restoring = False
        self.w.update_ready()
        # restored and sought: fetch from the new positions now (not after a fetch pause), and
        # let the loop see the new partitions (a clock close they need, their health checks)
        from agents.kafka.fetch_backoff import wake

        wake(self.consumer)
        self.wake_loop()
        log.info(
            "%s: assigned partitions %s", self.name, sorted(tp.partition for tp in tps)
        )

    async def _drop(self, p: int) -> None:
        self.states.pop(p, None)
        prod = self.producers.pop(p, None)
        if prod is not None:
            with contextlib.suppress(Exception):
                await prod.stop()

    async def _producer(self, p: int) -> Any:
        k = _kafka()
        s = self.s
        prod = _CheckedProducer(k.AIOKafkaProducer(
            bootstrap_servers=s.bootstrap,
            **self.w.kafka_kwargs(),
            transactional_id=f"{s.app_id}.{self.name}.{p}",
            transaction_timeout_ms=int(s.transaction_timeout_s * 1000),
            client_id=f"{s.app_id}-{self.name}-{p}-{s.worker_id}",
            linger_ms=5,
            max_batch_size=1024 * 1024,
            max_request_size=16 * 1024 * 1024,
        ))
        await prod.start()
        try:
            # Initialise the transactional id: fences the previous owner and aborts its open
            # transaction, so the checkpoint read below sees every committed write.
            await prod.begin_transaction()
            await prod.abort_transaction()
        except BaseException:
            with contextlib.suppress(Exception):
                await prod.stop()
            raise
        return prod

    async def _restore(self, tp: Any) -> None:
        p = tp.partition
        t0 = time.monotonic()
        prod = await self._producer(p)
        self.producers[p] = prod
        ck, progress = await read_latest_with_progress(self.reader, self.ckpt_topic, p)

        def build() -> Any:
            if ck is None:
                return self.new_state(p)
            state = self.state_to_restore(p)
            self.restore_state(state, ck.payload, ck.seq)
            if progress is not None:
                self.restore_progress(state, progress)
            return state

        if self.restore_in_thread():
            # seconds of CPU per partition at 10^7 streams: off the event loop, so that the
            # group's heartbeats (and the other stages) go on while it runs
            self.before_restore_thread()
            state = await asyncio.to_thread(build)
        else:
            state = build()
        start = await self.after_restore(state, ck is not None)
        if start is not None:
            state.offset = start
        if state.offset >= 0:
            await self._check_not_ahead(tp, state.offset, ck.seq if ck else None)
            self.consumer.seek(tp, state.offset)
        else:
            await self.seek_fresh(tp)
            state.offset = await self.consumer.position(tp)
        self.positioned(state)
        self.states[p] = state
        self.repositioned += 1
        self.last_commit[p] = time.monotonic()
        if self.log_positions():
            log.info(
                "%s partition %d restored (checkpoint seq %s, offset %d) in %.3f s",
                self.name, p, ck.seq if ck else None, state.offset, time.monotonic() - t0,
            )
        else:
            log.info("%s partition %d restored (%s) in %.3f s", self.name, p,
                     "from its checkpoint" if ck else "no checkpoint", time.monotonic() - t0)

    def log_positions(self) -> bool:
        """Whether the restore line may show the input offset and the checkpoint's sequence
        number. A stage whose input offsets count raw records (ingest: the events topic)
        shows them only to operators who asked for raw counts (``metrics_event_counts``)."""
        return True

    async def after_restore(self, state: Any, from_checkpoint: bool) -> int | None:
        """Stage hook after the checkpoint is read; may return the offset to start from."""
        return None

    def positioned(self, state: Any) -> None:
        """Stage hook once a restored state knows the input offset it starts from."""

    async def _check_not_ahead(self, tp: Any, offset: int, seq: int | None) -> None:
        """Refuse state that is ahead of its log: a checkpoint that has consumed the partition
        up to ``offset`` while the partition now ends before it. The broker lost records it had
        acknowledged (the development broker killed with kill -9, docs/operations.md); seeking
        there would wait forever for records that never come — or, reset to the beginning,
        count them twice. One line and exit status 4 instead of a silent stall."""
        end = (await self.consumer.end_offsets([tp]))[tp]
        if offset > end:
            raise self.ahead_of_log(tp.topic, tp.partition, offset, end, seq)

    def ahead_of_log(self, topic: str, partition: int, offset: int, end: int,
                     seq: int | None) -> CheckpointRefused:
        """The one-line refusal (exit status 4) of a checkpoint that has consumed ``topic``
        up to ``offset`` while the partition now ends at ``end``, before it."""
        return CheckpointRefused(
            f"{self.name} partition {partition}: the checkpoint (seq {seq}) is ahead of "
            f"the log: it has consumed {topic} up to offset {offset}, but the partition "
            f"ends at {end}. The broker lost records it had acknowledged (a development "
            "broker killed with kill -9 can: docs/operations.md); the state cannot be "
            "continued. Start a new deployment (stream-dp deployment new), or restore "
            "the broker's data")

    async def _try_restore(self, tp: Any) -> None:
        """Restore ``tp``; on failure log it and leave it to :meth:`_retry_missing`.

        An error the stage marks fatal (:attr:`fatal_restore_errors`) is not retried: the
        worker stops with it, because continuing would publish under a broken guarantee. So is a
        checkpoint that fails authentication or was written under another configuration
        (:class:`~agents.kafka.checkpoints.CheckpointRefused`,
        :class:`~stream_dp.integrity.IntegrityError`):
        the worker must not start with it, and retrying cannot change it.
        """
        try:
            await self._restore(tp)
        except self.fatal_restore_errors as exc:
            await self._drop(tp.partition)
            self.w.fail(exc)
        except (CheckpointRefused, IntegrityError) as exc:
            await self._drop(tp.partition)
            self.w.release_error("checkpoint_refused")
            refused = exc if isinstance(exc, CheckpointRefused) else CheckpointRefused(
                f"{self.name} partition {tp.partition}: refusing the checkpoint: {exc}"
            )
            self.w.fail(refused)
        except Exception as exc:
            await self._drop(tp.partition)
            self._retry_at = time.monotonic() + 1.0
            log.error("%s partition %d: restore failed (%s: %s); retrying", self.name,
                      tp.partition, type(exc).__name__, exc)

    def missing(self) -> list[int]:
        """Assigned partitions without restored state (a failed restore awaiting retry)."""
        if self.consumer is None:
            return []
        try:
            assigned = self.consumer.assignment()
        except Exception:
            return []
        return sorted(tp.partition for tp in assigned if tp.partition not in self.states)

    async def _retry_missing(self) -> None:
        """Restore assigned partitions whose restore failed earlier (at most once a second)."""
        if self.restoring or time.monotonic() < self._retry_at:
            return
        for tp in sorted(self.consumer.assignment(), key=lambda t: t.partition):
            if tp.partition not in self.states:
                await self._try_restore(tp)

    async def _recover(self, p: int, exc: BaseException) -> None:
        """A commit failed (e.g. fenced): drop the partition's state, restore it if still ours."""
        too_large = _kafka().errors.MessageSizeTooLargeError
        if isinstance(exc, TransactionRecordFailed) and any(
                isinstance(e, too_large) for e in exc.causes):
            # Not transient: the same records fail again after any restore. Stop, loudly.
            self.w.release_error("record_too_large")
            self.w.fail(RuntimeError(
                f"{self.name} partition {p}: {exc}. A record exceeds a topic's max.message.bytes "
                "(checkpoint_chunk_bytes, or a compact record of a large shard): raise the "
                "topic's limit or lower the setting ('stream-dp topics create' sets the limits "
                "it knows)"))
            return
        # A broker-side failure (fenced, timed out) is expected and needs no traceback; any
        # other exception is a bug in a step or an encoder, and the traceback is the only
        # way to diagnose it after the fact (an intermittent demo failure once logged just
        # 'commit failed (UFuncTypeError)').
        expected = isinstance(exc, (_kafka().errors.KafkaError, TransactionRecordFailed))
        what, detail = type(exc).__name__, str(exc)
        if detail.startswith(what):  # aiokafka's errors already name their class
            what = detail
        elif detail:
            what = f"{what}: {detail}"
        if not expected and not _maybe_transient(exc):
            last, n = self._bug_failures.get(p, ("", 0))
            n = n + 1 if last == what else 1
            self._bug_failures[p] = (what, n)
            if n >= BUG_RETRIES:
                # The same tick from the same checkpoint fails the same way: retrying for ever
                # would be a silent loop (no tick released). Stop and say so.
                log.warning("%s partition %d: commit failed (%s)", self.name, p, what,
                            exc_info=exc)
                self.w.release_error("commit_bug")
                self.w.fail(CommitBug(
                    f"{self.name} partition {p}: commit failed {n} times in a row with {what}: "
                    "not a broker problem but a bug, and restoring from the checkpoint repeats "
                    "it; stopping instead of retrying for ever (the log has the traceback; "
                    "please report it with the log)"))
                return
        log.warning("%s partition %d: commit failed (%s); restoring from checkpoint",
                    self.name, p, what, exc_info=None if expected else exc)
        await self._drop(p)
        causes = exc.causes if isinstance(exc, TransactionRecordFailed) else []
        if any(type(e).__name__ == "ProducerFenced" for e in (exc, *causes)):
            # Another worker owns the partition now (we were a zombie; the fencing may also come
            # as the records' error of a checked transaction). Do not fence it back:
            # our consumer learns of the new assignment at its next heartbeat and rejoins.
            return
        tp = _kafka().TopicPartition(self.topic, p)
        if tp in self.consumer.assignment():
            await self._try_restore(tp)

    async def _send_checkpoint(self, prod: Any, p: int, state: Any) -> None:
        state.seq += 1
        t0 = time.perf_counter()
        payload = state.to_bytes()
        #: seconds the last checkpoint of each partition took to encode (commit pacing)
        self.encode_seconds[p] = time.perf_counter() - t0
        for key, value, headers in chunk_messages(
            state.seq, payload, self.s.checkpoint_chunk_bytes
        ):
            await prod.send(self.ckpt_topic, value, key=key, partition=p, headers=headers)

    def offsets_committed_later(self, p: int, offset: int) -> None:
        """After a transaction committed: record ``offset`` as the group's committed offset of
        partition ``p``, in the background, at most once per second per partition.

        The checkpoint in the transaction holds the offset a restarted worker seeks to; the
        group's committed offsets serve lag monitoring and the ownership check only. Inside the
        transaction they would cost two broker round trips on every tick's latency path."""
        self._bug_failures.pop(p, None)
        now = time.monotonic()
        if now - self._offsets_at.get(p, -1e9) < min(1.0, self.s.stall_timeout_s / 4):
            return
        if self.restoring:  # a rebalance in progress: the commit would be refused anyway
            return
        self._offsets_at[p] = now
        consumer = self.consumer
        tp = _kafka().TopicPartition(self.topic, p)

        async def commit() -> None:
            try:
                await consumer.commit({tp: offset})
            except Exception as exc:  # a rebalance in progress, a lost partition: next time
                log.debug("%s: offset commit of partition %d skipped: %s", self.name, p, exc)

        task = asyncio.ensure_future(commit())
        self._offset_tasks.add(task)
        task.add_done_callback(self._offset_tasks.discard)

    # -- to implement ----------------------------------------------------------------------
    def consumer_options(self) -> dict[str, Any]:
        """Extra keyword arguments of the stage's input consumer (none by default)."""
        return {}

    def fetch_max_records(self) -> int:
        """The most items one ``getmany`` returns (records: ``max_batch``)."""
        return int(self.s.max_batch)

    def new_state(self, p: int) -> Any:
        raise NotImplementedError

    def state_to_restore(self, p: int) -> Any:
        """The state :meth:`restore_state` fills from a checkpoint (default :meth:`new_state`;
        a stage may leave out what the checkpoint replaces)."""
        return self.new_state(p)

    def restore_in_thread(self) -> bool:
        """Whether a partition's state is built and restored in a worker thread (default no:
        the stage's state must then be safe to build beside the event loop)."""
        return False

    def before_restore_thread(self) -> None:
        """Stage hook on the event loop before a restore thread starts (warm shared caches)."""

    def restore_state(self, state: Any, payload: bytes, seq: int) -> None:
        raise NotImplementedError

    def restore_progress(self, state: Any, progress: Progress) -> None:
        raise CheckpointRefused(f"{self.name}: a progress record in {self.ckpt_topic}, which "
                                "only release checkpoints have")

    async def seek_fresh(self, tp: Any) -> None:
        await self.consumer.seek_to_beginning(tp)

    async def handle(self, batch: dict[Any, list[Any]]) -> None:
        raise NotImplementedError

    def own_due_s(self, now: float) -> float:
        """Seconds (monotonic ``now``) until the stage's own work needs its loop though no
        record comes (a commit due, a backlog step); :data:`IDLE_WAIT_MAX_S` if none."""
        return IDLE_WAIT_MAX_S

    def next_due_s(self, now: float) -> float:
        """Seconds until the loop must run again though no record comes: the health checks
        (:meth:`check_ownership`, :meth:`check_liveness`), a failed restore's retry and
        :meth:`own_due_s`; at most :data:`IDLE_WAIT_MAX_S`, at least 0. A check already past
        its time (it runs at the next pass) does not count: it would make every pass due."""
        due = min(IDLE_WAIT_MAX_S, self.own_due_s(now))
        checks = [self._next_owner_check - now]
        if self.states:
            checks.append(self._next_liveness - now)
        if not self.restoring and self.missing():
            checks.append(self._retry_at - now)
        for left in checks:
            if left > 0:
                due = min(due, left)
        return max(0.0, due)

    def wake_loop(self) -> None:
        """End the loop's wait for records now: work that does not come as a record of the
        input (a clock close to apply, a failure to raise, a stop)."""
        self._woken.set()

    async def _next_batch(self) -> dict[Any, list[Any]]:
        """The next records: what is buffered, else a wait for records until
        :meth:`next_due_s` or a :meth:`wake_loop` (:func:`~agents.kafka.reading.getmany_or_wake`)."""
        from agents.kafka.reading import getmany_or_wake

        wait = max(IDLE_WAIT_MIN_S, self.next_due_s(time.monotonic()))
        batch = await getmany_or_wake(self.consumer, self._woken, wait,
                                      self.fetch_max_records())
        self._woken.clear()
        if not batch:
            self.idle_passes += 1
        return batch

    # -- main loop ----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: self.wake_loop())
        try:
            await self._loop(stop)
        finally:
            stopping.cancel()

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.w.fatal is not None:
                raise self.w.fatal
            seen = self.repositioned
            try:
                batch = await self._next_batch()
            except Exception as exc:
                if stop.is_set():
                    break
                log.warning("%s: fetch failed: %s", self.name, exc)
                await asyncio.sleep(0.5)
                continue
            async with self.lock:
                await self._retry_missing()
                if batch and seen != self.repositioned:
                    # Fetched while partitions were being assigned or restored: aiokafka starts
                    # fetching a newly assigned partition at the group's committed offset before
                    # the restore seeks it to its checkpoint's offset. Those records may lie past
                    # the restored state's offset (a release shard re-stepping since its last
                    # full checkpoint): processing them would skip the records in between.
                    # Fetch again from each state's own offset.
                    for tp in batch:
                        state = self.states.get(tp.partition)
                        if state is not None and state.offset >= 0:
                            self.consumer.seek(tp, state.offset)
                    batch = {}
                await self.handle(batch)
            try:
                await self.check_ownership()
            except Exception as exc:  # diagnostics only: never stop the stage for it
                log.debug("%s: ownership check failed: %s", self.name, exc)
            try:
                await self.check_liveness()
            except Exception as exc:  # diagnostics only
                log.debug("%s: liveness check failed: %s", self.name, exc)
