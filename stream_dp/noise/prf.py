"""Keyed, cryptographically secure uniform bits: AES-256 as a pseudo-random function.

Construction
------------
* The AES-256 key is derived from the secret and a domain-separation ``tag`` with HKDF-SHA256
  (RFC 5869; salt ``b"stream-dp/noise/v1"``, info ``b"prf|" + tag``). Different tags (strategies,
  parameters, refinement channels) therefore use unrelated AES keys.
* Each 128-bit output block is ``AES_k(input block)`` with the input block (16 bytes)::

      bytes 0..7   stream id, 64-bit little-endian
      bytes 8..15  node * 2**16 + draw counter, 64-bit little-endian
                   (node < 2**48, draw counter < 2**16)

  AES with a fixed secret key is a pseudo-random permutation, and on distinct inputs it is
  indistinguishable from a random function (PRP/PRF switching: advantage ≤ q²/2¹²⁹ for q
  blocks). So the bits for ``(secret, tag, stream, node, draw)`` are deterministic, and distinct
  tuples give (computationally) independent uniform bits. ECB over these counter blocks is
  exactly "AES in counter mode with a structured counter"; no block is ever encrypted twice.
* Output: the 16 bytes of each block read as two little-endian uint64 words ``(w0, w1)``.

All blocks of one call are encrypted in a single ``update_into`` call on a reused encryptor and
reused buffers (the fastest path measured in ``benchmarks/noise.py``).
"""

from __future__ import annotations

import threading

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from numpy.typing import NDArray

from stream_dp.noise import _fast
from stream_dp.noise.keys import SecretKey

__all__ = ["MAX_DRAWS", "MAX_NODE", "BlockPRF", "derive_aes_key"]

#: Nodes are in ``[0, MAX_NODE)``.
MAX_NODE = 2**48
#: Draw counters are in ``[0, MAX_DRAWS)``.
MAX_DRAWS = 2**16

_SALT = b"stream-dp/noise/v1"


def derive_aes_key(secret: bytes | SecretKey, tag: str) -> bytes:
    """HKDF-SHA256(secret, salt=b"stream-dp/noise/v1", info=b"prf|" + tag) → 32 bytes."""
    raw = SecretKey(secret).reveal()
    if not isinstance(tag, str):
        raise ValueError(f"tag must be a str, got {type(tag).__name__}")
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=b"prf|" + tag.encode())
    return hkdf.derive(raw)


class BlockPRF:
    """128-bit pseudo-random blocks for ``(stream id, node, draw counter)`` under ``(secret, tag)``.

    Instances are not thread-safe (they reuse buffers); a lock guards concurrent use anyway.
    """

    __slots__ = ("_enc", "_in", "_lock", "_secret", "tag")

    def __init__(self, secret: bytes | SecretKey, tag: str) -> None:
        self._secret = SecretKey(secret)
        self.tag = tag
        key = derive_aes_key(self._secret, tag)
        self._enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
        self._in: NDArray[np.uint64] = np.empty((0, 2), dtype="<u8")
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"BlockPRF(tag={self.tag!r}, key=<hidden>)"

    def child(self, suffix: str) -> BlockPRF:
        """An independent PRF for the derived tag ``tag + "|" + suffix``."""
        return BlockPRF(self._secret, f"{self.tag}|{suffix}")

    def blocks(
        self,
        stream_ids: NDArray[np.uint64],
        node: int,
        counters: NDArray[np.uint64] | int,
        out: NDArray[np.uint64] | None = None,
    ) -> NDArray[np.uint64]:
        """One block per stream: array of shape ``(n, 2)`` of uint64 words ``(w0, w1)``.

        ``counters`` is one draw counter per stream (or one for all), each in ``[0, 2**16)``;
        ``node`` in ``[0, 2**48)``. The result is a fresh array (safe to keep), or ``out``'s
        first ``2n + 2`` words (a reused scratch buffer, uint64, contiguous: the caller's hot
        loop then allocates nothing per call).
        """
        if isinstance(node, bool) or not isinstance(node, (int, np.integer)):
            raise ValueError(f"node must be an integer in [0, 2**48), got {node!r}")
        if not 0 <= int(node) < MAX_NODE:
            raise ValueError(f"node must be an integer in [0, 2**48), got {node!r}")
        ids = np.asarray(stream_ids, dtype=np.uint64)
        n = ids.shape[0]
        ctr = np.asarray(counters, dtype=np.uint64)
        kernels = _fast.kernels
        fill = (kernels is not None and ctr.shape == ids.shape and ids.flags.c_contiguous
                and ctr.flags.c_contiguous)
        if not fill and ctr.size and int(ctr.max()) >= MAX_DRAWS:
            raise ValueError("counters must be in [0, 2**16)")
        with self._lock:
            if self._in.shape[0] < n:
                self._in = np.empty((n, 2), dtype="<u8")
            blk = self._in[:n]
            if fill:  # one compiled pass: the blocks and the largest counter
                if kernels.prf_input(ids, int(node) << 16, ctr, blk) >= MAX_DRAWS:
                    raise ValueError("counters must be in [0, 2**16)")
            else:
                blk[:, 0] = ids
                np.bitwise_or(np.uint64(int(node) << 16), ctr, out=blk[:, 1])
            if out is None or out.shape[0] < 2 * n + 2:
                out = np.empty(2 * n + 2, dtype="<u8")  # fresh: the caller keeps the result
            else:
                out = out[: 2 * n + 2]
            written = self._enc.update_into(blk.data.cast("B"), out.data.cast("B"))
            if written != 16 * n:  # pragma: no cover - ECB on whole blocks never buffers
                raise RuntimeError("AES-ECB returned a partial block")
            words: NDArray[np.uint64] = out[: 2 * n].reshape(n, 2).view(np.uint64)
            return words

    def block_int(self, stream_id: int, node: int, counter: int) -> int:
        """One block as a 128-bit Python int (``w0 + 2**64 * w1``), for the rare exact paths."""
        words = self.blocks(np.array([stream_id], dtype=np.uint64), node, np.array([counter]))
        return int(words[0, 0]) | (int(words[0, 1]) << 64)
