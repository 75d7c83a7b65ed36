"""SipHash-2-4 with a 128-bit output (Aumasson & Bernstein, the reference implementation's
128-bit variant): the keyed hash of a person's identifier (:mod:`agents.ingest.users`).

:func:`siphash128` is the compiled one (``agents.ingest._fastingest``) when it is built, else
:func:`siphash128_py`, this module's own (the same bytes; tests check both against the
reference vectors).

>>> siphash128_py(bytes(range(16)), bytes(range(15))).hex()
'5493e99933b0a8117e08ec0f97cfc3d9'
"""

from __future__ import annotations

import struct as _struct

from agents.ingest.records import _fastingest

__all__ = ["siphash128", "siphash128_py"]

_M = (1 << 64) - 1


_KEY = _struct.Struct("<QQ")


def siphash128_py(key: bytes, data: bytes) -> bytes:
    """SipHash-2-4-128 of ``data`` under the 16-byte ``key``, in pure Python.

    The fallback of every person's hash when the compiled module is not built: the rounds
    work on local variables (1.2-1.35x faster than on a list), yet 64-bit arithmetic on
    Python ints keeps it at 13-60 µs for 30-256 bytes, ≈ 40x a keyed BLAKE2b from hashlib
    (docs/operations.md: run user level with the compiled module)."""
    if len(key) != 16:
        raise ValueError("siphash128: the key must be 16 bytes")
    k0, k1 = _KEY.unpack(key)
    v0 = 0x736F6D6570736575 ^ k0
    v1 = 0x646F72616E646F6D ^ k1 ^ 0xEE
    v2 = 0x6C7967656E657261 ^ k0
    v3 = 0x7465646279746573 ^ k1
    n = len(data)
    whole = n >> 3
    words = list(_struct.unpack_from(f"<{whole}Q", data)) if whole else []
    words.append(((n & 0xFF) << 56) | int.from_bytes(data[whole << 3:], "little"))
    m = _M
    out = []
    # one round loop for the whole message: a word (>= 0) takes 2 rounds between its two
    # xors; then the two finalisations (-1: v2 ^= 0xEE, -2: v1 ^= 0xDD) take 4 and each give
    # one half of the output
    for w, n_rounds in [(w, (0, 1)) for w in words] + [(-1, (0, 1, 2, 3)), (-2, (0, 1, 2, 3))]:
        if w >= 0:
            v3 ^= w
        elif w == -1:
            v2 ^= 0xEE
        else:
            v1 ^= 0xDD
        for _ in n_rounds:
            v0 = (v0 + v1) & m
            v1 = ((v1 << 13) | (v1 >> 51)) & m ^ v0
            v0 = ((v0 << 32) | (v0 >> 32)) & m
            v2 = (v2 + v3) & m
            v3 = ((v3 << 16) | (v3 >> 48)) & m ^ v2
            v0 = (v0 + v3) & m
            v3 = ((v3 << 21) | (v3 >> 43)) & m ^ v0
            v2 = (v2 + v1) & m
            v1 = ((v1 << 17) | (v1 >> 47)) & m ^ v2
            v2 = ((v2 << 32) | (v2 >> 32)) & m
        if w >= 0:
            v0 ^= w
        else:
            out.append(v0 ^ v1 ^ v2 ^ v3)
    return _KEY.pack(out[0], out[1])


siphash128 = _fastingest.siphash128 if _fastingest is not None else siphash128_py
