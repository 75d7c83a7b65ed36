"""The compact encoders write the columns through their buffers (one copy instead of two): the
records must be byte for byte what the old ``tobytes`` path wrote. The oracle below is that old
path, written out independently of the library's code."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from stream_dp.compact import decode_block, encode_block
from stream_dp.compact_histograms import decode_histogram_chunk, encode_histogram

_PREFIX = struct.Struct("<4sHHI")  # magic, version, reserved, header length (docs/formats.md)


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _old_record(magic: bytes, header: dict[str, Any], *columns: Any) -> bytes:
    """The encoders' output before the change: each column copied by ``tobytes``, then joined."""
    raw = _canonical(header)
    pad = -(_PREFIX.size + len(raw)) % 8
    return b"".join((_PREFIX.pack(magic, 1, 0, len(raw)), raw, b"\0" * pad,
                     *(np.ascontiguousarray(np.asarray(c, dtype="<f8")).tobytes()
                       for c in columns)))


def _awkward(rng: np.random.Generator, n: int) -> np.ndarray:
    """Values whose bytes are easy to get wrong: -0.0, subnormals, huge, tiny, integers."""
    x = rng.normal(scale=1e6, size=n)
    specials = np.array([-0.0, 0.0, 5e-324, -5e-324, 1.7976931348623157e308, 1e-300, 3.0])
    x[: min(n, specials.size)] = specials[: min(n, specials.size)]
    return x


_KW: dict[str, Any] = dict(shard="shard-3", tick=17, tick_start=160.0, tick_end=170.0, epoch=2,
                           strategy="tree", p=0.5, privacy={"model": "zcdp", "rho": 0.25},
                           cap=1.0, horizon=4096, manifest="ab" * 32)


@pytest.mark.parametrize("n", [0, 1, 7, 10_001])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "big-endian", "list"])
def test_encode_block_bytes_are_the_old_paths(n: int, layout: str) -> None:
    rng = np.random.default_rng(n + len(layout))
    base_v, base_e = _awkward(rng, 2 * n), np.abs(_awkward(rng, 2 * n))
    v: Any
    e: Any
    if layout == "strided":  # a view with stride 16: the encoder must make it contiguous
        v, e = base_v[::2], base_e[::2]
    elif layout == "big-endian":
        v, e = base_v[:n].astype(">f8"), base_e[:n].astype(">f8")
    elif layout == "list":
        v, e = base_v[:n].tolist(), base_e[:n].tolist()
    else:
        v, e = base_v[:n], base_e[:n]
    header = {"schema": "dp.counts.block.v1", "shard": "shard-3", "tick": 17,
              "tick_start": 160.0, "tick_end": 170.0, "epoch": 2, "strategy": "tree",
              "p": 0.5, "privacy": {"model": "zcdp", "rho": 0.25}, "cap": 1.0,
              "horizon": 4096, "n": n, "manifest": "ab" * 32}
    got = encode_block(values=v, stderr=e, **_KW)
    assert type(got) is bytes  # the producer gets bytes, as before
    assert got == _old_record(b"DPCB", header, v, e)
    block = decode_block(got)
    assert block.values.tobytes() == np.asarray(v, dtype="<f8").tobytes()
    assert block.stderr.tobytes() == np.asarray(e, dtype="<f8").tobytes()


@pytest.mark.parametrize(("total", "chunk_nodes"), [(1, 5), (10, 3), (10_007, 1_000), (12, 12)])
def test_encode_histogram_bytes_are_the_old_paths(total: int, chunk_nodes: int) -> None:
    rng = np.random.default_rng(total)
    vals, noisy = _awkward(rng, total), _awkward(rng, 2 * total)[::2]  # one strided column
    errs = np.abs(_awkward(rng, total)).astype(">f8")
    diag = {"iterations": 3, "residual": 1.5e-9}
    got = encode_histogram(domain="shop", tick=9, tick_end=90.0, values=vals, noisy=noisy,
                           stderr=errs, manifest="cd" * 32, consistent=False,
                           diagnostics=diag, chunk_nodes=chunk_nodes)
    chunks = -(-total // chunk_nodes)
    assert len(got) == chunks
    for c, rec in enumerate(got):
        lo, hi = c * chunk_nodes, min(total, (c + 1) * chunk_nodes)
        header = {"schema": "dp.histograms.block.v1", "domain": "shop", "tick": 9,
                  "tick_end": 90.0, "consistent": False, "diagnostics": diag,
                  "manifest": "cd" * 32, "total": total, "chunk": c, "chunks": chunks,
                  "offset": lo, "n": hi - lo}
        assert type(rec) is bytes
        assert rec == _old_record(b"DPHB", header, vals[lo:hi], noisy[lo:hi], errs[lo:hi])
        chunk = decode_histogram_chunk(rec)
        assert chunk.noisy.tobytes() == np.asarray(noisy[lo:hi], dtype="<f8").tobytes()
