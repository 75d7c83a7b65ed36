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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from agents.codec import encode
from agents.groups import leave_group
from agents.metrics import Metrics

try:  # orjson parses counts messages several times faster; same results on valid JSON
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is part of the service extra
    from json import loads as _loads  # type: ignore[assignment]

log = logging.getLogger(__name__)

HISTOGRAM_SCHEMA: Final = "dp.histograms.v1"
#: Default name of the one-partition leader-election topic (never written to).
LEADER_TOPIC: Final = "dp.reconcile.leader"
#: Default consumer group of the leader election.
LEADER_GROUP: Final = "stream-dp-reconcile"


class DomainLike(Protocol):
    """What the agent needs of :class:`stream_dp.domain.Domain`: the released nodes, in order."""

    @property
    def names(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Release:
    """The fields of one ``dp.counts.v1`` message the reconciler uses.

    ``tick`` is 1-based; ``tick_end`` in Unix seconds; ``value`` is the released (noisy) decayed
    count and ``stderr`` its analytic standard error, in counts.
    """

    stream: str
    tick: int
    tick_end: float
    value: float
    stderr: float

    @classmethod
    def from_json(cls, data: bytes | str) -> Release:
        """Decode a counts message; ``ValueError`` for anything that is not a valid release."""
        try:
            obj = _loads(data)
        except ValueError as exc:  # JSONDecodeError, orjson's, UnicodeDecodeError
            raise ValueError(f"counts message is not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError("counts message must be a JSON object")
        try:
            stream, tick = obj["stream"], obj["tick"]
            tick_end, value, stderr = obj["tick_end"], obj["value"], obj["stderr"]
        except KeyError as exc:
            raise ValueError(f"counts message lacks field {exc.args[0]!r}") from None
        if not isinstance(stream, str):
            raise ValueError("counts message field 'stream' must be a string")
        if isinstance(tick, bool) or not isinstance(tick, int) or tick < 1:
            raise ValueError(f"counts message field 'tick' must be an integer >= 1, got {tick!r}")
        nums = {"tick_end": tick_end, "value": value, "stderr": stderr}
        for name, v in nums.items():
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"counts message field {name!r} must be a number, got {v!r}")
        if not float(stderr) >= 0.0:
            raise ValueError(f"counts message field 'stderr' must be >= 0, got {stderr!r}")
        return cls(stream, tick, float(tick_end), float(value), float(stderr))


@dataclass(frozen=True)
class CompleteTick:
    """All of one tick's releases, in domain order (tuples, or float64 arrays from compact
    records)."""

    tick: int
    tick_end: float
    noisy: Any
    stderr: Any


@dataclass
class _Pending:
    tick_end: float = 0.0
    values: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: partition -> smallest offset of a message of this tick
    first_offset: dict[int, int] = field(default_factory=dict)


class TickAssembler:
    """Buffers releases per tick until every node of the domain has one.

    Ticks ``<= after_tick`` and ticks not divisible by ``every`` are ignored. Complete ticks come
    out in ascending order; an incomplete tick older than a complete one can never complete
    (each stream's releases are keyed by the stream, so they arrive in tick order: once tick
    ``t + 1`` is complete every release of tick ``t`` has been read) and is dropped with a
    warning. At most ``max_pending`` ticks are buffered (memory: about 150 bytes per node and
    tick); when a release shard lags further behind, the oldest pending tick is dropped.
    Plain bookkeeping, no I/O: the Kafka loop in :class:`Reconciler` drives it.
    """

    def __init__(
        self, names: Sequence[str], *, every: int = 1, after_tick: int = 0,
        max_pending: int = 256,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an integer >= 1 (ticks), got {every!r}")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an integer >= 1 (ticks), got {max_pending!r}")
        self.max_pending = max_pending
        if after_tick < 0:
            raise ValueError(f"after_tick must be >= 0, got {after_tick!r}")
        self.names = tuple(names)
        if len(set(self.names)) != len(self.names):
            raise ValueError("names must be distinct")
        self.index = {n: i for i, n in enumerate(self.names)}
        self.every = every
        self.after_tick = int(after_tick)
        self._pending: dict[int, _Pending] = {}
        self.unknown_streams = 0
        self.conflicts = 0
        #: ticks dropped without a histogram (total) and the most recent of them
        self.dropped = 0
        self.dropped_ticks: deque[int] = deque(maxlen=1000)

    def wanted(self, tick: int) -> bool:
        return tick > self.after_tick and tick % self.every == 0

    def add(self, partition: int, offset: int, release: Release) -> None:
        """Record one release read at ``(partition, offset)`` of the counts topic."""
        if not self.wanted(release.tick):
            return
        idx = self.index.get(release.stream)
        if idx is None:
            self.unknown_streams += 1
            return
        pending = self._open(release.tick)
        if pending is None:
            return
        pending.tick_end = max(pending.tick_end, release.tick_end)
        old = pending.values.get(idx)
        new = (release.value, release.stderr)
        if old is not None and old != new:
            # A re-published tick must be bit-identical (DESIGN.md §2.5); keep the first.
            self.conflicts += 1
            log.error(
                "conflicting re-publication of a release",
                extra={"stream": release.stream, "tick": release.tick},
            )
        elif old is None:
            pending.values[idx] = new
        prev = pending.first_offset.get(partition)
        if prev is None or offset < prev:
            pending.first_offset[partition] = offset

    def pop_complete(self) -> list[Any]:
        """Every tick that now has all its input, ascending (earlier incomplete ticks are
        dropped); afterwards ``after_tick`` is the last. Subclasses say what "complete" is and
        what a complete tick becomes (:meth:`_is_complete`, :meth:`_complete`)."""
        done = sorted(t for t, p in self._pending.items() if self._is_complete(t, p))
        out: list[Any] = []
        for t in done:
            for stale in sorted(s for s in self._pending if s < t):
                del self._pending[stale]
                self._drop(stale, f"incomplete while tick {t} is complete (releases lost)")
            made = self._complete(t, self._pending.pop(t))
            if made is not None:
                out.append(made)
            self.after_tick = t
        return out

    def _is_complete(self, tick: int, p: _Pending) -> bool:
        return len(p.values) == len(self.names)

    def _complete(self, tick: int, p: _Pending) -> Any:
        n = len(self.names)
        return CompleteTick(
            tick=tick,
            tick_end=p.tick_end,
            noisy=tuple(p.values[i][0] for i in range(n)),
            stderr=tuple(p.values[i][1] for i in range(n)),
        )

    def _open(self, tick: int) -> _Pending | None:
        """The buffer of ``tick``, created if new; ``None`` if it had to be dropped at once
        (more than ``max_pending`` ticks buffered and it is the oldest)."""
        pending = self._pending.get(tick)
        if pending is None:
            pending = self._pending[tick] = _Pending()
            if len(self._pending) > self.max_pending:
                oldest = min(self._pending)
                del self._pending[oldest]
                self._drop(oldest, "more than max_pending ticks buffered (a release shard lags)")
                if oldest == tick:
                    return None
        return pending

    def _drop(self, tick: int, why: str) -> None:
        self.dropped += 1
        self.dropped_ticks.append(tick)
        log.warning("dropping a tick without a histogram", extra={"tick": tick, "reason": why})

    def resume_offsets(self, positions: Mapping[int, int]) -> dict[int, int]:
        """Per partition, where a successor must start reading so that no pending tick is lost.

        ``positions`` are the consumer's next offsets; a partition holding messages of a pending
        tick resumes at the first of them.
        """
        out = dict(positions)
        for p in self._pending.values():
            for part, off in p.first_offset.items():
                if part in out:
                    out[part] = min(out[part], off)
        return out

    @property
    def pending_ticks(self) -> list[int]:
        return sorted(self._pending)


#: ``(domain, noisy, variances) -> result`` (numbers in domain order: sequences or arrays)
SolveFn = Callable[[Any, Any, Any], Any]

#: Schema of the consistent tables of a binary-attribute domain on the histograms topic.
MARGINALS_SCHEMA: Final = "dp.marginals.v1"


@dataclass(frozen=True)
class TableTick:
    """All ``dp.tables.v1`` records of one tick of a binary-attribute domain, in table order."""

    tick: int
    tick_end: float
    records: tuple[dict[str, Any], ...]


class TableAssembler(TickAssembler):
    """:class:`TickAssembler` for ``dp.tables.v1`` records: a tick is complete when all of its
    ``tables`` records (of one structure) are in. Same ordering, dropping and resume rules."""

    def __init__(self, *, every: int = 1, after_tick: int = 0, max_pending: int = 256) -> None:
        super().__init__((), every=every, after_tick=after_tick, max_pending=max_pending)
        self._want: dict[int, tuple[int, str]] = {}

    def _drop(self, tick: int, why: str) -> None:
        self._want.pop(tick, None)
        super()._drop(tick, why)

    def add_table(self, partition: int, offset: int, rec: dict[str, Any]) -> None:
        """Record one decoded table record read at ``(partition, offset)``."""
        tick = rec["tick"]
        if not self.wanted(tick):
            return
        pending = self._open(tick)
        if pending is None:
            return
        shape = (int(rec["tables"]), str(rec["structure"]))
        known = self._want.setdefault(tick, shape)
        index = int(rec["table"])
        held: dict[int, Any] = pending.values  # records here, not (value, stderr) pairs
        old = held.get(index)
        if known != shape or (old is not None and old != rec):
            self.conflicts += 1
            log.error("conflicting re-publication of a table", extra={"tick": tick,
                                                                       "table": index})
        elif old is None:
            held[index] = rec
        pending.tick_end = max(pending.tick_end, float(rec["tick_end"]))
        prev = pending.first_offset.get(partition)
        if prev is None or offset < prev:
            pending.first_offset[partition] = offset

    def _is_complete(self, tick: int, p: _Pending) -> bool:
        return len(p.values) == self._want.get(tick, (-1, ""))[0]

    def _complete(self, tick: int, p: _Pending) -> TableTick:
        n, _ = self._want.pop(tick)
        held: dict[int, Any] = p.values
        return TableTick(tick, p.tick_end, tuple(held[i] for i in range(n)))


class BlockAssembler(TickAssembler):
    """:class:`TickAssembler` for the compact input (``compact_topic``): one
    ``dp.counts.block.v1`` record per (shard, tick); a tick is complete when every one of the
    ``shards`` records is in. Each record's values are placed by its shard's manifest (stream
    names → domain positions, once per manifest). Records whose manifest is not known yet are
    kept in :attr:`unresolved` for the caller to retry after reading the manifests."""

    def __init__(self, names: Sequence[str], shards: int, *, every: int = 1,
                 after_tick: int = 0, max_pending: int = 256) -> None:
        super().__init__(names, every=every, after_tick=after_tick, max_pending=max_pending)
        self.shards = shards
        #: manifest sha256 -> domain positions of its streams (-1: not in the domain)
        self._positions: dict[str, Any] = {}
        self.unresolved: list[tuple[int, int, Any]] = []

    def set_manifests(self, manifests: Mapping[str, Any]) -> None:
        import numpy as np

        for man in manifests.values():
            if man.sha256 not in self._positions:
                pos = np.fromiter((self.index.get(n, -1) for n in man.streams), dtype=np.int64,
                                  count=len(man.streams))
                self.unknown_streams += int((pos < 0).sum())
                self._positions[man.sha256] = pos

    def add_block(self, partition: int, offset: int, block: Any) -> None:
        """Record one decoded compact record read at ``(partition, offset)``."""
        tick = block.tick
        if not self.wanted(tick):
            return
        pos = self._positions.get(str(block.header["manifest"]))
        if pos is None or pos.shape[0] != block.values.shape[0]:
            self.unresolved.append((partition, offset, block))
            return
        pending = self._open(tick)
        if pending is None:
            return
        held: dict[Any, Any] = pending.values
        shard = str(block.header["shard"])
        old = held.get(shard)
        if old is not None:
            if old[1].tobytes() != block.values.tobytes():
                self.conflicts += 1
                log.error("conflicting re-publication of a compact record",
                          extra={"shard": shard, "tick": tick})
        else:
            held[shard] = (pos, block.values, block.stderr)
        pending.tick_end = max(pending.tick_end, float(block.header["tick_end"]))
        prev = pending.first_offset.get(partition)
        if prev is None or offset < prev:
            pending.first_offset[partition] = offset

    def _is_complete(self, tick: int, p: _Pending) -> bool:
        return len(p.values) == self.shards

    def _complete(self, tick: int, p: _Pending) -> CompleteTick | None:
        import numpy as np

        n = len(self.names)
        noisy = np.full(n, np.nan)
        stderr = np.full(n, np.nan)
        held: dict[Any, Any] = p.values
        for pos, values, errs in held.values():
            ok = pos >= 0
            noisy[pos[ok]] = values[ok]
            stderr[pos[ok]] = errs[ok]
        if np.isnan(noisy).any():
            self._drop(tick, "the compact records do not cover every node of the domain")
            return None
        return CompleteTick(tick=tick, tick_end=p.tick_end, noisy=noisy, stderr=stderr)


def decode_table_record(data: bytes | str, domain_name: str | None = None) -> dict[str, Any]:
    """A ``dp.tables.v1`` value, checked for the fields the reconciler uses (``ValueError``)."""
    try:
        obj = _loads(data)
    except ValueError as exc:
        raise ValueError(f"table record is not JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("schema") != "dp.tables.v1":
        raise ValueError("not a dp.tables.v1 record")
    if domain_name is not None and obj.get("domain") != domain_name:
        raise ValueError(f"table record of domain {obj.get('domain')!r}, not {domain_name!r}")
    for name in ("tick", "tables", "table"):
        v = obj.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"table record field {name!r} must be an integer >= 0")
    attrs, cells = obj.get("attributes"), obj.get("cells")
    if not isinstance(attrs, list) or not isinstance(cells, list) or len(cells) != 1 << len(attrs):
        raise ValueError("table record needs 2^len(attributes) cells")
    if not isinstance(obj.get("stderr"), int | float) or not obj["stderr"] >= 0:
        raise ValueError("table record field 'stderr' must be a number >= 0")
    return obj


def marginals_message(tick: TableTick, attribute_names: Sequence[str],
                      domain_name: str) -> tuple[dict[str, Any], Any]:
    """The ``dp.marginals.v1`` value for one tick (docs/CONTRACTS.md) and solver diagnostics.

    The tables are made consistent with :func:`stream_dp.attributes.consistency.make_consistent`
    (GLS through the consistency engine's constraint groups, weighted by ``stderr²``).
    """
    import types

    import numpy as np

    from stream_dp.attributes.consistency import make_consistent_result

    recs = tick.records
    tables = [tuple(int(a) for a in r["attributes"]) for r in recs]
    noisy = [np.asarray(r["cells"], dtype=np.float64) for r in recs]
    variances = [max(float(r["stderr"]) ** 2, 1e-12) for r in recs]
    t0 = time.perf_counter()
    values, iterations, residual = make_consistent_result(tables, noisy, variances)
    seconds = time.perf_counter() - t0
    first = recs[0]
    out_tables = []
    for r, t, v in zip(recs, tables, values, strict=True):
        out_tables.append({
            "attributes": list(t), "names": [attribute_names[a] for a in t],
            "kind": r.get("kind", "cluster"), "cells": [float(x) for x in v],
            "noisy": [float(x) for x in r["cells"]], "stderr": float(r["stderr"]),
            "carried_from_model": bool(r.get("carried_from_model", False)),
        })
    message: dict[str, Any] = {
        "schema": MARGINALS_SCHEMA, "domain": domain_name, "tick": tick.tick,
        "tick_end": tick.tick_end, "epoch": first.get("epoch", 0),
        "structure": first.get("structure", ""), "attributes": list(attribute_names),
        "clusters": [list(t) for t, r in zip(tables, recs, strict=True)
                     if r.get("kind") != "bridge"],
        "bridges": [list(t) for t, r in zip(tables, recs, strict=True)
                    if r.get("kind") == "bridge"],
        "tables": out_tables,
        "total": float(np.mean([float(np.sum(v)) for v in values])),
        "strategy": first.get("strategy"), "p": first.get("p"), "privacy": first.get("privacy"),
        "budget": first.get("budget"), "consistent": True,
        "diagnostics": {"iterations": iterations, "residual": residual, "seconds": seconds},
    }
    return message, types.SimpleNamespace(seconds=seconds, iterations=iterations,
                                          residual=residual)


#: nodes of the JSON view handed to ``on_histogram`` when only compact histograms are published
_CALLBACK_NODES: Final = 20_000


def _diagnostics(result: Any) -> dict[str, Any]:
    return {"iterations": int(result.iterations), "residual": float(result.residual),
            "seconds": float(result.seconds)}


def _head(tick: CompleteTick, keep: int) -> CompleteTick:
    return CompleteTick(tick=tick.tick, tick_end=tick.tick_end, noisy=tick.noisy[:keep],
                        stderr=tick.stderr[:keep])


class _Head:
    """A solve result cut to its first ``keep`` nodes (for :func:`histogram_message`)."""

    def __init__(self, result: Any, keep: int) -> None:
        self.values = result.values[:keep]
        self.consistent = getattr(result, "consistent", True)
        self.iterations, self.residual, self.seconds = (result.iterations, result.residual,
                                                        result.seconds)


def _default_solve() -> SolveFn:
    from stream_dp.consistency import reconcile

    solve: SolveFn = reconcile
    return solve


def histogram_message(
    names: Sequence[str], tick: CompleteTick, result: Any, domain_name: str | None = None
) -> dict[str, Any]:
    """The ``dp.histograms.v1`` value for one solved tick (docs/CONTRACTS.md).

    ``result`` is a :class:`stream_dp.consistency.ReconcileResult`. Each node's ``stderr`` is the
    analytic standard error of its *noisy* release; the consistent value's error is no larger
    (a variance-weighted projection is the best linear unbiased estimate).
    """
    values = [float(v) for v in result.values]
    if len(values) != len(names):
        raise ValueError(f"solver returned {len(values)} values for {len(names)} nodes")
    message: dict[str, Any] = {
        "tick": tick.tick,
        "tick_end": tick.tick_end,
        "nodes": [
            {"stream": name, "value": v, "noisy": x, "stderr": s}
            for name, v, x, s in zip(names, values, tick.noisy, tick.stderr, strict=True)
        ],
        "consistent": bool(getattr(result, "consistent", True)),
        "diagnostics": {
            "iterations": int(result.iterations),
            "residual": float(result.residual),
            "seconds": float(result.seconds),
        },
        "schema": HISTOGRAM_SCHEMA,
    }
    if domain_name is not None:
        message["domain"] = domain_name
    return message


class _LeaderListener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: Reconciler) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.owner._step_down()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        if any(tp.partition == 0 for tp in assigned):
            self.owner._step_up()


def _security_of(settings: Any) -> Any:
    from agents.security import KafkaSecurity

    return KafkaSecurity.from_settings(settings)


async def ensure_leader_topic(bootstrap: str, topic: str = LEADER_TOPIC,
                              security: Any = None) -> None:
    """Create the one-partition leader topic if it does not exist (idempotent)."""
    from agents.security import client_kwargs

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_kwargs(security))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        if topic in existing:
            return
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()


@dataclass(frozen=True)
class ReconcilerConfig:
    """Where the reconciler reads, writes and elects.

    ``every`` is in ticks (publish ticks divisible by it); timeouts in milliseconds.
    """

    bootstrap: str
    counts_topic: str = "dp.counts.v1"
    histograms_topic: str = "dp.histograms.v1"
    #: read the compact records (``dp.counts.block.v1``) of this topic instead of the per-stream
    #: messages of ``counts_topic``; manifests on ``<compact_topic>.manifests``. Empty: JSON.
    compact_topic: str = ""
    #: release shards (one compact record per shard and tick)
    shards: int = 1
    #: publish each histogram as one dp.histograms.v1 JSON message on ``histograms_topic``
    histograms_json: bool = True
    #: with ``compact_topic``: the histogram's chunk records (dp.histograms.block.v1) go here
    #: (default ``<compact_topic>.histograms``), its node manifest to
    #: ``<compact_topic>.manifests`` under the key ``histogram``
    histogram_blocks_topic: str = ""
    #: nodes per chunk record (:data:`stream_dp.compact_histograms.CHUNK_NODES`)
    histogram_chunk_nodes: int = 262_144
    leader_topic: str = LEADER_TOPIC
    leader_group: str = LEADER_GROUP
    domain_name: str = "default"
    every: int = 1
    client_id: str = "stream-dp-reconcile"
    #: Static membership id for the election: a restarted worker (same id) takes its old
    #: place at once, even after ``kill -9``; a graceful stop still leaves the group explicitly.
    #: ``None``: dynamic membership.
    instance_id: str | None = None
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    poll_ms: int = 200
    #: Largest uncompressed histogram message (bytes); messages are gzip-compressed, and the
    #: compressed batch must fit the broker's / topic's ``max.message.bytes`` (1 MiB default).
    #: A node takes about 104 bytes of JSON, about 33 gzip-compressed (so ~30 000 nodes fit
    #: the 1 MiB default).
    max_message_bytes: int = 64 << 20
    #: Most ticks buffered while waiting for every node's release (see :class:`TickAssembler`).
    max_pending_ticks: int = 256
    #: TLS / SASL of the agent's Kafka clients (:class:`agents.security.KafkaSecurity`);
    #: ``None``: from the ``STREAM_DP_*`` environment
    security: Any = None

    def kafka_kwargs(self) -> dict[str, Any]:
        from agents.security import client_kwargs

        return client_kwargs(self.security)

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"every must be an integer >= 1 (ticks), got {self.every!r}")
        if not self.bootstrap:
            raise ValueError("bootstrap must be a non-empty 'host:port[,host:port]' string")
        if not self.domain_name:
            raise ValueError("domain_name must be non-empty (it keys the histograms)")
        if self.compact_topic and not self.histogram_blocks_topic:
            object.__setattr__(self, "histogram_blocks_topic", f"{self.compact_topic}.histograms")
        if not self.histograms_json and not self.histogram_blocks_topic:
            raise ValueError("histograms_json = False needs compact_topic (or "
                             "histogram_blocks_topic): nothing would be published")

    @property
    def manifests_topic(self) -> str:
        """Where the compact records' manifests (and the histogram's node manifest) live:
        ``<compact_topic>.manifests``; without ``compact_topic``, beside an explicitly set
        ``histogram_blocks_topic`` (``X.histograms`` → ``X.manifests``)."""
        if self.compact_topic:
            return f"{self.compact_topic}.manifests"
        if self.histogram_blocks_topic:
            from agents.manifests import histogram_manifests_topic

            return histogram_manifests_topic(self.histogram_blocks_topic)
        return ""

    @classmethod
    def from_settings(cls, settings: Any, domain_name: str, **changes: Any) -> ReconcilerConfig:
        """The configuration for an :class:`agents.config.Settings` and the domain's name.

        The election group is ``<app_id>.reconcile``; static membership id
        ``<worker_id>.reconcile``.
        """
        values: dict[str, Any] = {
            "bootstrap": settings.bootstrap,
            "counts_topic": settings.counts_topic,
            "histograms_topic": settings.histograms_topic,
            "compact_topic": getattr(settings, "compact_topic", ""),
            "shards": getattr(settings, "shards", 1),
            "histograms_json": bool(getattr(settings, "histograms_json", 1)),
            "leader_topic": getattr(settings, "leader_topic", LEADER_TOPIC),
            "security": _security_of(settings),
            "leader_group": f"{settings.app_id}.reconcile",
            "domain_name": domain_name,
            "every": settings.reconcile_every,
            "client_id": f"{settings.app_id}-reconcile-{settings.worker_id}",
            "instance_id": f"{settings.worker_id}.reconcile",
            "session_timeout_ms": int(settings.session_timeout_s * 1000),
            "heartbeat_interval_ms": max(100, int(settings.session_timeout_s * 1000) // 10),
        }
        values.update(changes)
        return cls(**values)


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
        self._manifest: tuple[bytes, str] | None = None
        #: the node manifest went out under the current leadership
        self._manifest_sent = False
        #: solver seconds of the most recent histograms (bounded: workers run for months)
        self.solve_seconds: deque[float] = deque(maxlen=10_000)

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
        from agents.groups import install_empty_assignment_rejoin

        install_empty_assignment_rejoin()
        cfg = self.config
        await ensure_leader_topic(cfg.bootstrap, cfg.leader_topic)
        election = AIOKafkaConsumer(
            bootstrap_servers=cfg.bootstrap, **cfg.kafka_kwargs(),
            group_id=cfg.leader_group,
            group_instance_id=cfg.instance_id,
            client_id=f"{cfg.client_id}-election",
            enable_auto_commit=False,
            auto_offset_reset="latest",
            session_timeout_ms=cfg.session_timeout_ms,
            heartbeat_interval_ms=cfg.heartbeat_interval_ms,
        )
        election.subscribe([cfg.leader_topic], listener=_LeaderListener(self))
        await election.start()
        member_id = ""
        try:
            while not stop_event.is_set():
                # Nothing is written to the leader topic; polling keeps membership alive and
                # surfaces a crashed leading task.
                await election.getmany(timeout_ms=cfg.poll_ms)
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
        await consumer.start()
        try:
            parts = await _partitions(consumer, topic)
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
                    for rec in await _read_range(consumer, tp, lo, hi):
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
                                       max_pending=cfg.max_pending_ticks)
            assembler.set_manifests(await self._manifests())
        else:
            assembler = TickAssembler(self.names, every=cfg.every, after_tick=after,
                                      max_pending=cfg.max_pending_ticks)
        log.info("reconcile leader resuming", extra={"after_tick": after})
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cfg.bootstrap, **cfg.kafka_kwargs(),
            group_id=f"{cfg.leader_group}.offsets",
            client_id=f"{cfg.client_id}-counts",
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
        await consumer.start()
        from agents.fetch_backoff import slow_down

        slow_down(consumer)  # histograms lag releases by seconds: 5x fewer empty fetches
        await producer.start()
        try:
            tps = await self._assign_counts(consumer)
            last_refresh = time.monotonic()
            while True:
                batches = await consumer.getmany(timeout_ms=cfg.poll_ms)
                # Decoding thousands of JSON messages is CPU work: a worker thread keeps the
                # event loop (heartbeats, the pipeline, the web server) responsive.
                complete = (
                    await asyncio.to_thread(self._ingest, assembler, batches)
                    if batches else []
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
                    offsets = assembler.resume_offsets(positions)
                    await consumer.commit(
                        {TopicPartition(self.input_topic, p): o for p, o in offsets.items()}
                    )
                if time.monotonic() - last_refresh > 30.0:  # partitions added to counts topic
                    last_refresh = time.monotonic()
                    parts = await _partitions(consumer, self.input_topic)
                    if len(parts) != len(tps):
                        tps = await self._assign_counts(consumer)
        finally:
            try:
                await producer.stop()
            finally:  # the consumer too, even when the producer's stop is cut short (outage)
                await consumer.stop()

    async def _manifests(self) -> dict[str, Any]:
        from agents.manifests import read_manifests

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
            parts = await _partitions(consumer, topic)
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
        self, assembler: TickAssembler, batches: Mapping[Any, list[ConsumerRecord[Any, Any]]]
    ) -> list[Any]:
        conflicts, dropped = assembler.conflicts, assembler.dropped
        for tp, records in batches.items():
            for rec in records:
                self._add(assembler, tp.partition, rec)
        complete = assembler.pop_complete()
        if self.metrics:
            if assembler.conflicts > conflicts:
                self.metrics.release_conflict(assembler.conflicts - conflicts)
            if assembler.dropped > dropped:
                self.metrics.reconcile_skipped(assembler.dropped - dropped)
        return complete

    def _solve_and_encode(self, tick: Any) -> tuple[Any, dict[str, Any], bytes | None,
                                                    list[bytes]]:
        """``(result, message, JSON value or None, chunk records)`` of one tick (a thread)."""
        cfg = self.config
        if self.tables_mode:
            message, result = marginals_message(tick, self.names, cfg.domain_name)
            return result, message, encode(message), []
        import numpy as np

        noisy = np.asarray(tick.noisy, dtype=np.float64)
        stderr = np.asarray(tick.stderr, dtype=np.float64)
        result = self._solver()(self.domain, noisy, stderr * stderr)
        chunks: list[bytes] = []
        if cfg.histogram_blocks_topic:
            from stream_dp.compact_histograms import encode_histogram

            chunks = encode_histogram(
                domain=cfg.domain_name, tick=int(tick.tick), tick_end=float(tick.tick_end),
                values=np.asarray(result.values, dtype=np.float64), noisy=noisy, stderr=stderr,
                manifest=self._node_manifest()[1], consistent=bool(getattr(result, "consistent",
                                                                            True)),
                diagnostics=_diagnostics(result), chunk_nodes=cfg.histogram_chunk_nodes)
        if cfg.histograms_json:
            message = histogram_message(self.names, tick, result, cfg.domain_name)
            return result, message, encode(message), chunks
        if self.on_histogram is None:  # nobody reads the JSON view: not built (20 000 nodes)
            return result, {}, None, chunks
        # compact only: callbacks get the first nodes (the top of a hierarchy) as JSON
        keep = min(len(self.names), _CALLBACK_NODES)
        message = histogram_message(self.names[:keep], _head(tick, keep),
                                    _Head(result, keep), cfg.domain_name)
        message["total_nodes"] = len(self.names)
        return result, message, None, chunks

    def _node_manifest(self) -> tuple[bytes, str]:
        """The histogram's ``dp.manifest.v1`` (shard ``histogram``) and its SHA-256, once."""
        if self._manifest is None:
            from stream_dp.compact import encode_manifest, manifest_hash
            from stream_dp.compact_histograms import HISTOGRAM_MANIFEST_SHARD

            self._manifest = (encode_manifest(HISTOGRAM_MANIFEST_SHARD, self.names),
                              manifest_hash(self.names))
        return self._manifest

    def _add(self, assembler: TickAssembler, partition: int, rec: ConsumerRecord[Any, Any]) -> None:
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
                from stream_dp.compact_histograms import HISTOGRAM_MANIFEST_SHARD

                await producer.send_and_wait(cfg.manifests_topic, self._node_manifest()[0],
                                             key=HISTOGRAM_MANIFEST_SHARD.encode(), partition=0)
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


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> list[int]:
    topics = await consumer.topics()  # refreshes metadata
    if topic not in topics:
        return []
    return sorted(consumer.partitions_for_topic(topic) or ())


async def _read_range(
    consumer: AIOKafkaConsumer, tp: TopicPartition, lo: int, hi: int
) -> list[ConsumerRecord[Any, Any]]:
    """Records of ``tp`` with offsets in ``[lo, hi)`` (the partition must be assigned)."""
    consumer.seek(tp, lo)
    out: list[ConsumerRecord[Any, Any]] = []
    deadline = time.monotonic() + 30.0
    while await consumer.position(tp) < hi and time.monotonic() < deadline:
        batch = await consumer.getmany(tp, timeout_ms=500)
        out.extend(r for r in batch.get(tp, []) if r.offset < hi)
    return out
