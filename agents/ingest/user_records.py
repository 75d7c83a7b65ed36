"""The per-person changelog's records (``ingest_users_topic``; issue #34): a person's state in a
few bytes, and the MAC that binds it to the deployment, the partition and the person.

A record is written for every person changed since the last commit, in the ingest transaction,
so its cost is paid once per person per commit: with every person new (the benchmark's 10^6
people), about once per event. Its first form — the state as JSON, sealed with HMAC-SHA256 and
the checkpoint's whole context embedded (557 bytes a record) — was most of a user-level
worker's CPU. This form is what the compiled table writes in its own pass
(``UserTable.changelog``, ``agents/ingest/csrc/usertable.c``), byte for byte as
:func:`encode_state` and :class:`ChangelogMac` do here (the authoritative side; the agreement
tests compare them):

**The value** (before its tag), all integers unsigned LEB128 varints in their shortest form::

    0x02  last_tick  n_periods  { period  count  n_leaves  { leaf  n }* }*

where ``leaf`` is ``0, zigzag(i)`` for an integer leaf ``i`` and ``1 + len, zigzag(x)...`` for a
tuple of integers (a grid's leaf, a tuple of nodes). Per-leaf entries exist only under a leaf
bound (the dict table's); the compact table's persons have none. A person is 10 to 20 bytes.

**The tag** (appended; 32 bytes): ``BLAKE2b-256(key = derive_key(noise key, "user changelog
v2"), data = BLAKE2b-256(context) ‖ person ‖ value)``, where ``context`` is the ingest
checkpoint's (:meth:`agents.ingest.state.IngestState.context`: deployment, partition, bounds)
and ``person`` the 16-byte keyed hash that is also the record's key. The context is bound but
not carried (the restore knows its own), so a record is about 60 bytes, key included. A writer
of the topic without the noise key can neither forge a record nor move one to another person,
partition or deployment; what it *can* do with genuine records — re-append an older one — the
table's digest catches (:mod:`agents.ingest.user_digest`).

Without a noise key (pure states of tests only) the value goes untagged.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

__all__ = ["CHANGELOG_MAC_PURPOSE", "ChangelogMac", "decode_state", "encode_state"]

#: the purpose under which the changelog's MAC key is derived from the noise key
CHANGELOG_MAC_PURPOSE = "user changelog v2"
#: the value's first byte: this encoding (the JSON form of checkpoint version 8 had none)
_FORMAT = 2
#: the tag's length, bytes
TAG_BYTES = 32

State = tuple[int, list[tuple[int, int, dict[Any, int]]]]


def _varint(out: bytearray, n: int) -> None:
    if n < 0:
        raise ValueError("a negative count or tick")
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(n: int) -> int:
    return 2 * n if n >= 0 else -2 * n - 1


def encode_state(state: State) -> bytes:
    """A person's changelog value (before its tag) for their state ``(last tick, periods)``
    (:meth:`stream_dp.user_level.Bounder.person`), as the module docstring defines it.

    >>> encode_state((70, [(0, 3, {})])).hex()
    '024601000300'
    >>> decode_state(encode_state((200, [(1, 2, {(0, 4): 1, 7: 2})])))
    (200, [(1, 2, {(0, 4): 1, 7: 2})])
    """
    last_tick, periods = state
    out = bytearray((_FORMAT,))
    _varint(out, last_tick)
    _varint(out, len(periods))
    for period, count, per_leaf in periods:
        _varint(out, period)
        _varint(out, count)
        _varint(out, len(per_leaf))
        for leaf, n in per_leaf.items():
            if type(leaf) is tuple:
                _varint(out, 1 + len(leaf))
                for x in leaf:
                    _varint(out, _zigzag(x))
            else:
                _varint(out, 0)
                _varint(out, _zigzag(leaf))
            _varint(out, n)
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.i = data, 0

    def varint(self) -> int:
        n = shift = 0
        data, i = self.data, self.i
        while True:
            if i >= len(data):
                raise ValueError("a changelog value ends inside a number")
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                if b == 0 and shift:
                    raise ValueError("a changelog value has a number not in its shortest form")
                self.i = i
                return n
            shift += 7

    def signed(self) -> int:
        z = self.varint()
        return z >> 1 if not z & 1 else -(z >> 1) - 1


def decode_state(value: bytes) -> State:
    """The state :func:`encode_state` wrote (``ValueError`` for anything else)."""
    if not value or value[0] != _FORMAT:
        raise ValueError("not a changelog value of this version (an earlier preview's JSON "
                         "form?)")
    r = _Reader(value)
    r.i = 1
    last_tick = r.varint()
    periods = []
    for _ in range(r.varint()):
        period, count = r.varint(), r.varint()
        per_leaf: dict[Any, int] = {}
        for _ in range(r.varint()):
            kind = r.varint()
            leaf: Any = r.signed() if kind == 0 else tuple(r.signed() for _ in range(kind - 1))
            if leaf in per_leaf:
                raise ValueError("a changelog value names one leaf twice")
            per_leaf[leaf] = r.varint()
        periods.append((period, count, per_leaf))
    if r.i != len(value):
        raise ValueError("a changelog value has bytes past its end")
    return last_tick, periods


class ChangelogMac:
    """The tag of one partition's changelog records under one checkpoint context.

    ``secret``: the noise key (``None``: untagged values, tests only); ``context``: the ingest
    checkpoint's context bytes.
    """

    def __init__(self, secret: bytes | None, context: bytes) -> None:
        self.key: bytes | None = None
        if secret is not None:
            from stream_dp.integrity import derive_key

            self.key = derive_key(secret, CHANGELOG_MAC_PURPOSE)
        #: BLAKE2b-256 of the context: what each tag binds
        self.context_hash = hashlib.blake2b(context, digest_size=32).digest()
        self._mac = (None if self.key is None else
                     hashlib.blake2b(digest_size=TAG_BYTES, key=self.key))

    def tag(self, person: bytes, value: bytes) -> bytes:
        """The tag of ``value`` for ``person`` (32 bytes; ``person``: 16)."""
        assert self._mac is not None
        h = self._mac.copy()
        h.update(self.context_hash)
        h.update(person)
        h.update(value)
        return h.digest()

    def seal(self, person: bytes, value: bytes) -> bytes:
        """``value`` with its tag (as is without a key)."""
        return value if self._mac is None else value + self.tag(person, value)

    def open(self, person: bytes, sealed: bytes) -> bytes:
        """The value of a record :meth:`seal` wrote for ``person``;
        :class:`stream_dp.integrity.IntegrityError` when its tag does not verify (forged,
        moved from another person, partition or deployment, or of an earlier version)."""
        if self._mac is None:
            return sealed
        from stream_dp.integrity import IntegrityError

        if type(person) is not bytes or len(person) != 16 or len(sealed) <= TAG_BYTES or not hmac.compare_digest(
                self.tag(person, sealed[:-TAG_BYTES]), sealed[-TAG_BYTES:]):
            raise IntegrityError(
                "a per-person changelog record does not verify under this deployment's noise "
                "key, partition and person (forged, moved, or written by an earlier version)")
        return sealed[:-TAG_BYTES]
