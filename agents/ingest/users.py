"""The person as unit of privacy on the ingest path (``privacy_unit = "user"``; issue #34,
docs/design/user-level.md §1–3): the identifier, the partition check and the per-person table
of one events partition (:class:`UserState`). Pure: no I/O.

For a record that passed every event-level check (so a dead-lettered record never consumes a
person's budget), in log order:

1. **the identifier**: the event JSON's ``user_field``, a string of 1 to 256 UTF-8 bytes
   (bytes are the identity: nothing is normalised); anything else is dead-lettered
   ``invalid_user``, with a detail that never repeats the identifier;
2. **the partition check**: Kafka's default partitioner on the identifier's bytes
   (:func:`agents.kafka.partitioner.key_partition`,
   ``(murmur2(b) & 0x7fffffff) % events_partitions``), must name the record's own partition,
   else ``wrong_partition`` — a decision from the record alone, so that all of one person's
   counted records live on one partition, where one table bounds them;
3. **the bound**: :class:`stream_dp.user_level.Bounder` (the library's authoritative rule),
   keyed by ``SipHash-2-4-128(identifier; key = derive_key(noise key, "user id
   siphash-2-4-128")[:16])`` (:mod:`agents.ingest.siphash`; BLAKE2b-128 before checkpoint
   version 11: ten times the cost a record, as much as the record digest itself). Counted
   events go on to their tick's bucket; the others are dropped (not dead-lettered) and only
   counted, for the operator-only metric ``stream_dp_user_bounded_events_total``.

The table (:func:`person_table`) is the compiled compact one (``agents.ingest._fastingest.
UserTable``, 32 bytes a person in a table kept between 1/2 and 3/4 full: 43–64 bytes per active
person) when the extension is built and the bounds fit it — no per-leaf bound (``L = 0`` and
``k ≥ K``), ``K ≤ 65535``, period and separation below ``2^32`` ticks —, else the library's
:class:`~stream_dp.user_level.Bounder` (a dict, ~570 bytes a person). The compact table decides
exactly as the ``Bounder`` (tests/unit/agents/ingest/test_user_table.py, decision by decision
and export by export); a state it cannot hold (a third open period for one person, a tick past
``2^31 − 1``) moves the partition's table to the ``Bounder`` for good, losing nothing (exports
are the same). Both list persons in hash order in the checkpoint (:meth:`UserState.to_doc`).

The identifier itself is never stored, logged, exported or checkpointed: only its keyed hash,
which nobody without the noise key can steer into another person's slot. The table is restored
with the same offsets as the rest of the partition's ingest state: in the worker through a
compacted changelog topic (``ingest_users_topic``: one sealed record per person changed since
the last write, in an ingest transaction at most every ``user_flush_interval_s``,
:meth:`UserState.take_changes`; the checkpoint carries the keyed digest of the table as
written that the restore checks the changelog against, :mod:`agents.ingest.user_digest`, and a
restore re-decides the events since the write, :mod:`agents.ingest.user_replay`), in pure states of tests whole inside the checkpoint
(:meth:`UserState.to_doc`). The slots of a period are
dropped once every tick of it is closed (:meth:`UserState.closed_before`).
"""

from __future__ import annotations

import json
from typing import Any

from agents.ingest.digest import _UNKEYED
from agents.ingest.records import _fastingest
from agents.ingest.siphash import siphash128
from agents.ingest.user_digest import TableDigest, table_digest_key
from agents.ingest.user_records import ChangelogMac, decode_state, encode_state
from agents.kafka.codec import Rejection
from agents.kafka.partitioner import key_partition
from stream_dp.user_level import Bounder, UserBounds
from stream_dp.user_level.bounding import columns_people, export_columns

__all__ = ["MAX_ID_BYTES", "USER_ID_PURPOSE", "UserState", "compact_table", "person_table",
           "record_bytes", "scanner_field", "table_status", "user_bounds", "user_key"]

#: longest identifier, in UTF-8 bytes
MAX_ID_BYTES = 256
#: the purpose under which the identifiers' hash key is derived from the noise key (the
#: hash's name in it: a key is never shared between two hash functions)
USER_ID_PURPOSE = "user id siphash-2-4-128"
#: the identifiers' keyed hash, as the checkpoint context names it
USER_ID_HASH = "siphash-2-4-128"


def user_key(secret: bytes | None) -> bytes:
    """The 16-byte SipHash key of the identifiers' hash, derived from the noise ``secret``
    (:func:`stream_dp.integrity.derive_key`); a fixed public key for ``None`` (tests only)."""
    if secret is None:
        return _UNKEYED[:16]
    from stream_dp.integrity import derive_key

    return derive_key(secret, USER_ID_PURPOSE)[:16]


def user_bounds(settings: Any) -> UserBounds:
    """The :class:`UserBounds` of ``settings`` (``privacy_unit = "user"``)."""
    return UserBounds(
        max_events=int(settings.user_max_events), period_ticks=int(settings.user_period_ticks),
        max_streams=int(settings.user_max_streams),
        max_events_per_stream=int(settings.user_max_events_per_stream),
        min_separation_ticks=int(settings.user_min_separation_ticks))


def record_bytes(state: tuple[int, list[tuple[int, int, dict[Any, int]]]]) -> bytes:
    """A person's changelog value (before its tag) for their state ``(last tick, periods)``
    (:meth:`stream_dp.user_level.Bounder.person`): :func:`agents.ingest.user_records.
    encode_state`, a few bytes."""
    return encode_state(state)


#: the compact table's limits (agents/ingest/csrc/usertable.c): u16 counts, u32 ticks
_TABLE_MAX_EVENTS = 0xFFFF
_TABLE_MAX_TICKS = (1 << 32) - 1


def person_table(bounds: UserBounds, compact: bool = True) -> Any:
    """An empty per-person table for ``bounds``: the compiled compact ``UserTable`` when it is
    built and the bounds fit it (no per-leaf bound, ``K ≤ 65535``), else a
    :class:`~stream_dp.user_level.Bounder`. Both decide alike; ``UserTable.admit`` answers
    ``None`` for a state it cannot hold (:meth:`UserState.decide_obj` then moves to the
    ``Bounder``). ``compact=False``: the ``Bounder`` always (the authoritative side of the
    agreement tests)."""
    if (not compact or _fastingest is None or bounds.max_streams
            or bounds.per_leaf_events < bounds.max_events
            or bounds.max_events > _TABLE_MAX_EVENTS
            or bounds.period_ticks > _TABLE_MAX_TICKS
            or bounds.min_separation_ticks > _TABLE_MAX_TICKS):
        return Bounder(bounds)
    return _fastingest.UserTable(bounds.max_events, bounds.period_ticks,
                                 bounds.min_separation_ticks)


def scanner_field(field: str) -> bytes | None:
    """``user_field`` as the compiled scanner matches it (its UTF-8 bytes against a member
    name's raw bytes), or ``None`` when it cannot match it as Python's json reads the name:
    more than 256 UTF-8 bytes (the scanner's limit; the setting counts characters), a control
    character (raw in a record, json refuses it: the scanner would count what the pure path
    dead-letters), a quote or a backslash (only ever escaped in a record), or no UTF-8 at all
    (a lone surrogate). The pure path then decides every record."""
    try:
        raw = field.encode("utf-8")
    except UnicodeEncodeError:
        return None
    if not 1 <= len(raw) <= 256 or any(b < 0x20 or b in b'"\\' for b in raw):
        return None
    return raw


def compact_table(bounds: UserBounds) -> bool:
    """Whether :func:`person_table` gives the compiled compact table for ``bounds`` (else the
    pure path's ``Bounder``): what a person costs in memory and which path decides."""
    return type(person_table(bounds)) is not Bounder


def table_status(bounds: UserBounds, field: str = "user") -> str:
    """One line for the start-up log: which path and table bound persons under ``bounds``
    with the identifier in ``field``."""
    compact = compact_table(bounds)
    if compact and scanner_field(field) is not None:
        return ("the compiled scanner bounds persons in its own pass (the compact per-person "
                "table, 32 bytes a person)")
    if compact:
        return ("every record takes the pure Python path (user_field has a control character, "
                "a quote or a backslash, or more than 256 UTF-8 bytes); the compact table")
    why = ("the compiled ingest path is not available" if _fastingest is None else
           "a leaf bound (user_max_streams, or user_max_events_per_stream below "
           "user_max_events) or user_max_events above 65535")
    return f"every record takes the pure Python path and the dict table ({why})"


def _filled(bounds: UserBounds, people: list[Any], compact: bool) -> Any:
    """A :func:`person_table` holding ``people`` (as :meth:`Bounder.export` lists them;
    ``ValueError`` for counts the bounds cannot give, as :meth:`Bounder.load` says it)."""
    table = person_table(bounds, compact)
    if type(table) is not Bounder:
        try:
            table.load(people)
            return table
        except OverflowError:  # a state the compact table cannot hold: the Bounder decides
            table = Bounder(bounds)
    table.load(people)
    return table


def _identifier(obj: Any, field: str) -> bytes | Rejection:
    """The identifier's UTF-8 bytes from a decoded event (a JSON object), or why there is
    none. The detail never repeats the identifier."""
    got = obj.get(field) if type(obj) is dict else None
    if got is None:
        what = "is missing" if type(obj) is not dict or field not in obj else "is null"
        return Rejection("invalid_user", f"the person's identifier (field {field!r}) {what}")
    if type(got) is not str:
        return Rejection("invalid_user", f"the person's identifier (field {field!r}) must be a "
                         f"string, got {type(got).__name__}")
    try:
        raw = got.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape (\ud800): no UTF-8 bytes
        return Rejection("invalid_user", f"the person's identifier (field {field!r}) is not "
                         "valid Unicode (a lone surrogate)")
    if not raw:
        return Rejection("invalid_user", f"the person's identifier (field {field!r}) is empty")
    if len(raw) > MAX_ID_BYTES:
        return Rejection("invalid_user", f"the person's identifier (field {field!r}) is "
                         f"{len(raw)} bytes long, more than {MAX_ID_BYTES}")
    return raw


class UserState:
    """The per-person table of one events partition and the decisions it makes."""

    def __init__(self, settings: Any, partition: int, secret: bytes | None) -> None:
        self.bounds = user_bounds(settings)
        self.field = str(settings.user_field)
        self.partitions = int(settings.events_partitions)
        self.partition = partition
        #: the table: a compact ``UserTable`` or a ``Bounder`` (:func:`person_table`; set
        #: ``compact`` false, then :meth:`restore`, for the ``Bounder`` whatever the bounds)
        self.compact = True
        self.bounder: Any = person_table(self.bounds)
        #: the identifiers' hash key (SipHash-2-4-128; the compiled scanner's too)
        self.key = user_key(secret)
        #: the first period some tick of which is still open (slots of earlier ones are gone)
        self.open_period = 0
        self._changelog = False
        #: persons (keyed hashes) changed since the last :meth:`take_changes` (those a compact
        #: table counted it lists itself: ``UserTable.take_dirty``, no object per event)
        self.touched: set[bytes] = set()
        #: changelog form: how many people the restored checkpoint says the table holds
        self.expected_people = 0
        #: changelog form: how many people the table held when last written (what the
        #: checkpoints until the next write say: the changelog holds that table)
        self.written_people = 0
        #: changelog form: the keyed digest of the table as written to the changelog, and the
        #: tag of it that the restored checkpoint carries (agents.ingest.user_digest)
        self.digest = TableDigest(table_digest_key(secret), record_bytes)
        self.expected_digest = self.digest.tag()  # no checkpoint: the empty table

    @property
    def changelog(self) -> bool:
        """The worker's form: the table lives in a compacted changelog topic (one record per
        person changed, written at each flush: agents.ingest.user_flush), not in the checkpoint;
        pure states of tests
        keep it whole in the checkpoint."""
        return self._changelog

    @changelog.setter
    def changelog(self, on: bool) -> None:
        self._changelog = bool(on)
        self._track()

    def _track(self) -> None:
        """A compact table collects the persons it counts iff in changelog form."""
        if type(self.bounder) is not Bounder:
            self.bounder.tracking = self._changelog

    def context(self) -> dict[str, Any]:
        """What the table depends on (bound into the ingest checkpoint's context)."""
        b = self.bounds
        return {"field": self.field, "id_hash": USER_ID_HASH,
                "period_ticks": b.period_ticks, "max_events": b.max_events,
                "max_streams": b.max_streams, "max_events_per_stream": b.max_events_per_stream,
                "min_separation_ticks": b.min_separation_ticks}

    def decide(self, value: bytes, tick: int, leaf: Any) -> Rejection | bool:
        """:meth:`decide_obj` for an event's raw value that passed
        :func:`agents.kafka.codec.decode_event` (a JSON object in UTF-8), parsed as it does."""
        return self.decide_obj(json.loads(value.decode("utf-8")), tick, leaf)

    def decide_obj(self, obj: Any, tick: int, leaf: Any) -> Rejection | bool:
        """For an event (its decoded JSON object) that passed every event-level check: a
        :class:`Rejection` (no valid identifier, or not on its person's partition), ``True``
        (counted: recorded in the table) or ``False`` (over the person's bounds: dropped).
        O(1) in the table's size."""
        ident = _identifier(obj, self.field)
        if type(ident) is Rejection:
            return ident
        assert type(ident) is bytes
        home = key_partition(ident, self.partitions)
        if home != self.partition:
            return Rejection("wrong_partition", f"the person's identifier maps to partition "
                             f"{home} (Kafka's default partitioner over "
                             f"{self.partitions}), the record is on {self.partition}: key "
                             "records by the identifier")
        person = siphash128(self.key, ident)
        if type(self.bounder) is Bounder and self._changelog and person not in self.touched:
            was = self.bounder.person(person)  # as last written: the digest takes its term out
            counted: bool | None = self.bounder.admit(person, tick, leaf)
            if counted:  # a refusal changes nothing
                self.digest.changing(person, was)
                self.touched.add(person)
            return bool(counted)
        counted = self.bounder.admit(person, tick, leaf)
        if counted is None:  # the compact table cannot hold this state: the Bounder for good
            moved = Bounder(self.bounds)
            moved.load(self.bounder.export())
            self._take_dirty()
            self.bounder = moved
            return self.decide_person(person, tick, leaf)
        # a refusal changes nothing; a compact table lists whom it counted itself (with the
        # state each had before, for the digest: UserTable.take_dirty)
        return counted

    def decide_person(self, person: bytes, tick: int, leaf: Any) -> bool:
        """:meth:`decide_obj`'s last step for a person's keyed hash (the table moved to the
        :class:`~stream_dp.user_level.Bounder`)."""
        if self._changelog and person not in self.touched:
            was = self.bounder.person(person)
            counted = bool(self.bounder.admit(person, tick, leaf))
            if counted:
                self.digest.changing(person, was)
                self.touched.add(person)
            return counted
        return bool(self.bounder.admit(person, tick, leaf))

    def _take_dirty(self) -> None:
        """The persons a compact table counted since the last call, into :attr:`touched`,
        each noted for the digest with their state before their first change."""
        for person, was in self.bounder.take_dirty(states=True):
            self.digest.changing(person, was)
            self.touched.add(person)

    def closed_before(self, next_tick: int) -> None:
        """Every tick before ``next_tick`` is closed: drop the slots of the periods wholly
        closed, and the persons whose spacing can no longer bind (O(persons), once per
        period, not per tick)."""
        period = self.bounds.period_of(next_tick)
        if period > self.open_period:
            self.open_period = period
            changed = self.bounder.forget_before(period, open_tick=next_tick)
            if self.changelog and changed:
                self.touched.update(changed)  # keyed hashes
                self.digest.changed_unnoted()  # most people at once: summed whole, once

    # ------------------------------------------------------------------ checkpoint
    def take_changes(self, mac: ChangelogMac | None = None) -> list[tuple[bytes, bytes | None]]:
        """The changelog records of every person changed since the last call, in hash order:
        ``(keyed hash, value)``, the value their state's bytes (:func:`record_bytes`) tagged
        by ``mac`` (untagged without one), or ``None`` (a tombstone) for a person the table
        dropped; the table's digest moves with them. A compact table writes them in its own
        pass (``UserTable.changelog``, byte for byte the same)."""
        if type(self.bounder) is not Bounder:
            mac = mac or ChangelogMac(None, b"")
            # (the compiled pass sorts and merges them with its own list: no sort here)
            out, delta = self.bounder.changelog(list(self.touched), mac.key,
                                                mac.context_hash, self.digest.key)
            self.touched = set()
            self.digest.written_sum(int.from_bytes(delta, "little"), self._table_sum)
            self.written_people = len(self.bounder)
            return out  # type: ignore[no-any-return]
        raw: list[tuple[bytes, bytes | None]] = []
        for person in sorted(self.touched):
            got = self.bounder.person(person)
            raw.append((person, None if got is None else record_bytes(got)))
        self.touched = set()
        self.digest.written(raw, self._table)
        self.written_people = len(self.bounder)
        if mac is None:
            return raw
        return [(person, None if value is None else mac.seal(person, value))
                for person, value in raw]

    def _table(self) -> Any:
        """Every person of the table with their state, for :class:`TableDigest`."""
        return ((person, (last_tick, periods))
                for person, last_tick, periods in self.bounder.export())

    def _table_sum(self) -> int:
        """``D`` of the whole table (:mod:`agents.ingest.user_digest`)."""
        if type(self.bounder) is not Bounder:
            return int.from_bytes(self.bounder.digest_sum(self.digest.key), "little")
        return self.digest.sum_of(self._table())

    def load_changes(self, records: list[tuple[bytes, bytes | None]]) -> None:
        """The table from the changelog's records in offset order (the last one per person
        wins; a tombstone deletes), after a :meth:`restore` of a changelog checkpoint."""
        latest: dict[bytes, bytes | None] = {}
        for person, value in records:
            latest[person] = value
        people = []
        try:
            for person, value in latest.items():
                if value is None:
                    continue
                if len(person) != 16:
                    raise ValueError("a person's hash is not 16 bytes")
                last_tick, periods = decode_state(value)
                people.append((person, last_tick, periods))
            bounder = _filled(self.bounds, people, self.compact)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"per-person changelog: unreadable record ({exc})") from None
        self.bounder = bounder
        self._track()
        self.touched = set()
        self.digest.load_sum(self._table_sum())  # checked against the checkpoint's by the caller

    def to_doc(self) -> dict[str, Any]:
        """The table as JSON-able columns (:meth:`stream_dp.user_level.Bounder.columns`, persons
        in hash order whichever the table; the persons' keyed hashes as one hex string, 32
        digits each; a grid's leaf, a tuple of nodes, as a list). In changelog form only the
        open period (the table is in the changelog, written in the same transaction)."""
        if self.changelog:  # how many people and the digest of the table as written: a lost
            # changelog, or one a writer of the topic rolled back, is refused, not trusted
            return {"open_period": self.open_period, "changelog": True,
                    "people": self.written_people, "digest": self.digest.tag()}
        rows: list[Any] = self.bounder.export()
        rows.sort(key=lambda row: row[0])  # hash order (the compact table's export order)
        cols = export_columns(rows)
        persons = cols.pop("persons")
        assert all(type(p) is bytes and len(p) == 16 for p in persons)  # keyed hashes (decide)
        cols["leaf"] = [list(x) if type(x) is tuple else x for x in cols["leaf"]]
        return {"open_period": self.open_period, "hashes": b"".join(persons).hex(), **cols}

    def restore(self, doc: Any) -> None:
        """The table of :meth:`to_doc` (a sealed checkpoint's: authentic, but checked anyway).
        In changelog form an empty table: :meth:`load_changes` fills it."""
        if bool(doc.get("changelog")) != self.changelog:
            raise ValueError("ingest checkpoint: the per-person table is in "
                             + ("the checkpoint, not in its changelog topic" if self.changelog
                                else "a changelog topic, not in the checkpoint"))
        self.touched = set()
        if self.changelog:
            self.open_period = int(doc["open_period"])
            self.expected_people = self.written_people = int(doc["people"])
            self.expected_digest = str(doc["digest"])
            self.bounder = person_table(self.bounds, self.compact)
            self._track()
            self.digest.load(())
            return
        try:
            self.open_period = int(doc["open_period"])
            raw = bytes.fromhex(doc["hashes"])
            if len(raw) % 16:
                raise ValueError("the persons' hashes are not 16 bytes each")
            cols: dict[str, list[Any]] = {k: [int(x) for x in doc[k]] for k in (
                "last_tick", "periods", "period", "count", "leaves", "leaf_count")}
            cols["persons"] = [raw[i:i + 16] for i in range(0, len(raw), 16)]
            cols["leaf"] = [tuple(x) if type(x) is list else int(x) for x in doc["leaf"]]
            bounder = _filled(self.bounds, columns_people(cols), self.compact)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"ingest checkpoint: unreadable per-person table ({exc})") from None
        self.bounder = bounder
        self._track()
