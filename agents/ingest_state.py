"""The ingest state of one events partition (:class:`IngestState`) and what processing
produces (:class:`IngestOutput`). Pure: no I/O.

Moved out of :mod:`agents.ingest` (which re-exports these names and documents the design).
"""

from __future__ import annotations

import json
import math
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.codec import (
    CLOSE_HEADER,
    Rejection,
    decode_attribute_event,
    decode_event,
    marker_key,
    parse_close_marker,
)
from agents.config import Settings
from agents.ingest_digest import (
    _DIGEST_MOD,
    _UNKEYED,
    _blake2b,
    digest_key,
    entry_key,
    record_digest,
)
from agents.ingest_records import (
    _NO_STOP,
    Record,
    RecordBlock,
    _fast_dumps,
    _fast_loads,
    _fastingest,
)
from agents.ingest_routing import Partial, Router
from agents.ingest_schedule import Close, ScheduleEntry, ScheduleMismatch
from agents.ticks import Schedule
from stream_dp.contributions import cap_units, clip_limit_units, value_unit


@dataclass
class IngestOutput:
    """What processing produced since the last commit: dead letters, partials, schedule entries."""

    dead_letters: list[tuple[bytes | None, Rejection, bytes | None, int]] = field(
        default_factory=list
    )
    partials: list[Partial] = field(default_factory=list)
    entries: list[ScheduleEntry] = field(default_factory=list)
    accepted: int = 0
    clamped: int = 0
    late: int = 0
    ticks_closed: int = 0

    def clear(self) -> None:
        self.dead_letters.clear()
        self.partials.clear()
        self.entries.clear()
        self.accepted = self.clamped = self.late = self.ticks_closed = 0


#: router -> ``agents._fastingest.KeyIndex`` of its declared keys (or ``False``: none can be
#: built here): one per router, shared by the states of every events partition (the index of
#: 10^6 keys takes ~56 MB); rebuilt when the declared dict changed since (``KeyIndex.fresh``)
_KEY_INDEXES: weakref.WeakKeyDictionary[Router, Any] = weakref.WeakKeyDictionary()


def _key_index(router: Router) -> Any:
    """The compiled scanner's index of ``router.declared`` (``None``: it looks keys up in the
    dict). Only for flat and hierarchy domains, whose declared keys are fixed when the router
    is built; a grid's grow as keys are seen, and the dict serves them (a record whose key
    the index lacks goes to the pure path, so a stale index could only cost time — but the
    scanner ignores one that is not fresh anyway)."""
    if _fastingest is None or not router.leaf_mode:
        return None
    found = _KEY_INDEXES.get(router)
    if found is False:
        return None
    if found is None or not found.fresh(router.declared):
        try:
            found = _fastingest.KeyIndex(router.declared)
        except NotImplementedError:  # no dict version tag on this Python (3.14+)
            _KEY_INDEXES[router] = False
            return None
        _KEY_INDEXES[router] = found
    return found


def _is_marker(headers: Any) -> bool:
    if not headers:
        return False
    return any(k == CLOSE_HEADER for k, _ in headers)


class IngestState:
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
        #: ``agents.pipeline.HAND_OVER_TICKS`` and commits between steps.
        self.hand_over_limit: int | None = None
        #: the last tick whose partials are in a *committed* transaction (the checkpoint read
        #: at restore, or the worker's last commit): :meth:`handed_over_through` runs ahead of
        #: it while a step's transaction is being sent, and only this one may be read as
        #: "the partials topic must hold them" (the release stage's lost-log check)
        self.written_through = 0
        #: use the compiled fast path when it is available (tests compare both paths)
        self.use_fast_path = True

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

    # ------------------------------------------------------------------ processing
    def _fast_scanner(self) -> Any:
        """The compiled scanner for this state's settings (built once per settings object), or
        ``None`` for the pure path (not built, disabled, or a binary-attribute domain)."""
        if _fastingest is None or self.router.patterns or not self.use_fast_path:
            return None
        s = self.settings
        cached = self.__dict__.get("_scanner")
        if cached is not None and cached[0] is s:
            return cached[1]
        scanner = _fastingest.Scanner(
            self._dkey, int(s.max_message_bytes), float(s.max_event_value), float(s.cap),
            1.0 / self.unit, int(self.cap_u), float(s.origin), float(s.tick_seconds),
            float(s.allowed_lateness_s), float(s.close_grace_s), float(s.max_future_skew_s),
            float(s.max_event_age_s) if s.max_event_age_s > 0 else math.inf,
            self.markers, s.strategy == "naive-int")
        self.__dict__["_scanner"] = (s, scanner)
        return scanner

    def process_fetched(self, items: Sequence[Any]) -> int:
        """Process what the events consumer fetched for this partition, in order: records, and
        record blocks (:mod:`agents.raw_records`: one fetched batch each, records read in place
        by the compiled scanner). Returns the number of records."""
        if RecordBlock is None or not any(type(it) is RecordBlock for it in items):
            self.process_batch(items)
            return len(items)
        n = 0
        run: list[Any] = []
        for it in items:
            if type(it) is RecordBlock:
                if run:
                    self.process_batch(run)
                    n += len(run)
                    run = []
                self.process_batch(it)
                n += len(it)
            else:
                run.append(it)
        if run:
            self.process_batch(run)
            n += len(run)
        return n

    def process(self, offset: int, key: bytes | None, value: bytes | None, timestamp: int = -1,
                timestamp_type: int = 0) -> None:
        """Process one record at ``offset`` (records below :attr:`offset` are skipped)."""
        self.process_batch([Record(offset, key, value, timestamp, timestamp_type)])

    def process_batch(self, records: Sequence[Any]) -> None:
        """Process records of this partition in offset order. This is the hot loop.

        ``records`` carry ``.offset``, ``.key``, ``.value``, ``.timestamp`` (ms),
        ``.timestamp_type`` and ``.headers`` (e.g. aiokafka's ``ConsumerRecord``).
        """
        s = self.settings
        sch = self.schedule
        max_bytes, max_value, cap = s.max_message_bytes, s.max_event_value, s.cap
        inv_unit = 1.0 / self.unit  # a power of two: value * inv_unit is exact
        cap_u = self.cap_u
        origin = s.origin
        tick_seconds = s.tick_seconds
        lateness = s.allowed_lateness_s
        grace = s.close_grace_s
        skew = s.max_future_skew_s
        max_age = s.max_event_age_s if s.max_event_age_s > 0 else math.inf
        markers = self.markers
        lat = self.lat_trusted
        whole = s.strategy == "naive-int"  # integer releases: whole-number values only
        nodes_of = self.router.nodes
        bucket_key = self.router.bucket_key
        patterns = self.router.patterns
        buckets = self.buckets
        dead = self.out.dead_letters
        floor = math.floor
        loads = _fast_loads
        digest_of = record_digest
        dkey = self._dhash
        accepted = clamped = late = 0
        position = entry_offset = self.offset
        cache_get = self.router.declared.get
        digest = self.digest
        # Event times are bounded by the worker's own clock too (read once per batch): a
        # far-future time — on a markers deployment, or with a forged CreateTime stamp as far
        # ahead — would open a bucket that closes only years later (memory, checkpoints).
        horizon_ts = self.clock() + skew
        if self.range_start < 0:
            self.range_start = position if position >= 0 else (
                records[0].offset if records else -1)
        start = 0
        while start < len(records) and records[start].offset < position:
            start += 1  # already processed (e.g. re-delivered after a seek)
        n_records = len(records)
        scanner = self._fast_scanner()
        declared = self.router.declared
        index = _key_index(self.router) if scanner is not None else None
        i = start
        while i < n_records:
            if scanner is not None:
                # Compiled fast path (agents/csrc/fastingest.c): the records it is sure about,
                # up to the first one that needs the code below (or a closing point).
                i, added, got, clipped = scanner.scan(
                    records, i, self.next_tick,
                    self.pending[0].offset if self.pending else _NO_STOP, horizon_ts,
                    lat and not self.replaying, buckets, declared, index)
                digest += added
                accepted += got
                clamped += clipped
                if i >= n_records:
                    break
                end = i + 1
            else:
                end = n_records
            for i in range(i, end):  # noqa: B020 - one record (fast path) or all (pure path)
                r = records[i]
                offset = r.offset
                # Closing points reached: ticks close before this record is looked at.
                if self.pending and self.pending[0].offset <= offset:
                    self.digest = digest % _DIGEST_MOD
                    self.offset = offset
                    self.apply_due()
                    digest = self.digest
                key = r.key
                value = r.value
                rts_ms = getattr(r, "timestamp", -1)
                rtype = getattr(r, "timestamp_type", 0)
                if rts_ms is None or rtype is None:
                    # a message-format v0 record (aiokafka: timestamp and type None): no Kafka
                    # timestamp, like -1; the compiled path hands such records over to here
                    rts_ms = -1
                    rtype = 0 if rtype is None else rtype
                headers = getattr(r, "headers", ())
                if headers and _is_marker(headers):
                    # A close marker belongs to the range it closes: digest it, then close after it.
                    digest += digest_of(dkey, offset, -1 if markers else rts_ms, rtype, key, value,
                                        headers)
                    self.digest = digest % _DIGEST_MOD
                    self.offset = offset + 1
                    self._marker(key, value, offset)
                    self.apply_due()
                    digest = self.digest
                    continue
                next_tick = self.next_tick
                arrival = rts_ms / 1000.0
                if lat and rtype == 1 and rts_ms >= 0 and not self.replaying:
                    # LogAppendTime (the topic's setting, checked at start-up): the broker's clock
                    # is the schedule's clock. The first record it stamped at or past a tick's
                    # deadline + grace closes that tick before itself: every later record is past
                    # the deadline too, so this selects exactly the events the clock rule selects.
                    # Never past what the worker's own clock allows (a broker clock far ahead, or a
                    # forged stamp, cannot close ticks early or many at once).
                    through = floor((arrival - grace - lateness - origin) / tick_seconds)
                    if through >= next_tick:
                        through = min(through, sch.due_through(self.clock()))
                    if through >= next_tick:
                        self.digest = digest % _DIGEST_MOD
                        self.offset = offset
                        self.pending = [c for c in self.pending if c.through > through]
                        self._apply(Close(through, offset, "log_append_time", arrival))
                        digest = self.digest
                        next_tick = self.next_tick
                # Everything that can change this record's fate is digested, headers included (a
                # record that closes ticks before itself belongs to the next range).
                digest += digest_of(dkey, offset, -1 if markers else rts_ms, rtype, key, value,
                                    headers)
                # Fast path: a well-formed event for a declared key, in range and on time. Any doubt
                # falls through to the full classification below (decode_event is the authoritative
                # validator; a property test checks that both paths agree).
                obj: Any = None
                if value is not None and len(value) <= max_bytes:
                    try:  # noqa: SIM105 - contextlib.suppress costs a context manager per event
                        obj = loads(value)
                    except ValueError:  # malformed or not UTF-8 (orjson.JSONDecodeError included)
                        pass
                if type(obj) is dict and (markers or rts_ms >= 0):
                    rts: Any = obj.get("ts")
                    rv: Any = obj.get("value", 1.0)
                    tts = type(rts)
                    tv = type(rv)
                    if (
                        (tts is float or tts is int) and (tv is float or tv is int)
                        and origin <= rts and 0.0 <= rv <= max_value
                        and rts <= horizon_ts
                        and (markers or (rts <= arrival + skew and arrival - rts <= max_age))
                        and (not whole or float(rv).is_integer())
                    ):
                        rk: Any = obj.get("key")
                        try:
                            nodes = cache_get(rk)  # declared str keys only
                        except TypeError:  # an unhashable key (list, object)
                            nodes = None
                        if nodes is not None:
                            tick = floor((rts - origin) / tick_seconds) + 1  # == Schedule.tick_of
                            if tick >= next_tick and (
                                    markers
                                    or tick > floor((arrival - lateness - origin) / tick_seconds)):
                                if rv > cap:  # clamp first: rv * inv_unit may overflow
                                    clamped += 1
                                    rv = cap
                                u = round(rv * inv_unit)  # exact integer units (sums are exact)
                                if u > cap_u:
                                    u = cap_u
                                found = buckets.get(tick)
                                if found is None:
                                    found = buckets[tick] = {}
                                found[nodes] = found.get(nodes, 0) + u
                                accepted += 1
                                continue
                # Full classification, with the reason of any rejection.
                if patterns:
                    got_at = decode_attribute_event(value, max_bytes, self.router.domain)
                    if type(got_at) is Rejection:
                        dead.append((key, got_at, value, offset))
                        continue
                    pattern, ts = got_at
                    nodes, v = (pattern,), 1.0
                else:
                    got_ev = decode_event(value, max_bytes, max_value)
                    if type(got_ev) is Rejection:
                        dead.append((key, got_ev, value, offset))
                        continue
                    ev_key, ts, v = got_ev  # type: ignore[misc]
                    nodes = nodes_of(ev_key)
                    if nodes is None:
                        dead.append((key, Rejection("unknown_key",
                                                    f"key {ev_key[:200]!r} is not declared"),
                                     value, offset))
                        continue
                if ts < origin:
                    dead.append((key, Rejection("before_origin", f"ts={ts!r} < origin={origin!r}"),
                                 value, offset))
                    continue
                tick = sch.tick_of(ts)
                if ts > horizon_ts:
                    dead.append((key, Rejection("future", f"ts={ts!r} is more than {skew:g} s "
                                 "ahead of the worker's clock"), value, offset))
                    continue
                if not markers:
                    if rts_ms < 0:
                        dead.append((key, Rejection("no_timestamp", "the record carries no Kafka "
                                     "timestamp, so its arrival cannot be checked"), value, offset))
                        continue
                    if ts > arrival + skew:
                        dead.append((key, Rejection("future", f"ts={ts!r} is more than {skew:g} s "
                                     f"ahead of the record's timestamp {arrival!r}"), value, offset))
                        continue
                    if arrival - ts > max_age:
                        dead.append((key, Rejection("too_old", f"ts={ts!r} is more than "
                                     f"{s.max_event_age_s:g} s before the record's timestamp "
                                     f"{arrival!r}"), value, offset))
                        continue
                    if sch.is_late(tick, arrival):
                        late += 1
                        dead.append((key, Rejection("late", f"arrived at {arrival!r}, after the "
                                     f"deadline {sch.deadline(tick)!r} of tick {tick}"), value, offset))
                        continue
                if whole and not float(v).is_integer():
                    dead.append((key, Rejection("value_not_integer", f"value={v!r} is not a whole "
                                 "number (strategy naive-int)"), value, offset))
                    continue
                if tick < next_tick:
                    late += 1
                    dead.append((key, Rejection("tick_closed", f"tick {tick} was closed before "
                                 f"offset {offset} (next open tick {next_tick})"), value, offset))
                    continue
                if patterns:
                    units = 1  # every event counts once (a count, not a value)
                else:
                    if v > cap:  # clamp first: v * inv_unit may overflow a float
                        clamped += 1
                        v = cap
                    units = round(v * inv_unit)
                    if units > cap_u:
                        units = cap_u
                slow_bucket = buckets.get(tick)
                if slow_bucket is None:
                    slow_bucket = buckets[tick] = {}
                bkey = bucket_key(nodes)
                slow_bucket[bkey] = slow_bucket.get(bkey, 0) + units
                accepted += 1
            i = end
        self.digest = digest % _DIGEST_MOD
        if start < len(records):
            position = records[-1].offset + 1
        if position != self.offset and position >= 0:
            self.offset = max(position, self.offset)
        if self.offset != entry_offset or dead:
            # records were consumed (a marker moves the offset itself, and one that closes
            # nothing — a second replay's — must not leave the batch uncommitted: its dead
            # letters and offset would wait in memory for ever, in silence)
            self.dirty = True
        self.out.accepted += accepted
        self.out.clamped += clamped
        self.out.late += late
        self.apply_due()

    def _marker(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        """A record with the close header at ``offset`` (already digested: it belongs to the
        range it closes). Markers schedule: an authentic marker closes ticks before the next
        record, never past the worker's own clock; anything else is dead-lettered."""
        dead = self.out.dead_letters
        if not self.markers:
            dead.append((key, Rejection("unexpected_marker", "a record with the close header on "
                         "a clock-schedule deployment (not schedule input here)"), value, offset))
            return
        if self.replaying:  # persisted closing points decide; markers were applied before
            return
        got = parse_close_marker(value, mac_key=self._mkey, topic=self.settings.events_topic,
                                 partition=self.partition)
        if type(got) is Rejection:
            dead.append((key, got, value, offset))
            return
        at, final = got  # type: ignore[misc]
        sch = self.schedule
        through = sch.closed_by_marker(at, final)
        allowed = sch.due_through(self.clock())
        if through > allowed:
            dead.append((key, Rejection("marker_ahead", f"the marker closes through tick "
                         f"{through}, but the worker's clock allows tick {allowed} at most "
                         "(deadline + close_grace_s not passed)"), value, offset))
            return
        if through >= self.next_tick:
            self.pending = [c for c in self.pending if c.through > through]
            self._apply(Close(through, offset + 1, "marker", at))

    def advance_to(self, position: int) -> None:
        """The consumer's position moved past records that are not delivered (transaction
        markers): treat them as processed, then apply any closing point reached."""
        if position > self.offset >= 0:
            self.offset = position
            self.dirty = True
        self.apply_due()

    # ------------------------------------------------------------------ checkpoint
    def context(self) -> bytes:
        """Canonical description of everything this partition's state depends on: the
        checkpoint is bound to it (a restore under anything else is refused)."""
        from stream_dp.mechanism import canonical_json

        s = self.settings
        return canonical_json({
            "kind": "ingest checkpoint", "version": 5, "partition": self.partition,
            "events_partitions": s.events_partitions, "shards": s.shards,
            "domain": self.domain_id, "epoch": getattr(s, "epoch", 0), "cap": float(s.cap),
            "schedule": list(self.schedule_id), "strategy": s.strategy,
        })

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
        from agents.bucket_columns import bucket_columns

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
        # ~4.6x faster on 3·10^5 open keys (the sums are finite); the columns as arrays
        return _fast_dumps(doc, numpy=True)

    def restore(self, data: bytes, seq: int, wall: float = 0.0) -> None:
        """Restore from :meth:`to_bytes`; a sealed checkpoint that is tampered with, written
        under another key or another configuration raises
        :class:`stream_dp.integrity.IntegrityError` (the worker refuses to start with it)."""
        if self._key is not None:
            from stream_dp.integrity import unseal

            data = unseal(self._key, "ingest checkpoint", self.context(), data)
        d = json.loads(data)
        if d.get("v") not in (5, 6) or d.get("partition") != self.partition:
            raise ValueError(
                "ingest checkpoint of another version or partition (checkpoints written before "
                "exact integer sums (v5) cannot be resumed: start a new deployment, stream-dp "
                "deployment new)"
            )
        if (d["v"] == 6) != bool(d.get("unsent")):
            raise ValueError("ingest checkpoint: version 6 and a list of closed ticks to hand "
                             "over come together (v5 has none)")
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
