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
   keyed by ``BLAKE2b-128(identifier; key = derive_key(noise key, "user id"))``. Counted
   events go on to their tick's bucket; the others are dropped (not dead-lettered) and only
   counted, for the operator-only metric ``stream_dp_user_bounded_events_total``.

The identifier itself is never stored, logged, exported or checkpointed: only its keyed hash,
which nobody without the noise key can steer into another person's slot. The table is restored
with the same offsets as the rest of the partition's ingest state: in the worker through a
compacted changelog topic (``ingest_users_topic``: one sealed record per person changed since
the last commit, written in the same transaction, :meth:`UserState.take_changes`; the
checkpoint carries the keyed digest of the table that the restore checks the changelog against,
:mod:`agents.ingest.user_digest`), in pure states of tests whole inside the checkpoint
(:meth:`UserState.to_doc`). The slots of a period are
dropped once every tick of it is closed (:meth:`UserState.closed_before`).
"""

from __future__ import annotations

import json
from typing import Any

from agents.ingest.digest import _UNKEYED, _blake2b
from agents.ingest.user_digest import TableDigest, table_digest_key
from agents.kafka.codec import Rejection
from agents.kafka.partitioner import key_partition
from stream_dp.user_level import Bounder, UserBounds

__all__ = ["MAX_ID_BYTES", "USER_ID_PURPOSE", "UserState", "record_bytes", "user_bounds",
           "user_key"]

#: longest identifier, in UTF-8 bytes
MAX_ID_BYTES = 256
#: the purpose under which the identifiers' hash key is derived from the noise key
USER_ID_PURPOSE = "user id"


def user_key(secret: bytes | None) -> bytes:
    """The 32-byte BLAKE2b key of the identifiers' hash, derived from the noise ``secret``
    (:func:`stream_dp.integrity.derive_key`); a fixed public key for ``None`` (tests only)."""
    if secret is None:
        return _UNKEYED
    from stream_dp.integrity import derive_key

    return derive_key(secret, USER_ID_PURPOSE)


def user_bounds(settings: Any) -> UserBounds:
    """The :class:`UserBounds` of ``settings`` (``privacy_unit = "user"``)."""
    return UserBounds(
        max_events=int(settings.user_max_events), period_ticks=int(settings.user_period_ticks),
        max_streams=int(settings.user_max_streams),
        max_events_per_stream=int(settings.user_max_events_per_stream),
        min_separation_ticks=int(settings.user_min_separation_ticks))


def record_bytes(state: tuple[int, list[tuple[int, int, dict[Any, int]]]]) -> bytes:
    """A person's changelog record (before its seal) for their state ``(last tick, periods)``
    (:meth:`stream_dp.user_level.Bounder.person`): the JSON ``[last tick, [[period, count,
    [[leaf, n], ...]], ...]]`` (a grid's leaf, a tuple of nodes, as a list)."""
    last_tick, periods = state
    return json.dumps([last_tick, [
        [p, count, [[list(x) if type(x) is tuple else x, n] for x, n in per_leaf.items()]]
        for p, count, per_leaf in periods]], separators=(",", ":")).encode()


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
        self.bounder = Bounder(self.bounds)
        #: the keyed hash with its key block already absorbed (copied per record)
        self._hash = _blake2b(digest_size=16, key=user_key(secret))
        #: the first period some tick of which is still open (slots of earlier ones are gone)
        self.open_period = 0
        #: the worker's form: the table lives in a compacted changelog topic (one record per
        #: person changed, written with each commit), not in the checkpoint; pure states of
        #: tests keep it whole in the checkpoint
        self.changelog = False
        #: persons (keyed hashes) changed since the last :meth:`take_changes`
        self.touched: set[bytes] = set()
        #: changelog form: how many people the restored checkpoint says the table holds
        self.expected_people = 0
        #: changelog form: the keyed digest of the table as written to the changelog, and the
        #: tag of it that the restored checkpoint carries (agents.ingest.user_digest)
        self.digest = TableDigest(table_digest_key(secret), record_bytes)
        self.expected_digest = self.digest.tag()  # no checkpoint: the empty table

    def context(self) -> dict[str, Any]:
        """What the table depends on (bound into the ingest checkpoint's context)."""
        b = self.bounds
        return {"field": self.field, "period_ticks": b.period_ticks, "max_events": b.max_events,
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
        h = self._hash.copy()
        h.update(ident)
        person = h.digest()
        if not self.changelog or person in self.touched:
            return self.bounder.admit(person, tick, leaf)
        was = self.bounder.person(person)  # as last written: the digest takes its term out
        counted = self.bounder.admit(person, tick, leaf)
        if counted:  # a refusal changes nothing
            self.digest.changing(person, was)
            self.touched.add(person)
        return counted

    def closed_before(self, next_tick: int) -> None:
        """Every tick before ``next_tick`` is closed: drop the slots of the periods wholly
        closed, and the persons whose spacing can no longer bind (O(persons), once per
        period, not per tick)."""
        period = self.bounds.period_of(next_tick)
        if period > self.open_period:
            self.open_period = period
            changed = self.bounder.forget_before(period, open_tick=next_tick)
            if self.changelog and changed:
                self.touched.update(changed)  # type: ignore[arg-type]  # keyed hashes
                self.digest.changed_unnoted()  # most people at once: summed whole, once

    # ------------------------------------------------------------------ checkpoint
    def take_changes(self) -> list[tuple[bytes, bytes | None]]:
        """The changelog records of every person changed since the last call, in hash order:
        ``(keyed hash, JSON of (last tick, periods))`` (:func:`record_bytes`), or ``None`` (a
        tombstone) for a person the table dropped; the table's digest moves with them. The
        caller seals them (:meth:`agents.ingest.state.IngestState.user_changes`)."""
        out: list[tuple[bytes, bytes | None]] = []
        for person in sorted(self.touched):
            got = self.bounder.person(person)
            out.append((person, None if got is None else record_bytes(got)))
        self.touched = set()
        self.digest.written(out, self._table)
        return out

    def _table(self) -> Any:
        """Every person of the table with their state, for :class:`TableDigest`."""
        return ((person, (last_tick, periods))
                for person, last_tick, periods in self.bounder.export())

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
                last_tick, periods = json.loads(value)
                people.append((person, int(last_tick), [
                    (int(p), int(count), {tuple(x) if type(x) is list else int(x): int(n)
                                          for x, n in per_leaf})
                    for p, count, per_leaf in periods]))
            bounder = Bounder(self.bounds)
            bounder.load(people)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"per-person changelog: unreadable record ({exc})") from None
        self.bounder = bounder
        self.touched = set()
        self.digest.load(self._table())  # checked against the checkpoint's by the caller

    def to_doc(self) -> dict[str, Any]:
        """The table as JSON-able columns (:meth:`stream_dp.user_level.Bounder.columns`; the
        persons' keyed hashes as one hex string, 32 digits each; a grid's leaf, a tuple of
        nodes, as a list). In changelog form only the open period (the table is in the
        changelog, written in the same transaction)."""
        if self.changelog:  # how many people and the digest of the table as written: a lost
            # changelog, or one a writer of the topic rolled back, is refused, not trusted
            return {"open_period": self.open_period, "changelog": True,
                    "people": len(self.bounder), "digest": self.digest.tag()}
        cols = self.bounder.columns()
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
            self.expected_people = int(doc["people"])
            self.expected_digest = str(doc["digest"])
            self.bounder = Bounder(self.bounds)
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
            bounder = Bounder(self.bounds)
            bounder.load_columns(cols)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"ingest checkpoint: unreadable per-person table ({exc})") from None
        self.bounder = bounder
