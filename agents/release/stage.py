"""The release stage of the worker pipeline (:class:`ReleaseStage`).

Consumes the partials topic (group ``<app_id>.release``), runs one
:class:`agents.release.state.ReleaseState` per shard and publishes each complete tick's noisy
counts with the shard's checkpoint in one transaction (see :mod:`agents.worker.pipeline`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from agents.ingest.routing import Partial, Router
from agents.ingest.stage import IngestStage
from agents.kafka.batches import send_batched
from agents.kafka.checkpoints import CheckpointRefused, Progress, progress_message
from agents.kafka.stage import _kafka, _Stage
from agents.kafka.stage_host import StageHost
from agents.release.state import Release, ReleaseOverflow, ReleaseState
from agents.telemetry.pipeline_metrics import PipelineMetrics

log = logging.getLogger("stream_dp.pipeline")

#: Most count messages one release transaction publishes (bounds a transaction's size after a
#: long outage, while a backlog of many small ticks still goes out in few transactions).
_MAX_MESSAGES_PER_COMMIT = 200_000
#: ... and never more ticks than this per transaction
_MAX_TICKS_PER_COMMIT = 1024
#: the partials consumer's pause after empty fetches grows to this many times
#: ``empty_fetch_backoff_ms`` (1 s by default) while this process's own ingest owns every events
#: partition: then every partial comes from its commits, and each wakes the consumer
#: (:meth:`ReleaseStage.partials_committed`); otherwise it stays at the setting, so partials
#: from other workers wait no longer than before
_IDLE_GROWTH_ALL_LOCAL = 20.0


#: called after each committed shard-tick release (may return an awaitable)
OnRelease = Callable[[Release], Awaitable[None] | None]
#: awaited with ``(topic, partition, offset, value)`` of a committed compact record
OnCompact = Callable[[str, int, int, bytes], Awaitable[None]]


class ReleaseHost(StageHost, Protocol):
    """What the release stage sees of the process that runs it, besides :class:`StageHost`."""

    #: node routing of the domain (the streams of each shard)
    router: Router
    #: the noise key (the noise and the checkpoints' seals derive from it)
    key: bytes
    #: the deployment's domain (binary-attribute domains build their tables from it)
    domain: Any
    #: the privacy parameters published with every count (``Settings.privacy.as_dict()``)
    privacy: dict[str, Any]
    metrics: PipelineMetrics
    #: seconds from a tick's close to its release being committed (diagnostics)
    latencies: deque[float]
    #: where each shard-tick release spent its time (seconds; diagnostics)
    release_timings: deque[dict[str, float]]
    on_release: OnRelease | None
    on_compact: OnCompact | None
    #: the ingest stage of the same process: its owned partitions tell a log that lost records
    #: from partials that are merely late
    ingest: IngestStage

    def mechanism(self) -> Any:
        """The deployment's release mechanism (built once)."""
        ...

    def new_bank(self, shard: int) -> Any:
        """A fresh counter bank for the streams of ``shard`` (``None`` if it has none)."""
        ...


class ReleaseStage(_Stage):
    name = "release"
    w: ReleaseHost

    def __init__(self, worker: ReleaseHost, topic: str, group: str, ckpt_topic: str) -> None:
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

    #: the growth in force (agents.kafka.fetch_backoff.pace), set when it changes
    _growth = 1.0

    def partials_committed(self) -> None:
        """The in-process ingest committed partials: fetch them now (ends the fetch pause)."""
        from agents.kafka.fetch_backoff import wake

        if self.consumer is not None:
            wake(self.consumer)

    def _pace(self) -> None:
        """A long pause between empty fetches only while every partial comes from this
        process's ingest (each of its commits wakes the consumer)."""
        from agents.kafka.fetch_backoff import pace

        ingest = getattr(self.w, "ingest", None)
        local = (ingest is not None and not ingest.restoring
                 and len(ingest.states) >= self.s.events_partitions)
        growth = _IDLE_GROWTH_ALL_LOCAL if local else 1.0
        if growth != self._growth and self.consumer is not None:
            with contextlib.suppress(ValueError):  # not started yet: next time
                pace(self.consumer, growth)
                self._growth = growth

    def own_due_s(self, now: float) -> float:
        """A tick ready but held back while a backlog is read: when the 0.2 s gathering ends; a
        dirty state: when its commit is due (:meth:`handle`); a tick missing partials: when
        it has waited ``stall_timeout_s`` (:meth:`check_ownership`); else nothing."""
        due = super().own_due_s(now)
        for p, state in list(self.states.items()):
            if state.restepping:
                continue  # stepped as its partials come
            if state.ready():  # held back for a backlog, or more ready than one commit took
                since = self._ready_since.get(p)
                due = min(due, 0.0 if since is None else since + 0.2 - now)
            elif state.dirty and not state.pending.get(state.next_tick):
                due = min(due, self.last_commit.get(p, 0.0) + self.s.commit_interval_s - now)
            slot = state.pending.get(state.next_tick)
            since = self._incomplete.get((state.shard, state.next_tick))
            if slot and since is not None and len(slot) < state.sources:
                # the stall check of the tick it waits for (older entries are stale: released
                # ticks; one already past its timeout is checked at the 1 s passes)
                left = since + self.s.stall_timeout_s - now
                if left > 0:
                    due = min(due, left)
        return due

    def new_state(self, p: int) -> ReleaseState:
        if self.w.router.patterns:
            from agents.release.attributes import AttributeReleaseState, new_live

            live = new_live(self.s, self.w.domain, self.w.key,
                            self.w.router.deployment_nonce) if p == 0 else None
            return AttributeReleaseState(self.s, self.w.router, p, live, key=self.w.key)
        return self._shard_state(p, self.w.new_bank(p))

    def state_to_restore(self, p: int) -> ReleaseState:
        """A shard's state without its counter bank: the checkpoint's bank replaces it (a bank
        built here would cost its stream ids, ≈ 2 µs a stream, to be thrown away)."""
        if self.w.router.patterns:
            return self.new_state(p)
        return self._shard_state(p, None)

    def _shard_state(self, p: int, bank: Any) -> ReleaseState:
        return ReleaseState(self.s, self.w.router, p, bank, key=self.w.key,
                            mechanism=self.w.mechanism())

    def restore_in_thread(self) -> bool:
        """A release shard's restore (its bank's stream ids and state from the checkpoint) runs
        in a thread: seconds a shard at 250 000 streams."""
        return True

    def before_restore_thread(self) -> None:
        self.w.mechanism()  # built once, on the loop, before any thread uses it

    async def check_ownership(self) -> None:
        """Also: a tick that misses partials from some events partitions for
        ``stall_timeout_s`` means an ingest partition has no working owner: rejoin ingest.
        (And the fetch pace: :meth:`_pace`.)"""
        self._pace()
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
        # What each owned partition's committed checkpoint says was written (written_through:
        # set at restore and after each committed transaction, so neither ticks closed in
        # memory nor a hand-over step still in flight count), taken BEFORE the partials' end
        # offsets: read after them, a commit in between looked like partials missing from the
        # log (a false 'state is ahead of the log', exit 4: 3 of 10 runs of the test of a
        # partition left without an owner, right after the partition was assigned again).
        committed = {p: int(ingest.states[p].written_through) for p in owned}
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
                           f"written through {committed[tp.partition]}, closed through "
                           f"{int(st.next_tick) - 1}), but {self.topic} does not hold them")
            else:
                # during a backlog's hand-over the ticks are closed long before their partials
                # are written: name both, or "closed through 474000" reads like a loss
                log.warning("ticks wait for partials of events partition %d, owned here: it "
                            "has handed over through tick %d (closed through %d), at offset %d "
                            "of %d", tp.partition, st.handed_over_through(),
                            int(st.next_tick) - 1, int(st.offset), end)
                continue
            self.w.release_error("checkpoint_refused")
            self.w.fail(CheckpointRefused(
                f"{problem}: the state is ahead of the log. The broker lost records it had "
                "acknowledged (a development broker killed with kill -9 can: "
                "docs/operations.md); the state cannot be continued. Start a new deployment "
                "(stream-dp deployment new), or restore the broker's data"))
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
                "the worker was down longer than the retention. Start a new deployment (stream-dp "
                "deployment new).")
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
            await send_batched(prod, topic, part, items)

    async def _send_compact(self, prod: Any, shard: int, releases: list[Release],
                            sent: list[tuple[Any, bytes]] | None = None) -> bool:
        """With ``compact_topic`` set: one ``dp.counts.block.v1`` record per release (partition
        = shard, key = shard name) and, once per producer, the shard's manifest. Returns whether
        the manifest went into this transaction (it counts as sent only once committed).
        ``sent`` (if given) gets each compact record's delivery future and value, in order."""
        if not self.s.compact_topic or not releases:
            return False
        name = releases[0].shard_name().encode("utf-8")
        manifest = shard not in self._manifest_sent
        if manifest:
            await prod.send(self.s.manifests_topic, key=name, value=releases[0].manifest(),
                            partition=shard)
        for rel in releases:
            value = rel.compact(self.s, self.w.privacy)
            fut = await prod.send(self.s.compact_topic, key=name, value=value, partition=shard)
            if sent is not None:
                sent.append((fut, value))
        return manifest

    async def _hand_over(self, p: int, sent: list[tuple[Any, bytes]]) -> None:
        """After the commit: each compact record with its offset to ``worker.on_compact`` (the
        in-process reconcile agent takes it instead of fetching it back; it may ignore it)."""
        hook = getattr(self.w, "on_compact", None)
        if hook is None:
            return
        for fut, value in sent:
            try:
                offset = int(fut.result().offset)  # done: awaited before the commit
                await hook(self.s.compact_topic, p, offset, value)
            except Exception:  # the hand-over is an optimisation: the topic still has it
                log.exception("compact hand-over failed; the reconcile agent reads the topic")
                return

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
            handed: list[tuple[Any, bytes]] | None = (
                [] if getattr(self.w, "on_compact", None) else None)
            sent_manifest = await self._send_compact(prod, p, releases, handed)
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
            if handed:  # committed: what a read_committed consumer of the topic now gets
                await self._hand_over(p, handed)
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
        # a markers replay's ticks end in the log's past (2024: 10^8 s ago), and their closing
        # time is the marker's event time: latency from the moment this stage had the tick's
        # partials (wall clock) instead
        markers = getattr(self.s, "schedule", "clock") == "markers"
        for rel in releases:
            start = gathered_at.get(rel.tick, wall0) if markers else rel.tick_end
            m.tick_released(now - start, len(rel.streams))
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
