"""Kafka's default partitioner for keyed records: which partition a key lands on.

Every Kafka client's default partitioner (the Java client's ``BuiltInPartitioner`` and
``DefaultPartitioner`` before it, librdkafka's ``murmur2_random``, kafka-python, aiokafka) puts a
record with a non-null key on partition ``(murmur2(key) & 0x7fffffff) % partitions``, where
``murmur2`` is Kafka's variant of MurmurHash2 (seed ``0x9747b28c``, little-endian 4-byte blocks)
of the key's bytes. User-level privacy (docs/design/user-level.md §2) relies on it: producers key
each record by the person's identifier (its UTF-8 bytes), so all of one person's records sit on
one events partition, and the worker can recompute that partition from the record alone.

Pure Python on purpose (no Kafka client import): the ingest path, the simulators' checks and
the tests can use it without a client, and it does not depend on which client (or which
version of it) produced the record.
"""

from __future__ import annotations

__all__ = ["key_partition", "murmur2", "person_key"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2(data)`` as an unsigned 32-bit integer (0 … 2³² − 1).

    Java returns the same 32 bits as a signed ``int``; ``murmur2(b) & 0x7fffffff`` is Java's
    ``Utils.toPositive(Utils.murmur2(b))`` either way.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length % 4
    # the Java switch falls through: 3 bytes left mix in byte 2, then byte 1, then byte 0
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def key_partition(key: bytes, partitions: int) -> int:
    """The partition (0 … ``partitions`` − 1) Kafka's default partitioner gives a record whose
    key is ``key`` on a topic of ``partitions`` partitions."""
    if partitions < 1:
        raise ValueError(f"partitions must be ≥ 1, got {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def person_key(identifier: str) -> bytes:
    """The record key of a person's events: the identifier's UTF-8 bytes, exactly (no
    normalisation: two spellings that look alike are two people)."""
    return identifier.encode("utf-8")
