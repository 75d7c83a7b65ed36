"""The hot loop of the ingest state: every decision about one record
(:class:`RecordProcessing`, mixed into :class:`agents.ingest.state.IngestState`), and what
processing produces (:class:`IngestOutput`). Pure: no I/O.

For each record, in offset order: closing points reached close their ticks first; a close
marker closes ticks after itself (markers schedule); a LogAppendTime stamp past a deadline
closes before itself; then the record is digested and classified — accepted into its tick's
bucket (clamped to ``cap``, in exact integer units) or dead-lettered with a reason. The compiled
scanner (``agents.ingest._fastingest``) takes the records it is sure about and hands every other
one to the Python code here, which is authoritative (``tests/unit/agents/ingest/test_fastingest.py``).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.config.settings import Settings
from agents.ingest.digest import _DIGEST_MOD, record_digest
from agents.ingest.records import _NO_STOP, Record, RecordBlock, _fast_loads, _fastingest
from agents.ingest.routing import Partial, Router
from agents.ingest.schedule import Close, ScheduleEntry
from agents.ingest.ticks import Schedule
from agents.ingest.users import UserState, scanner_field
from agents.kafka.codec import (
    CLOSE_HEADER,
    Rejection,
    decode_attribute_event,
    decode_event,
    parse_close_marker,
)

__all__ = ["IngestOutput", "RecordProcessing"]


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
    #: events over their person's bounds, dropped (privacy_unit = user; operator only)
    bounded: int = 0

    def clear(self) -> None:
        self.dead_letters.clear()
        self.partials.clear()
        self.entries.clear()
        self.accepted = self.clamped = self.late = self.ticks_closed = self.bounded = 0


#: router -> ``agents.ingest._fastingest.KeyIndex`` of its declared keys (or ``False``: none can be
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


class RecordProcessing:
    """Processing of records for :class:`~agents.ingest.state.IngestState`, which sets every
    attribute declared here and defines the closing of ticks (:meth:`apply_due`)."""

    settings: Settings
    router: Router
    schedule: Schedule
    partition: int
    #: next offset to process; -1 = not known yet
    offset: int
    #: first tick not yet closed
    next_tick: int
    #: running digest of the records since the last closing point, and where that range began
    digest: int
    range_start: int
    #: records were consumed since the last commit
    dirty: bool
    markers: bool
    lat_trusted: bool
    #: exact sums: values in integer units of ``unit``; one event adds at most ``cap_u``
    unit: float
    cap_u: int
    #: tick -> {bucket key: sum of clamped values in integer units}
    buckets: dict[int, dict[Any, int]]
    #: closing points decided but not reached yet, in offset order
    pending: list[Close]
    out: IngestOutput
    clock: Callable[[], float]
    use_fast_path: bool
    #: the per-person table (privacy_unit = user), else None
    users: UserState | None
    #: offsets of records refused by the worker's clock since the table's last write
    future_offsets: list[int]
    _dkey: bytes
    _dhash: Any
    _mkey: bytes

    @property
    def replaying(self) -> bool:
        """True while persisted closing points are ahead (live rules are suspended)."""
        raise NotImplementedError

    def apply_due(self) -> int:
        """Apply every pending closing point that the processed offset has reached."""
        raise NotImplementedError

    def _apply(self, c: Close) -> int:
        """Close ticks ``next_tick..c.through`` at ``c.offset``; return how many closed."""
        raise NotImplementedError

    def _fast_scanner(self) -> Any:
        """The compiled scanner for this state's settings (built once per settings object), or
        ``None`` for the pure path (not built, disabled, a binary-attribute domain, or a person
        as the unit of privacy whose table is not the compact one: see
        :func:`agents.ingest.users.person_table`)."""
        users = self.users
        if _fastingest is None or self.router.patterns or not self.use_fast_path or (
                users is not None and (type(users.bounder) is not _fastingest.UserTable
                                       or scanner_field(users.field) is None)):
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
        if users is not None:
            scanner.users(scanner_field(users.field), users.partitions, users.partition,
                          users.key)
        self.__dict__["_scanner"] = (s, scanner)
        return scanner

    def process_fetched(self, items: Sequence[Any]) -> int:
        """Process what the events consumer fetched for this partition, in order: records, and
        record blocks (:mod:`agents.ingest.raw_records`: one fetched batch each, records read in place
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
        accepted = clamped = late = bounded = 0
        users = self.users
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
            if scanner is not None and users is not None and type(
                    users.bounder) is not _fastingest.UserTable:
                scanner = None  # the table moved to the Bounder (users.py): pure from here
            if scanner is not None:
                # Compiled fast path (agents/ingest/csrc/fastingest.c): the records it is sure about,
                # up to the first one that needs the code below (or a closing point). At user
                # level the person's bound is its last decision, in the same pass.
                i, added, got, clipped, dropped = scanner.scan(
                    records, i, self.next_tick,
                    self.pending[0].offset if self.pending else _NO_STOP, horizon_ts,
                    lat and not self.replaying, buckets, declared, index,
                    None if users is None else users.bounder)
                digest += added
                accepted += got
                clamped += clipped
                bounded += dropped
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
                                if users is not None:
                                    # the last decision, as on the full path below (there it
                                    # is explained); obj is what decode_event would parse
                                    verdict = users.decide_obj(obj, tick, nodes)
                                    if verdict is not True:
                                        if verdict is False:
                                            bounded += 1
                                        else:
                                            dead.append((key, verdict, value, offset))
                                        continue
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
                    if users is not None and users.changelog:
                        # decided by the clock, not by the record: a restore that re-decides
                        # the events since the table's last write needs it (user_flush)
                        self.future_offsets.append(offset)
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
                bkey = bucket_key(nodes)
                if users is not None:
                    # last: a record dead-lettered above never consumes its person's budget
                    verdict = users.decide(value, tick, bkey)
                    if verdict is not True:
                        if verdict is False:
                            bounded += 1  # dropped, never dead-lettered (the raw record
                            # holds the identifier)
                        else:
                            dead.append((key, verdict, value, offset))
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
        self.out.bounded += bounded
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
