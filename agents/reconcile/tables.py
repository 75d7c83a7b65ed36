"""Consistent tables of binary-attribute domains: :class:`TableAssembler` and
:class:`BlockAssembler` gather a tick's ``dp.tables.v1`` records, :func:`marginals_message`
builds the ``dp.marginals.v1`` value.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agents.reconcile.ticks import CompleteTick, TickAssembler, _Pending

try:  # orjson parses counts messages several times faster; same results on valid JSON
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is part of the service extra
    from json import loads as _loads  # type: ignore[assignment]
log = logging.getLogger("agents.reconcile")  # the agent's logger, as before the split

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
                 after_tick: int = 0, max_pending: int = 256,
                 index: Mapping[str, int] | None = None) -> None:
        super().__init__(names, every=every, after_tick=after_tick, max_pending=max_pending,
                         index=index)
        self.shards = shards
        #: manifest sha256 -> domain positions of its streams (-1: not in the domain)
        self._positions: dict[str, Any] = {}
        #: manifest sha256 -> None when every stream is in the domain, else (the known streams'
        #: domain positions, their indices in the record): computed once per manifest, not per
        #: record (a boolean mask over 250 000 streams per shard and tick was most of the scatter)
        self._known: dict[str, Any] = {}
        self.unresolved: list[tuple[int, int, Any]] = []

    def set_manifests(self, manifests: Mapping[str, Any]) -> None:
        import numpy as np

        for man in manifests.values():
            if man.sha256 not in self._positions:
                pos = np.fromiter((self.index.get(n, -1) for n in man.streams), dtype=np.int64,
                                  count=len(man.streams))
                unknown = int((pos < 0).sum())
                self.unknown_streams += unknown
                self._positions[man.sha256] = pos
                idx = np.flatnonzero(pos >= 0) if unknown else None
                self._known[man.sha256] = None if idx is None else (pos[idx], idx)

    def add_block(self, partition: int, offset: int, block: Any) -> None:
        """Record one decoded compact record read at ``(partition, offset)``."""
        tick = block.tick
        if not self.wanted(tick):
            return
        sha = str(block.header["manifest"])
        pos = self._positions.get(sha)
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
            held[shard] = (pos, block.values, block.stderr, self._known.get(sha))
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
        for pos, values, errs, known in held.values():
            # the same assignments, in the same order, as masking with pos >= 0 here
            if known is None:  # every stream of the shard is a node of the domain
                noisy[pos] = values
                stderr[pos] = errs
            else:
                target, idx = known
                noisy[target] = values[idx]
                stderr[target] = errs[idx]
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
