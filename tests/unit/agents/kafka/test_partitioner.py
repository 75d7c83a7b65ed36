"""Kafka's default partitioner: murmur2 against Kafka's published values, and against the
partitioner of the client the service produces with (an independent implementation)."""

from __future__ import annotations

import random

import pytest

from agents.kafka.partitioner import key_partition, murmur2, person_key

#: ``Utils.murmur2`` of these UTF-8 strings, as Kafka's own ``UtilsTest.testMurmur2`` asserts
#: them (Java signed ints; the same table is repeated by other clients' test suites)
KAFKA_UTILS_TEST = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}

#: the partition out of 1000 that the Java client's partitioner gives these keys (the values
#: kafka-python's ``test_murmur2_java_compatibility`` was written against): every tail length
PARTITION_OF_1000 = {
    b"": 681,
    b"a": 524,
    b"ab": 434,
    b"abc": 107,
    b"123456789": 566,
    b"\x00 ": 742,
}


@pytest.mark.parametrize(("text", "java"), sorted(KAFKA_UTILS_TEST.items()))
def test_murmur2_matches_kafkas_utils_test(text: str, java: int) -> None:
    assert murmur2(text.encode()) == java & 0xFFFFFFFF
    # toPositive: what the partitioner takes the remainder of
    assert murmur2(text.encode()) & 0x7FFFFFFF == java & 0x7FFFFFFF


@pytest.mark.parametrize(("key", "partition"), sorted(PARTITION_OF_1000.items()))
def test_key_partition_matches_the_java_partitioner(key: bytes, partition: int) -> None:
    assert key_partition(key, 1000) == partition


def test_agrees_with_the_producers_default_partitioner_on_random_keys() -> None:
    """aiokafka's ``DefaultPartitioner`` (what ``stream-dp simulate`` and the demo produce with)
    places every key where :func:`key_partition` says: lengths 0–300, any bytes, 1–64
    partitions."""
    from aiokafka.partitioner import DefaultPartitioner

    rng = random.Random(34)
    client = DefaultPartitioner()
    for _ in range(3000):
        key = rng.randbytes(rng.randrange(0, 301))
        n = rng.randrange(1, 65)
        assert key_partition(key, n) == client(key, list(range(n)), list(range(n)))
        assert murmur2(key) < 2**32


def test_person_key_is_the_exact_utf8_bytes_and_partitions_must_be_positive() -> None:
    assert person_key("u1") == b"u1"
    # no normalisation: a precomposed and a decomposed é are two people
    assert person_key("\u00e9") == b"\xc3\xa9" != person_key("e\u0301")
    assert key_partition(b"x", 1) == 0
    with pytest.raises(ValueError, match="partitions must be"):
        key_partition(b"x", 0)
