"""A domain of ``m`` named binary attributes (1 ≤ m ≤ 64) and the events over it.

An event is a bit string (character ``i`` = attribute ``i``, ``"0"``/``"1"``) or the list of the
names of the attributes that are 1. Events are held as a ``(n, m)`` ``uint8`` matrix of 0/1.

Domain file (TOML; the ``[domain]`` table if present, else the top level), read by
:meth:`BinaryDomain.from_file`::

    [domain]
    name = "basket"                   # optional
    kind = "binary"
    attributes = ["milk", "bread", "eggs"]   # 1..64 distinct names; index = position

One event touches exactly one cell of every marginal table over the domain, whatever the table:
that is what the accounting of :mod:`stream_dp.attributes.release` composes over.

>>> d = BinaryDomain(["milk", "bread", "eggs"])
>>> d.encode(["eggs", "milk"]).tolist()
[1, 0, 1]
>>> d.encode("011").tolist()
[0, 1, 1]
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp import _toml

__all__ = ["MAX_ATTRIBUTES", "BinaryDomain", "Bits", "parse_bits"]

#: Largest number of attributes a domain may declare.
MAX_ATTRIBUTES = 64

Bits = NDArray[np.uint8]


def parse_bits(text: str, m: int) -> Bits:
    """The 0/1 vector of a bit string of exactly ``m`` characters ``0``/``1`` (else ``ValueError``)."""
    if not isinstance(text, str):
        raise ValueError(f"attrs must be a string of {m} characters 0/1, got {type(text).__name__}")
    if len(text) != m:
        raise ValueError(f"attrs must have exactly {m} characters 0/1, got {len(text)}")
    if text.strip("01"):
        bad = next(c for c in text if c not in "01")
        raise ValueError(f"attrs must contain only the characters 0 and 1, got {bad!r}")
    return np.frombuffer(text.encode("ascii"), dtype=np.uint8) - np.uint8(48)


class BinaryDomain:
    """``m`` distinct named binary attributes, in declaration order (index = position)."""

    #: the service tells domains apart by ``kind`` (:mod:`stream_dp.domain` has the others)
    kind = "binary"

    def __init__(self, names: Sequence[str], name: str = "attributes") -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("the domain name must be a non-empty string")
        self.name = name
        if isinstance(names, str):
            raise ValueError("names must be a sequence of attribute names, not one string")
        names_t = tuple(names)
        if not 1 <= len(names_t) <= MAX_ATTRIBUTES:
            raise ValueError(
                f"a binary domain has 1..{MAX_ATTRIBUTES} attributes, got {len(names_t)}"
            )
        if any(not isinstance(n, str) or not n for n in names_t):
            raise ValueError("attribute names must be non-empty strings")
        if len(set(names_t)) != len(names_t):
            raise ValueError("attribute names must be distinct")
        self.names = names_t
        self._index = {n: i for i, n in enumerate(names_t)}

    @classmethod
    def from_toml(cls, doc: Mapping[str, Any]) -> BinaryDomain:
        """The domain of a parsed domain file (``kind = "binary"``, ``attributes = [...]``)."""
        table = doc.get("domain", doc)
        if not isinstance(table, Mapping) or table.get("kind") != "binary":
            raise ValueError('a binary-attribute domain file needs kind = "binary"')
        names = table.get("attributes")
        if not isinstance(names, list):
            raise ValueError("a binary-attribute domain needs attributes = [names, ...]")
        return cls(names, table.get("name", "attributes"))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> BinaryDomain:
        """Read a domain file (module doc); ``ValueError`` naming the file on any problem."""
        try:
            with open(path, "rb") as fh:
                doc = _toml.load(fh)
        except OSError as exc:
            raise ValueError(f"cannot read domain file {str(path)!r}: {exc.strerror}") from None
        except _toml.TOMLDecodeError as exc:
            raise ValueError(f"domain file {str(path)!r} is not valid TOML: {exc}") from None
        try:
            return cls.from_toml(doc)
        except ValueError as exc:
            raise ValueError(f"domain file {str(path)!r}: {exc}") from None

    @classmethod
    def numbered(cls, m: int) -> BinaryDomain:
        """Attributes named ``a0 … a{m-1}``."""
        if isinstance(m, bool) or not isinstance(m, int):
            raise ValueError(f"m must be an integer in [1, {MAX_ATTRIBUTES}], got {m!r}")
        return cls([f"a{i}" for i in range(m)])

    def digest(self) -> str:
        """SHA-256 (hex) of the name and the attribute names in order (binds noise and
        checkpoints of a service to the declared attributes)."""
        import hashlib
        import json

        text = json.dumps({"kind": "binary", "name": self.name, "attributes": self.names},
                          separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def pattern(self, event: str | Sequence[str]) -> int:
        """An event as one integer: bit ``i`` set when attribute ``i`` is 1 (``ValueError`` for
        a malformed event, like :meth:`encode`).

        >>> BinaryDomain(["milk", "bread", "eggs"]).pattern("101")
        5
        >>> BinaryDomain([f"a{i}" for i in range(64)]).pattern("1" * 64) == 2**64 - 1
        True
        """
        bits = self.encode(event)
        # Python ints: ``1 << np.int64(63)`` wraps to -2**63, so an event with attribute 63
        # set (m = 64) became a negative pattern that the release stage refused (issue 37)
        return sum(1 << int(i) for i in np.flatnonzero(bits))

    @property
    def m(self) -> int:
        """Number of attributes."""
        return len(self.names)

    def index(self, name: str) -> int:
        """Position of attribute ``name`` (``ValueError`` if undeclared)."""
        try:
            return self._index[name]
        except KeyError:
            raise ValueError(f"undeclared attribute {name!r}") from None

    def encode(self, event: str | Sequence[str]) -> Bits:
        """0/1 vector of one event: a bit string of length m, or the names of its 1-attributes."""
        if isinstance(event, str):
            return parse_bits(event, self.m)
        out = np.zeros(self.m, dtype=np.uint8)
        for name in event:
            out[self.index(name)] = 1
        return out

    def encode_many(self, events: Sequence[str | Sequence[str]]) -> Bits:
        """``(n, m)`` 0/1 matrix of several events."""
        if not events:
            return np.zeros((0, self.m), dtype=np.uint8)
        return np.stack([self.encode(e) for e in events])

    def check_query(self, attrs: Sequence[int], max_alpha: int = 8) -> tuple[int, ...]:
        """A query as a tuple of distinct attribute indices, 1 ≤ α ≤ ``max_alpha``."""
        if isinstance(attrs, (str, bytes)) or not isinstance(attrs, Sequence):
            raise ValueError("a query must be a list of attribute indices")
        q = tuple(attrs)
        if not 1 <= len(q) <= max_alpha:
            raise ValueError(f"a query must have 1..{max_alpha} attributes, got {len(q)}")
        for a in q:
            if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
                raise ValueError(f"attribute indices must be integers, got {a!r}")
            if not 0 <= int(a) < self.m:
                raise ValueError(f"attribute index {a} out of range [0, {self.m - 1}]")
        if len(set(q)) != len(q):
            raise ValueError(f"a query must not repeat an attribute, got {list(q)}")
        return tuple(int(a) for a in q)
