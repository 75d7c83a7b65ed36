"""Ingest stage state for one events partition (pure: no I/O; the pipeline does the Kafka part).

For each record, in offset order: decode and validate (:func:`agents.codec.decode_event`),
reject undeclared keys, timestamps out of range and late events (→ dead letters), clamp the
value to ``cap`` and add it to every node the event feeds, in the bucket of its tick. When the
partition's watermark passes a tick's end (:class:`agents.ticks.PartitionClock`), the tick's
bucket is split by release shard and handed over as one *partial* per shard — for **every**
shard, even empty ones, so the release schedule never depends on the data.

The state (offset, clock, open buckets) round-trips through :meth:`IngestState.to_bytes` so that
a restarted worker resumes exactly where the last committed checkpoint left off.

Node routing (:class:`Router`): a stream belongs to shard ``crc32(name) mod shards`` — stable
across processes and releases (Python's ``hash`` is salted per process, so it is not used).
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agents.codec import Rejection, decode_event
from agents.config import Settings
from agents.ticks import PartitionClock

__all__ = ["IngestState", "Partial", "Router", "shard_of"]

try:  # orjson parses ~5x faster; the stdlib decoder (and decode_event) stays authoritative
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency of the service extra
    _std = json.JSONDecoder().raw_decode

    def _fast_loads(raw: bytes | bytearray | memoryview | str, /) -> Any:
        text = raw if isinstance(raw, str) else bytes(raw).decode()
        obj, end = _std(text)
        if end != len(raw):
            raise ValueError("not a single JSON value")
        return obj


def shard_of(stream: str, shards: int) -> int:
    """The release shard of ``stream``: ``crc32(UTF-8 name) mod shards``."""
    return zlib.crc32(stream.encode("utf-8")) % shards


class Record(NamedTuple):
    """One input record (the attributes of aiokafka's ``ConsumerRecord`` that ingest uses)."""

    offset: int
    key: bytes | None
    value: bytes | None


class Router:
    """Maps event keys to nodes and nodes to (shard, index within the shard).

    ``domain`` is a :class:`stream_dp.domain.Domain`; shard ``s`` releases the nodes
    ``shard_nodes[s]`` (global indices, in domain order).
    """

    def __init__(self, domain: Any, shards: int) -> None:
        self.domain = domain
        self.shards = shards
        names: Sequence[str] = domain.names
        self.node_shard = [shard_of(n, shards) for n in names]
        self.shard_nodes: list[list[int]] = [[] for _ in range(shards)]
        self.local_index = [0] * len(names)
        for i, s in enumerate(self.node_shard):
            self.local_index[i] = len(self.shard_nodes[s])
            self.shard_nodes[s].append(i)
        self._cache: dict[str, tuple[int, ...] | None] = {}
        #: declared event keys seen so far -> their nodes (the ingest fast path's lookup)
        self.declared: dict[str, tuple[int, ...]] = {}

    def shard_names(self, shard: int) -> list[str]:
        names: Sequence[str] = self.domain.names
        return [names[i] for i in self.shard_nodes[shard]]

    def nodes(self, key: str) -> tuple[int, ...] | None:
        """Global node indices an event with ``key`` feeds, or ``None`` if undeclared."""
        try:
            return self._cache[key]
        except KeyError:
            pass
        try:
            found: tuple[int, ...] | None = tuple(int(i) for i in self.domain.nodes_for_event(key))
        except KeyError:
            found = None
        if len(self._cache) < 1_000_000:
            self._cache[key] = found
            if found is not None and len(key) <= 1024:
                self.declared[key] = found
        return found


@dataclass(frozen=True)
class Partial:
    """Raw per-node counts of one tick from one events partition for one release shard.

    INTERNAL ONLY (raw counts): ``idx`` are indices within the shard, ``counts`` their sums.
    """

    tick: int
    source: int
    shard: int
    idx: tuple[int, ...]
    counts: tuple[float, ...]
    closed_at: float

    def encode(self) -> bytes:
        return json.dumps(
            {"tick": self.tick, "src": self.source, "shard": self.shard, "idx": self.idx,
             "counts": self.counts, "closed_at": self.closed_at},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Partial:
        d = json.loads(raw)
        return cls(
            int(d["tick"]), int(d["src"]), int(d["shard"]), tuple(int(i) for i in d["idx"]),
            tuple(float(c) for c in d["counts"]), float(d["closed_at"]),
        )


@dataclass
class IngestOutput:
    """What processing produced since the last commit: dead letters and closed ticks' partials."""

    dead_letters: list[tuple[bytes | None, Rejection, bytes | None, int]] = field(
        default_factory=list
    )
    partials: list[Partial] = field(default_factory=list)
    accepted: int = 0
    clamped: int = 0
    late: int = 0
    ticks_closed: int = 0

    def clear(self) -> None:
        self.dead_letters.clear()
        self.partials.clear()
        self.accepted = self.clamped = self.late = self.ticks_closed = 0


class IngestState:
    """Offset, clock and open tick buckets of one events partition (see module docstring)."""

    def __init__(
        self, settings: Settings, router: Router, partition: int, wall: float, offset: int = -1
    ) -> None:
        self.settings = settings
        self.router = router
        self.partition = partition
        #: next offset to process; -1 = not known yet (no checkpoint: start per events_start)
        self.offset = offset
        self.seq = 0
        self.clock = PartitionClock(
            origin=settings.origin,
            tick_seconds=settings.tick_seconds,
            lateness=settings.allowed_lateness_s,
            idle_timeout=settings.idle_timeout_s,
            wall=wall,
        )
        #: tick -> {nodes an event feeds (tuple of global indices): sum of clamped values}.
        #: Summing per event key (one dict update per event) and expanding to nodes at tick
        #: close in sorted order keeps the float sums deterministic across restarts.
        self.buckets: dict[int, dict[tuple[int, ...], float]] = {}
        self.out = IngestOutput()
        self.dirty = False

    # ------------------------------------------------------------------ processing
    def process(self, offset: int, key: bytes | None, value: bytes | None, wall: float,
                unix_now: float) -> None:
        """Process one record at ``offset`` (records below :attr:`offset` are skipped)."""
        self.process_batch([Record(offset, key, value)], wall, unix_now)

    def process_batch(self, records: Sequence[Any], wall: float, unix_now: float) -> None:
        """Process records (``.offset``, ``.key``, ``.value``; e.g. aiokafka's
        ``ConsumerRecord``) of this partition in offset order. This is the hot loop."""
        s = self.settings
        max_bytes, max_value, cap = s.max_message_bytes, s.max_event_value, s.cap
        origin = s.origin
        future_limit = unix_now + s.max_future_skew_s
        old_limit = unix_now - s.max_event_age_s if s.max_event_age_s > 0 else -math.inf
        clock = self.clock
        tick_seconds = clock.tick_seconds
        next_tick = clock.next_tick
        nodes_of = self.router.nodes
        buckets = self.buckets
        dead = self.out.dead_letters
        floor = math.floor
        loads = _fast_loads
        accepted = clamped = late = 0
        max_ts = -math.inf
        position = self.offset
        lo = max(origin, old_limit)
        cache_get = self.router.declared.get
        cur_tick = -1
        bucket: dict[tuple[int, ...], float] = {}
        start = 0
        while start < len(records) and records[start].offset < position:
            start += 1  # already processed (e.g. re-delivered after a seek)
        if start < len(records):
            position = records[-1].offset + 1
        for i in range(start, len(records)):
            r = records[i]
            value = r.value
            # Fast path: a well-formed event for a declared key, in range and not late. Any
            # doubt falls through to the full classification below (decode_event is the
            # authoritative validator; a property test checks that both paths agree).
            obj: Any = None
            if value is not None and len(value) <= max_bytes:
                try:  # noqa: SIM105 - contextlib.suppress costs a context manager per event
                    obj = loads(value)
                except ValueError:  # malformed or not UTF-8 (orjson.JSONDecodeError included)
                    pass
            if type(obj) is dict:
                rts: Any = obj.get("ts")
                rv: Any = obj.get("value", 1.0)
                tts = type(rts)
                tv = type(rv)
                if (
                    (tts is float or tts is int) and (tv is float or tv is int)
                    and lo <= rts <= future_limit and 0.0 <= rv <= max_value
                ):
                    rk: Any = obj.get("key")
                    try:
                        nodes = cache_get(rk)  # declared str keys only
                    except TypeError:  # an unhashable key (list, object)
                        nodes = None
                    if nodes is not None:
                        tick = floor((rts - origin) / tick_seconds) + 1  # == tick_of
                        if tick >= next_tick:
                            if rv > cap:
                                rv = cap
                                clamped += 1
                            if tick != cur_tick:
                                cur_tick = tick
                                found = buckets.get(tick)
                                if found is None:
                                    found = buckets[tick] = {}
                                bucket = found
                            bucket[nodes] = bucket.get(nodes, 0.0) + rv
                            if rts > max_ts:
                                max_ts = rts
                            accepted += 1
                            continue
            # Full classification, with the reason of any rejection.
            key = r.key
            offset = r.offset
            got = decode_event(value, max_bytes, max_value)
            if type(got) is Rejection:
                dead.append((key, got, value, offset))
                continue
            ev_key, ts, v = got  # type: ignore[misc]
            nodes = nodes_of(ev_key)
            if nodes is None:
                dead.append((key, Rejection("unknown_key", f"key {ev_key[:200]!r} is not declared"),
                             value, offset))
            elif ts < origin:
                dead.append((key, Rejection("before_origin", f"ts={ts!r} < origin={origin!r}"),
                             value, offset))
            elif ts > future_limit:
                dead.append((key, Rejection("future", f"ts={ts!r} is more than "
                             f"{s.max_future_skew_s:g} s ahead of the wall clock"), value, offset))
            elif ts < old_limit:
                dead.append((key, Rejection("too_old", f"ts={ts!r} is more than "
                             f"{s.max_event_age_s:g} s old"), value, offset))
            else:
                tick = floor((ts - origin) / tick_seconds) + 1  # == PartitionClock.tick_of
                if tick < next_tick:
                    late += 1
                    dead.append((key, Rejection("late", f"tick {tick} already closed (next open "
                                 f"tick {next_tick})"), value, offset))
                    continue
                if v > cap:
                    v = cap
                    clamped += 1
                slow_bucket = buckets.get(tick)
                if slow_bucket is None:
                    slow_bucket = buckets[tick] = {}
                slow_bucket[nodes] = slow_bucket.get(nodes, 0.0) + v
                if ts > max_ts:
                    max_ts = ts
                accepted += 1
        if position != self.offset:
            self.offset = position
            self.dirty = True
        if accepted:
            clock.observe(float(max_ts), wall)
        self.out.accepted += accepted
        self.out.clamped += clamped
        self.out.late += late

    def close_ticks(self, wall: float, unix_now: float, max_ticks: int = 10_000) -> int:
        """Close every tick the watermark allows (at most ``max_ticks``); return how many."""
        last = min(self.clock.closable_through(wall), self.clock.next_tick - 1 + max_ticks)
        first = self.clock.next_tick
        if last < first:
            return 0
        router = self.router
        for tick in range(first, last + 1):
            bucket = self.buckets.pop(tick, {})
            sums: dict[int, float] = {}
            for nodes in sorted(bucket):  # fixed order: bit-identical sums on every replay
                c = bucket[nodes]
                for n in nodes:
                    sums[n] = sums.get(n, 0.0) + c
            per_shard: list[list[tuple[int, float]]] = [[] for _ in range(router.shards)]
            for n in sorted(sums):
                per_shard[router.node_shard[n]].append((router.local_index[n], sums[n]))
            for shard, items in enumerate(per_shard):
                self.out.partials.append(
                    Partial(tick, self.partition, shard, tuple(i for i, _ in items),
                            tuple(c for _, c in items), unix_now)
                )
        self.clock.close_through(last, wall=wall)
        self.out.ticks_closed += last - first + 1
        self.dirty = True
        return last - first + 1

    # ------------------------------------------------------------------ checkpoint
    def to_bytes(self) -> bytes:
        """Offset, clock and open buckets (JSON; floats round-trip exactly)."""
        return json.dumps(
            {
                "v": 2,
                "partition": self.partition,
                "offset": self.offset,
                "clock": self.clock.to_dict(),
                "buckets": {
                    str(t): [[list(k) for k in sorted(b)], [b[k] for k in sorted(b)]]
                    for t, b in self.buckets.items()
                },
            },
            separators=(",", ":"),
            allow_nan=False,
        ).encode()

    def restore(self, data: bytes, seq: int, wall: float) -> None:
        d = json.loads(data)
        if d.get("v") != 2 or d.get("partition") != self.partition:
            raise ValueError("ingest checkpoint of another version or partition")
        s = self.settings
        self.offset = int(d["offset"])
        self.seq = seq
        self.clock = PartitionClock.from_dict(
            d["clock"], origin=s.origin, tick_seconds=s.tick_seconds,
            lateness=s.allowed_lateness_s, idle_timeout=s.idle_timeout_s, wall=wall,
        )
        self.buckets = {
            int(t): {tuple(int(n) for n in k): float(c) for k, c in zip(b[0], b[1], strict=True)}
            for t, b in d["buckets"].items()
        }
        if not all(math.isfinite(c) for b in self.buckets.values() for c in b.values()):
            raise ValueError("ingest checkpoint holds non-finite counts")
