"""The ingest state of one events partition (:class:`IngestState`) and what processing
produces (:class:`IngestOutput`). Pure: no I/O.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from agents.config.settings import Settings
from agents.ingest.digest import (
    _UNKEYED,
    _blake2b,
    digest_key,
    entry_key,
)
from agents.ingest.processing import IngestOutput, RecordProcessing
from agents.ingest.records import (
    _fast_dumps,
)
from agents.ingest.routing import Partial, Router
from agents.ingest.schedule import Close, ScheduleEntry, ScheduleMismatch
from agents.ingest.ticks import Schedule
from agents.ingest.user_flush import MAX_FUTURE, FlushPoint
from agents.ingest.user_records import ChangelogMac
from agents.ingest.users import UserState
from agents.kafka.codec import (
    marker_key,
)
from stream_dp.contributions import cap_units, clip_limit_units, value_unit

#: the version of user-level ingest checkpoints (the per-person table and its digest; 9: the
#: changelog's binary records, agents.ingest.user_records; 10: the table's flush point,
#: agents.ingest.user_flush; 11: the identifiers' SipHash, agents.ingest.siphash — versions 9
#: and 10 keyed persons by BLAKE2b and are refused)
USER_LEVEL_VERSION = 11


class IngestState(RecordProcessing):
    """Offset, next open tick, open buckets and closing points of one events partition."""

    def __init__(
        self, settings: Settings, router: Router, partition: int, wall: float = 0.0,
        offset: int = -1, key: bytes | None = None, domain_id: str = "",
    ) -> None:
        self.settings = settings
        #: the noise key: checkpoints are sealed with a MAC under a key derived from it
        #: (:mod:`stream_dp.integrity`); ``None`` leaves them unsealed (tests of the pure state)
        self._key = key
        self.domain_id = domain_id
        self.router = router
        self.partition = partition
        #: next offset to process; -1 = not known yet (no checkpoint: start per events_start)
        self.offset = offset
        self.seq = 0
        self.schedule = Schedule(
            origin=settings.origin, tick_seconds=settings.tick_seconds,
            lateness=settings.allowed_lateness_s, grace=settings.close_grace_s,
        )
        self.markers = settings.schedule == "markers"
        #: the LogAppendTime closing rule applies only where the events topic's
        #: message.timestamp.type is LogAppendTime (the setting, checked against the topic at
        #: start-up): a record's own timestamp-type bit is never trusted on its own
        self.lat_trusted = settings.events_timestamp_type == "LogAppendTime" and not self.markers
        #: the worker's clock (Unix seconds): bounds every closing point (injectable for tests)
        self.clock: Callable[[], float] = time.time
        #: keyed digest and close-marker MAC keys, derived from the noise key
        self._dkey = digest_key(key)
        #: the keyed hash with its key block already absorbed (copied per record)
        self._dhash = _blake2b(digest_size=16, key=self._dkey)
        self.entry_key = entry_key(key)
        self._mkey = marker_key(key if key is not None else _UNKEYED)
        #: exact sums: values in integer units of ``unit`` (stream_dp.contributions)
        self.unit = value_unit(settings.cap)
        self.cap_u = cap_units(settings.cap, self.unit)
        self.clip = clip_limit_units(settings.cap, settings.max_events_per_tick)
        #: schedule-topic offset from which closing points not yet applied can lie (kept in
        #: the checkpoint: a restore reads the schedule topic from there, not from its start)
        self.schedule_from = 0
        #: first tick not yet closed
        self.next_tick = 1
        #: tick -> {bucket key (:meth:`Router.bucket_key`: the event's leaf, or the tuple of
        #: nodes it feeds): sum of clamped values in integer units}. Integer sums are exact, so
        #: one event moves a sum by exactly its own contribution whatever else arrives.
        self.buckets: dict[int, dict[Any, int]] = {}
        #: closing points decided but not reached yet, in offset order
        self.pending: list[Close] = []
        #: closing points read back from the schedule topic that are still ahead (offset order)
        self.known: list[ScheduleEntry] = []
        #: running digest of the records since the last closing point, and where that range began
        self.digest = 0
        self.range_start = -1
        self.out = IngestOutput()
        self.dirty = False
        #: closed ticks whose partials are not handed over yet, as ``(first, through,
        #: decided_at)`` ranges in tick order. Closing is a decision (``next_tick`` moves, the
        #: schedule entry is written at once); handing a closed tick's partials over is work
        #: that a large backlog (e.g. 474 000 due ticks) must not do in one synchronous step:
        #: :meth:`hand_over` does it ``hand_over_limit`` ticks at a time, and the buckets of
        #: these ticks stay in :attr:`buckets` (and in the checkpoint) until then.
        self.unsent: list[tuple[int, int, float]] = []
        #: at most this many closed ticks handed over per :meth:`_apply` / :meth:`hand_over`
        #: call; ``None``: all at once (pure states, unit tests). The worker sets
        #: ``agents.worker.pipeline.HAND_OVER_TICKS`` and commits between steps.
        self.hand_over_limit: int | None = None
        #: the last tick whose partials are in a *committed* transaction (the checkpoint read
        #: at restore, or the worker's last commit): :meth:`handed_over_through` runs ahead of
        #: it while a step's transaction is being sent, and only this one may be read as
        #: "the partials topic must hold them" (the release stage's lost-log check)
        self.written_through = 0
        #: use the compiled fast path when it is available (tests compare both paths)
        self.use_fast_path = True
        #: privacy_unit = user: the per-person table (agents.ingest.users), part of the
        #: checkpoint; None at event level (whose checkpoints are unchanged)
        self.users: UserState | None = None
        if settings.privacy_unit == "user":
            # a binary-attribute domain too: the bound's "stream" (L, k) is then the event's
            # attribute pattern, its bucket key (docs/design/user-level.md §1)
            self.users = UserState(settings, partition, key)
        #: changelog form: where the table was last written to its changelog (``None``: not
        #: yet, the next commit writes it), when (monotonic seconds), and the offsets of the
        #: records refused since then by the worker's clock (agents.ingest.user_flush)
        self.flush_point: FlushPoint | None = None
        self.flushed_at = 0.0
        self.future_offsets: list[int] = []

    # ------------------------------------------------------------------ schedule
    @property
    def schedule_id(self) -> tuple[str, float, float, float]:
        s = self.settings
        return (s.schedule, float(s.origin), float(s.tick_seconds), float(s.allowed_lateness_s))

    def load_known(self, entries: Sequence[ScheduleEntry]) -> None:
        """Adopt persisted closing points of this partition (schedule topic, in write order).

        Entries already applied (``through < next_tick``) are skipped; the rest are followed
        exactly, and live rules resume only after the last of them. Raises
        :class:`ScheduleMismatch` for entries of another schedule.
        """
        # Keyed by deployment (app id) and partition, not by topic name: the same deployment
        # reading a changed copy of its log from another topic is refused too.
        mine = [e for e in entries if (e.app_id, e.partition) == (
            self.settings.app_id, self.partition)]
        for e in mine:
            if e.schedule != self.schedule_id:
                raise ScheduleMismatch(
                    f"events partition {self.partition}: the schedule topic holds closing points "
                    f"made under schedule {e.schedule}, the settings say {self.schedule_id}; "
                    "releasing under another schedule with the same key would reuse noise on "
                    "differently bucketed data. Start a new deployment (stream-dp "
                    "deployment new), with its own schedule_topic."
                )
        unique: list[ScheduleEntry] = []
        for e in mine:  # the same point written twice (e.g. a retried transaction) counts once
            if unique and (e.first, e.through, e.close_offset, e.digest) == (
                    unique[-1].first, unique[-1].through, unique[-1].close_offset,
                    unique[-1].digest):
                continue
            unique.append(e)
        self.known = [e for e in unique if e.through >= self.next_tick]
        prev = None
        for e in self.known:
            if prev is not None and (e.close_offset < prev.close_offset
                                     or e.through <= prev.through):
                raise ScheduleMismatch(
                    f"events partition {self.partition}: schedule entries out of order "
                    f"(through {prev.through} at {prev.close_offset}, then {e.through} at "
                    f"{e.close_offset})"
                )
            prev = e
        if self.known and self.offset >= 0 and self.known[0].start_offset != self.range_start \
                and self.range_start >= 0:
            raise ScheduleMismatch(
                f"events partition {self.partition}: checkpoint (range from offset "
                f"{self.range_start}) and schedule topic (next closing range from "
                f"{self.known[0].start_offset}) disagree"
            )
        self.pending = [Close(e.through, e.close_offset, "persisted", e.decided_at)
                        for e in self.known]

    @property
    def replaying(self) -> bool:
        """True while persisted closing points are ahead (live rules are suspended)."""
        return bool(self.known)

    def schedule_close(self, through: int, offset: int, rule: str, decided_at: float) -> bool:
        """Decide that every tick ``≤ through`` closes before ``offset``; False if redundant.

        Used by the pipeline's clock rule (``offset`` = the end offset read once the clock
        passed ``deadline(through) + grace``). Ignored while replaying persisted points.
        """
        if self.replaying or through < self.next_tick:
            return False
        last = self.pending[-1] if self.pending else None
        if last is not None and last.through >= through:
            return False
        offset = max(offset, last.offset if last is not None else offset, self.offset)
        self.pending.append(Close(through, offset, rule, decided_at))
        return True

    def covered_through(self) -> int:
        """The last tick that is closed or has a closing point decided."""
        if self.pending:
            return max(self.pending[-1].through, self.next_tick - 1)
        return self.next_tick - 1

    def apply_due(self) -> int:
        """Apply every pending closing point that the processed offset has reached."""
        n = 0
        while self.pending and self.pending[0].offset <= self.offset:
            n += self._apply(self.pending.pop(0))
        return n

    def _apply(self, c: Close) -> int:
        """Close ticks ``next_tick..c.through`` at ``c.offset``; return how many closed."""
        if self.range_start < 0:
            self.range_start = self.offset if self.offset >= 0 else c.offset
        entry_digest = f"{self.digest:032x}"
        if c.rule == "persisted":
            want = self.known.pop(0)
            if (want.start_offset, want.close_offset, want.digest) != (
                    self.range_start, c.offset, entry_digest):
                raise ScheduleMismatch(
                    f"events partition {self.partition}: the records of offsets "
                    f"[{want.start_offset}, {want.close_offset}) (ticks {want.first}..{want.through})"
                    " differ from the ones released under this key and schedule (digest "
                    f"{entry_digest} over [{self.range_start}, {c.offset}) vs {want.digest}). "
                    "A changed log must not be released with the same noise: start a new "
                    "deployment (stream-dp deployment new)."
                )
            rule, decided = want.rule, want.decided_at
        else:
            rule, decided = c.rule, c.decided_at
        first = self.next_tick
        if c.through < first:
            return 0
        # closed now; the partials follow in bounded steps (hand_over), oldest ticks first
        self.unsent.append((first, c.through, decided))
        if c.rule != "persisted":  # a followed point is on the schedule topic already
            self.out.entries.append(ScheduleEntry(
                self.settings.app_id, self.settings.events_topic, self.partition, first,
                c.through, self.range_start, c.offset, entry_digest, rule, decided,
                self.schedule_id,
            ))
        self.next_tick = c.through + 1
        if self.users is not None:  # slots of wholly closed periods go (no event can reach them)
            self.users.closed_before(self.next_tick)
        self.digest = 0
        self.range_start = c.offset
        self.dirty = True
        self.hand_over(self.hand_over_limit)
        return c.through - first + 1

    @property
    def unsent_ticks(self) -> int:
        """How many closed ticks still wait for their partials to be handed over."""
        return sum(through - first + 1 for first, through, _ in self.unsent)

    def handed_over_through(self) -> int:
        """The last tick whose partials have been handed over (``next_tick - 1`` unless a
        backlog of closed ticks is still being handed over)."""
        return self.unsent[0][0] - 1 if self.unsent else self.next_tick - 1

    def mark_written(self, through: int | None = None) -> None:
        """The transaction holding the partials through tick ``through`` (default: every
        tick handed over so far) committed."""
        self.written_through = self.handed_over_through() if through is None else through

    def hand_over(self, limit: int | None = None) -> int:
        """Hand over the partials of at most ``limit`` closed ticks (``None``: all), oldest
        first, into :attr:`out`; return how many ticks. Each tick gets one partial per release
        shard, empty ones included, exactly as if it had been handed over when it closed: the
        partials depend only on the tick's bucket and its closing point's ``decided_at``."""
        n = 0
        while self.unsent and (limit is None or n < limit):
            first, through, decided = self.unsent[0]
            last = through if limit is None else min(through, first + (limit - n) - 1)
            self._partials(first, last, decided)
            n += last - first + 1
            if last == through:
                self.unsent.pop(0)
            else:
                self.unsent[0] = (last + 1, through, decided)
        if n:
            self.out.ticks_closed += n
            self.dirty = True
        return n

    def _partials(self, first: int, through: int, decided: float) -> None:
        """One partial per release shard for each tick ``first..through`` (closed ticks)."""
        router = self.router
        for tick in range(first, through + 1):
            bucket = self.buckets.pop(tick, {})
            if router.patterns:
                # every table lives in shard 0: hand it the tick's events as (pattern, count)
                items = sorted((nodes[0], v) for nodes, v in bucket.items())
                for shard in range(router.shards):
                    mine = items if shard == 0 else []
                    # one entry per distinct pattern, which nothing public bounds: cut into
                    # records that fit the partials topic whatever the events (Partial.split)
                    self.out.partials.extend(Partial(
                        tick, self.partition, shard, tuple(i for i, _ in mine),
                        tuple(x for _, x in mine), decided).split())
                continue
            clip = self.clip
            if router.leaf_mode:
                # int64 columns (no Python int per node; issue #25), tuples beyond int64
                for shard, (idx, counts) in enumerate(router.tick_columns(bucket, clip)):
                    self.out.partials.append(
                        Partial(tick, self.partition, shard, idx, counts, decided))
                continue
            sums: dict[int, int] = {}
            for nodes, v in bucket.items():  # exact integers: any order gives the same sums
                v = v if v < clip else clip
                for n in nodes:
                    sums[n] = sums.get(n, 0) + v
            per_shard: list[list[tuple[int, int]]] = [[] for _ in range(router.shards)]
            for n in sorted(sums):
                x = sums[n]
                per_shard[router.node_shard[n]].append((router.local_index[n],
                                                        x if x < clip else clip))
            for shard, items in enumerate(per_shard):
                self.out.partials.append(
                    Partial(tick, self.partition, shard, tuple(i for i, _ in items),
                            tuple(x for _, x in items), decided)
                )

    # ------------------------------------------------------------------ checkpoint
    def context(self, *, before_siphash: bool = False) -> bytes:
        """Canonical description of everything this partition's state depends on: the
        checkpoint is bound to it (a restore under anything else is refused).
        ``before_siphash``: the context of user-level checkpoints of versions 7 to 10 (no
        ``id_hash``), only to recognise them and refuse them in their own words."""
        from stream_dp.mechanism import canonical_json

        s = self.settings
        doc = {
            "kind": "ingest checkpoint", "version": 5, "partition": self.partition,
            "events_partitions": s.events_partitions, "shards": s.shards,
            "domain": self.domain_id, "epoch": getattr(s, "epoch", 0), "cap": float(s.cap),
            "schedule": list(self.schedule_id), "strategy": s.strategy,
        }
        if self.users is not None:  # absent at event level: its context is unchanged
            users = self.users.context()
            if before_siphash:
                del users["id_hash"]
            doc["users"] = users
        return canonical_json(doc)

    def to_bytes(self) -> bytes:
        """Offset, next tick, running digest, open buckets and closed ticks not handed over
        yet (JSON; floats round-trip), sealed with a MAC bound to :meth:`context` when the
        state has a key."""
        payload = self._payload()
        if self._key is None:
            return payload
        from stream_dp.integrity import seal

        return seal(self._key, "ingest checkpoint", self.context(), payload)

    def _payload(self) -> bytes:
        from agents.ingest.bucket_columns import bucket_columns

        buckets = {}
        for t, b in self.buckets.items():
            # keys sorted: a deterministic checkpoint; a flat/hierarchy key is its leaf index,
            # a grid's its tuple of nodes; sums are integer units (v5), clipped:
            # min(min(a, c) + b, c) == min(a + b, c), so clipping is lossless
            buckets[str(t)] = list(bucket_columns(b, self.clip, self.router.leaf_mode,
                                                  arrays=True))
        doc = {
            "v": 5,
            "partition": self.partition,
            "offset": self.offset,
            "next_tick": self.next_tick,
            "range_start": self.range_start,
            "digest": f"{self.digest:032x}",
            "schedule_from": self.schedule_from,
            "schedule": list(self.schedule_id),
            "buckets": buckets,
        }
        if self.unsent:  # closed ticks not handed over yet (a backlog); absent otherwise, so
            # the checkpoints of a worker without a backlog stay as they were. Version 6: a
            # worker from before the hand-over reads v5 only, so it refuses this checkpoint
            # instead of ignoring the list and losing those ticks' partials
            doc["v"] = 6
            doc["unsent"] = [[a, b, d] for a, b, d in self.unsent]
        if self.users is not None:
            # Version 11: the per-person table, restored with these offsets (nothing counted
            # twice after a restart), in changelog form with the keyed digest of the table the
            # restore checks the changelog against (v7, the preview before it, had none) and
            # where the table was last written (v10; v9 wrote it with every commit). A
            # worker that reads v5/v6/v7 only refuses it rather than restart every person's
            # budget or skip the check; absent at event level
            doc["v"] = USER_LEVEL_VERSION
            users = self.users.to_doc()
            if self.users.changelog:  # the table as of this point, the events since re-decided
                # (None before the first write: the worker writes it with its first commit, so
                # only a test's snapshot has none; a restore refuses it)
                users["flush"] = None if self.flush_point is None else replace(
                    self.flush_point, future=tuple(self.future_offsets)).to_doc()
            doc["users"] = users
        # ~4.6x faster on 3·10^5 open keys (the sums are finite); the columns as arrays
        return _fast_dumps(doc, numpy=True)

    def user_changes(self) -> list[tuple[bytes, bytes | None]]:
        """The per-person changelog records to write with the next checkpoint (changelog
        form): key = a person's keyed hash, value its state tagged with a MAC bound to
        :meth:`context` and that key (``None``: a tombstone;
        :mod:`agents.ingest.user_records`). The table is then *flushed* here: the checkpoint
        carries this point until the next call (:mod:`agents.ingest.user_flush`)."""
        assert self.users is not None
        changes = self.users.take_changes(ChangelogMac(self._key, self.context()))
        self.flush_point = FlushPoint(self.offset, self.next_tick, self.range_start,
                                      self.digest, self.schedule_from, self.users.open_period)
        self.flushed_at = time.monotonic()
        self.future_offsets = []
        return changes

    def written_empty(self) -> None:
        """A fresh partition (no checkpoint) positioned at its first offset: its empty table
        counts as written there (its changelog is empty), so a restore from a later commit
        re-decides from here."""
        assert self.users is not None and not len(self.users.bounder)
        self.flush_point = FlushPoint(self.offset, self.next_tick, self.range_start,
                                      self.digest, self.schedule_from, self.users.open_period)
        self.flushed_at = time.monotonic()
        self.future_offsets = []

    def user_flush_due(self, interval_s: float) -> bool:
        """Whether the next commit writes the per-person table (changelog form): never
        written, ``interval_s`` seconds passed since (0: always), or many records refused by
        the worker's clock meanwhile (:data:`~agents.ingest.user_flush.MAX_FUTURE`)."""
        return (self.flush_point is None or interval_s <= 0
                or time.monotonic() - self.flushed_at >= interval_s
                or len(self.future_offsets) >= MAX_FUTURE)

    def user_unflushed(self) -> bool:
        """Whether the per-person table (changelog form) has moved since it was written."""
        return self.users is not None and self.users.changelog and (
            self.flush_point is None or self.flush_point.offset != self.offset
            or self.flush_point.next_tick != self.next_tick)

    def load_user_changes(self, records: list[tuple[bytes, bytes | None]]) -> None:
        """The per-person table from its changelog partition (after :meth:`restore`); a
        record that does not verify raises :class:`stream_dp.integrity.IntegrityError`, a
        table other than the one the checkpoint sealed (lost, or assembled by a writer of the
        topic out of genuine old records: :mod:`agents.ingest.user_digest`) a
        :class:`ScheduleMismatch`."""
        assert self.users is not None
        mac = ChangelogMac(self._key, self.context())
        records = [(person, None if value is None else mac.open(person, value))
                   for person, value in records]
        self.users.load_changes(records)
        if len(self.users.bounder) != self.users.expected_people:
            raise ScheduleMismatch(
                f"events partition {self.partition}: the per-person changelog holds "
                f"{len(self.users.bounder)} people, the checkpoint says "
                f"{self.users.expected_people}: a lost or re-created changelog topic would "
                "give people budgets they spent. Restore the topic, or start a new deployment "
                "(stream-dp deployment new)")
        if not self.users.digest.matches(self.users.expected_digest):
            raise ScheduleMismatch(
                f"events partition {self.partition}: the per-person changelog "
                f"{self.settings.ingest_users_topic!r} does not hold the table the checkpoint "
                "sealed (its digest differs: a record replayed, dropped or reordered by a writer "
                "of the topic would give people budgets they spent). Restore the topic from this "
                "deployment's own data, or start a new deployment (stream-dp deployment new)")

    def restore(self, data: bytes, seq: int, wall: float = 0.0) -> None:
        """Restore from :meth:`to_bytes`; a sealed checkpoint that is tampered with, written
        under another key or another configuration raises
        :class:`stream_dp.integrity.IntegrityError` (the worker refuses to start with it)."""
        if self._key is not None:
            from stream_dp.integrity import IntegrityError, unseal

            try:
                data = unseal(self._key, "ingest checkpoint", self.context(), data)
            except IntegrityError as e:
                # a genuine checkpoint of a development build's user level (versions 7 to
                # 10, sealed before persons were keyed by SipHash) gets its own line below;
                # anything else keeps the configuration refusal
                if e.reason != "configuration" or self.users is None:
                    raise
                try:
                    data = unseal(self._key, "ingest checkpoint",
                                  self.context(before_siphash=True), data)
                except IntegrityError:
                    raise e from None
                if json.loads(data).get("v") not in (7, 8, 9, 10):
                    raise
        d = json.loads(data)
        if d.get("v") in (9, 10):  # fatal: the persons' hashes of its table are BLAKE2b's
            raise ScheduleMismatch(
                f"events partition {self.partition}: an ingest checkpoint of version {d['v']}, "
                "whose per-person table is keyed by BLAKE2b hashes of the identifiers; this "
                "version keys persons by SipHash and cannot match "
                "them: start a new deployment (stream-dp deployment new)")
        if d.get("v") in (7, 8):  # fatal (the worker stops): retrying cannot change it
            raise ScheduleMismatch(
                f"events partition {self.partition}: an ingest checkpoint of the user-level "
                f"preview (version {d['v']}): its per-person changelog was written in an "
                "earlier format (" + ("before the per-person table digest" if d["v"] == 7 else
                                     "JSON records") + ") that this version does not read; "
                "start a new deployment (stream-dp deployment new)")
        if d.get("v") not in (5, 6, USER_LEVEL_VERSION) or d.get("partition") != self.partition:
            raise ValueError(
                "ingest checkpoint of another version or partition (checkpoints written before "
                "exact integer sums (v5) cannot be resumed: start a new deployment, stream-dp "
                "deployment new)"
            )
        if d["v"] != USER_LEVEL_VERSION and (d["v"] == 6) != bool(d.get("unsent")):
            raise ValueError("ingest checkpoint: version 6 and a list of closed ticks to hand "
                             "over come together (v5 has none)")
        user_level = d["v"] == USER_LEVEL_VERSION
        if user_level != (self.users is not None) or ("users" in d) != user_level:
            raise ValueError("ingest checkpoint: a per-person table (version 11) comes with "
                             "privacy_unit = user, and only with it")
        if tuple(d["schedule"]) != self.schedule_id:
            raise ScheduleMismatch(
                f"events partition {self.partition}: the checkpoint was written under schedule "
                f"{tuple(d['schedule'])}, the settings say {self.schedule_id}"
            )
        self.offset = int(d["offset"])
        self.next_tick = int(d["next_tick"])
        self.range_start = int(d["range_start"])
        self.digest = int(d["digest"], 16)
        self.schedule_from = int(d.get("schedule_from", 0))
        self.unsent = [(int(a), int(b), float(t)) for a, b, t in d.get("unsent", [])]
        if any(not (0 < a <= b < self.next_tick) for a, b, _ in self.unsent):
            raise ValueError("ingest checkpoint lists closed ticks to hand over that are not "
                             "closed")
        # disjoint and in tick order, as _apply appends them: an overlap or a repeat would hand
        # a tick over twice (the second time with an empty bucket), a disorder would make
        # handed_over_through() name the wrong tick; decided_at is a Unix time (seconds)
        pairs = zip(self.unsent, self.unsent[1:], strict=False)  # neighbours: one shorter
        if any(b0 >= a1 for (_, b0, _), (a1, _, _) in pairs) or \
                not all(math.isfinite(t) for _, _, t in self.unsent):
            raise ValueError("ingest checkpoint lists closed ticks to hand over that overlap, "
                             "repeat, are out of tick order or have no closing time")
        if self.users is not None:
            self.users.restore(d["users"])
            if self.users.changelog:
                got = d["users"].get("flush")
                if got is None:
                    raise ValueError("ingest checkpoint: written before the per-person table "
                                     "ever was (no flush point)")
                self.flush_point = FlushPoint.from_doc(got, self.offset, self.next_tick)
                self.future_offsets = list(self.flush_point.future)
                self.flushed_at = time.monotonic()
        self.seq = seq
        self.written_through = self.handed_over_through()  # committed with this checkpoint
        key_of = self.router.bucket_key
        leaf_mode = self.router.leaf_mode

        def restored(k: Any) -> Any:
            if type(k) is int:
                if not leaf_mode:
                    raise ValueError("ingest checkpoint of a flat/hierarchy domain")
                return k
            return key_of(k)  # a list of nodes (v3, grids, binary attributes)

        self.buckets = {
            int(t): {restored(k): c for k, c in zip(b[0], b[1], strict=True)}
            for t, b in d["buckets"].items()
        }
        if not all(type(c) is int and c >= 0 for b in self.buckets.values() for c in b.values()):
            raise ValueError("ingest checkpoint holds counts that are not integer units >= 0")
