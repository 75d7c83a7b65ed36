"""Authenticated state: seal a payload with a MAC bound to a purpose and a configuration.

A checkpoint restored from a topic or a file must be exactly what this deployment wrote, under
*this* configuration (DESIGN.md §2.5): whoever can write the checkpoint topic must not be able to
forge counter state, and a worker restarted with another ε, strategy, weights, domain, epoch or
key must refuse the old state instead of quietly continuing with it.

:func:`seal` returns ``MAGIC | len(context) | context | len(payload) | payload | tag`` where
``tag = HMAC-SHA256(K, everything before it)`` and
``K = HKDF-SHA256(secret, salt=b"stream-dp/integrity/v1", info=b"mac|" + purpose)``. So

* the key never leaves the process and is never stored (only a MAC under a derived key);
* a blob sealed for one ``purpose`` (e.g. a release checkpoint) does not verify as another
  (e.g. a counter bank) — separate keys per purpose;
* ``context`` (the canonical description of the mechanism/configuration that wrote the state)
  is covered by the MAC *and* stored in clear, so :func:`unseal` can say *why* it refuses:

  - ``reason == "malformed"``: not a sealed blob (bad magic, truncated, trailing bytes);
  - ``reason == "tampered"``: the MAC does not verify — a changed byte, or a blob written
    under another noise key or for another purpose (indistinguishable by design);
  - ``reason == "configuration"``: authentic, but written under another configuration; the
    message names the differing fields when the contexts are JSON objects
    (``"strategy: 'dmfda' (checkpoint) vs 'tree' (now)"``).

Only the MAC is checked first: a forged blob can never make :func:`unseal` report a misleading
"configuration" difference, because the stored context is only read after it is authenticated.

>>> blob = seal(b"k" * 32, "demo", b'{"eps":1}', b"state")
>>> unseal(b"k" * 32, "demo", b'{"eps":1}', blob)
b'state'
>>> unseal(b"k" * 32, "demo", b'{"eps":2}', blob)
Traceback (most recent call last):
...
stream_dp.integrity.IntegrityError: demo was written under another configuration: eps: 1 (stored) vs 2 (expected)
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import struct
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["IntegrityError", "derive_key", "seal", "unseal"]

_MAGIC = b"SDPSEAL1"
_SALT = b"stream-dp/integrity/v1"
_TAG_BYTES = 32
_LEN = struct.Struct(">Q")
_MIN_SECRET = 16


class IntegrityError(ValueError):
    """A sealed blob was refused; ``reason`` is ``"malformed"``, ``"tampered"`` or
    ``"configuration"`` (see the module docstring)."""

    def __init__(self, message: str, reason: str = "tampered") -> None:
        super().__init__(message)
        self.reason = reason


def _mac_key(secret: bytes, purpose: str) -> bytes:
    if isinstance(secret, (bytearray, memoryview)):
        secret = bytes(secret)
    if not isinstance(secret, bytes) or len(secret) < _MIN_SECRET:
        raise ValueError(f"secret must be bytes of length ≥ {_MIN_SECRET} (the noise key)")
    if not isinstance(purpose, str) or not purpose:
        raise ValueError("purpose must be a non-empty string")
    return _derived(secret, purpose)


@functools.lru_cache(maxsize=64)
def _derived(secret: bytes, purpose: str) -> bytes:
    """The HKDF derivation itself, remembered: a user-level worker seals one changelog record
    per person changed (10^5 and more per commit, 10^7 at a restore), and deriving the same
    key each time was a large part of that work. The secret is in this process anyway."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=b"mac|" + purpose.encode())
    return hkdf.derive(secret)


def derive_key(secret: bytes, purpose: str) -> bytes:
    """A 32-byte key for ``purpose`` derived from the noise secret (HKDF-SHA256, the same
    derivation as the MAC keys of :func:`seal`). Different purposes give unrelated keys, and
    nothing about ``secret`` can be learnt from one of them. Used for the keyed schedule
    digest and the close markers' MACs (docs/privacy.md, "Threat model").

    >>> len(derive_key(b"k" * 32, "close marker"))
    32
    >>> derive_key(b"k" * 32, "a") == derive_key(b"k" * 32, "b")
    False
    """
    return _mac_key(secret, purpose)


def _as_bytes(name: str, value: object) -> bytes:
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if not isinstance(value, bytes):
        raise ValueError(f"{name} must be bytes, got {type(value).__name__}")
    return value


def seal(secret: bytes, purpose: str, context: bytes, payload: bytes) -> bytes:
    """``payload`` with ``context`` and an HMAC-SHA256 tag under a key derived from ``secret``
    and ``purpose``. ``secret``: ≥ 16 bytes (never stored). Returns the sealed blob."""
    key = _mac_key(secret, purpose)
    ctx = _as_bytes("context", context)
    body = _as_bytes("payload", payload)
    head = _MAGIC + _LEN.pack(len(ctx)) + ctx + _LEN.pack(len(body)) + body
    return head + hmac.new(key, head, hashlib.sha256).digest()


def _leaf(obj: Any) -> Any:
    """A canonical value shown plainly: exact floats as floats, arrays by shape and hash."""
    if isinstance(obj, dict) and set(obj) == {"f"} and isinstance(obj["f"], str):
        try:
            return float.fromhex(obj["f"])
        except ValueError:
            return obj
    if isinstance(obj, dict) and {"array", "shape", "sha256"} <= set(obj):
        return f"array{tuple(obj['shape'])} sha256:{str(obj['sha256'])[:12]}"
    return None


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    leaf = _leaf(obj)
    if leaf is not None:
        return {prefix: leaf}
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


#: Fields named first when two configurations differ (the ones an operator changes).
_FIRST = ("strategy", "privacy", "model", "epsilon", "rho", "p", "horizon", "cap", "domain",
          "epoch", "shard", "shards")


def _rank(path: str) -> tuple[int, str]:
    parts = path.split(".")
    for i, name in enumerate(_FIRST):
        if name in parts:
            return i, path
    return len(_FIRST), path


def _describe_difference(stored: bytes, expected: bytes) -> str:
    """Human-readable list of the fields in which two JSON contexts differ (best effort)."""
    try:
        a = _flatten(json.loads(stored))
        b = _flatten(json.loads(expected))
    except (ValueError, UnicodeDecodeError):
        return "the stored configuration description differs from the expected one"
    diffs = []
    for k in sorted(set(a) | set(b), key=_rank):
        if a.get(k, "<absent>") != b.get(k, "<absent>"):
            diffs.append(f"{k}: {_short(a.get(k, '<absent>'))} (stored) vs "
                         f"{_short(b.get(k, '<absent>'))} (expected)")
    if not diffs:
        return "the stored configuration description differs from the expected one"
    more = f"; and {len(diffs) - 4} more" if len(diffs) > 4 else ""
    return "; ".join(diffs[:4]) + more


def _short(v: object) -> str:
    if isinstance(v, str):
        text = v if v == "<absent>" else repr(v)
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        text = repr(v)
    else:
        text = json.dumps(v, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def unseal(secret: bytes, purpose: str, context: bytes, blob: bytes) -> bytes:
    """The payload of ``blob`` if it was sealed with ``secret``, ``purpose`` and ``context``.

    Raises :class:`IntegrityError` (a ``ValueError``) otherwise; the MAC is checked before the
    stored context is looked at, and compared in constant time.
    """
    key = _mac_key(secret, purpose)
    ctx_expected = _as_bytes("context", context)
    raw = _as_bytes("blob", blob)
    what = purpose
    minimum = len(_MAGIC) + 2 * _LEN.size + _TAG_BYTES
    if len(raw) < minimum or not raw.startswith(_MAGIC):
        raise IntegrityError(f"{what}: not a sealed blob (bad magic or too short)", "malformed")
    pos = len(_MAGIC)
    (n_ctx,) = _LEN.unpack_from(raw, pos)
    pos += _LEN.size
    if n_ctx > len(raw) - minimum:
        raise IntegrityError(f"{what}: sealed blob truncated (context)", "malformed")
    ctx = raw[pos : pos + n_ctx]
    pos += n_ctx
    (n_body,) = _LEN.unpack_from(raw, pos)
    pos += _LEN.size
    if pos + n_body + _TAG_BYTES != len(raw):
        raise IntegrityError(f"{what}: sealed blob truncated or with trailing bytes", "malformed")
    body = raw[pos : pos + n_body]
    tag = raw[pos + n_body :]
    want = hmac.new(key, raw[: pos + n_body], hashlib.sha256).digest()
    if not hmac.compare_digest(tag, want):
        raise IntegrityError(
            f"{what} failed authentication: it was changed after it was written, or written "
            "under another noise key; refusing it",
            "tampered",
        )
    if not hmac.compare_digest(ctx, ctx_expected):
        raise IntegrityError(
            f"{what} was written under another configuration: "
            f"{_describe_difference(ctx, ctx_expected)}",
            "configuration",
        )
    return body
