"""Compact columnar tick records: one record per shard and tick instead of one JSON per stream.

A shard is a fixed, ordered list of streams (its **manifest**, published once); each tick's
record carries a small JSON header and the values and standard errors as little-endian float64
arrays in manifest order, so a subscriber reads 10^6 counts with two ``numpy.frombuffer`` calls.
Format spec: docs/formats.md. This module has no Kafka imports: any subscriber can use it.

**Tick record** (``dp.counts.block.v1``), byte layout:

====== ========= ===========================================================
offset size      field
====== ========= ===========================================================
0      4         magic ``b"DPCB"``
4      2         format version, uint16 little-endian (1)
6      2         reserved, zero
8      4         header length ``H``, uint32 little-endian
12     H         header: UTF-8 JSON object (sorted keys, no spaces)
12+H   pad       zero bytes up to the next multiple of 8
A      8·n       values, float64 little-endian, manifest order
A+8n   8·n       standard errors, float64 little-endian, manifest order
====== ========= ===========================================================

The header holds ``schema``, ``shard``, ``tick``, ``tick_start``/``tick_end`` (Unix seconds),
``epoch``, ``strategy``, ``p``, ``privacy``, ``cap``, ``horizon``, ``n`` (streams) and
``manifest`` (the SHA-256 of the shard's manifest, :func:`manifest_hash`).

**Manifest** (``dp.manifest.v1``): a JSON object ``{"schema", "shard", "streams", "sha256"}``;
``sha256`` is the hex SHA-256 of the UTF-8 JSON array of stream names (no spaces, non-ASCII kept).

>>> m = encode_manifest("shard-0", ["a", "b"])
>>> rec = encode_block(shard="shard-0", tick=3, tick_start=0.0, tick_end=60.0, epoch=0,
...                    strategy="naive", p=0.9, privacy={"model": "pure", "epsilon": 1.0},
...                    cap=1.0, horizon=4095, manifest=decode_manifest(m).sha256,
...                    values=[1.5, 2.5], stderr=[1.4, 1.4])
>>> block = decode_block(rec)
>>> block.values.tolist(), block.header["tick"]
([1.5, 2.5], 3)
>>> [r["stream"] for r in block.records(decode_manifest(m))]
['a', 'b']
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "BLOCK_SCHEMA",
    "MAGIC",
    "MANIFEST_SCHEMA",
    "VERSION",
    "Block",
    "Manifest",
    "decode_block",
    "decode_manifest",
    "encode_block",
    "encode_manifest",
    "manifest_hash",
]

MAGIC = b"DPCB"
VERSION = 1
BLOCK_SCHEMA = "dp.counts.block.v1"
MANIFEST_SCHEMA = "dp.manifest.v1"
_PREFIX = struct.Struct("<4sHHI")
_HEADER_KEYS = ("schema", "shard", "tick", "tick_start", "tick_end", "epoch", "strategy", "p",
                "privacy", "cap", "horizon", "n", "manifest")


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


_HASHES: dict[tuple[str, ...], str] = {}


def manifest_hash(streams: Sequence[str]) -> str:
    """Hex SHA-256 of the UTF-8 JSON array of ``streams`` (order matters).

    Remembered for tuples (a shard's stream tuple is hashed at every tick: 50 ms at 250 000
    names, a lookup by the same tuple object is a pointer comparison)."""
    if isinstance(streams, tuple):
        found = _HASHES.get(streams)
        if found is None:
            found = hashlib.sha256(_canonical(list(streams))).hexdigest()
            if len(_HASHES) >= 64:
                _HASHES.clear()
            _HASHES[streams] = found
        return found
    return hashlib.sha256(_canonical(list(streams))).hexdigest()


@dataclass(frozen=True)
class Manifest:
    """A shard's ordered stream names and their hash."""

    shard: str
    streams: tuple[str, ...]
    sha256: str

    def index(self) -> dict[str, int]:
        """Stream name → position in every tick record of the shard (built once and shared:
        readers choose streams by name at every tick; do not modify it)."""
        found: dict[str, int] | None = self.__dict__.get("_index")
        if found is None:
            found = self.__dict__["_index"] = {name: i for i, name in enumerate(self.streams)}
        return found


def encode_manifest(shard: str, streams: Sequence[str]) -> bytes:
    """One ``dp.manifest.v1`` value (publish it keyed by ``shard`` on a compacted topic)."""
    names = list(streams)
    if not isinstance(shard, str) or not shard:
        raise ValueError(f"shard must be a non-empty string, got {shard!r}")
    if not all(isinstance(s, str) and s for s in names) or len(set(names)) != len(names):
        raise ValueError("streams must be distinct non-empty strings")
    return _canonical({"schema": MANIFEST_SCHEMA, "shard": shard, "streams": names,
                       "sha256": manifest_hash(names)})


def decode_manifest(data: bytes) -> Manifest:
    """Parse and verify a ``dp.manifest.v1`` value (``ValueError`` if malformed or its hash
    does not match its streams)."""
    try:
        obj = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"manifest is not UTF-8 JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("schema") != MANIFEST_SCHEMA:
        raise ValueError(f"not a {MANIFEST_SCHEMA} record")
    streams, shard, digest = obj.get("streams"), obj.get("shard"), obj.get("sha256")
    if not isinstance(streams, list) or not all(isinstance(s, str) for s in streams):
        raise ValueError("manifest streams must be a list of strings")
    if not isinstance(shard, str) or not isinstance(digest, str):
        raise ValueError("manifest shard and sha256 must be strings")
    if manifest_hash(streams) != digest:
        raise ValueError("manifest sha256 does not match its streams")
    return Manifest(shard, tuple(streams), digest)


def _column(name: str, data: ArrayLike, n: int | None) -> NDArray[np.float64]:
    arr = np.ascontiguousarray(np.asarray(data, dtype="<f8"))
    if arr.ndim != 1 or (n is not None and arr.shape[0] != n):
        raise ValueError(f"{name} must be a 1-d array of {n if n is not None else 'n'} numbers")
    return arr


def encode_block(*, shard: str, tick: int, tick_start: float, tick_end: float, epoch: int,
                 strategy: str, p: float, privacy: dict[str, Any], cap: float, horizon: int,
                 manifest: str, values: ArrayLike, stderr: ArrayLike) -> bytes:
    """One ``dp.counts.block.v1`` record: ``values``/``stderr`` in the manifest's order."""
    vals = _column("values", values, None)
    errs = _column("stderr", stderr, vals.shape[0])
    if isinstance(tick, bool) or not isinstance(tick, (int, np.integer)) or tick < 1:
        raise ValueError(f"tick must be an integer ≥ 1, got {tick!r}")
    header = {
        "schema": BLOCK_SCHEMA, "shard": str(shard), "tick": int(tick),
        "tick_start": float(tick_start), "tick_end": float(tick_end), "epoch": int(epoch),
        "strategy": str(strategy), "p": float(p), "privacy": privacy, "cap": float(cap),
        "horizon": int(horizon), "n": int(vals.shape[0]), "manifest": str(manifest),
    }
    raw = _canonical(header)
    pad = -(_PREFIX.size + len(raw)) % 8
    # join reads the contiguous columns through their buffers: one copy of the 16 bytes per
    # stream into the record, not two (``tobytes`` would copy each column first)
    return b"".join((_PREFIX.pack(MAGIC, VERSION, 0, len(raw)), raw, b"\0" * pad,
                     vals.data, errs.data))


@dataclass(frozen=True)
class Block:
    """A decoded tick record: the header and read-only views of the two columns."""

    header: dict[str, Any]
    values: NDArray[np.float64]
    stderr: NDArray[np.float64]

    @property
    def tick(self) -> int:
        return int(self.header["tick"])

    def check(self, manifest: Manifest) -> None:
        """``ValueError`` unless ``manifest`` is the one this record was written against."""
        if manifest.sha256 != self.header["manifest"] or len(manifest.streams) != len(self.values):
            raise ValueError(
                f"manifest {manifest.sha256[:12]}… ({len(manifest.streams)} streams) is not "
                f"this record's {str(self.header['manifest'])[:12]}… ({len(self.values)})")

    def records(self, manifest: Manifest, streams: Sequence[str] | None = None
                ) -> Iterator[dict[str, Any]]:
        """The per-stream ``dp.counts.v1`` view (all streams, or ``streams`` in that order), with
        the fields in the order the service writes them."""
        self.check(manifest)
        h = self.header
        privacy = dict(h["privacy"])
        # the field order of a dp.counts.v1 message (model first in the privacy object)
        privacy = {"model": privacy.pop("model", None), **privacy}
        head = {"tick": h["tick"], "tick_start": h["tick_start"], "tick_end": h["tick_end"]}
        tail = {"strategy": h["strategy"], "p": h["p"], "privacy": privacy, "cap": h["cap"],
                "horizon": h["horizon"], "schema": "dp.counts.v1"}
        if streams is None:
            pairs: Iterator[tuple[int, str]] = iter(enumerate(manifest.streams))
        else:
            index = manifest.index()
            missing = [s for s in streams if s not in index]
            if missing:
                raise ValueError(f"streams not in shard {manifest.shard!r}: {missing[:5]}")
            pairs = iter((index[s], s) for s in streams)
        for i, name in pairs:
            yield {"stream": name, **head, "value": float(self.values[i]),
                   "stderr": float(self.stderr[i]), **tail}


def _open_record(data: bytes, magic: bytes, schema: str, keys: Sequence[str]
                 ) -> tuple[memoryview, dict[str, Any], int]:
    """``(buffer, header, start of the columns)`` of a record with the 12-byte prefix (magic,
    version, reserved, header length), a JSON header and 8-byte aligned columns; ``ValueError``
    for a wrong magic, version or schema, a truncated record, or a header without ``keys``."""
    buf = memoryview(bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data)
    if len(buf) < _PREFIX.size:
        raise ValueError("record shorter than its 12-byte prefix")
    found, version, _, hlen = _PREFIX.unpack_from(buf, 0)
    if found != magic:
        raise ValueError(f"bad magic {bytes(found)!r} (expected {magic!r})")
    if version != VERSION:
        raise ValueError(f"unsupported format version {version} (this decoder reads {VERSION})")
    end = _PREFIX.size + hlen
    if end > len(buf):
        raise ValueError("record truncated inside its header")
    try:
        header = json.loads(bytes(buf[_PREFIX.size:end]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"header is not UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("schema") != schema:
        raise ValueError(f"not a {schema} record")
    missing = [k for k in keys if k not in header]
    if missing:
        raise ValueError(f"header lacks {missing}")
    return buf, header, end + (-end % 8)


def decode_block(data: bytes) -> Block:
    """Parse a ``dp.counts.block.v1`` record (``ValueError`` on any inconsistency). The columns
    are zero-copy read-only views of ``data``."""
    buf, header, start = _open_record(data, MAGIC, BLOCK_SCHEMA, _HEADER_KEYS)
    n = header["n"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"header n must be an integer ≥ 0, got {n!r}")
    if len(buf) != start + 16 * n:
        raise ValueError(f"record is {len(buf)} bytes; {start + 16 * n} expected for n = {n}")
    values = np.frombuffer(buf, dtype="<f8", count=n, offset=start)
    stderr = np.frombuffer(buf, dtype="<f8", count=n, offset=start + 8 * n)
    if n and not (np.isfinite(values).all() and np.isfinite(stderr).all()):
        raise ValueError("non-finite value or standard error")
    values.flags.writeable = False
    stderr.flags.writeable = False
    if not math.isfinite(float(header["tick_start"])):
        raise ValueError("tick_start must be finite")
    return Block(header, values, stderr)
