"""The reconcile side agent: consistent histograms from the released noisy counts.

Every ``every`` ticks (default: every tick) the agent gathers one tick's releases for the whole
domain from the counts topic, projects them onto the domain's constraints with
:func:`stream_dp.consistency.reconcile` weighted by the analytic variances (``stderr²`` from the
messages), and publishes the result to the histograms topic (key: the domain name), with the
solver's diagnostics. Consistency is post-processing of released values: it spends no budget.

**One leader per cluster.** Every worker runs a :class:`Reconciler`; they all join one consumer
group on a dedicated one-partition *leader topic* (nothing is ever written to it). Whoever holds
partition 0 is the leader: it reads every partition of the counts topic by manual assignment and
publishes. When the leader stops (graceful stop → LeaveGroup) or its session expires, the group
rebalances and another worker takes over. Leadership is given up inside the revocation callback,
before the partition moves, so in a graceful hand-over two leaders never overlap.

**Resuming.** A new leader reads the last published histogram tick for its domain from the
histograms topic and only publishes later ticks, reading the counts topic from the offsets the
previous leader committed (consumer group ``<leader group>.offsets``; committed *after* the
histogram is acknowledged, at the first message of a not-yet-published tick in each partition),
so no tick is missed. Re-publishing a tick (possible only if a leader died between publishing and
committing, or in a split brain) yields identical ``tick``, ``tick_end`` and ``nodes``: the counts
for a tick are bit-identical by the release rule (DESIGN.md §2.5) and the solver is deterministic;
only ``diagnostics.seconds`` (wall time) may differ.

Where the code lives: tick assembly in :mod:`agents.reconcile.ticks`, binary-attribute tables
in :mod:`agents.reconcile.tables`, the histogram message and the encoding of a solved tick in
:mod:`agents.reconcile.messages`, leader election in :mod:`agents.reconcile.leader`, the
configuration in :mod:`agents.reconcile.config`; this module keeps the :class:`Reconciler`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from agents.kafka.fetch_backoff import FETCHER_IDLE_MS
from agents.kafka.groups import leave_group
from agents.kafka.reading import (
    finish_before_cancel,
    getmany_or_wake,
    partitions_of,
    read_range,
)
from agents.reconcile.config import ReconcilerConfig, SolveFn, _default_solve
from agents.reconcile.leader import _LeaderListener, ensure_leader_topic
from agents.reconcile.messages import solve_and_encode
from agents.reconcile.tables import (
    BlockAssembler,
    TableAssembler,
    decode_table_record,
)
from agents.reconcile.ticks import DomainLike, Release, TickAssembler
from agents.telemetry.metrics import Metrics

log = logging.getLogger("agents.reconcile")


class Reconciler:
    """The side agent of one worker; publishes only while it is the cluster's leader.

    ``on_histogram`` (optional) is awaited with each published message (the demo shows them).
    Run with ``await reconciler.run(stop_event)``; it returns after ``stop_event`` is set,
    having left the election group.
    """

    def __init__(
        self,
        config: ReconcilerConfig,
        domain: DomainLike,
        *,
        metrics: Metrics | None = None,
        solve: SolveFn | None = None,
        on_histogram: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self.domain = domain
        self.names: tuple[str, ...] = tuple(domain.names)
        #: a binary-attribute domain: dp.tables.v1 in, dp.marginals.v1 out
        self.tables_mode = getattr(domain, "kind", "") == "binary"
        self.metrics = metrics
        self._solve = solve
        self.on_histogram = on_histogram
        self._lead_task: asyncio.Task[None] | None = None
        self.is_leader = False
        self.published = 0
        self.last_tick = 0
        self._manifest: tuple[list[tuple[str, bytes]], str] | None = None
        #: the node manifest went out under the current leadership
        self._manifest_sent = False
        #: solver seconds of the most recent histograms (bounded: workers run for months)
        self.solve_seconds: deque[float] = deque(maxlen=10_000)
        #: the leading task's input consumer while it leads (the hand-over seeks it)
        self._lead_consumer: AIOKafkaConsumer | None = None
        #: compact records taken over from this process's release stage: the consumer has been
        #: moved past them, the leading loop has not added them yet (partition, record)
        self._handed: list[tuple[int, _HandedRecord]] = []
        #: partition -> the offset after the record taken over last (where it was sought to)
        self._taken_next: dict[int, int] = {}
        #: set by a hand-over: the leading loop's wait for records ends
        self._lead_woken = asyncio.Event()
        #: compact records taken over from the release stage instead of fetched back (count)
        self.handed_over = 0
        #: compact records offered by the release stage but read from the topic (count): not
        #: leading, or the consumer was not exactly at the record (behind, or already past it)
        self.handed_missed = 0

    # -- leadership ---------------------------------------------------------------------------
    def _step_up(self) -> None:
        if self._lead_task is None or self._lead_task.done():
            log.info("became reconcile leader", extra={"domain": self.config.domain_name})
            self.is_leader = True
            if self.metrics:
                self.metrics.set_leader(True)
            self._lead_task = asyncio.get_running_loop().create_task(self._lead())

    async def _step_down(self) -> None:
        task, self._lead_task = self._lead_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            log.info("gave up reconcile leadership", extra={"domain": self.config.domain_name})
        self.is_leader = False
        if self.metrics:
            self.metrics.set_leader(False)

    async def run(self, stop_event: asyncio.Event) -> None:
        """Join the election and serve until ``stop_event`` is set."""
        from agents.kafka.aborted_transactions import install as install_aborted_transactions
        from agents.kafka.groups import install_empty_assignment_rejoin

        install_empty_assignment_rejoin()
        install_aborted_transactions()
        cfg = self.config
        await ensure_leader_topic(cfg.bootstrap, cfg.leader_topic)
        election = AIOKafkaConsumer(
            bootstrap_servers=cfg.bootstrap, **cfg.kafka_kwargs(),
            group_id=cfg.leader_group,
            group_instance_id=cfg.instance_id,
            client_id=f"{cfg.client_id}-election",
            consumer_timeout_ms=FETCHER_IDLE_MS,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            session_timeout_ms=cfg.session_timeout_ms,
            heartbeat_interval_ms=cfg.heartbeat_interval_ms,
        )
        election.subscribe([cfg.leader_topic], listener=_LeaderListener(self._step_up, self._step_down))
        try:
            await election.start()  # waits for the first assignment: the join can fail here
        except BaseException:
            with contextlib.suppress(Exception):
                await election.stop()
            raise
        member_id = ""
        try:
            while not stop_event.is_set():
                # Nothing is written to the leader topic, so its partition is paused: the
                # fetcher would otherwise poll it for nothing (measured: 16 empty fetch round
                # trips a second, as many as the release stage's consumer). Membership lives
                # in the coordinator's heartbeats, not in fetches; a new assignment comes
                # unpaused and is paused here. Polling surfaces a crashed leading task.
                unpaused = election.assignment() - election.paused()
                if unpaused:
                    election.pause(*unpaused)
                await getmany_or_wake(election, stop_event, cfg.poll_ms / 1000)  # a stop ends it
                member_id = getattr(election._coordinator, "member_id", "") or member_id
                task = self._lead_task
                if task is not None and task.done():
                    exc = task.exception()
                    log.error("reconcile leader loop failed; restarting it",
                              exc_info=exc)
                    self._lead_task = None
                    await asyncio.sleep(1.0)
                    self._step_up()
        finally:
            await self._step_down()
            await election.stop()  # a dynamic member leaves the group here
            if cfg.instance_id is not None:  # aiokafka skips LeaveGroup for static members
                await leave_group(cfg.bootstrap, cfg.leader_group, member_id, cfg.security)

    # -- the hand-over from this process's release stage --------------------------------------
    async def hand_over(self, topic: str, partition: int, offset: int, value: bytes) -> None:
        """A compact record this process's release stage wrote at ``(partition, offset)`` of
        ``topic``, called only after its transaction **committed** (so it is a record a
        read_committed consumer would return, with these bytes).

        When the leading consumer's position in that partition is exactly ``offset`` — it has
        returned every earlier record — the record is taken as if fetched and the consumer is
        moved past it (``seek(offset + 1)``): the 16 bytes per stream are not fetched back from
        the broker. Otherwise (not leading, behind: other workers' shards or a backlog are
        still to be read, or already past it) nothing happens and the consumer reads it from
        the topic as before. Offsets are committed no further than a taken record the leading
        loop has not yet added (:meth:`_commit_positions`), so a crash at any point resumes
        from the topic with nothing skipped.
        """
        consumer = self._lead_consumer
        if consumer is None or topic != self.input_topic or self.tables_mode:
            self.handed_missed += 1
            return
        tp = TopicPartition(topic, partition)
        if tp not in consumer.assignment():
            self.handed_missed += 1
            return
        try:
            position = await consumer.position(tp)  # no suspension while the position is valid
        except Exception:  # unassigned meanwhile (re-assignment, leadership lost)
            self.handed_missed += 1
            return
        if self._lead_consumer is not consumer:
            self.handed_missed += 1
            return
        # The one offset between the record taken last in this partition (the consumer was
        # moved to just after it and has not moved since) and this one is necessarily the
        # commit marker of the transaction that wrote that record: a transactional producer's
        # next records in a partition follow its previous transaction's marker there, so any
        # other record, or an aborted transaction, would leave a wider gap. Taking this record
        # skips only that marker (never returned by a consumer).
        after_marker = position == self._taken_next.get(partition, -1) and offset == position + 1
        if position != offset and not after_marker:
            self.handed_missed += 1
            return
        # Synchronous from here (``position`` returned without suspending, or just after the
        # position became valid): no fetch can move the position between the check and the
        # seek, and the leading loop sees the record before it next commits offsets.
        self._handed.append((partition, _HandedRecord(offset, value)))
        lead: AIOKafkaConsumer = consumer
        lead.seek(tp, offset + 1)  # also drops a prefetched or in-flight copy of it
        self._taken_next[partition] = offset + 1
        self.handed_over += 1
        self._lead_woken.set()  # the leading loop adds it now, not after its wait

    def _commit_positions(self, positions: dict[int, int]) -> dict[int, int]:
        """``positions`` lowered to the first taken-over record not yet added to the assembler:
        the consumer is already past it, but a successor must read it from the topic."""
        out = dict(positions)
        for part, rec in self._handed:
            if part in out:
                out[part] = min(out[part], rec.offset)
        return out

    # -- the leader's work --------------------------------------------------------------------
    async def last_published_tick(self) -> int:
        """Largest tick of a histogram for this domain on the histograms topic (0 if none);
        with ``histograms_json = False``: the largest tick whose last chunk is on the chunk
        topic (chunks go out in order)."""
        cfg = self.config
        key = cfg.domain_name.encode()
        topic = cfg.histograms_topic if cfg.histograms_json else cfg.histogram_blocks_topic

        def tick_of(value: bytes) -> int:
            if cfg.histograms_json:
                return int(json.loads(value)["tick"])
            from stream_dp.compact_histograms import decode_histogram_chunk

            h = decode_histogram_chunk(value).header
            if int(h["chunk"]) != int(h["chunks"]) - 1 or h["domain"] != cfg.domain_name:
                raise ValueError("not a final chunk of this domain")
            return int(h["tick"])

        consumer = AIOKafkaConsumer(
            bootstrap_servers=cfg.bootstrap, **cfg.kafka_kwargs(), client_id=f"{cfg.client_id}-resume",
            enable_auto_commit=False, group_id=None,
        )
        try:  # started inside: a stop signal during start() must close it too
            # and let finish first: a handshake cancelled half way leaves a connection that
            # stop() cannot close ('Unclosed AIOKafkaConnection'; a stop right after the
            # election, which now ends its wait at once, cancelled it there)
            await finish_before_cancel(consumer.start(), _STARTUP_GRACE_S)
            parts = await partitions_of(consumer, topic)
            if not parts:
                return 0
            tps = [TopicPartition(topic, p) for p in parts]
            consumer.assign(tps)
            begin = await consumer.beginning_offsets(tps)
            end = await consumer.end_offsets(tps)
            best = 0
            for tp in tps:
                found, window, hi = False, 16, end[tp]
                while not found and hi > begin[tp]:
                    lo = max(begin[tp], hi - window)
                    for rec in await read_range(consumer, tp, lo, hi):
                        if rec.key == key and rec.value is not None:
                            with contextlib.suppress(ValueError, KeyError, TypeError):
                                best = max(best, tick_of(rec.value))
                                found = True
                    hi, window = lo, window * 8
            return best
        finally:
            await consumer.stop()

    def _solver(self) -> SolveFn:
        if self._solve is None:
            self._solve = _default_solve()
        return self._solve

    async def _lead(self) -> None:
        cfg = self.config
        self._manifest_sent = False
        after = await self.last_published_tick()
        # Continue at the next multiple of `every`.
        self.last_tick = after
        assembler: TickAssembler
        if self.tables_mode:
            assembler = TableAssembler(every=cfg.every, after_tick=after,
                                       max_pending=cfg.max_pending_ticks)
        elif cfg.compact_topic:
            assembler = BlockAssembler(self.names, cfg.shards, every=cfg.every, after_tick=after,
                                       max_pending=cfg.max_pending_ticks,
                                       index=self._name_index())
            assembler.set_manifests(await self._manifests())
        else:
            assembler = TickAssembler(self.names, every=cfg.every, after_tick=after,
                                      max_pending=cfg.max_pending_ticks,
                                      index=self._name_index())
        log.info("reconcile leader resuming", extra={"after_tick": after})
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cfg.bootstrap, **cfg.kafka_kwargs(),
            group_id=f"{cfg.leader_group}.offsets",
            client_id=f"{cfg.client_id}-counts",
            consumer_timeout_ms=FETCHER_IDLE_MS,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=10_000,
            # compact records hold a whole shard's tick (16 bytes per stream)
            max_partition_fetch_bytes=(64 << 20) if cfg.compact_topic else 1 << 20,
            fetch_max_bytes=(128 << 20) if cfg.compact_topic else 52_428_800,
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=cfg.bootstrap, **cfg.kafka_kwargs(), client_id=f"{cfg.client_id}-out", acks="all",
            # gzip shrinks JSON histograms about 3x; the chunks' float64 columns hardly
            # compress, and gzip runs on the event loop (2 s per tick at 10^6 nodes)
            enable_idempotence=True, linger_ms=0,
            compression_type="gzip" if cfg.histograms_json else None,
            max_request_size=cfg.max_message_bytes,
        )
        from agents.kafka.fetch_backoff import pace, slow_down
        from agents.kafka.produce_encoding import install as install_produce_encoding

        install_produce_encoding()  # its histogram chunks: ~24 MB per tick at 10^6 nodes

        async def start() -> list[TopicPartition]:
            await consumer.start()
            # histograms lag releases by seconds: 5x fewer empty fetches, growing to 20x (1 s
            # by default) between ticks; an in-process release stage hands its records over
            slow_down(consumer)
            pace(consumer, _IDLE_GROWTH)
            await producer.start()
            return await self._assign_counts(consumer)

        try:  # started inside: a step-down during start() must close both (no 'Unclosed')
            tps = await finish_before_cancel(start(), _STARTUP_GRACE_S)
            self._handed, self._taken_next = [], {}
            self._lead_consumer = consumer  # from now on the release stage may hand over
            last_refresh = time.monotonic()
            while True:
                # records, a hand-over, or poll_ms: no pass on a timer while records come
                batches = await getmany_or_wake(consumer, self._lead_woken, cfg.poll_ms / 1000)
                self._lead_woken.clear()  # what woke it is taken just below
                # records taken over meanwhile: each at the position the previous batch ended
                handed, self._handed = self._handed, []
                # Decoding thousands of JSON messages is CPU work: a worker thread keeps the
                # event loop (heartbeats, the pipeline, the web server) responsive.
                complete = (
                    await asyncio.to_thread(self._ingest, assembler, batches, handed)
                    if batches or handed else []
                )
                if isinstance(assembler, BlockAssembler) and assembler.unresolved:
                    # records of a shard whose manifest is new: read the manifests, retry once
                    assembler.set_manifests(await self._manifests())
                    retry, assembler.unresolved = assembler.unresolved, []
                    for part, off, block in retry:
                        assembler.add_block(part, off, block)
                    for part, off, block in assembler.unresolved:
                        log.error("compact record without a published manifest; skipped",
                                  extra={"partition": part, "offset": off, "tick": block.tick})
                    assembler.unresolved = []
                    complete += assembler.pop_complete()
                for tick in complete:
                    await self._publish(producer, tick)
                if complete:
                    positions = {tp.partition: await consumer.position(tp) for tp in tps}
                    offsets = assembler.resume_offsets(self._commit_positions(positions))
                    await consumer.commit(
                        {TopicPartition(self.input_topic, p): o for p, o in offsets.items()}
                    )
                if time.monotonic() - last_refresh > 30.0:  # partitions added to counts topic
                    last_refresh = time.monotonic()
                    parts = await partitions_of(consumer, self.input_topic)
                    if len(parts) != len(tps):
                        # re-assigned from the committed offsets: records taken over but not
                        # added yet are read again from the topic (the assembler keeps one copy)
                        self._taken_next = {}  # the consumer moved back
                        tps = await self._assign_counts(consumer)
        finally:
            self._lead_consumer = None  # no hand-over into a stopping consumer
            self._handed = []
            try:
                await producer.stop()
            finally:  # the consumer too, even when the producer's stop is cut short (outage)
                await consumer.stop()

    async def _manifests(self) -> dict[str, Any]:
        from agents.kafka.manifests import read_manifests

        cfg = self.config
        return await read_manifests(cfg.bootstrap, cfg.kafka_kwargs(),
                                    f"{cfg.compact_topic}.manifests")

    @property
    def input_topic(self) -> str:
        """The topic the leader reads: the compact records if configured, else the counts."""
        cfg = self.config
        return cfg.compact_topic if cfg.compact_topic and not self.tables_mode else cfg.counts_topic

    async def _assign_counts(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        topic = self.input_topic
        parts: list[int] = []
        for _ in range(100):
            parts = await partitions_of(consumer, topic)
            if parts:
                break
            await asyncio.sleep(0.2)
        if not parts:
            raise RuntimeError(f"topic {topic!r} not found; run 'stream-dp topics create'")
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        for tp in tps:
            committed = await consumer.committed(tp)
            if committed is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, committed)
        return tps

    def _ingest(
        self, assembler: TickAssembler, batches: Mapping[Any, list[ConsumerRecord[Any, Any]]],
        handed: list[tuple[int, _HandedRecord]] | None = None,
    ) -> list[Any]:
        conflicts, dropped = assembler.conflicts, assembler.dropped
        extra: dict[int, list[_HandedRecord]] = {}
        for part, hrec in handed or ():
            extra.setdefault(part, []).append(hrec)
        for tp, records in batches.items():
            more = extra.pop(tp.partition, None)
            # fetched and taken-over records of a partition in offset order, as a consumer
            # reading them all from the topic adds them (the first copy of a tick is kept)
            merged: list[Any] = (records if more is None
                                 else sorted([*records, *more], key=lambda r: r.offset))
            for rec in merged:
                self._add(assembler, tp.partition, rec)
        for part, more in extra.items():
            for hrec in sorted(more, key=lambda r: r.offset):
                self._add(assembler, part, hrec)
        complete = assembler.pop_complete()
        if self.metrics:
            if assembler.conflicts > conflicts:
                self.metrics.release_conflict(assembler.conflicts - conflicts)
            if assembler.dropped > dropped:
                self.metrics.reconcile_skipped(assembler.dropped - dropped)
        return complete

    def _solve_and_encode(self, tick: Any) -> tuple[Any, dict[str, Any], bytes | None,
                                                    list[bytes]]:
        """``(result, message, JSON value or None, chunk records)`` of one tick (a thread):
        :func:`agents.reconcile.messages.solve_and_encode` with this agent's domain and config."""
        cfg = self.config
        return solve_and_encode(
            tick, names=self.names, domain=self.domain, solver=self._solver,
            domain_name=cfg.domain_name, tables_mode=self.tables_mode,
            histograms_json=cfg.histograms_json, blocks=bool(cfg.histogram_blocks_topic),
            chunk_nodes=cfg.histogram_chunk_nodes, node_manifest=self._node_manifest,
            view=self.on_histogram is not None)

    def _name_index(self) -> Mapping[str, int]:
        """Node name → histogram position, once per agent (not at every leadership: 10^7 names
        take seconds of the event loop): a :class:`stream_dp.domain.Domain`'s own index, not a
        second copy of it."""
        found: Mapping[str, int] | None = self.__dict__.get("_index")
        if found is None:
            found = getattr(self.domain, "positions", None)
            if found is None:
                found = dict(zip(self.names, range(len(self.names)), strict=True))
            self.__dict__["_index"] = found
        return found

    def _node_manifest(self) -> tuple[list[tuple[str, bytes]], str]:
        """The histogram's ``dp.manifest.v1`` records (key ``histogram``, or pieces beyond
        32 MiB: :mod:`stream_dp.node_manifest`) and the SHA-256 of all its names, once."""
        if self._manifest is None:
            from stream_dp.compact import manifest_hash
            from stream_dp.node_manifest import encode_node_manifest

            self._manifest = (encode_node_manifest(self.names), manifest_hash(self.names))
        return self._manifest

    def _add(self, assembler: TickAssembler, partition: int,
             rec: ConsumerRecord[Any, Any] | _HandedRecord) -> None:
        if rec.value is None:
            return
        if isinstance(assembler, BlockAssembler):
            from stream_dp.compact import decode_block

            try:
                block = decode_block(rec.value)
            except ValueError as exc:
                log.warning("skipping an invalid compact record",
                            extra={"partition": partition, "offset": rec.offset, "error": str(exc)})
                return
            assembler.add_block(partition, rec.offset, block)
            return
        if isinstance(assembler, TableAssembler):
            try:
                table = decode_table_record(rec.value, self.config.domain_name)
            except ValueError as exc:
                log.warning("skipping an invalid table record",
                            extra={"partition": partition, "offset": rec.offset, "error": str(exc)})
                return
            assembler.add_table(partition, rec.offset, table)
            return
        try:
            release = Release.from_json(rec.value)
        except ValueError as exc:
            log.warning("skipping an invalid counts message",
                        extra={"partition": partition, "offset": rec.offset, "error": str(exc)})
            return
        assembler.add(partition, rec.offset, release)

    def _skip(self, tick: int, reason: str, detail: str) -> None:
        """No histogram for ``tick``: log, count (``stream_dp_reconcile_errors_total``), go on;
        the input offsets are committed past it like any published tick."""
        log.error("cannot publish a histogram for this tick; skipped",
                  extra={"tick": tick, "reason": reason, "error": detail})
        self.last_tick = tick
        self._count_error(reason)

    def _count_error(self, reason: str) -> None:
        """``stream_dp_reconcile_errors_total{reason}`` += 1."""
        if self.metrics:
            record = getattr(self.metrics, "reconcile_error", None)
            if record is not None:
                record(reason)
            else:  # pragma: no cover - a metrics object of an older interface
                self.metrics.reconcile_skipped()

    async def _publish(self, producer: AIOKafkaProducer, tick: Any) -> None:
        cfg = self.config
        try:
            result, message, value, chunks = await asyncio.to_thread(self._solve_and_encode, tick)
        except ValueError as exc:  # e.g. a zero variance: skip the tick, never crash the leader
            self._skip(tick.tick, "unsolvable", str(exc))
            return
        if value is not None and len(value) > cfg.max_message_bytes:
            detail = (f"{len(value)} bytes > max_message_bytes {cfg.max_message_bytes}; set "
                      "histograms_json = 0 and compact_topic (chunked compact histograms)")
            if not chunks:
                self._skip(tick.tick, "too_large", detail)
                return
            # the chunk records still carry the tick: only the JSON view is missing
            log.error("histogram too large as JSON; published as chunks only",
                      extra={"tick": tick.tick, "error": detail})
            self._count_error("too_large")
            value = None
        from aiokafka.errors import MessageSizeTooLargeError

        key = cfg.domain_name.encode()
        try:
            if chunks and not self._manifest_sent:
                # in order, on one partition: a reader joins the pieces it has read in full
                for shard, record in self._node_manifest()[0]:
                    await producer.send_and_wait(cfg.manifests_topic, record,
                                                 key=shard.encode(), partition=0)
                self._manifest_sent = True
            # Broker timestamp = publish time: event-time stamps of a replayed old log would
            # fall outside time-based retention at once. Chunks in order, one partition (the
            # domain's key): a reader that sees the last chunk of a tick has seen them all.
            sent = [await producer.send(cfg.histogram_blocks_topic, c, key=key) for c in chunks]
            if value is not None:
                sent.append(await producer.send(cfg.histograms_topic, value, key=key))
            for fut in sent:
                await fut
        except MessageSizeTooLargeError as exc:
            # not transient: retrying (or restarting the leader) would fail the same way
            self._skip(tick.tick, "too_large", f"the broker refused a record ({exc}); raise "
                       "max.message.bytes of the histograms topic ('stream-dp topics create' "
                       "sets 64 MiB) or set histograms_json = 0 (chunked compact histograms)")
            return
        self.published += 1
        self.last_tick = tick.tick
        seconds = float(result.seconds)
        self.solve_seconds.append(seconds)
        if self.metrics:
            self.metrics.histogram_published(
                tick.tick, seconds, int(result.iterations), float(result.residual)
            )
        log.info(
            "histogram published",
            extra={"tick": tick.tick, "nodes": len(self.names), "solve_seconds": seconds,
                   "iterations": int(result.iterations), "residual": float(result.residual)},
        )
        if self.on_histogram is not None:
            await self.on_histogram(message)


class _HandedRecord(NamedTuple):
    """A committed compact record handed over by the release stage: what :meth:`Reconciler._add`
    reads of a fetched record (its offset in the partition and its value, the bytes sent)."""

    offset: int
    value: bytes


#: the counts consumer's pause after empty fetches grows to this many times its first (5 × the
#: backoff): ~1 s between ticks instead of 0.25 s (agents.kafka.fetch_backoff.pace)
_IDLE_GROWTH = 4.0
#: how long a step-down waits for the leader's clients to finish starting (seconds): well
#: inside the worker's 15 s stop bound (outage: start() hangs)
_STARTUP_GRACE_S = 3.0
