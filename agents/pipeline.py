"""The worker pipeline: events → ticks → noisy releases, with an exactly-once effect.

Two stages run in every worker; each is a consumer group, so partitions (and with them state)
spread over the workers of a deployment:

1. **Ingest** (group ``<app_id>.ingest``, one state per events partition,
   :class:`agents.ingest.IngestState`): decode, validate, clamp, bucket by the tick of each
   event's own time; lateness from each record's own Kafka timestamp. Ticks close at public
   closing points (:mod:`agents.ticks`): on the ``clock`` schedule, once the clock has passed a
   tick's deadline + grace, at the partition's end offset read then (or earlier at a broker
   timestamp past the deadline); on the ``markers`` schedule at replay close markers. At every
   tick close it emits to **every** release shard one *partial* (the partition's raw per-node
   sums for that tick, possibly empty) on the internal topic ``dp.partials.v1``, partition =
   shard, and persists the closing point with a digest of the records it covers on the schedule
   topic. Rejected records go to ``dp.events.dlq``.
2. **Release** (group ``<app_id>.release``, one state per shard, :class:`agents.release.ReleaseState`):
   when tick ``n``'s partials from all events partitions are in, sum them in partition order,
   step the shard's :class:`~stream_dp.counters.CounterBank` over **every** declared stream
   of the shard (zeros included) and publish one ``dp.counts.v1`` message per stream.

Why a re-partition stage: an event feeds several released nodes (leaf and ancestors, or total,
marginals and cell) that live in different shards; the root is fed by every event. The partials
topic carries raw per-tick counts: it is internal, read only by the release stage inside
transactions, short-lived (``partials_retention_s``), and documented as the single exception in
``docs/configuration.md`` ("Internal topics and raw counts").

**Exactly-once effect.** Every stage partition has its own transactional producer
(``transactional.id = <app_id>.<stage>.<partition>``). One Kafka transaction holds, atomically,
the outputs (partials and dead letters, or counts), the stage partition's checkpoint (in a
compacted checkpoint topic, partition = stage partition, :mod:`agents.checkpoints`) and the
offset to resume from (inside the checkpoint: what a restarted worker seeks to). The consumer
group's committed offsets (lag monitoring, the ownership check) are committed after the
transaction, in the background, at most once per second per partition — inside the transaction
they would add two broker round trips to every tick's latency. A new owner of a partition first
initialises that partition's transactional id — which fences the previous owner (a ``kill -9``'d
zombie or a worker that lost the partition in a rebalance) and aborts its open transaction —
then reads the newest committed checkpoint (``read_committed``) and seeks to its offsets. So
each tick's partial and each release is committed exactly once; everything downstream reads
``read_committed``. Even a ``read_uncommitted`` reader only ever sees bit-identical copies of a
``(stream, tick)``: partials are summed in a fixed order and the noise is keyed by
``(secret, stream, node)``.

**Why aiokafka directly and not faust agents.** faust's own exactly-once mode has open bugs
around rebalances (see NOTES) and does not give control over seeks, per-partition transactions
and checkpoint restore order; both stages therefore run as plain asyncio tasks on aiokafka
consumers/producers, which the ``stream-dp worker`` command hosts next to the web server and the
reconcile agent (:mod:`agents.reconcile`). Workers use static membership
(``group.instance.id = worker_id``) so a restarted worker takes its own place at once, and send
an explicit LeaveGroup on graceful shutdown (aiokafka skips it for static members) so the others
take over its partitions.

Entry points: :func:`run_worker` (used by ``stream-dp worker``), :class:`Worker` (readiness
flags), and ``python -m agents.pipeline`` (settings from the environment; used by the tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from agents.checkpoints import (
    Progress,
    chunk_messages,
    progress_message,
    read_all,
    read_latest_with_progress,
)
from agents.codec import dlq_message, encode
from agents.config import Settings, load_domain
from agents.deployment import deployment_id
from agents.groups import (
    install_empty_assignment_rejoin,
    install_static_commit_rejoin,
    leave_group,
)
from agents.ingest import (
    FAST_PATH_STATUS,
    IngestState,
    Partial,
    Router,
    ScheduleEntry,
    ScheduleMismatch,
)
from agents.release import CheckpointRefused, Release, ReleaseOverflow, ReleaseState
from stream_dp.integrity import IntegrityError

__all__ = ["Metrics", "NullMetrics", "Release", "Worker", "check_backlog", "run_worker"]

log = logging.getLogger("stream_dp.pipeline")

OnRelease = Callable[[Release], Awaitable[None] | None]

#: Most count messages one release transaction publishes (bounds a transaction's size after a
#: long outage, while a backlog of many small ticks still goes out in few transactions).
_MAX_MESSAGES_PER_COMMIT = 200_000
#: ... and never more ticks than this per transaction
_MAX_TICKS_PER_COMMIT = 1024
#: a worker more than this many ticks behind the clock schedule says so and reports progress
BACKLOG_TICKS = 100
#: seconds between two progress lines while a worker catches up
PROGRESS_EVERY_S = 10.0
#: seconds a stopping worker waits for its stages to commit, leave their groups and close
#: (the broker gone: they are cancelled and closed after that)
SHUTDOWN_S = 8.0


class Metrics(Protocol):
    """What the pipeline reports (implemented by :class:`agents.metrics.Metrics`).

    Counts are non-negative integers, durations seconds. Never per-stream values.
    """

    def event_accepted(self, n: int = 1) -> None: ...
    def event_dead_lettered(self, reason: str, n: int = 1) -> None: ...
    def event_late(self, n: int = 1) -> None: ...
    def stream_clipped(self, n: int = 1) -> None: ...
    def tick_released(self, latency_seconds: float, n_streams: int = 0) -> None: ...
    def checkpoint_written(self, seconds: float) -> None: ...
    def release_error(self, reason: str) -> None: ...
    def set_consumer_lag(self, messages: int) -> None: ...
    def set_ready(self, ready: bool) -> None: ...


class NullMetrics:
    """Metrics that record nothing."""

    def event_accepted(self, n: int = 1) -> None:
        pass

    def event_dead_lettered(self, reason: str, n: int = 1) -> None:
        pass

    def event_late(self, n: int = 1) -> None:
        pass

    def stream_clipped(self, n: int = 1) -> None:
        pass

    def tick_released(self, latency_seconds: float, n_streams: int = 0) -> None:
        pass

    def checkpoint_written(self, seconds: float) -> None:
        pass

    def release_error(self, reason: str) -> None:
        pass

    def set_consumer_lag(self, messages: int) -> None:
        pass

    def set_ready(self, ready: bool) -> None:
        pass


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


class TransactionRecordFailed(RuntimeError):
    """Records of a transaction could not be written (e.g. larger than the topic allows);
    ``causes`` holds their errors."""

    def __init__(self, message: str, causes: list[BaseException]) -> None:
        super().__init__(message)
        self.causes = causes


class _CheckedProducer:
    """A transactional aiokafka producer that commits only if every record of the transaction
    was written.

    aiokafka commits a transaction even when one of its records failed for good (measured: a
    record above the topic's ``max.message.bytes`` is dropped with ``MessageSizeTooLargeError``
    on its delivery future, and ``commit_transaction`` still succeeds with the others). A release
    or checkpoint silently missing from a committed transaction would break "a tick is released
    once": every delivery future is awaited before the commit, and any failure raises
    :class:`TransactionRecordFailed` instead (the stage aborts and recovers).
    """

    def __init__(self, producer: Any) -> None:
        self._p = producer
        self._futures: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._p, name)

    async def begin_transaction(self) -> None:
        self._futures = []
        await self._p.begin_transaction()

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        fut = await self._p.send(*args, **kwargs)
        self._futures.append(fut)
        return fut

    async def send_batch(self, *args: Any, **kwargs: Any) -> Any:
        fut = await self._p.send_batch(*args, **kwargs)
        self._futures.append(fut)
        return fut

    async def commit_transaction(self) -> None:
        futures, self._futures = self._futures, []
        if futures:
            await self._p.flush()
            results = await asyncio.gather(*futures, return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise TransactionRecordFailed(
                    f"{len(failed)} of {len(futures)} records of the transaction were not "
                    f"written ({type(failed[0]).__name__}: {failed[0]}); not committing", failed)
        await self._p.commit_transaction()

    async def abort_transaction(self) -> None:
        futures, self._futures = self._futures, []
        for fut in futures:  # retrieved: no "exception was never retrieved" noise
            if fut.done() and not fut.cancelled():
                fut.exception()
        await self._p.abort_transaction()


class _Stage:
    """Common machinery: group consumer, per-partition transactional producers, restore."""

    name = "stage"

    def __init__(self, worker: Worker, topic: str, group: str, ckpt_topic: str) -> None:
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
        self.w._update_ready()
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
        self.w._update_ready()
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
        state = self.new_state(p)
        if ck is not None:
            self.restore_state(state, ck.payload, ck.seq)
            if progress is not None:
                self.restore_progress(state, progress)
        start = await self.after_restore(state, ck is not None)
        if start is not None:
            state.offset = start
        if state.offset >= 0:
            await self._check_not_ahead(tp, state.offset, ck.seq if ck else None)
            self.consumer.seek(tp, state.offset)
        else:
            await self.seek_fresh(tp)
            state.offset = await self.consumer.position(tp)
        self.states[p] = state
        self.repositioned += 1
        self.last_commit[p] = time.monotonic()
        log.info(
            "%s partition %d restored (checkpoint seq %s, offset %d) in %.3f s",
            self.name, p, ck.seq if ck else None, state.offset, time.monotonic() - t0,
        )

    async def after_restore(self, state: Any, from_checkpoint: bool) -> int | None:
        """Stage hook after the checkpoint is read; may return the offset to start from."""
        return None

    async def _check_not_ahead(self, tp: Any, offset: int, seq: int | None) -> None:
        """Refuse state that is ahead of its log: a checkpoint that has consumed the partition
        up to ``offset`` while the partition now ends before it. The broker lost records it had
        acknowledged (the development broker killed with kill -9, docs/operations.md); seeking
        there would wait forever for records that never come — or, reset to the beginning,
        count them twice. One line and exit status 4 instead of a silent stall."""
        end = (await self.consumer.end_offsets([tp]))[tp]
        if offset > end:
            raise CheckpointRefused(
                f"{self.name} partition {tp.partition}: the checkpoint (seq {seq}) is ahead of "
                f"the log: it has consumed {tp.topic} up to offset {offset}, but the partition "
                f"ends at {end}. The broker lost records it had acknowledged (a development "
                "broker killed with kill -9 can: docs/operations.md); the state cannot be "
                "continued. Start a new epoch (new topics), or restore the broker's data")

    async def _try_restore(self, tp: Any) -> None:
        """Restore ``tp``; on failure log it and leave it to :meth:`_retry_missing`.

        A :class:`ScheduleMismatch` (or any error the stage marks fatal) is not retried: the
        worker stops with it, because continuing would publish under a broken guarantee. So is a
        checkpoint that fails authentication or was written under another configuration
        (:class:`~agents.release.CheckpointRefused`, :class:`~stream_dp.integrity.IntegrityError`):
        the worker must not start with it, and retrying cannot change it.
        """
        try:
            await self._restore(tp)
        except ScheduleMismatch as exc:
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
        log.warning("%s partition %d: commit failed (%s); restoring from checkpoint",
                    self.name, p, type(exc).__name__)
        await self._drop(p)
        if type(exc).__name__ == "ProducerFenced":
            # Another worker owns the partition now (we were a zombie). Do not fence it back:
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

    # -- partitions without an owner --------------------------------------------------------
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
        k = _kafka()
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

    # -- to implement ----------------------------------------------------------------------
    def consumer_options(self) -> dict[str, Any]:
        """Extra keyword arguments of the stage's input consumer (none by default)."""
        return {}

    def fetch_max_records(self) -> int:
        """The most items one ``getmany`` returns (records: ``max_batch``)."""
        return int(self.s.max_batch)

    def new_state(self, p: int) -> Any:
        raise NotImplementedError

    def restore_state(self, state: Any, payload: bytes, seq: int) -> None:
        raise NotImplementedError

    def restore_progress(self, state: Any, progress: Progress) -> None:
        raise CheckpointRefused(f"{self.name}: a progress record in {self.ckpt_topic}, which "
                                "only release checkpoints have")

    async def seek_fresh(self, tp: Any) -> None:
        await self.consumer.seek_to_beginning(tp)

    async def handle(self, batch: dict[Any, list[Any]]) -> None:
        raise NotImplementedError

    # -- main loop ----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.w.fatal is not None:
                raise self.w.fatal
            seen = self.repositioned
            try:
                batch = await self.consumer.getmany(timeout_ms=100,
                                                    max_records=self.fetch_max_records())
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
        k = _kafka()
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
                    "continued. Start a new epoch (new topics), or restore the broker's data"))
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


class IngestStage(_Stage):
    name = "ingest"

    #: a consumer without a group that reads the log end offsets (read_uncommitted): the
    #: clock rule closes at the high watermark, so another producer's open transaction (which
    #: holds back the last stable offset) cannot move an honest event past the closing point
    hw: Any = None

    async def start(self) -> None:
        from agents.topics import check_events_topic

        await check_events_topic(self.s.bootstrap, self.s)
        log.info("%s", FAST_PATH_STATUS)  # compiled ingest fast path, or why not
        await super().start()
        k = _kafka()
        self.hw = k.AIOKafkaConsumer(
            bootstrap_servers=self.s.bootstrap, **self.w.kafka_kwargs(),
            isolation_level="read_uncommitted", enable_auto_commit=False,
            client_id=f"{self.s.app_id}-{self.name}-end-{self.s.worker_id}",
        )
        await self.hw.start()

    async def run(self, stop: asyncio.Event) -> None:
        """The stage's loop, plus (clock schedule) a timer that reads the end offsets as soon
        as a tick's deadline + grace passes, not after the batch being processed: on CreateTime
        topics a busy worker would otherwise read them later, and a burst of junk could move
        an honest straggler across the closing point."""
        if self.s.schedule != "clock":
            await super().run(stop)
            return
        timer = asyncio.create_task(self._clock_closes(stop), name="stream-dp-ingest-clock")
        try:
            await super().run(stop)
        finally:
            timer.cancel()
            with contextlib.suppress(BaseException):
                await timer

    async def _clock_closes(self, stop: asyncio.Event) -> None:
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
                for tp, end_offset in ends.items():
                    state = self.states.get(tp.partition)
                    if state is not None:
                        state.schedule_close(due, int(end_offset), "clock", now)
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

    def consumer_options(self) -> dict[str, Any]:
        """The events consumer yields aiokafka's decoded records as they are, without a
        ``ConsumerRecord`` per record (:mod:`agents.raw_records`; same batches, offsets and
        contents)."""
        from agents.raw_records import install, raw_records

        return {"value_deserializer": raw_records} if install() else {}

    def fetch_max_records(self) -> int:
        """With record blocks (one item per fetched batch, typically 100–500 records), one
        ``getmany`` returns at most ``max_batch / 100`` of them, so one handler call stays at
        about ``max_batch`` records (a few ms of compiled work, not the whole prefetch)."""
        from agents.ingest import RecordBlock

        if RecordBlock is not None:
            return max(1, int(self.s.max_batch) // 100)
        return int(self.s.max_batch)

    def new_state(self, p: int) -> IngestState:
        return IngestState(self.s, self.w.router, p, key=self.w.key, domain_id=self.w.domain_id)

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
        from agents.nonce import NONCE_KEY

        # from the offset the checkpoint names (restore time independent of the deployment's
        # age); without a checkpoint, from the beginning
        records = await read_all(self.reader, self.s.schedule_topic, state.partition,
                                 start=state.schedule_from if from_checkpoint else 0)
        entries = []
        for r in records:
            if r.key == NONCE_KEY:
                continue  # the deployment nonce (partition 0), not a closing point
            try:
                entries.append(ScheduleEntry.decode(r.value, state.entry_key))
            except ScheduleMismatch as exc:
                raise ScheduleMismatch(
                    f"schedule topic {self.s.schedule_topic!r} partition {state.partition}, "
                    f"offset {r.offset}: {exc}") from None
            except (ValueError, KeyError, TypeError):
                raise ScheduleMismatch(
                    f"schedule topic {self.s.schedule_topic!r} partition {state.partition}: "
                    f"unreadable entry at offset {r.offset}"
                ) from None
        state.load_known(entries)
        if not from_checkpoint and state.known:
            first = state.known[0]
            if first.first != 1:
                raise ScheduleMismatch(
                    f"events partition {state.partition}: no checkpoint, and the persisted "
                    f"closing points start at tick {first.first}, not 1"
                )
            state.range_start = first.start_offset
            log.info("ingest partition %d: following %d persisted closing points (ticks "
                     "through %d)", state.partition, len(state.known), state.known[-1].through)
            return int(first.start_offset)
        return None

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
        for p, state in list(self.states.items()):
            out = state.out
            # A large open state (10^5 open keys: ~0.1 s to encode) is checkpointed at most
            # every 20x its encoding time between tick closes: checkpoints cost <= 5% of the
            # loop, and at a tick close it is written anyway.
            interval = max(self.s.commit_interval_s, 20.0 * self.encode_seconds.get(p, 0.0))
            due_commit = time.monotonic() - self.last_commit.get(p, 0.0) >= interval
            if out.ticks_closed or len(out.dead_letters) >= 10_000 or (
                    state.dirty and due_commit):
                jobs.append(self._commit(p, state))
        self.w.metrics.set_consumer_lag(lag)
        if jobs:
            await asyncio.gather(*jobs)

    async def flush_all(self) -> None:
        await asyncio.gather(
            *(self._commit(p, st) for p, st in list(self.states.items()) if st.dirty)
        )

    async def _commit(self, p: int, state: IngestState) -> None:
        prod = self.producers.get(p)
        if prod is None:
            return
        s = self.s
        out = state.out
        t0 = time.monotonic()
        marks = [time.time()]
        try:
            await prod.begin_transaction()
            for key, rej, raw, offset in out.dead_letters:
                msg = dlq_message(rej, raw, s.events_topic, p, offset)
                await prod.send(s.dlq_topic, encode(msg), key=key)
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
            marks.append(time.time())
            await self._send_checkpoint(prod, p, state)
            marks.append(time.time())
            await prod.commit_transaction()
            marks.append(time.time())
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
        m.checkpoint_written(time.monotonic() - t0)
        if out.accepted:
            m.event_accepted(out.accepted)
        if out.late:
            m.event_late(out.late)
        reasons: dict[str, int] = {}
        for _, rej, _, _ in out.dead_letters:
            if rej.reason not in ("late", "tick_closed"):
                reasons[rej.reason] = reasons.get(rej.reason, 0) + 1
        for reason, n in reasons.items():
            m.event_dead_lettered(reason, n)
        self.w.stats["accepted"] += out.accepted
        self.w.stats["clamped"] += out.clamped
        self.w.stats["dead_letters"] += len(out.dead_letters)
        self.w.stats["partition_ticks_closed"] += out.ticks_closed
        out.clear()
        state.dirty = False
        self.last_commit[p] = time.monotonic()


class ReleaseStage(_Stage):
    name = "release"

    def __init__(self, worker: Worker, topic: str, group: str, ckpt_topic: str) -> None:
        super().__init__(worker, topic, group, ckpt_topic)
        #: shard -> (its streams, counts partition of each): recomputed when the streams change
        self._partitions: dict[int, tuple[tuple[str, ...], list[int]]] = {}
        #: (shard, tick) -> monotonic time its first partial was seen while incomplete
        self._incomplete: dict[tuple[int, int], float] = {}
        #: shard -> monotonic time since which its next tick is ready but held back (backlog)
        self._ready_since: dict[int, float] = {}
        #: shards whose manifest this worker has committed to the manifests topic
        self._manifest_sent: set[int] = set()
        #: shard -> monotonic time its last full checkpoint was committed here
        self._full_at: dict[int, float] = {}
        #: (shard, tick) -> wall time its last partial was read (diagnostics: release_timings)
        self._gathered: dict[tuple[int, int], float] = {}

    def new_state(self, p: int) -> ReleaseState:
        if self.w.router.patterns:
            from agents.release import AttributeReleaseState, new_live

            live = new_live(self.s, self.w.domain, self.w.key,
                            self.w.router.deployment_nonce) if p == 0 else None
            return AttributeReleaseState(self.s, self.w.router, p, live, key=self.w.key)
        return ReleaseState(
            self.s, self.w.router, p, self.w.new_bank(p), key=self.w.key,
            mechanism=self.w.mechanism(),
        )

    async def check_ownership(self) -> None:
        """Also: a tick that misses partials from some events partitions for
        ``stall_timeout_s`` means an ingest partition has no working owner: rejoin ingest."""
        await super().check_ownership()
        now = time.monotonic()
        waiting: set[int] = set()
        for state in list(self.states.values()):
            slot = state.pending.get(state.next_tick)
            key = (state.shard, state.next_tick)
            if not slot or len(slot) == state.sources:
                self._incomplete.pop(key, None)
                continue
            since = self._incomplete.setdefault(key, now)
            if now - since >= self.s.stall_timeout_s:
                waiting.update(set(range(state.sources)) - set(slot))
        for key in [k for k in self._incomplete if now - self._incomplete[k] > 600]:
            del self._incomplete[key]
        if waiting:
            ticks = [st.next_tick for st in self.states.values()
                     if st.pending.get(st.next_tick)]
            if await self._lost_records(sorted(waiting), min(ticks) if ticks else 0):
                return
            await self.w.ingest.rejoin(
                f"ticks wait for partials of events partitions {sorted(waiting)} for more than "
                f"{self.s.stall_timeout_s:g} s")

    async def _lost_records(self, sources: list[int], tick: int) -> bool:
        """Ticks wait for partials of events partitions this worker owns itself: rejoining the
        group cannot help. Find out why and stop in one line (exit status 4) when the log lost
        records the state depends on — a persisted closing point past the partition's end, or
        partials the ingest checkpoint says were written — instead of waiting for ever. Returns
        True if the worker is stopping."""
        ingest = self.w.ingest
        owned = [s for s in sources if s in ingest.states]
        if not owned or tick <= 0:
            return False
        k = _kafka()
        # What each owned partition's committed checkpoint says was written, taken BEFORE the
        # partials' end offsets: ticks an ingest state has closed in memory are written in a
        # transaction that commits later (state.out holds them until then). Read after the
        # end offsets, a commit in between looked like partials missing from the log (a false
        # 'state is ahead of the log', exit 4: 3 of 10 runs of the test of a partition left
        # without an owner, right after the partition was assigned again).
        committed = {p: int(ingest.states[p].next_tick) - 1 - int(ingest.states[p].out.ticks_closed)
                     for p in owned}
        # only when every waiting shard has read its partials partition to the end: a shard
        # that lags behind a backlog has not seen them yet
        shards = [k.TopicPartition(self.topic, p) for p, st in self.states.items()
                  if st.pending.get(st.next_tick)]
        shard_ends = await self.consumer.end_offsets(shards)
        for tp in shards:
            if await self.consumer.position(tp) < int(shard_ends.get(tp, 0)):
                return False
        tps = [k.TopicPartition(ingest.topic, s) for s in owned]
        ends = await ingest.consumer.end_offsets(tps)
        for tp in tps:
            st = ingest.states.get(tp.partition)
            if st is None:
                continue
            end = int(ends.get(tp, 0))
            nxt = st.pending[0] if st.pending else None
            if nxt is not None and int(nxt.offset) > end:
                problem = (f"events partition {tp.partition}: a persisted closing point (ticks "
                           f"through {nxt.through}) lies at offset {nxt.offset}, but the "
                           f"partition ends at {end}")
            elif committed.get(tp.partition, 0) >= tick:
                problem = (f"release waits for the partials of tick {tick} from events partition "
                           f"{tp.partition}, which its checkpoint says were written (ticks "
                           f"closed through {committed[tp.partition]}), but {self.topic} does "
                           "not hold them")
            else:
                log.warning("ticks wait for partials of events partition %d, owned here: it "
                            "has closed through tick %d, at offset %d of %d", tp.partition,
                            int(st.next_tick) - 1, int(st.offset), end)
                continue
            self.w.release_error("checkpoint_refused")
            self.w.fail(CheckpointRefused(
                f"{problem}: the state is ahead of the log. The broker lost records it had "
                "acknowledged (a development broker killed with kill -9 can: "
                "docs/operations.md); the state cannot be continued. Start a new epoch (new "
                "topics), or restore the broker's data"))
            return True
        return False

    def restore_state(self, state: Any, payload: bytes, seq: int) -> None:
        state.restore(payload, seq, self.w.key)
        self._full_at.pop(state.shard, None)

    def restore_progress(self, state: Any, progress: Progress) -> None:
        state.restore_progress(progress.payload, self.w.key)
        if state.restepping:
            log.info("release shard %d: re-stepping ticks %d..%d from the retained partials "
                     "(released before the restart; not published again)", state.shard,
                     state.next_tick, state.resume_tick - 1)

    async def after_restore(self, state: Any, from_checkpoint: bool) -> int | None:
        """Refuse to start if the partials to re-step from are no longer retained."""
        if not state.restepping or state.offset < 0:
            return None
        tp = _kafka().TopicPartition(self.topic, state.shard)
        begin = (await self.consumer.beginning_offsets([tp]))[tp]
        if begin > state.offset:
            raise CheckpointRefused(
                f"release shard {state.shard}: ticks {state.next_tick}..{state.resume_tick - 1} "
                f"were released after the newest full checkpoint, but the partials to re-step "
                f"them from (offset {state.offset} on) are gone (the partition starts at "
                f"{begin}): partials_retention_s is too short for release_checkpoint_every, or "
                "the worker was down longer than the retention. Start a new epoch.")
        return None

    def _full_overdue(self, state: ReleaseState) -> bool:
        """The last full state is older than a quarter of the partials' retention: the partials
        since then must outlive it with a wide margin, so the next commit writes it."""
        age = time.monotonic() - self._full_at.get(state.shard, -math.inf)
        return age >= self.s.partials_retention_s / 4

    def _full_due(self, state: ReleaseState, released: int) -> bool:
        """Whether this commit writes the full state (else a progress record)."""
        return (not released or state.unsaved + released >= state.checkpoint_every
                or self._full_overdue(state))

    async def handle(self, batch: dict[Any, list[Any]]) -> None:
        for tp, records in batch.items():
            state = self.states.get(tp.partition)
            if state is None:
                continue
            for r in records:
                try:
                    partial = Partial.decode(r.value)
                except (ValueError, KeyError, TypeError) as exc:
                    log.error("release shard %d: undecodable partial at offset %d: %s",
                              tp.partition, r.offset, type(exc).__name__)
                    state.offset = max(state.offset, r.offset + 1)
                    continue
                state.add(r.offset, partial)
            if state.ready() and not state.restepping:
                self._gathered.setdefault((tp.partition, state.next_tick), time.time())
        jobs = []
        wall = time.monotonic()
        k = _kafka()
        for p, state in list(self.states.items()):
            if state.restepping:
                # Released before the restore: the same partials and the same keyed noise give
                # the same state; nothing is published and nothing committed until caught up
                # (a commit now would write a full checkpoint behind the progress record).
                while state.restepping and state.ready():
                    state.step()
                    self.w.stats["ticks_restepped"] += 1
                if state.restepping:
                    continue
            due = wall - self.last_commit.get(p, 0.0) >= self.s.commit_interval_s
            # The next tick's partials are arriving: it is released in a moment, and a commit
            # now would put a whole checkpoint on its latency path (the partials read so far are
            # re-read after a restart anyway).
            gathering = bool(state.pending.get(state.next_tick))
            # an idle shard's full state, before the partials it was stepped from expire
            overdue = bool(state.unsaved) and self._full_overdue(state)
            if state.ready():
                # While partials wait in the partition (a backlog), gather more ready ticks
                # into one transaction, for at most 0.2 s: a backlog goes out at processing
                # speed instead of one transaction per fetch.
                since = self._ready_since.setdefault(p, wall)
                tp = k.TopicPartition(self.topic, p)
                end = self.consumer.highwater(tp)
                try:
                    # more than one offset to go: the last committed transaction's commit
                    # marker alone (one offset, never delivered as a record) is not a backlog
                    # and must not hold the release back until the next fetch
                    behind = end is not None and end - await self.consumer.position(tp) > 1
                except Exception:
                    behind = False
                if behind and wall - since < 0.2:
                    continue
                self._ready_since.pop(p, None)
                jobs.append(self._commit(p, state))
            elif overdue or (state.dirty and due and not gathering):
                jobs.append(self._commit(p, state))
        if jobs:
            await asyncio.gather(*jobs)

    async def _partitions_of(self, prod: Any, shard: int, streams: tuple[str, ...]) -> list[int]:
        """Counts-topic partition of each stream (the default murmur2 key partitioner)."""
        cached = self._partitions.get(shard)
        if cached is not None and (cached[0] is streams or cached[0] == streams):
            return cached[1]
        from aiokafka.partitioner import murmur2

        parts = sorted(await prod.partitions_for(self.s.counts_topic))
        found = [parts[(murmur2(n.encode("utf-8")) & 0x7FFFFFFF) % len(parts)] for n in streams]
        self._partitions[shard] = (streams, found)
        return found

    async def _send_counts(self, prod: Any, shard: int, releases: list[Release]) -> None:
        """All count messages of ``releases`` (in tick order), as whole record batches per
        partition: a backlog of many ticks goes out in few produce requests."""
        topic = self.s.counts_topic
        by_part: dict[int, list[tuple[bytes, bytes]]] = {}
        for rel in releases:
            partition_of = await self._partitions_of(prod, shard, rel.streams)
            for part, kv in zip(partition_of, rel.messages(self.s, self.w.privacy), strict=True):
                by_part.setdefault(part, []).append(kv)
        for part, items in sorted(by_part.items()):
            batch = prod.create_batch()
            for key, value in items:
                if batch.append(key=key, value=value, timestamp=None) is None:
                    await prod.send_batch(batch, topic, partition=part)
                    batch = prod.create_batch()
                    if batch.append(key=key, value=value, timestamp=None) is None:
                        raise ValueError("a count message does not fit an empty batch")
            if batch.record_count():
                await prod.send_batch(batch, topic, partition=part)

    async def _send_compact(self, prod: Any, shard: int, releases: list[Release]) -> bool:
        """With ``compact_topic`` set: one ``dp.counts.block.v1`` record per release (partition
        = shard, key = shard name) and, once per producer, the shard's manifest. Returns whether
        the manifest went into this transaction (it counts as sent only once committed)."""
        if not self.s.compact_topic or not releases:
            return False
        name = releases[0].shard_name().encode("utf-8")
        manifest = shard not in self._manifest_sent
        if manifest:
            await prod.send(self.s.manifests_topic, key=name, value=releases[0].manifest(),
                            partition=shard)
        for rel in releases:
            await prod.send(self.s.compact_topic, key=name, value=rel.compact(self.s, self.w.privacy),
                            partition=shard)
        return manifest

    async def _commit(self, p: int, state: ReleaseState) -> None:
        prod = self.producers.get(p)
        if prod is None:
            return
        t0 = time.monotonic()
        releases: list[Release] = []
        wall0 = time.time()
        try:
            per_commit = max(1, min(_MAX_TICKS_PER_COMMIT,
                                    _MAX_MESSAGES_PER_COMMIT // max(1, len(state.names))))
            while state.ready() and len(releases) < per_commit:
                try:
                    releases.append(state.step())
                    if state.clipped:
                        self.w.metrics.stream_clipped(state.clipped)
                        state.clipped = 0
                except ReleaseOverflow as exc:
                    # Not transient: the same counts fail again after any restore. Stop.
                    self.w.release_error("overflow")
                    self.w.fail(exc)
                    return
            marks = [time.time()]
            await prod.begin_transaction()
            marks.append(time.time())
            if self.s.counts_json:
                await self._send_counts(prod, p, releases)
            sent_manifest = await self._send_compact(prod, p, releases)
            marks.append(time.time())
            full = self._full_due(state, len(releases))
            if full:
                await self._send_checkpoint(prod, p, state)
            else:
                key, value, headers = progress_message(state.seq, state.progress_bytes())
                await prod.send(self.ckpt_topic, value, key=key, partition=p, headers=headers)
            marks.append(time.time())
            await prod.commit_transaction()
            marks.append(time.time())
            self.offsets_committed_later(p, state.offset)
            if sent_manifest:
                self._manifest_sent.add(p)
            if full:
                state.unsaved = 0
                self._full_at[p] = time.monotonic()
            else:
                state.unsaved += len(releases)
        except Exception as exc:
            with contextlib.suppress(Exception):
                await prod.abort_transaction()
            await self._recover(p, exc)
            return
        now = time.time()
        m = self.w.metrics
        m.checkpoint_written(time.monotonic() - t0)
        state.dirty = False
        self.last_commit[p] = time.monotonic()
        gathered_at = {t: self._gathered.pop((p, t)) for (q, t) in list(self._gathered)
                       if q == p and t < state.next_tick}  # older ones: released before a rebalance
        for rel in releases:
            m.tick_released(now - rel.tick_end, len(rel.streams))
            self.w.stats["shard_ticks_released"] += 1
            self.w.latencies.append(now - rel.closed_at)
            gathered = gathered_at.get(rel.tick, wall0)
            self.w.release_timings.append({
                "tick": rel.tick, "shard": p, "to_stage": wall0 - rel.closed_at,
                "gathered": gathered - rel.closed_at,
                "step": marks[0] - wall0, "begin": marks[1] - marks[0],
                "output": marks[2] - marks[1], "checkpoint": marks[3] - marks[2],
                "commit": marks[4] - marks[3]})
            if self.w.on_release is not None:
                try:
                    res = self.w.on_release(rel)
                    if inspect.isawaitable(res):
                        await res
                except Exception:
                    log.exception("on_release callback failed")


class Worker:
    """One worker process: the ingest and release stages, readiness and counters.

    ``ready`` is True once both stages have restored the state of every partition assigned to
    them, and False while a rebalance is in progress. ``stats`` holds operational totals (never
    raw counts). ``on_release`` is called after each committed shard-tick release.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        metrics: Metrics | None = None,
        on_release: OnRelease | None = None,
        key: bytes | None = None,
        domain: Any = None,
    ) -> None:
        self.settings = settings
        self.metrics: Metrics = metrics if metrics is not None else NullMetrics()
        self.on_release = on_release
        self.key = key if key is not None else settings.noise_key()
        self.domain = domain if domain is not None else load_domain(settings.domain_file)
        from agents.config import check_attribute_settings
        from agents.fetch_backoff import install as install_fetch_backoff

        check_attribute_settings(settings, self.domain)
        install_fetch_backoff(settings.empty_fetch_backoff_ms / 1000.0)
        install_empty_assignment_rejoin()
        install_static_commit_rejoin()
        self.router = Router(self.domain, settings.shards)
        from agents.topics import check_shard_size

        check_shard_size(self.router)
        if settings.compact_topic:
            from agents.topics import check_compact_size

            check_compact_size(self.domain, self.router)
        from agents.security import KafkaSecurity

        #: TLS / SASL of every Kafka client this worker creates
        self.security = KafkaSecurity.from_settings(settings)
        self.security.validate()

        #: the deployment's identity (domain digest, every setting that decides what a tick
        #: contains, app id, events topic): noise and checkpoints are bound to it
        self.domain_id: str = deployment_id(settings, self.router.domain_id)
        self.privacy: dict[str, Any] = dict(settings.privacy.as_dict())
        self.ingest = IngestStage(
            self, settings.events_topic, settings.ingest_group, settings.ingest_checkpoints_topic
        )
        self.release = ReleaseStage(
            self, settings.partials_topic, settings.release_group,
            settings.release_checkpoints_topic,
        )
        self.stats: dict[str, int] = {
            "accepted": 0, "clamped": 0, "dead_letters": 0, "partition_ticks_closed": 0,
            "shard_ticks_released": 0, "ownership_recoveries": 0, "ticks_restepped": 0,
            "stalled_partitions": 0,
        }
        #: seconds from the last source partition closing a tick to its release being committed
        #: (the most recent ones; for benchmarks and diagnostics)
        self.latencies: deque[float] = deque(maxlen=10_000)
        #: where each of the most recent shard-tick releases spent its time (seconds): from the
        #: tick's close to the release stage starting on it (ingest close, partials transaction,
        #: fetch), counter step, begin_transaction, output records, checkpoint, commit
        self.release_timings: deque[dict[str, float]] = deque(maxlen=10_000)
        #: the ingest side of a tick's close, per events partition: from the close decision to
        #: the partials transaction starting, its outputs, checkpoint and commit (seconds)
        self.ingest_timings: deque[dict[str, float]] = deque(maxlen=10_000)
        #: records handed to the ingest stage so far (committed or not; for benchmarks)
        self.processed = 0
        self._ready = False
        self._mechanism: Any = None
        #: an error that must stop the worker (e.g. a log that differs from the released one)
        self.fatal: BaseException | None = None
        from agents.ticks import Schedule

        self.schedule = Schedule(
            origin=settings.origin, tick_seconds=settings.tick_seconds,
            lateness=settings.allowed_lateness_s, grace=settings.close_grace_s,
        )

    def kafka_kwargs(self) -> dict[str, Any]:
        """Security keyword arguments for an aiokafka client of this worker."""
        return self.security.client_kwargs()

    def release_error(self, reason: str) -> None:
        """Count a fatal release error (metric ``stream_dp_release_errors_total{reason}``)."""
        record = getattr(self.metrics, "release_error", None)
        if record is not None:
            record(reason)

    def fail(self, exc: BaseException) -> None:
        """Stop the worker with ``exc`` (logged once; the stages raise it from their loops)."""
        if self.fatal is None:
            # the one error line is the caller's (``stream-dp worker`` names the cause and its
            # exit status); here only that the pipeline stops, and why, for embedders' logs
            log.info("pipeline stopping: %s", type(exc).__name__)
            self.fatal = exc

    def check_schedule(self, now: float | None = None) -> None:
        """Refuse a clock schedule whose origin lies too many ticks in the past."""
        check_backlog(self.settings, now)

    @property
    def ready(self) -> bool:
        """State restored for all assigned partitions of both stages, not rebalancing."""
        return self._ready and not self.ingest.missing() and not self.release.missing()

    def _update_ready(self) -> None:
        ready = not self.ingest.restoring and not self.release.restoring
        if ready != self._ready:
            self._ready = ready
            self.metrics.set_ready(ready)

    def mechanism(self) -> Any:
        if self._mechanism is None:
            from agents.release import build_mechanism

            self._mechanism = build_mechanism(self.settings)
        return self._mechanism

    def new_bank(self, shard: int) -> Any:
        from stream_dp.counters import CounterBank

        names = self.router.shard_names(shard)
        if not names:
            return None
        return CounterBank(
            self.mechanism(), names, self.key, domain_id=self.domain_id, epoch=self.settings.epoch
        )

    async def adopt_nonce(self) -> None:
        """Read (or create) the deployment's nonce (:mod:`agents.nonce`) and bind the noise
        and every checkpoint to it, before any state is built."""
        from agents.nonce import adopt_nonce

        nonce = await adopt_nonce(self.settings, self.router.domain_id, self.key,
                                  self.kafka_kwargs())
        self.router.deployment_nonce = nonce
        self.domain_id = deployment_id(self.settings, self.router.domain_id, nonce)

    async def run(self, stop_event: asyncio.Event | None = None) -> None:
        stop = stop_event if stop_event is not None else asyncio.Event()
        self.mechanism()  # fail fast on bad strategy settings
        self.check_schedule()
        tasks: list[asyncio.Task[None]] = []
        tasks_progress: list[asyncio.Task[None]] = []
        stopper = asyncio.create_task(stop.wait())
        if self.settings.schedule == "clock":
            due = self.schedule.due_through(time.time())
            if due > BACKLOG_TICKS:
                # said before the first (possibly long) step: a deployment without checkpoints
                # releases every due tick before the live ones
                log.info("%d ticks are due on the clock schedule (origin %s, %s of event time); "
                         "partitions without a checkpoint release all of them first",
                         due, time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                            time.gmtime(self.settings.origin)),
                         _duration(due * self.settings.tick_seconds))
        try:
            await self.adopt_nonce()
            await self.ingest.start()
            await self.release.start()
            tasks = [
                asyncio.create_task(self.ingest.run(stop), name="stream-dp-ingest"),
                asyncio.create_task(self.release.run(stop), name="stream-dp-release"),
            ]
            # diagnostics only: not one of the tasks whose end stops the worker
            progress = asyncio.create_task(self._report_progress(stop),
                                           name="stream-dp-progress")
            tasks_progress.append(progress)
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stopper and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            stop.set()
            stopper.cancel()
            for t in tasks_progress:
                t.cancel()
            self._ready = False
            self.metrics.set_ready(False)
            await self._shut_down(tasks)

    def released_through(self) -> int | None:
        """The last tick every release shard of this worker has released (None: no shard)."""
        states = list(self.release.states.values())
        if not states:
            return None
        return min(int(st.next_tick) for st in states) - 1

    async def _report_progress(self, stop: asyncio.Event) -> None:
        """Say how far behind the clock schedule the worker starts, then, while it catches up,
        one progress line every :data:`PROGRESS_EVERY_S` seconds (ticks released, rate, ETA).
        Quiet when the worker is up to date: a live worker is one tick behind at most."""
        if self.settings.schedule != "clock":
            return
        try:
            await self._progress_loop(stop)
        except Exception as exc:  # diagnostics only: never stop the worker for them
            log.debug("progress report failed: %s", exc)

    async def _progress_loop(self, stop: asyncio.Event) -> None:
        t0 = time.monotonic()
        due0 = self.schedule.due_through(time.time())
        announced = False
        first: tuple[float, int] | None = None
        while not stop.is_set():
            due = self.schedule.due_through(time.time())
            done = self.released_through()
            if done is not None:
                behind = due - done
                if not announced:
                    announced = True
                    if behind > BACKLOG_TICKS:
                        log.warning(
                            "starting %d ticks behind the clock schedule (ticks %d..%d, %s of "
                            "event time): every one is released before the live ticks; "
                            "progress every %.0f s", behind, done + 1, due,
                            _duration(behind * self.settings.tick_seconds), PROGRESS_EVERY_S)
                elif behind > BACKLOG_TICKS:
                    if first is None:
                        first = (time.monotonic(), done)
                    rate = (done - first[1]) / max(time.monotonic() - first[0], 1e-9)
                    speed = f"{rate:.0f} ticks/s, ETA {_duration(behind / rate)}" if rate > 0 \
                        else "rate and ETA at the next line"
                    log.info("catching up: released through tick %d of %d (%d behind, %s)",
                             done, due, behind, speed)
                elif first is not None:
                    log.info("caught up: released through tick %d (%.0f s after start; %d "
                             "ticks were due then)", done, time.monotonic() - t0, due0)
                    first = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PROGRESS_EVERY_S if announced else 1.0)

    async def _shut_down(self, tasks: list[asyncio.Task[None]]) -> None:
        """Finish the stages' current batches and transactions, leave the groups, close every
        client — within :data:`SHUTDOWN_S` seconds in all. With the broker reachable that is a
        graceful stop; without it (an outage) nothing can be committed anyway, so the stages are
        cancelled and their clients closed without waiting for the broker: a SIGTERM during an
        outage ends the worker in seconds, never with a traceback."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SHUTDOWN_S
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=SHUTDOWN_S / 2)
            for t in late:
                t.cancel()
            for t in tasks:  # their errors were reported from the loop above
                with contextlib.suppress(BaseException):
                    await t
        stops = asyncio.gather(self.ingest.stop(), self.release.stop(), return_exceptions=True)
        try:
            for stage, res in zip((self.ingest, self.release), await asyncio.wait_for(
                    stops, timeout=max(0.5, deadline - loop.time())), strict=True):
                if isinstance(res, BaseException):  # e.g. a client's stop cut short
                    log.debug("%s: stop: %s", stage.name, type(res).__name__)
                    await stage.close_clients()
        except TimeoutError:
            log.warning("stopped without a graceful leave: the broker did not answer within "
                        "%.0f s (partitions move to other workers after the session timeout)",
                        SHUTDOWN_S)
            for stage in (self.ingest, self.release):
                await stage.close_clients()


def _duration(seconds: float) -> str:
    """``1 d 03:04:05`` / ``03:04:05`` for progress lines."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(seconds)
    days, rest = divmod(s, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days} d {clock}" if days else clock


def check_backlog(settings: Settings, now: float | None = None) -> None:
    """Raise ``ValueError`` if a clock schedule's origin lies more than ``max_backlog_ticks``
    ticks in the past (every tick from 1 on is released: almost always a mistake)."""
    if settings.schedule != "clock":
        return
    from agents.ticks import Schedule

    sch = Schedule(settings.origin, settings.tick_seconds, settings.allowed_lateness_s,
                   settings.close_grace_s)
    behind = sch.due_through(time.time() if now is None else now)
    if behind > settings.max_backlog_ticks:
        raise ValueError(
            f"origin {settings.origin!r} lies {behind} ticks in the past (max_backlog_ticks = "
            f"{settings.max_backlog_ticks}): every tick from 1 on would be released. Set origin "
            "to the deployment's start, or raise max_backlog_ticks"
        )


async def run_worker(
    settings: Settings,
    *,
    on_release: OnRelease | None = None,
    stop_event: asyncio.Event | None = None,
    metrics: Metrics | None = None,
    worker: Worker | None = None,
) -> Worker:
    """Run a worker until ``stop_event`` is set (or a stage fails); returns the worker.

    Pass a pre-built ``worker`` to read its ``ready`` flag from elsewhere (web server).
    """
    w = worker or Worker(settings, metrics=metrics, on_release=on_release)
    await w.run(stop_event)
    return w


def main() -> int:  # pragma: no cover - exercised by the integration tests as a subprocess
    """``python -m agents.pipeline``: settings from the environment; SIGTERM/SIGINT stop."""
    settings = Settings.load()
    level = {"warn": "WARNING"}.get(settings.log_level.lower(), settings.log_level.upper())
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_worker(settings, stop_event=stop)

    asyncio.run(_main())
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
