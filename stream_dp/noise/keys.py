"""The noise secret: loading it safely, hiding it from logs, and stable 64-bit stream ids.

The secret key decides every noise sample (DESIGN.md §2.4–2.6): whoever knows it can subtract the
noise. It is read from a file or an environment variable, never from the command line, and never
appears in a ``repr``, a log line or an exception message (not even a prefix of it).

Accepted encodings (file content or environment value):

* **hex**: the text, with surrounding ASCII whitespace removed, consists only of an even number
  of hexadecimal digits → the decoded bytes (``openssl rand -hex 32`` gives a 32-byte key);
* **raw**: anything else → the bytes themselves, minus one trailing newline (``\\n`` or ``\\r\\n``).

After decoding the key must have at least 32 bytes (256 bits). Keys loaded by :func:`load_key`
(the path every deployment uses) are also refused when they are *visibly* of low entropy: all
bytes equal, a short pattern repeated, a counting sequence, or fewer than
:data:`MIN_DISTINCT_BYTES` distinct byte values (32 random bytes have about 30). A key *file*
that its group or others may read or write is refused, as ``ssh`` refuses such a private key
(one line naming the file and ``chmod 600``; :func:`key_file_permission_problem`). Make a key
with::

    (umask 077; python -c 'import secrets; print(secrets.token_hex(32))' > noise.key)
    (umask 077; head -c 32 /dev/urandom | xxd -p -c 64 > noise.key)

No fingerprint, prefix or hash of the key is ever printed (a short one would help a brute-force
search); ``stream-dp replay`` keeps a 256-bit keyed check value in its state file only.

>>> sk = SecretKey(bytes(range(32)))
>>> sk
SecretKey(<hidden, 32 bytes>)
>>> stream_id("shop/berlin") == stream_id("shop/berlin")
True
>>> 0 <= stream_id("shop/berlin") < 2**64
True
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "DEFAULT_KEY_ENV",
    "HOW_TO_MAKE_A_KEY",
    "MIN_DISTINCT_BYTES",
    "MIN_KEY_BYTES",
    "SecretKey",
    "key_file_permission_problem",
    "key_weakness",
    "load_key",
    "stream_id",
    "stream_ids",
]

#: Environment variable read by :func:`load_key` when no path is given.
DEFAULT_KEY_ENV = "STREAM_DP_KEY"
#: Minimum key length in bytes after decoding.
MIN_KEY_BYTES = 32
#: A loaded key with fewer distinct byte values is refused as visibly low-entropy.
MIN_DISTINCT_BYTES = 12
#: How to make a good key (quoted in the errors).
HOW_TO_MAKE_A_KEY = (
    "make one with: python -c 'import secrets; print(secrets.token_hex(32))' "
    "(or: head -c 32 /dev/urandom | xxd -p -c 64)"
)

_HEX = re.compile(rb"\A(?:[0-9a-fA-F]{2})+\Z")
_WHITESPACE = b" \t\r\n\v\f"


class SecretKey:
    """A noise secret whose ``repr``/``str`` never reveal it; ``bytes(sk)`` gives the key.

    Equality compares in constant time. Not picklable on purpose (a checkpoint must never carry
    the key: ``CounterBank.to_bytes`` stores state only).
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes | bytearray | memoryview | SecretKey) -> None:
        if isinstance(key, SecretKey):
            raw = key.reveal()
        elif isinstance(key, (bytes, bytearray, memoryview)):
            raw = bytes(key)
        else:
            raise ValueError(
                f"key must be bytes (>= {MIN_KEY_BYTES}) or a SecretKey, got {type(key).__name__}"
            )
        if len(raw) < MIN_KEY_BYTES:
            raise ValueError(
                f"key must be at least {MIN_KEY_BYTES} bytes after decoding, got {len(raw)} bytes"
            )
        self._key = raw

    def reveal(self) -> bytes:
        """The key bytes (for key derivation only; never log them)."""
        return self._key

    def __bytes__(self) -> bytes:
        return self._key

    def __len__(self) -> int:
        return len(self._key)

    def __repr__(self) -> str:
        return f"SecretKey(<hidden, {len(self._key)} bytes>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SecretKey):
            return NotImplemented
        return hmac.compare_digest(self._key, other._key)

    def __hash__(self) -> int:
        return hash(hashlib.blake2b(self._key, digest_size=8, person=b"sdp-keyhash").digest())

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("SecretKey cannot be pickled (the noise key is never serialised)")

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)


def _decode(content: bytes, source: str) -> bytes:
    stripped = content.strip(_WHITESPACE)
    if _HEX.match(stripped):
        key = bytes.fromhex(stripped.decode("ascii"))
    else:
        key = content
        if key.endswith(b"\r\n"):
            key = key[:-2]
        elif key.endswith(b"\n"):
            key = key[:-1]
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"key from {source} must be at least {MIN_KEY_BYTES} bytes after decoding "
            f"(hex or raw), got {len(key)} bytes; {HOW_TO_MAKE_A_KEY}"
        )
    weakness = key_weakness(key)
    if weakness is not None:
        raise ValueError(
            f"key from {source} is of visibly low entropy ({weakness}); use {MIN_KEY_BYTES} "
            f"random bytes: {HOW_TO_MAKE_A_KEY}"
        )
    return key


def key_weakness(key: bytes) -> str | None:
    """Why ``key`` is visibly of low entropy, or ``None``. Never describes the key's content.

    >>> key_weakness(b"k" * 32)
    'all bytes are equal'
    >>> key_weakness(bytes.fromhex("5f3c" * 16))
    'it repeats a 2-byte pattern'
    >>> key_weakness(bytes(range(32)))
    'it is a counting sequence'
    >>> key_weakness(bytes.fromhex("9f" * 16 + "01" * 16))
    'only 2 distinct byte values'
    >>> key_weakness(hashlib.sha256(b"x").digest()) is None
    True
    """
    n = len(key)
    if n == 0 or key.count(key[0]) == n:
        return "all bytes are equal"
    for period in range(1, n // 2 + 1):
        if key[period:] == key[:-period]:
            return f"it repeats a {period}-byte pattern"
    step = (key[1] - key[0]) % 256
    if all((key[i + 1] - key[i]) % 256 == step for i in range(n - 1)):
        return "it is a counting sequence"
    distinct = len(set(key))
    if distinct < MIN_DISTINCT_BYTES:
        return f"only {distinct} distinct byte values"
    return None


def key_file_permission_problem(st: os.stat_result, euid: int | None = None) -> str | None:
    """Why a key file with status ``st`` is too open for the process of effective uid ``euid``
    (default: this one), or ``None``: the rule of ``ssh`` for private keys, with PostgreSQL's
    exception for ``ssl_key_file``.

    Any access by others is refused, and any access by the group, except read access to a file
    owned by root when this process is not root: that is how a secret reaches a service account
    through its group (a Kubernetes secret volume with ``fsGroup`` is ``root:<fsGroup>``, mode
    ``0440``, read by a non-root container).

    >>> import stat
    >>> def st(mode, uid): return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, uid, 0, 64, 0, 0, 0))
    >>> key_file_permission_problem(st(0o600, 1000), euid=1000)
    >>> key_file_permission_problem(st(0o644, 1000), euid=1000)
    'readable or writable by group or others (mode 0644)'
    >>> key_file_permission_problem(st(0o440, 0), euid=10001)
    >>> key_file_permission_problem(st(0o440, 0), euid=0)
    'readable or writable by group or others (mode 0440)'
    """
    if euid is None:
        euid = os.geteuid() if hasattr(os, "geteuid") else -1
    mode = st.st_mode & 0o777
    too_open = 0o037 if st.st_uid == 0 and euid != 0 else 0o077
    if mode & too_open:
        return f"readable or writable by group or others (mode {mode:04o})"
    return None


def load_key(path: str | os.PathLike[str] | None = None, env: str = DEFAULT_KEY_ENV) -> bytes:
    """Read the noise secret from ``path`` (a file) or, if ``path`` is None, from ``$env``.

    Returns the decoded key bytes (≥ 32). Raises ``ValueError`` if the file or variable is
    missing, unreadable, too short or visibly of low entropy (:func:`key_weakness`), or if the
    file can be read or written by its group or by others
    (:func:`key_file_permission_problem`: ``chmod 600`` it); messages name the source and say
    how to make a key, never show the content.
    """
    if path is not None:
        p = Path(path)
        try:
            with open(p, "rb") as fh:
                problem = key_file_permission_problem(os.fstat(fh.fileno()))
                if problem is not None:
                    raise ValueError(
                        f"key file {str(p)!r} is {problem}: anyone who can read it can remove "
                        f"the noise; run: chmod 600 {str(p)!r}"
                    )
                content = fh.read()
        except OSError as exc:
            raise ValueError(
                f"key file {str(p)!r} cannot be read ({type(exc).__name__}); "
                f"path must name a readable file holding a key of >= {MIN_KEY_BYTES} bytes"
            ) from None
        return _decode(content, f"file {str(p)!r}")
    value = os.environ.get(env)
    if value is None or value == "":
        raise ValueError(
            f"no noise key: environment variable {env} is not set (or pass a key file path); "
            f"it must hold >= {MIN_KEY_BYTES} random bytes; {HOW_TO_MAKE_A_KEY}"
        )
    return _decode(os.fsencode(value), f"environment variable {env}")


def stream_id(name: str) -> int:
    """Stable 64-bit id of a stream name: BLAKE2b-64 of its UTF-8 bytes (personalised).

    The id, not the position in a bank, keys the noise, so a stream's noise does not depend on
    partitioning or on which other streams share its bank.
    """
    if not isinstance(name, str):
        raise ValueError(f"name must be a str, got {type(name).__name__}")
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8, person=b"stream-dp/sid").digest()
    return int.from_bytes(digest, "little")


def stream_ids(names: Iterable[str]) -> NDArray[np.uint64]:
    """:func:`stream_id` of every name as a uint64 array; ``ValueError`` on duplicate ids.

    Two distinct names colliding on 64 bits (probability about n²/2⁶⁵) would share their noise,
    so it is refused rather than silently accepted.
    """
    ids = [stream_id(n) for n in names]
    arr = np.array(ids, dtype=np.uint64)
    if len(set(ids)) != len(ids):
        raise ValueError("names must be distinct and their 64-bit stream ids must not collide")
    return arr
