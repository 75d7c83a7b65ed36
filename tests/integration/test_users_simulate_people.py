"""`stream-dp simulate --people` into a real broker: every person's records on the one partition
Kafka's default partitioner names for the person's key, the same events as the log, and
per-person counts from the documented heavy-tailed law (issue 34)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from agents.kafka.partitioner import key_partition
from tests.integration._users import create_topic, read_all, stream_dp

pytestmark = pytest.mark.integration

PARTITIONS = 4
PEOPLE = 2000


def test_simulate_people_keys_every_person_onto_one_partition(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    create_topic(kafka_broker, unique_name, partitions=PARTITIONS)
    args = ("simulate", "searchlogs", "--seed", "34", "--ticks", "300", "--rate", "50",
            "--people", str(PEOPLE), "--user-field", "visitor")
    stream_dp(*args, "--out", str(tmp_path / "log.jsonl"), check=True)
    proc = stream_dp(*args, "--to-topic", "--bootstrap", kafka_broker, "--topic", unique_name,
                     check=True, timeout=300)
    messages = read_all(kafka_broker, unique_name)
    logged = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert len(messages) == len(logged) > 20_000
    assert f"{len(logged)} events produced to {unique_name}" in proc.stderr

    # the same events as the log, each with its person
    def event(v: dict[str, object]) -> tuple[object, ...]:
        return (v["key"], v["ts"], v["value"], v["visitor"])

    assert Counter(event(m.json()) for m in messages) == Counter(event(v) for v in logged)

    # each record keyed by its person's UTF-8 bytes, on the partition murmur2 names for them
    partitions: dict[str, set[int]] = defaultdict(set)
    for m in messages:
        person = m.json()["visitor"]
        assert m.key == person.encode("utf-8")
        assert m.partition == key_partition(m.key, PARTITIONS), (person, m.partition)
        partitions[person].add(m.partition)
    assert all(len(p) == 1 for p in partitions.values())
    assert {p for ps in partitions.values() for p in ps} == set(range(PARTITIONS))

    # heavy-tailed as documented: ranks against scipy's Zipfian pmf (s = 1), χ² over bins of
    # at least 20 expected events, loose bound at this fixed seed; a few people thousands of
    # events, most people a few
    counts = np.zeros(PEOPLE, dtype=np.int64)
    for person, n in Counter(m.json()["visitor"] for m in messages).items():
        counts[int(person[1:]) - 1] = n
    probs = stats.zipfian(1.0, PEOPLE).pmf(np.arange(1, PEOPLE + 1))
    total = int(counts.sum())
    edges, acc = [0], 0.0
    for r, p in enumerate(probs, start=1):
        acc += p * total
        if acc >= 20:
            edges.append(r)
            acc = 0.0
    edges[-1] = PEOPLE
    observed = np.add.reduceat(counts, edges[:-1])
    expected = np.add.reduceat(probs, edges[:-1]) * total
    assert stats.chisquare(observed, expected).pvalue > 1e-6
    active = counts[counts > 0]
    assert active.max() >= 2000 and np.median(active) <= 5
    assert np.sum(counts >= 1000) <= 3
