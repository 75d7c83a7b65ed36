"""Compact histogram chunks (stream_dp/compact_histograms.py, docs/formats.md, issue #14).

A reader written here from the spec alone (``struct``/``json``/``array``) reads every bit the
encoder wrote; the chunks tile the histogram exactly; headers validate against the published
schema; the assembled histogram's JSON view equals the ``dp.histograms.v1`` message the
reconcile agent writes for the same solve; corrupt records are refused.
"""

from __future__ import annotations

import array
import json
import struct
import sys

import numpy as np
import pytest

from agents.kafka.codec import validate
from stream_dp.compact import encode_manifest, manifest_hash
from stream_dp.compact_histograms import (
    HistogramAssembler,
    decode_histogram_chunk,
    encode_histogram,
)

SHA = manifest_hash(["a", "b", "c"])


def spec_reader(data: bytes) -> tuple[dict, list[float], list[float], list[float]]:
    """docs/formats.md, "Compact histograms", implemented without the library."""
    magic, version, _reserved, hlen = struct.unpack_from("<4sHHI", data, 0)
    assert magic == b"DPHB" and version == 1
    header = json.loads(data[12:12 + hlen].decode("utf-8"))
    start = 12 + hlen
    start += -start % 8
    n = header["n"]
    assert len(data) == start + 24 * n
    cols = []
    for i in range(3):
        col = array.array("d", data[start + 8 * n * i:start + 8 * n * (i + 1)])
        if sys.byteorder == "big":
            col.byteswap()
        cols.append(col.tolist())
    return header, cols[0], cols[1], cols[2]


def _columns(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=n) * 1e3, rng.normal(size=n) * 1e3, rng.uniform(0.1, 9, n)


@pytest.mark.parametrize("n,chunk", [(0, 4), (1, 4), (7, 3), (9, 3), (1000, 1000), (1001, 250)])
def test_the_spec_reader_reassembles_every_bit(n: int, chunk: int) -> None:
    v, x, s = _columns(n)
    recs = encode_histogram(domain="web", tick=5, tick_end=300.0, values=v, noisy=x, stderr=s,
                            manifest=SHA, chunk_nodes=chunk,
                            diagnostics={"iterations": 1, "residual": 0.0, "seconds": 0.01})
    assert len(recs) == max(1, -(-n // chunk))
    got_v: list[float] = []
    got_x: list[float] = []
    got_s: list[float] = []
    for i, rec in enumerate(recs):
        h, cv, cx, cs = spec_reader(rec)
        validate("dp.histograms.block.v1", h)
        assert (h["chunk"], h["chunks"], h["offset"], h["total"]) == (i, len(recs), len(got_v), n)
        assert h["n"] == len(cv) <= chunk
        got_v += cv
        got_x += cx
        got_s += cs
    # bit for bit, including signed zeros and every mantissa bit
    for got, want in ((got_v, v), (got_x, x), (got_s, s)):
        assert np.array_equal(np.array(got, dtype="<f8").view(np.int64),
                              np.asarray(want, dtype="<f8").view(np.int64))


def test_the_assembler_takes_chunks_in_any_order_once() -> None:
    v, x, s = _columns(10, 1)
    recs = encode_histogram(domain="d", tick=3, tick_end=1.0, values=v, noisy=x, stderr=s,
                            manifest=SHA, chunk_nodes=3)
    old = encode_histogram(domain="d", tick=2, tick_end=0.5, values=v, noisy=x, stderr=s,
                           manifest=SHA, chunk_nodes=3)
    asm = HistogramAssembler()
    order = [2, 0, 2, 3]  # a repeat, and the last chunk before the others
    assert all(asm.add(decode_histogram_chunk(recs[i])) is None for i in order)
    hist = asm.add(decode_histogram_chunk(recs[1]))
    assert hist is not None and hist.tick == 3
    assert np.array_equal(hist.values, v) and np.array_equal(hist.noisy, x)
    assert np.array_equal(hist.stderr, s)
    # the same tick again (a new leader re-publishing it) and older ticks are not returned
    assert all(asm.add(decode_histogram_chunk(r)) is None for r in recs + old)


def test_chunks_of_another_manifest_are_not_mixed_in() -> None:
    v, x, s = _columns(4, 2)
    a = encode_histogram(domain="d", tick=1, tick_end=1.0, values=v, noisy=x, stderr=s,
                         manifest=SHA, chunk_nodes=2)
    b = encode_histogram(domain="d", tick=1, tick_end=1.0, values=v + 1, noisy=x, stderr=s,
                         manifest="0" * 64, chunk_nodes=2)
    asm = HistogramAssembler()
    assert asm.add(decode_histogram_chunk(a[0])) is None
    assert asm.add(decode_histogram_chunk(b[1])) is None
    hist = asm.add(decode_histogram_chunk(a[1]))
    assert hist is not None and hist.manifest == SHA and np.array_equal(hist.values, v)


def test_the_json_view_equals_the_reconcile_agents_message() -> None:
    from agents.reconcile.messages import histogram_message
    from agents.reconcile.ticks import CompleteTick
    from stream_dp.consistency import reconcile
    from stream_dp.domain import Domain

    dom = Domain.from_paths([f"r{i}/l{j}" for i in range(3) for j in range(4)], name="web")
    rng = np.random.default_rng(3)
    noisy = rng.normal(10, 3, dom.size)
    stderr = np.full(dom.size, 1.5)
    result = reconcile(dom, noisy, stderr**2)
    tick = CompleteTick(tick=4, tick_end=240.0, noisy=noisy, stderr=stderr)
    want = histogram_message(dom.names, tick, result, "web")
    recs = encode_histogram(domain="web", tick=4, tick_end=240.0, values=result.values,
                            noisy=noisy, stderr=stderr, manifest=manifest_hash(dom.names),
                            consistent=want["consistent"], diagnostics=want["diagnostics"],
                            chunk_nodes=5)
    asm = HistogramAssembler()
    hists = [asm.add(decode_histogram_chunk(r)) for r in recs]
    hist = hists[-1]
    assert hist is not None
    assert hist.message(dom.names) == want
    validate("dp.histograms.v1", hist.message(dom.names))
    part = hist.message(dom.names, keep=[0, 2])
    assert [n["stream"] for n in part["nodes"]] == [dom.names[0], dom.names[2]]
    assert part["total_nodes"] == dom.size
    head = hist.head_message(dom.names[:3])
    assert head["nodes"] == want["nodes"][:3] and head["total_nodes"] == dom.size


def _corrupt(rec: bytes, header: dict | None = None, body: bytes | None = None) -> bytes:
    hlen = struct.unpack_from("<I", rec, 8)[0]
    start = 12 + hlen + (-(12 + hlen) % 8)
    h = json.loads(rec[12:12 + hlen]) if header is None else header
    raw = json.dumps(h, sort_keys=True, separators=(",", ":")).encode()
    pad = -(12 + len(raw)) % 8
    return (struct.pack("<4sHHI", b"DPHB", 1, 0, len(raw)) + raw + b"\0" * pad
            + (rec[start:] if body is None else body))


def test_corrupt_records_are_refused() -> None:
    v, x, s = _columns(4, 4)
    rec = encode_histogram(domain="d", tick=1, tick_end=1.0, values=v, noisy=x, stderr=s,
                           manifest=SHA, chunk_nodes=4)[0]
    h = decode_histogram_chunk(rec).header
    cases = {
        "bad magic": b"DPCB" + rec[4:],
        "version": rec[:4] + struct.pack("<H", 2) + rec[6:],
        "bytes": rec[:-8],
        "chunk 4 of 1": _corrupt(rec, {**h, "chunk": 1}),
        "exceeds": _corrupt(rec, {**h, "offset": 1}),
        "lacks": _corrupt(rec, {k: val for k, val in h.items() if k != "manifest"}),
        "non-finite": _corrupt(rec, body=np.array([np.nan] * 12).tobytes()),
        "not a dp.histograms.block.v1": _corrupt(rec, {**h, "schema": "dp.counts.block.v1"}),
        "tick must": _corrupt(rec, {**h, "tick": 0}),
    }
    for bad in cases.values():
        with pytest.raises(ValueError):
            decode_histogram_chunk(bad)
    with pytest.raises(ValueError, match="non-finite"):
        encode_histogram(domain="d", tick=1, tick_end=1.0, values=[np.inf], noisy=[0.0],
                         stderr=[1.0], manifest=SHA)
    with pytest.raises(ValueError, match="chunk_nodes"):
        encode_histogram(domain="d", tick=1, tick_end=1.0, values=[0.0], noisy=[0.0],
                         stderr=[1.0], manifest=SHA, chunk_nodes=0)


def test_the_node_manifest_is_a_manifest_record() -> None:
    validate("dp.manifest.v1", json.loads(encode_manifest("histogram", ["all", "a", "b"])))
