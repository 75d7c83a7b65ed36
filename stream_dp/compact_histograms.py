"""Compact consistent histograms: a tick's histogram as a few columnar chunk records.

The JSON histogram (``dp.histograms.v1``) costs about 100 bytes per node: 100 MB per tick at
10^6 nodes, more than a Kafka record may hold. The compact form carries the three numbers of
each node (consistent value, noisy release, standard error) as little-endian float64 columns in
the order of a node manifest (a ``dp.manifest.v1`` with ``shard = "histogram"``, published
once), cut into chunks of at most :data:`CHUNK_NODES` nodes so that every record stays a few
MiB. Format spec: docs/formats.md. No Kafka imports: any subscriber can use it.

**Chunk record** (``dp.histograms.block.v1``), byte layout (same prefix as
``dp.counts.block.v1``, another magic):

====== ========= ===========================================================
offset size      field
====== ========= ===========================================================
0      4         magic ``b"DPHB"``
4      2         format version, uint16 little-endian (1)
6      2         reserved, zero
8      4         header length ``H``, uint32 little-endian
12     H         header: UTF-8 JSON object (sorted keys, no spaces)
12+H   pad       zero bytes up to the next multiple of 8
A      8·n       consistent values, float64 little-endian
A+8n   8·n       noisy releases, float64 little-endian
A+16n  8·n       standard errors of the noisy releases, float64 little-endian
====== ========= ===========================================================

Header: ``schema``, ``domain``, ``tick``, ``tick_end``, ``consistent``, ``diagnostics``
(``iterations``, ``residual``, ``seconds``), ``manifest`` (SHA-256 of the node manifest),
``total`` (nodes in the histogram), ``chunk`` / ``chunks`` (0-based index, count), ``offset``
(manifest position of the chunk's first node) and ``n`` (nodes in the chunk). Node
``offset + i`` of the manifest has the chunk's ``i``-th numbers.

>>> recs = encode_histogram(domain="d", tick=2, tick_end=120.0, values=[3.0, 1.0, 2.0],
...                         noisy=[3.1, 0.9, 2.2], stderr=[1.0, 1.0, 1.0], manifest="ab" * 32,
...                         chunk_nodes=2)
>>> len(recs)
2
>>> asm = HistogramAssembler()
>>> [asm.add(decode_histogram_chunk(r)) for r in recs][-1].values.tolist()
[3.0, 1.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from stream_dp.compact import _PREFIX, _canonical, _column, _open_record

__all__ = [
    "CHUNK_NODES",
    "HISTOGRAM_BLOCK_SCHEMA",
    "HISTOGRAM_MAGIC",
    "HISTOGRAM_MANIFEST_SHARD",
    "Histogram",
    "HistogramAssembler",
    "HistogramChunk",
    "decode_histogram_chunk",
    "encode_histogram",
]

HISTOGRAM_MAGIC = b"DPHB"
VERSION = 1
HISTOGRAM_BLOCK_SCHEMA = "dp.histograms.block.v1"
#: the ``shard`` field (and Kafka key) of the node manifest on the manifests topic
HISTOGRAM_MANIFEST_SHARD = "histogram"
#: nodes per chunk: 24 bytes each, so a chunk record is at most 6 MiB plus its header
CHUNK_NODES = 262_144
_HEADER_KEYS = ("schema", "domain", "tick", "tick_end", "consistent", "diagnostics", "manifest",
                "total", "chunk", "chunks", "offset", "n")


def encode_histogram(*, domain: str, tick: int, tick_end: float, values: ArrayLike,
                     noisy: ArrayLike, stderr: ArrayLike, manifest: str, consistent: bool = True,
                     diagnostics: dict[str, Any] | None = None,
                     chunk_nodes: int = CHUNK_NODES) -> list[bytes]:
    """The chunk records of one tick's histogram, in chunk order (publish them in this order).

    ``values``, ``noisy`` and ``stderr`` are in the order of the node manifest whose SHA-256 is
    ``manifest``; ``chunk_nodes`` ≥ 1 nodes per record."""
    vals = _column("values", values, None)
    total = int(vals.shape[0])
    nz = _column("noisy", noisy, total)
    errs = _column("stderr", stderr, total)
    if isinstance(tick, bool) or not isinstance(tick, (int, np.integer)) or tick < 1:
        raise ValueError(f"tick must be an integer ≥ 1, got {tick!r}")
    if isinstance(chunk_nodes, bool) or not isinstance(chunk_nodes, int) or chunk_nodes < 1:
        raise ValueError(f"chunk_nodes must be an integer ≥ 1, got {chunk_nodes!r}")
    if not (np.isfinite(vals).all() and np.isfinite(nz).all() and np.isfinite(errs).all()):
        raise ValueError("non-finite value, noisy release or standard error")
    diag = {k: v for k, v in (diagnostics or {}).items()}
    chunks = max(1, -(-total // chunk_nodes))
    out = []
    for c in range(chunks):
        lo, hi = c * chunk_nodes, min(total, (c + 1) * chunk_nodes)
        header = {
            "schema": HISTOGRAM_BLOCK_SCHEMA, "domain": str(domain), "tick": int(tick),
            "tick_end": float(tick_end), "consistent": bool(consistent), "diagnostics": diag,
            "manifest": str(manifest), "total": total, "chunk": c, "chunks": chunks,
            "offset": lo, "n": hi - lo,
        }
        raw = _canonical(header)
        pad = -(_PREFIX.size + len(raw)) % 8
        # the slices of the contiguous columns are contiguous: join copies them once through
        # their buffers (``tobytes`` would copy each first; 24 bytes per node per tick)
        out.append(b"".join((_PREFIX.pack(HISTOGRAM_MAGIC, VERSION, 0, len(raw)), raw,
                             b"\0" * pad, vals[lo:hi].data, nz[lo:hi].data,
                             errs[lo:hi].data)))
    return out


@dataclass(frozen=True)
class HistogramChunk:
    """A decoded chunk record: its header and read-only views of its three columns."""

    header: dict[str, Any]
    values: NDArray[np.float64]
    noisy: NDArray[np.float64]
    stderr: NDArray[np.float64]

    @property
    def tick(self) -> int:
        return int(self.header["tick"])


def _int_field(header: dict[str, Any], key: str, low: int) -> int:
    v = header[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"header {key} must be an integer ≥ {low}, got {v!r}")
    return v


def decode_histogram_chunk(data: bytes) -> HistogramChunk:
    """Parse a ``dp.histograms.block.v1`` record (``ValueError`` on any inconsistency); the
    columns are zero-copy read-only views of ``data``."""
    buf, header, start = _open_record(data, HISTOGRAM_MAGIC, HISTOGRAM_BLOCK_SCHEMA, _HEADER_KEYS)
    n = _int_field(header, "n", 0)
    total = _int_field(header, "total", 0)
    chunks = _int_field(header, "chunks", 1)
    chunk = _int_field(header, "chunk", 0)
    offset = _int_field(header, "offset", 0)
    _int_field(header, "tick", 1)
    if chunk >= chunks or offset + n > total:
        raise ValueError(f"chunk {chunk} of {chunks} at offset {offset} (+{n}) exceeds its "
                         f"histogram of {total} nodes")
    if len(buf) != start + 24 * n:
        raise ValueError(f"record is {len(buf)} bytes; {start + 24 * n} expected for n = {n}")
    cols = [np.frombuffer(buf, dtype="<f8", count=n, offset=start + 8 * n * i) for i in range(3)]
    for col in cols:
        if n and not np.isfinite(col).all():
            raise ValueError("non-finite value, noisy release or standard error")
        col.flags.writeable = False
    return HistogramChunk(header, cols[0], cols[1], cols[2])


@dataclass(frozen=True)
class Histogram:
    """One tick's whole consistent histogram, in node-manifest order."""

    tick: int
    tick_end: float
    domain: str
    manifest: str
    consistent: bool
    diagnostics: dict[str, Any]
    values: NDArray[np.float64]
    noisy: NDArray[np.float64]
    stderr: NDArray[np.float64]

    def message(self, names: Sequence[str], keep: Sequence[int] | None = None
                ) -> dict[str, Any]:
        """The ``dp.histograms.v1`` view (all nodes, or the manifest positions ``keep``), given
        the node manifest's ``names``; plus ``total_nodes`` when ``keep`` selects fewer."""
        if len(names) != len(self.values):
            raise ValueError(f"{len(names)} names for a histogram of {len(self.values)} nodes")
        idx = range(len(names)) if keep is None else keep
        msg = self._message([(names[i], i) for i in idx])
        if keep is not None:
            msg["total_nodes"] = len(names)
        return msg

    def head_message(self, head: Sequence[str]) -> dict[str, Any]:
        """The ``dp.histograms.v1`` view of the first ``len(head)`` nodes, named ``head`` (the
        start of the node manifest), with ``total_nodes``."""
        if len(head) > len(self.values):
            raise ValueError(f"{len(head)} names for a histogram of {len(self.values)} nodes")
        msg = self._message(list(zip(head, range(len(head)), strict=True)))
        msg["total_nodes"] = len(self.values)
        return msg

    def _message(self, named: list[tuple[str, int]]) -> dict[str, Any]:
        v, x, s = self.values, self.noisy, self.stderr
        return {
            "tick": self.tick, "tick_end": self.tick_end,
            "nodes": [{"stream": name, "value": float(v[i]), "noisy": float(x[i]),
                       "stderr": float(s[i])} for name, i in named],
            "consistent": self.consistent, "diagnostics": dict(self.diagnostics),
            "schema": "dp.histograms.v1", "domain": self.domain,
        }


class HistogramAssembler:
    """Gathers chunk records into whole histograms (any chunk order, duplicates ignored).

    A re-published tick (a new reconcile leader) repeats identical chunks. At most
    ``max_pending`` incomplete ticks are held (the oldest is dropped first)."""

    def __init__(self, max_pending: int = 4) -> None:
        self.max_pending = max_pending
        self._pending: dict[tuple[int, str], dict[int, HistogramChunk]] = {}
        #: the newest tick returned so far (older ones are ignored)
        self.last_tick = 0

    def add(self, chunk: HistogramChunk) -> Histogram | None:
        """Add one chunk; return the tick's histogram when this chunk completes it."""
        h = chunk.header
        tick = chunk.tick
        if tick <= self.last_tick:
            return None
        key = (tick, str(h["manifest"]))
        got = self._pending.setdefault(key, {})
        got[int(h["chunk"])] = chunk
        if len(got) < int(h["chunks"]):
            while len(self._pending) > self.max_pending:
                del self._pending[min(self._pending)]
            return None
        del self._pending[key]
        parts = [got[i] for i in range(int(h["chunks"]))]
        total = int(h["total"])
        offsets = np.cumsum([0] + [p.values.shape[0] for p in parts])
        if offsets[-1] != total or any(int(p.header["total"]) != total
                                       or int(p.header["offset"]) != int(o)
                                       for p, o in zip(parts, offsets, strict=False)):
            raise ValueError(f"tick {tick}: chunks do not tile its {total} nodes")
        self.last_tick = tick
        for k in [k for k in self._pending if k[0] <= tick]:
            del self._pending[k]
        return Histogram(
            tick=tick, tick_end=float(h["tick_end"]), domain=str(h["domain"]),
            manifest=str(h["manifest"]), consistent=bool(h["consistent"]),
            diagnostics=dict(h["diagnostics"]),
            values=np.concatenate([p.values for p in parts]),
            noisy=np.concatenate([p.noisy for p in parts]),
            stderr=np.concatenate([p.stderr for p in parts]),
        )
