"""SipHash-2-4 with a 128-bit output (Aumasson & Bernstein, the reference implementation's
128-bit variant): the keyed hash of a person's identifier (:mod:`agents.ingest.users`).

:func:`siphash128` is the compiled one (``agents.ingest._fastingest``) when it is built, else
:func:`siphash128_py`, this module's own (the same bytes; tests check both against the
reference vectors).

>>> siphash128_py(bytes(range(16)), bytes(range(15))).hex()
'5493e99933b0a8117e08ec0f97cfc3d9'
"""

from __future__ import annotations

from agents.ingest.records import _fastingest

__all__ = ["siphash128", "siphash128_py"]

_M = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M


def siphash128_py(key: bytes, data: bytes) -> bytes:
    """SipHash-2-4-128 of ``data`` under the 16-byte ``key``, in pure Python."""
    if len(key) != 16:
        raise ValueError("siphash128: the key must be 16 bytes")
    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:], "little")
    v = [0x736F6D6570736575 ^ k0, 0x646F72616E646F6D ^ k1 ^ 0xEE,
         0x6C7967656E657261 ^ k0, 0x7465646279746573 ^ k1]

    def rounds(n: int) -> None:
        v0, v1, v2, v3 = v
        for _ in range(n):
            v0 = (v0 + v1) & _M
            v1 = _rotl(v1, 13) ^ v0
            v0 = _rotl(v0, 32)
            v2 = (v2 + v3) & _M
            v3 = _rotl(v3, 16) ^ v2
            v0 = (v0 + v3) & _M
            v3 = _rotl(v3, 21) ^ v0
            v2 = (v2 + v1) & _M
            v1 = _rotl(v1, 17) ^ v2
            v2 = _rotl(v2, 32)
        v[:] = [v0, v1, v2, v3]

    n = len(data)
    whole = n - n % 8
    for i in range(0, whole, 8):
        m = int.from_bytes(data[i:i + 8], "little")
        v[3] ^= m
        rounds(2)
        v[0] ^= m
    b = ((n & 0xFF) << 56) | int.from_bytes(data[whole:], "little")
    v[3] ^= b
    rounds(2)
    v[0] ^= b
    v[2] ^= 0xEE
    rounds(4)
    lo = v[0] ^ v[1] ^ v[2] ^ v[3]
    v[1] ^= 0xDD
    rounds(4)
    hi = v[0] ^ v[1] ^ v[2] ^ v[3]
    return lo.to_bytes(8, "little") + hi.to_bytes(8, "little")


siphash128 = _fastingest.siphash128 if _fastingest is not None else siphash128_py
