"""Release stage state for one shard (pure: no I/O; the pipeline does the Kafka part).

A shard owns a fixed set of declared streams (:class:`agents.ingest.Router`) and one
:class:`stream_dp.counters.CounterBank` for them. Tick ``n`` is released once partials for
``n`` from **all** events partitions are in: they are summed in source-partition order (so the
float sums are bit-identical on every replay), the bank steps over every stream of the shard
(zeros included), and one ``dp.counts.v1`` message per stream is produced.

State (bank bytes, next tick, pending partials of later ticks, input offset) round-trips through
:meth:`ReleaseState.to_bytes`; together with noise keyed by ``(secret, stream, node)`` a replay
from a checkpoint republishes bit-identical values.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agents.codec import encode
from agents.config import Settings
from agents.ingest import Partial, Router

__all__ = ["Release", "ReleaseState"]

_MAGIC = b"SDPREL1\n"


@dataclass(frozen=True)
class Release:
    """One shard's release for one tick (noisy values only; never raw counts)."""

    tick: int
    tick_start: float
    tick_end: float
    shard: int
    streams: tuple[str, ...]
    values: NDArray[np.float64]
    stderr: float
    strategy: str
    closed_at: float

    def messages(self, settings: Settings, privacy: dict[str, Any]) -> list[tuple[bytes, bytes]]:
        """``(key, value)`` of the ``dp.counts.v1`` messages, one per stream.

        Byte-identical to ``encode(count_message(...))`` (a unit test checks it) but built from
        a per-tick template: only the stream name and the value vary.
        """
        names = _json_names(self.streams)
        head = (
            f',"tick":{int(self.tick)},"tick_start":{float(self.tick_start)!r},'
            f'"tick_end":{float(self.tick_end)!r},"value":'
        )
        tail = (
            f',"stderr":{float(self.stderr)!r},"strategy":{json.dumps(self.strategy)},'
            f'"p":{float(settings.p)!r},"privacy":{encode(privacy).decode()},'
            f'"cap":{float(settings.cap)!r},"horizon":{int(settings.horizon)},'
            '"schema":"dp.counts.v1"}'
        )
        return [
            (key, f'{{"stream":{jname}{head}{v!r}{tail}'.encode())
            for (key, jname), v in zip(names, self.values.tolist(), strict=True)
        ]


_NAME_CACHE: dict[tuple[str, ...], list[tuple[bytes, str]]] = {}


def _json_names(streams: tuple[str, ...]) -> list[tuple[bytes, str]]:
    """``(UTF-8 key, JSON string literal)`` per stream, cached per shard's stream tuple."""
    found = _NAME_CACHE.get(streams)
    if found is None:
        found = [(n.encode("utf-8"), json.dumps(n)) for n in streams]
        if len(_NAME_CACHE) > 64:
            _NAME_CACHE.clear()
        _NAME_CACHE[streams] = found
    return found


class ReleaseState:
    """Counter bank, next tick, pending partials and input offset of one release shard."""

    def __init__(self, settings: Settings, router: Router, shard: int, bank: Any) -> None:
        self.settings = settings
        self.router = router
        self.shard = shard
        self.bank = bank
        self.names = tuple(router.shard_names(shard))
        self.sources = settings.events_partitions
        self.next_tick = 1
        self.offset = -1
        self.seq = 0
        #: tick -> source partition -> partial
        self.pending: dict[int, dict[int, Partial]] = {}
        self.dirty = False
        self.duplicates = 0

    def add(self, offset: int, partial: Partial) -> None:
        """Record one partial read at ``offset`` of this shard's partials partition."""
        if offset < self.offset:
            return
        self.offset = offset + 1
        self.dirty = True
        if partial.shard != self.shard or not 0 <= partial.source < self.sources:
            raise ValueError(
                f"partial for shard {partial.shard} from source {partial.source} does not "
                f"belong to shard {self.shard} with {self.sources} sources"
            )
        if partial.tick < self.next_tick:
            self.duplicates += 1  # already released; committed partials are never resent
            return
        slot = self.pending.setdefault(partial.tick, {})
        if partial.source in slot:
            self.duplicates += 1
            return
        slot[partial.source] = partial

    def ready(self) -> bool:
        """True if the next tick has partials from every events partition."""
        slot = self.pending.get(self.next_tick)
        return slot is not None and len(slot) == self.sources

    def step(self) -> Release:
        """Release the next tick (call only when :meth:`ready`)."""
        tick = self.next_tick
        slot = self.pending.pop(tick)
        counts = np.zeros(len(self.names), dtype=np.float64)
        for src in range(self.sources):  # fixed order: bit-identical float sums
            part = slot[src]
            if part.idx:
                counts[np.asarray(part.idx, dtype=np.int64)] += np.asarray(
                    part.counts, dtype=np.float64
                )
        if self.bank is not None and self.bank.tick != tick - 1:
            raise RuntimeError(
                f"shard {self.shard}: bank is at tick {self.bank.tick}, expected {tick - 1}"
            )
        if self.bank is None:  # a shard without streams still keeps the schedule
            values = np.zeros(0, dtype=np.float64)
        else:
            values = np.asarray(self.bank.step(counts), dtype=np.float64)
        self.next_tick = tick + 1
        self.dirty = True
        start, end = self.settings.tick_bounds(tick)
        return Release(
            tick=tick,
            tick_start=start,
            tick_end=end,
            shard=self.shard,
            streams=self.names,
            values=values,
            stderr=float(self.bank.stderr) if self.bank is not None else 0.0,
            strategy=str(self.bank.mechanism.name) if self.bank is not None else "",
            closed_at=max(p.closed_at for p in slot.values()),
        )

    # ------------------------------------------------------------------ checkpoint
    def to_bytes(self) -> bytes:
        header = json.dumps(
            {
                "v": 1,
                "shard": self.shard,
                "offset": self.offset,
                "next_tick": self.next_tick,
                "names": len(self.names),
                "pending": [
                    [p.tick, p.source, list(p.idx), list(p.counts), p.closed_at]
                    for slot in self.pending.values()
                    for p in slot.values()
                ],
            },
            separators=(",", ":"),
            allow_nan=False,
        ).encode()
        bank = self.bank.to_bytes() if self.bank is not None else b""
        return _MAGIC + struct.pack(">Q", len(header)) + header + bank

    def restore(self, data: bytes, seq: int, key: bytes) -> None:
        from stream_dp.counters import CounterBank

        if not data.startswith(_MAGIC):
            raise ValueError("release checkpoint: bad magic")
        (n,) = struct.unpack(">Q", data[len(_MAGIC) : len(_MAGIC) + 8])
        start = len(_MAGIC) + 8
        header = json.loads(data[start : start + n])
        if header.get("v") != 1 or header.get("shard") != self.shard:
            raise ValueError("release checkpoint of another version or shard")
        self.offset = int(header["offset"])
        self.next_tick = int(header["next_tick"])
        self.seq = seq
        self.pending = {}
        for tick, src, idx, counts, closed_at in header["pending"]:
            p = Partial(int(tick), int(src), self.shard, tuple(idx), tuple(counts), float(closed_at))
            self.pending.setdefault(p.tick, {})[p.source] = p
        if not self.names:
            self.bank = None
            return
        bank = CounterBank.from_bytes(data[start + n :], key)
        if tuple(bank.names) != self.names:
            raise ValueError(
                f"shard {self.shard}: checkpoint streams differ from the domain's "
                "(the domain file or the shard count changed)"
            )
        self.bank = bank
        if bank.tick != self.next_tick - 1:
            raise ValueError(
                f"shard {self.shard}: checkpoint bank tick {bank.tick} != next_tick - 1"
            )
