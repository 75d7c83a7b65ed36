"""The AES-256 PRF: key derivation and block layout against independent oracles, uniformity."""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy import stats

from stream_dp.noise.prf import MAX_DRAWS, MAX_NODE, BlockPRF, derive_aes_key

SECRET = bytes(range(32))


def _hkdf_sha256(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    """RFC 5869 with the standard library only (32-byte output = T(1))."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


def _aes_block(key: bytes, stream: int, node: int, counter: int) -> tuple[int, int]:
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    block = stream.to_bytes(8, "little") + ((node << 16) | counter).to_bytes(8, "little")
    out = enc.update(block) + enc.finalize()
    return int.from_bytes(out[:8], "little"), int.from_bytes(out[8:], "little")


def test_key_derivation_is_rfc5869_hkdf() -> None:
    expected = _hkdf_sha256(SECRET, b"stream-dp/noise/v1", b"prf|naive/p=0.5")
    assert derive_aes_key(SECRET, "naive/p=0.5") == expected
    assert derive_aes_key(SECRET, "a") != derive_aes_key(SECRET, "b")


def test_blocks_match_documented_layout() -> None:
    prf = BlockPRF(SECRET, "layout")
    key = _hkdf_sha256(SECRET, b"stream-dp/noise/v1", b"prf|layout")
    ids = np.array([0, 1, 2**64 - 1, 12345678901234567890], dtype=np.uint64)
    ctr = np.array([0, 7, MAX_DRAWS - 1, 3], dtype=np.uint64)
    node = MAX_NODE - 2
    words = prf.blocks(ids, node, ctr)
    for i in range(ids.size):
        assert (int(words[i, 0]), int(words[i, 1])) == _aes_block(
            key, int(ids[i]), node, int(ctr[i])
        )
    w0, w1 = _aes_block(key, 5, 9, 2)
    assert prf.block_int(5, 9, 2) == w0 | (w1 << 64)


def test_results_are_not_overwritten_by_later_calls() -> None:
    prf = BlockPRF(SECRET, "buffers")
    ids = np.arange(100, dtype=np.uint64)
    first = prf.blocks(ids, 1, 0)
    keep = first.copy()
    prf.blocks(ids[:10], 2, 0)
    prf.blocks(np.arange(1000, dtype=np.uint64), 3, 0)
    assert np.array_equal(first, keep)
    assert np.array_equal(prf.blocks(ids, 1, 0), keep)
    assert np.array_equal(prf.blocks(ids[40:50], 1, 0), keep[40:50])  # batch-independent


def test_bits_are_uniform_and_distinct() -> None:
    prf = BlockPRF(SECRET, "uniformity")
    n = 1 << 16
    words = prf.blocks(np.arange(n, dtype=np.uint64), 0, 0)
    # byte histogram
    counts = np.bincount(words.view(np.uint8).ravel(), minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-4
    # every bit position is fair (two-sided binomial z-test, Bonferroni over 128 positions)
    bits = np.unpackbits(words.view(np.uint8), axis=1)
    ones = bits.sum(axis=0)
    z = (ones - n / 2) / np.sqrt(n / 4)
    assert np.max(np.abs(z)) < 5.0
    # no repeated blocks across streams, nodes, counters
    more = np.concatenate(
        [
            words,
            prf.blocks(np.arange(n, dtype=np.uint64), 1, 0),
            prf.blocks(np.arange(n, dtype=np.uint64), 0, 1),
        ]
    )
    assert np.unique(more, axis=0).shape[0] == 3 * n


def test_keys_tags_and_children_differ() -> None:
    ids = np.arange(64, dtype=np.uint64)
    a = BlockPRF(SECRET, "t").blocks(ids, 0, 0)
    assert not np.array_equal(a, BlockPRF(SECRET[::-1], "t").blocks(ids, 0, 0))
    assert not np.array_equal(a, BlockPRF(SECRET, "u").blocks(ids, 0, 0))
    child = BlockPRF(SECRET, "t").child("refine/1/0")
    assert child.tag == "t|refine/1/0"
    assert not np.array_equal(a, child.blocks(ids, 0, 0))


@pytest.mark.parametrize("node", [-1, MAX_NODE, 1.0, True])
def test_rejects_bad_node(node: object) -> None:
    with pytest.raises(ValueError, match="node must be an integer"):
        BlockPRF(SECRET, "t").blocks(np.arange(2, dtype=np.uint64), node, 0)  # type: ignore[arg-type]


def test_rejects_counter_overflow_and_short_secret() -> None:
    with pytest.raises(ValueError, match="counters"):
        BlockPRF(SECRET, "t").blocks(np.arange(2, dtype=np.uint64), 0, MAX_DRAWS)
    with pytest.raises(ValueError, match="at least 32 bytes"):
        BlockPRF(b"short", "t")
