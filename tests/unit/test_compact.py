"""Compact columnar tick records (stream_dp/compact.py, docs/formats.md; issue #14 groundwork).

The decoder printed in the spec (docs/formats.md, ``struct``/``json``/``array`` only; no numpy,
no library code), executed as written, must read every bit the encoder wrote; the headers validate against the published
JSON Schemas; the per-stream view equals the ``dp.counts.v1`` messages the service writes today;
every kind of corruption is refused with a clear error.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from agents.kafka.codec import count_message, validate
from stream_dp.compact import (
    Block,
    decode_block,
    decode_manifest,
    encode_block,
    encode_manifest,
    manifest_hash,
)

PRIVACY = {"model": "pure", "epsilon": 1.0}


def _block(values: np.ndarray, stderr: np.ndarray, manifest: str, tick: int = 7) -> bytes:
    return encode_block(shard="s0", tick=tick, tick_start=1.7e9, tick_end=1.7e9 + 60, epoch=2,
                        strategy="tree-ls", p=0.999, privacy=PRIVACY, cap=2.0, horizon=4095,
                        manifest=manifest, values=values, stderr=stderr)


def _spec_decoder(data: bytes) -> tuple[dict, list[float], list[float]]:
    """``read_record`` from docs/formats.md ("Reading a record without numpy"), executed as
    written there: the spec's own decoder."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text("utf-8")
    section = doc.split("## Reading a record without numpy", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/formats.md", "exec"), namespace)
    return namespace["read_record"](data)  # type: ignore[operator,no-any-return]


@pytest.mark.parametrize("n", [0, 1, 3, 10_000])
def test_a_subscriber_written_from_the_spec_decodes_exactly(n: int) -> None:
    rng = np.random.default_rng(n)
    names = [f"stream-{i}/ünïcode" for i in range(n)]
    values = rng.normal(0, 1e6, n)
    values[: min(n, 2)] = [-0.0, 5e-324][: min(n, 2)]  # signed zero and a subnormal
    stderr = rng.uniform(0, 10, n)
    man = encode_manifest("s0", names)
    rec = _block(values, stderr, decode_manifest(man).sha256)
    header, vals, errs = _spec_decoder(rec)
    assert np.array_equal(np.array(vals).view(np.int64), values.view(np.int64))  # bit for bit
    assert np.array_equal(np.array(errs), stderr)
    # the manifest hash a subscriber computes from the spec
    spec_hash = hashlib.sha256(json.dumps(names, separators=(",", ":"), ensure_ascii=False)
                               .encode("utf-8")).hexdigest()
    assert header["manifest"] == spec_hash == manifest_hash(names)
    assert len(rec) == 12 + len(rec[12:12 + struct.unpack_from("<I", rec, 8)[0]]) + (
        -(12 + struct.unpack_from("<I", rec, 8)[0]) % 8) + 16 * n
    block = decode_block(rec)
    assert np.array_equal(block.values.view(np.int64), values.view(np.int64))
    assert not block.values.flags.writeable


def test_headers_and_manifests_match_the_published_schemas() -> None:
    names = ["a", "b", "c"]
    man = encode_manifest("s0", names)
    validate("dp.manifest.v1", json.loads(man))
    rec = _block(np.arange(3.0), np.ones(3), decode_manifest(man).sha256)
    validate("dp.counts.block.v1", decode_block(rec).header)


def test_the_per_stream_view_equals_todays_json_messages() -> None:
    names = ["x", "y", "z"]
    manifest = decode_manifest(encode_manifest("s0", names))
    values, stderr = np.array([1.25, -3.5, 7.0]), np.array([0.5, 0.5, 0.5])
    block = decode_block(_block(values, stderr, manifest.sha256))
    expected = [count_message(stream=s, tick=7, tick_start=1.7e9, tick_end=1.7e9 + 60,
                              value=float(v), stderr=float(e), strategy="tree-ls", p=0.999,
                              privacy=PRIVACY, cap=2.0, horizon=4095)
                for s, v, e in zip(names, values, stderr, strict=True)]
    got = list(block.records(manifest))
    assert got == expected
    for msg in got:
        validate("dp.counts.v1", msg)
    assert [r["stream"] for r in block.records(manifest, ["z", "x"])] == ["z", "x"]
    with pytest.raises(ValueError, match="not in shard"):
        list(block.records(manifest, ["nope"]))


def test_a_record_is_refused_with_another_manifest() -> None:
    rec = _block(np.zeros(2), np.zeros(2), manifest_hash(["a", "b"]))
    other = decode_manifest(encode_manifest("s0", ["b", "a"]))  # same names, other order
    with pytest.raises(ValueError, match="manifest"):
        list(decode_block(rec).records(other))


def _corrupt(rec: bytes, offset: int, data: bytes) -> bytes:
    return rec[:offset] + data + rec[offset + len(data):]


def test_corrupted_records_are_refused() -> None:
    rec = _block(np.arange(4.0), np.ones(4), manifest_hash(list("abcd")))
    hlen = struct.unpack_from("<I", rec, 8)[0]
    cases = {
        "bad magic": _corrupt(rec, 0, b"XXXX"),
        "unsupported format version": _corrupt(rec, 4, struct.pack("<H", 2)),
        "shorter than": rec[:5],
        "truncated inside its header": rec[:12 + hlen - 1],
        "bytes;": rec[:-8],
        "expected for n": rec + b"\0" * 8,
        "non-finite": rec[:-8] + struct.pack("<d", float("nan")),
        "not UTF-8 JSON": _corrupt(rec, 12, b"\xff"),
    }
    for message, bad in cases.items():
        with pytest.raises(ValueError, match=message):
            decode_block(bad)
    with pytest.raises(ValueError, match="sha256 does not match"):
        obj = json.loads(encode_manifest("s0", ["a"]))
        obj["streams"] = ["b"]
        decode_manifest(json.dumps(obj).encode())
    with pytest.raises(ValueError, match="distinct"):
        encode_manifest("s0", ["a", "a"])
    with pytest.raises(ValueError, match="stderr"):
        _block(np.zeros(3), np.zeros(2), manifest_hash(["a", "b", "c"]))


def test_a_million_streams_take_sixteen_bytes_each() -> None:
    """The size the issue budgets for (267 MB of JSON per tick before): 16 B per stream plus a
    header of a few hundred bytes."""
    n = 1_000_000
    rec = _block(np.zeros(n), np.zeros(n), "0" * 64)
    assert 16 * n < len(rec) < 16 * n + 1024
    block: Block = decode_block(rec)
    assert block.values.shape == (n,) and block.tick == 7
