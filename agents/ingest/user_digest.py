"""The keyed digest of one partition's per-person table in its changelog (issue #34, review of
the user-level preview): what lets a restore tell the table the checkpoint sealed from any
other table a writer of ``ingest_users_topic`` can assemble out of genuine records.

**The hole.** The per-person table lives in a compacted changelog topic: one sealed record per
person changed per commit, written in the ingest transaction; a restore reads the partition
to its end and the *last* record per person wins. Every record is authentic (a MAC bound to
the deployment, the partition and the person), but the topic's writers are not trusted
(DESIGN.md §2.7): one can append a copy of an *older* genuine record of a person after the
newest (their count rolls back, so more than K of their events count), or a tombstone (the
tombstone is a null value, which nothing seals) together with an old record of a person a
closed period had freed, so that even the number of people stays the same.

**The check.** With every commit the checkpoint (sealed, same transaction) carries
``tag = BLAKE2b-256_k(D)`` of the table's multiset hash

    ``D = Σ_{persons p in the table} F_k(p, r_p)  mod 2^256``,
    ``F_k(p, r) = BLAKE2b-256(key = k, data = p ‖ r)``,

where ``r_p`` is the record last written for ``p`` (:func:`agents.ingest.users.record_bytes`
of their state, the changelog value before its seal; ``p`` is 16 bytes, so ``p ‖ r`` is
unambiguous) and ``k`` is derived from the noise key (purpose ``"user table digest"``). The
restore sums ``F_k`` over the table it read (the last record of every person, tombstones
removed), tags the sum and refuses unless the tag is the checkpoint's.

**Why a writer of the topic cannot pass it.** Whatever it appends, reorders or re-appends, the
table it leaves is a set ``S'`` of (person, genuine record) pairs, one per person. Passing
needs ``Σ_{S'} F_k = Σ_{S} F_k`` for the sealed table ``S``: ``F_k`` is a PRF under a key it
does not have, so for ``S' ≠ S`` that difference is a non-zero integer combination (coefficients
±1) of values it cannot compute, uniform on a set of 2^256 values, and holds with probability
2^-256 per attempt (each attempt a restore that stops the worker). It cannot learn the values
either: the checkpoints it reads hold only tags, and a tag of a sum says nothing of the sum's
terms. Were ``D`` itself in the checkpoint, a commit that changed one person would reveal
``F_k(p, new) - F_k(p, old)`` (a person's first record: ``F_k(p, r)`` itself), and from
enough such differences a generalized-birthday search (Wagner's k-tree algorithm, about 2^31
work from 2^19 persons' differences at 256 bits) finds a set of substitutions that sums to zero.

**Why a sum, not XOR.** XOR is addition mod 2: from 257 known differences (the case above)
Gaussian elimination finds a zero-sum set of substitutions outright, and a term entered twice
cancels, so a bug that notes a person twice goes unseen. Mod 2^256 a term entered twice counts
twice.

**Why not bind each record to its commit instead.** A restore that checks the records' commit
numbers (non-decreasing in offset order, the last one the checkpoint's) is passed by appending
the old record of a person followed by copies of every genuine record written since (without
that person's): after compaction the log is in commit order again and holds the true table
with that person rolled back. Any such binding has to say *which* record each person's is,
i.e. digest the whole table.

**Incremental.** A commit adds ``F_k(p, new) - F_k(p, old)`` for the persons it writes (a
tombstone: ``-F_k(p, old)``): O(people changed). The old record of a person is their state
noted just before their first change since the last commit (:meth:`TableDigest.changing`,
O(1), kept only for the persons changed since). A closed period changes most persons at once
without noting them (:meth:`agents.ingest.users.UserState.closed_before`): the next commit
sums the whole table, once per period, like the forgetting itself. A restore sums the table
it reads, which it reads whole anyway.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable
from typing import Any

from agents.ingest.digest import _UNKEYED, _blake2b

__all__ = ["DIGEST_PURPOSE", "TableDigest", "table_digest_key"]

#: the purpose under which the digest's key is derived from the noise key
DIGEST_PURPOSE = "user table digest"
#: the sum is modulo 2^256: terms and tag are BLAKE2b-256
_MOD = 1 << 256
#: BLAKE2b personalisations: the terms and the tag under one key never collide
_TERM, _TAG = b"stream-dp/uterm", b"stream-dp/utag"


def table_digest_key(secret: bytes | None) -> bytes:
    """The digest's 32-byte BLAKE2b key, derived from the noise ``secret``
    (:func:`stream_dp.integrity.derive_key`); a fixed public key for ``None`` (tests only)."""
    if secret is None:
        return _UNKEYED
    from stream_dp.integrity import derive_key

    return derive_key(secret, DIGEST_PURPOSE)


class TableDigest:
    """``D`` of the module docstring for one partition's table, kept as records are written.

    ``encode`` turns a person's state (what :meth:`changing` and the ``table`` of
    :meth:`written` give: ``(last tick, periods)``) into the record bytes the changelog gets.
    """

    def __init__(self, key: bytes, encode: Callable[[Any], bytes]) -> None:
        #: ``k`` (the compiled table computes the same terms under it: ``UserTable.changelog``)
        self.key = key
        self._term = _blake2b(digest_size=32, key=key, person=_TERM)
        self._tag = _blake2b(digest_size=32, key=key, person=_TAG)
        self._encode = encode
        #: ``D`` over the records written so far (or read at the restore)
        self.total = 0
        #: person -> their state as last written (``None``: no record), noted at their first
        #: change since the last write
        self._was: dict[bytes, Any] = {}
        #: persons changed without being noted: the next write sums the whole table
        self._whole = False

    def term(self, person: bytes, record: bytes) -> int:
        """``F_k(person, record)`` as an integer."""
        h = self._term.copy()
        h.update(person)
        h.update(record)
        return int.from_bytes(h.digest(), "little")

    def changing(self, person: bytes, state: Any) -> None:
        """``person`` is about to change for the first time since the last write; ``state``
        is theirs now, i.e. as last written (``None``: the table has no record of them)."""
        if person not in self._was:
            self._was[person] = state

    def changed_unnoted(self) -> None:
        """Persons changed without :meth:`changing` (a closed period's forgetting): the next
        :meth:`written` sums the whole table."""
        self._whole = True

    def written(self, changes: Iterable[tuple[bytes, bytes | None]],
                table: Callable[[], Iterable[tuple[bytes, Any]]]) -> None:
        """The records ``(person, record or None for a tombstone)`` written with this commit;
        ``table()`` gives every person of the table with their state now (only called for a
        whole sum)."""
        if not self._whole:
            total = self.total
            for person, record in changes:
                if person not in self._was:  # changed but not noted: fall back to the sum
                    self._whole = True
                    break
                was = self._was[person]
                if was is not None:
                    total -= self.term(person, self._encode(was))
                if record is not None:
                    total += self.term(person, record)
            else:
                self.total = total % _MOD
        if self._whole:
            self.load(table())
        self._was = {}
        self._whole = False

    def written_sum(self, delta: int, whole: Callable[[], int]) -> None:
        """A commit of the compiled table, which notes the persons it counts and sums their
        terms itself: ``delta`` is ``Σ F_k(p, new) − Σ F_k(p, old)`` over them; ``whole()``
        ``D`` of the whole table (called instead when persons changed unnoted)."""
        self.total = (whole() if self._whole or self._was else self.total + delta) % _MOD
        self._was = {}
        self._whole = False

    def load_sum(self, total: int) -> None:
        """``D`` of a whole table, summed by the compiled table (``UserTable.digest_sum``)."""
        self.total = total % _MOD
        self._was = {}
        self._whole = False

    def sum_of(self, table: Iterable[tuple[bytes, Any]]) -> int:
        """``D`` of a whole table: every ``(person, state)`` in it."""
        encode = self._encode
        return sum(self.term(person, encode(state)) for person, state in table) % _MOD

    def load(self, table: Iterable[tuple[bytes, Any]]) -> None:
        """``D`` of a whole table: every ``(person, state)`` in it (after a restore, or once
        per closed period)."""
        self.load_sum(self.sum_of(table))

    def tag(self) -> str:
        """What the checkpoint carries: ``BLAKE2b-256_k(D)`` in 64 hex digits (never ``D``:
        see the module docstring)."""
        h = self._tag.copy()
        h.update(self.total.to_bytes(32, "little"))
        return h.hexdigest()

    def matches(self, tag: str) -> bool:
        """Whether the table's tag is ``tag`` (a checkpoint's), in constant time."""
        return hmac.compare_digest(self.tag(), tag)
