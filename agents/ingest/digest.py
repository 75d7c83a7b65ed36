"""The keyed schedule digest of ingested records (sums of per-record keyed BLAKE2b-128 values
modulo 2^128) and the keys it and the persisted closing points use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

#: digests are sums of per-record BLAKE2b-128 values modulo 2^128 (incremental, order-bound
#: through the offset inside every record's hash)
_DIGEST_MOD = 1 << 128


_blake2b = hashlib.blake2b
#: the purpose under which the schedule digest's key is derived from the noise key
DIGEST_PURPOSE = "schedule digest"
#: the digest key of pure states built without a noise key (unit tests only; a worker always
#: has the noise key, and a digest under a public key could be matched by a forger)
_UNKEYED = b"stream-dp/unkeyed-digest-tests-only"[:32]


def digest_key(secret: bytes | None) -> bytes:
    """The schedule digest's 32-byte BLAKE2b key, derived from the noise ``secret``
    (:func:`stream_dp.integrity.derive_key`); a fixed public key for ``None`` (tests)."""
    if secret is None:
        return _UNKEYED
    from stream_dp.integrity import derive_key

    return derive_key(secret, DIGEST_PURPOSE)


def entry_key(secret: bytes | None) -> bytes:
    """The MAC key of persisted closing points (schedule topic), derived from the noise key."""
    if secret is None:
        return _UNKEYED
    from stream_dp.integrity import derive_key

    return derive_key(secret, "schedule entry")


def _header_bytes(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    parts = []
    for k, v in headers:
        kb = k.encode("utf-8", "surrogatepass") if isinstance(k, str) else bytes(k)
        parts.append(b"%d|%b" % (len(kb), kb))
        parts.append(b"-|" if v is None else b"%d|%b" % (len(v), v))
    return b"".join(parts)


def record_digest(dkey: Any, offset: int, timestamp: int, timestamp_type: int,
                  key: bytes | None, value: bytes | None,
                  headers: Sequence[tuple[str, bytes | None]] = ()) -> int:
    """The digest contribution of one record: keyed BLAKE2b-128 (key ``dkey``,
    :func:`digest_key`, or a keyed ``hashlib.blake2b`` object of it, which saves hashing the
    key block per record) of everything that can change the record's fate, as an integer.

    The hashed bytes are ``b"<offset>|<timestamp>|<type>|"``, then the key and the value each as
    ``b"-|"`` (absent) or ``b"<len>|"`` and the bytes, then ``b"<number of headers>|"`` and each
    header's name and value the same way. Every field is length-prefixed, so no two records
    give the same bytes. Without the key nobody can compute a record's contribution, so the sum
    of contributions (the range digest) cannot be matched by a search over forged records
    (a generalized-birthday attack needs the values)."""
    if key is not None and value is not None and not headers:  # the common case: one format
        data = b"%d|%d|%d|%d|%b%d|%b0|" % (offset, timestamp, timestamp_type, len(key), key,
                                             len(value), value)
    else:
        kpart = b"-|" if key is None else b"%d|%b" % (len(key), key)
        vpart = b"-|" if value is None else b"%d|%b" % (len(value), value)
        data = b"%d|%d|%d|%b%b%d|%b" % (offset, timestamp, timestamp_type, kpart, vpart,
                                         len(headers), _header_bytes(headers) if headers else b"")
    if type(dkey) is bytes:
        h = _blake2b(data, digest_size=16, key=dkey)
    else:
        h = dkey.copy()
        h.update(data)
    return int.from_bytes(h.digest(), "little")
