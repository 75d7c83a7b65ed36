"""Release state of a binary-attribute domain's shard (:class:`AttributeReleaseState`): each
tick's clipped cell counts measured as the epoch's marginal tables (:mod:`stream_dp.attributes`)
and published as ``dp.tables.v1`` records (:class:`TableRelease`). Pure: no I/O.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from agents.config.domain import attribute_config
from agents.config.settings import Settings
from agents.ingest.routing import Router, _int_list
from agents.kafka.checkpoints import CheckpointRefused
from agents.kafka.codec import encode
from agents.release.state import _MAGIC, CHECKPOINT_PURPOSE, Release, ReleaseState
from stream_dp.integrity import seal
from stream_dp.mechanism import canonical_json

#: Schema of the per-table records of a binary-attribute domain on the counts topic.
TABLES_SCHEMA = "dp.tables.v1"


def attribute_accounting(settings: Settings, domain: Any) -> dict[str, Any]:
    """What the worker logs at start-up for a binary-attribute deployment: the ε one event
    spends, exactly (the largest ``ε₀ + K·ε_t`` over every table count an epoch can have, as
    its full decimal expansion; ``ε₀`` is 0 with one attribute, where no bootstrap runs), the
    bound each table cell is clipped to and the first epoch's bank strategy; at user level the
    person's figures (:func:`agents.release.person.person_summary`)."""
    from agents.release.person import person_summary
    from stream_dp.attributes.live import check_live_range
    from stream_dp.attributes.release import max_tables, worst_spent
    from stream_dp.exact_budget import exact_decimal

    c = attribute_config(settings, domain)
    eps0 = c.bootstrap_epsilon
    return {
        "model": "pure", "epsilon_per_event": c.epsilon, "bootstrap_per_event": eps0,
        "spent_per_event_exact": exact_decimal(worst_spent(c.epsilon, c.m, eps0)),
        "tables_per_epoch_max": max_tables(c.m), "attributes": c.m,
        "structure_epoch_ticks": c.epoch_ticks, "cell_clip_events_per_tick": c.max_cell_count,
        "first_epoch_strategy": check_live_range(c),
        # privacy_unit = user: a person's K counted events per period (no key at event level,
        # whose log line is unchanged)
        **({"per_person": person_summary(settings, domain)}
           if settings.privacy_unit == "user" else {}),
    }


def attribute_description(settings: Settings, domain: Any, nonce: str = "") -> str:
    """Canonical text keying every noise draw of a binary-attribute deployment (bound to the
    deployment's identity and nonce, :mod:`agents.config.deployment`)."""
    from agents.config.deployment import deployment_id

    did = deployment_id(settings, domain.digest(), nonce)
    return f"stream-dp/attributes/v2/deployment={did}/epoch={int(settings.epoch)}"


def new_live(settings: Settings, domain: Any, key: bytes, nonce: str = "") -> Any:
    """A fresh :class:`stream_dp.attributes.live.LiveMarginals` for the deployment."""
    from stream_dp.attributes.live import LiveMarginals

    return LiveMarginals(attribute_config(settings, domain), key,
                         attribute_description(settings, domain, nonce))


@dataclass(frozen=True)
class TableRelease(Release):
    """One tick of a binary-attribute domain: every measured table (noisy, decayed).

    ``streams`` holds the record key of each table (all the same: the tables of a tick stay in
    one counts partition, in order); ``values`` all cells of all tables, concatenated; ``live``
    the :class:`~stream_dp.attributes.live.LiveTick`, ``domain`` the binary domain.
    """

    live: Any = None
    domain: Any = None

    def records(self, settings: Settings, privacy: dict[str, Any]) -> list[dict[str, Any]]:
        """The ``dp.tables.v1`` values of this tick, one per table (docs/CONTRACTS.md)."""
        lt = self.live
        names = self.domain.names
        kinds = lt.table_kinds()
        describe = lt.structure.describe()
        budget = {"bootstrap": lt.split.bootstrap, "per_table": lt.split.per_table,
                  "tables": lt.split.n_tables, "epoch_ticks": int(settings.attribute_epoch_ticks)}
        out = []
        for i, t in enumerate(lt.tables):
            out.append({
                "schema": TABLES_SCHEMA, "domain": self.domain.name, "tick": int(self.tick),
                "tick_start": float(self.tick_start), "tick_end": float(self.tick_end),
                "epoch": int(lt.epoch), "table": i, "tables": len(lt.tables),
                "attributes": list(t), "names": [names[a] for a in t], "kind": kinds[i],
                "cells": [float(v) for v in lt.values[i]], "stderr": float(lt.stderr[i]),
                "carried_from_model": bool(lt.carried_from_model[i]), "structure": describe,
                "strategy": self.strategy, "p": float(settings.p), "privacy": privacy,
                "budget": budget, "bootstrap": lt.bootstrap if i == 0 else None,
            })
        return out

    def messages(self, settings: Settings, privacy: dict[str, Any]) -> list[tuple[bytes, bytes]]:
        """``(key, value)`` per table: key ``<domain>/tables``."""
        return [(k.encode("utf-8"), encode(r)) for k, r in
                zip(self.streams, self.records(settings, privacy), strict=True)]


class AttributeReleaseState(ReleaseState):
    """Release state of a binary-attribute domain: shard 0 holds the
    :class:`~stream_dp.attributes.live.LiveMarginals` (every table); partials carry
    ``(pattern, count)`` pairs instead of stream indices. Other shards keep the schedule only."""

    def __init__(self, settings: Settings, router: Router, shard: int, live: Any, *,
                 key: bytes | None = None) -> None:
        super().__init__(settings, router, shard, None, key=key, mechanism=False)
        self.live = live
        self._config = attribute_config(settings, router.domain)
        self._description = attribute_description(
            settings, router.domain, getattr(router, "deployment_nonce", ""))

    def step(self) -> Any:
        """Release the next tick (call only when :meth:`ready`)."""
        tick = self.next_tick
        slot = self.pending.pop(tick)
        acc: dict[int, int] = {}
        for src in range(self.sources):  # exact integer event counts
            part = slot[src]
            for pat, c in zip(_int_list(part.idx), _int_list(part.counts), strict=True):
                acc[pat] = acc.get(pat, 0) + c
        self.next_tick = tick + 1
        self.dirty = True
        start, end = self.settings.tick_bounds(tick)
        closed = max(p.closed_at for p in slot.values())
        if self.live is None:
            return Release(tick, start, end, self.shard, (), np.zeros(0), 0.0, "", closed)
        if self.live.tick != tick - 1:
            raise RuntimeError(f"attribute tables are at tick {self.live.tick}, expected {tick - 1}")
        pats = sorted(acc)
        lt = self.live.step(np.array(pats, dtype=np.uint64),
                            np.array([acc[p] for p in pats], dtype=np.float64),
                            cell_clip=float(self.settings.max_events_per_tick))
        key = f"{self.router.domain.name}/tables"
        return TableRelease(
            tick=tick, tick_start=start, tick_end=end, shard=self.shard,
            streams=(key,) * len(lt.tables), values=np.concatenate(lt.values),
            stderr=float(max(lt.stderr)), strategy=str(self.live.release.bank.mechanism.name),
            closed_at=closed, live=lt, domain=self.router.domain,
        )

    @property
    def checkpoint_every(self) -> int:
        """Every tick: the attribute tables are not re-stepped after a restore."""
        return 1

    def context(self) -> bytes:
        if self._context is None:
            s = self.settings
            self._context = canonical_json({
                "context": "stream-dp/release-checkpoint/attributes", "version": 1,
                "attributes": self._config.describe(), "description": self._description,
                "domain": self.domain_id, "epoch": s.epoch, "shard": self.shard,
                "shards": s.shards, "events_partitions": s.events_partitions,
                "origin": s.origin, "tick_seconds": s.tick_seconds,
            })
        return self._context

    def to_bytes(self) -> bytes:
        if self._key is None:
            raise ValueError("ReleaseState needs the noise key (key=...) to seal checkpoints")
        header = json.dumps({
            "v": 1, "shard": self.shard, "offset": self.offset, "next_tick": self.next_tick,
            "pending": [[p.tick, p.source, _int_list(p.idx), _int_list(p.counts), p.closed_at]
                        for slot in self.pending.values() for p in slot.values()],
            **self._pieces_header(),
        }, separators=(",", ":"), allow_nan=False).encode()
        body = self.live.to_bytes() if self.live is not None else b""
        data = _MAGIC + struct.pack(">Q", len(header)) + header + body
        return seal(self._key, CHECKPOINT_PURPOSE, self.context(), data)

    def _restore(self, data: bytes, seq: int, key: bytes) -> None:
        from stream_dp.attributes.live import LiveMarginals

        body = self._restore_header(data, seq, key)
        if self.live is None:
            return
        try:
            live = LiveMarginals.from_bytes(body, self._config, key, self._description)
        except ValueError as exc:
            raise CheckpointRefused(f"shard {self.shard}: attribute tables: {exc}") from None
        if live.tick != self.next_tick - 1:
            raise CheckpointRefused(
                f"shard {self.shard}: checkpoint tables at tick {live.tick} != next_tick - 1")
        self.live = live
