"""The person as unit of privacy under kill -9 (issue #34; the crash suite's pattern,
tests/integration/test_pipeline_crashes.py): a real broker, a worker subprocess killed with
SIGKILL and restarted again and again while it ingests a log of people keyed by their
identifier. Each person's table is restored with the ingest offsets, so:

* every (stream, tick) is released, each copy (aborted transactions included) bit-identical,
  committed readers see it once;
* the values equal the offline exact decayed counts of the **bounded** log (the library's
  rescanning oracle, ``keep_mask``, over the log in order; enormous ε): an event that a
  restart counted twice, or a budget that a restart forgot, would show.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from agents.config.domain import load_domain
from agents.ingest.users import user_bounds
from agents.kafka.codec import schema as load_schema
from agents.kafka.partitioner import key_partition as kafka_partition
from stream_dp.user_level import keep_mask
from tests.integration import pipeline_support as ps
from tests.integration.test_pipeline_crashes import bound_of

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.crash,
              pytest.mark.timeout(600)]

N_TICKS = 30


def _people_log(s: Any, leaves: list[str], n: int) -> list[tuple[str, str, float, float]]:
    """``(person, leaf, ts, value)`` in log order: heavy-tailed people (a few with hundreds
    of events, most with a handful), every leaf, across period boundaries."""
    rng = np.random.default_rng(17)
    people = [f"u{i}" for i in range(400)]
    weights = 1.0 / np.arange(1, len(people) + 1) ** 1.2
    who = rng.choice(len(people), n, p=weights / weights.sum())
    ts = np.sort(rng.uniform(s.origin, s.origin + N_TICKS * s.tick_seconds, n))
    keys = rng.integers(0, len(leaves), n)
    values = rng.choice([1.0, 0.5, 2.0], n, p=[0.8, 0.1, 0.1])
    return [(people[w], leaves[k], float(t), float(v))
            for w, k, t, v in zip(who, keys, ts, values, strict=True)]


def _message(person: str, leaf: str, ts: float, value: float) -> tuple[bytes, bytes]:
    return person.encode(), json.dumps({"key": leaf, "ts": ts, "value": value,
                                        "user": person}).encode()


def _user_settings(kafka_broker: str, tmp_path: Path, unique_name: str,
                   leaf_bounds: bool = True, **kw: Any) -> Any:
    """Leaf bounds (L, k): the pure ingest path over the dict table; without: the compiled
    scanner bounds persons in its compact table (agents.ingest.users.person_table)."""
    if leaf_bounds:
        kw.update(user_max_streams=3, user_max_events_per_stream=2)
    return ps.make_settings(kafka_broker, tmp_path, unique_name, ps.hierarchy_paths(2, 3, 4),
                            epsilon=1e4, tick_seconds=1.0, transaction_timeout_s=10.0,
                            privacy_unit="user", user_period_ticks=10, user_max_events=4, **kw)


async def _check_bounded_releases(s: Any, log: list[tuple[str, str, float, float]]) -> None:
    """Every (stream, tick) released once, every copy bit-identical, values equal to the
    exact decayed counts of the bounded log (the library's oracle over the log in order)."""
    domain = load_domain(s.domain_file)
    bounds = user_bounds(s)
    events = [(p, int((t - s.origin) // s.tick_seconds) + 1, leaf) for p, leaf, t, _ in log]
    kept = [(leaf, t, v) for (p, leaf, t, v), k in zip(log, keep_mask(events, bounds),
                                                       strict=True) if k]
    assert len(kept) < len(log) // 2  # the bounds bite: a lost table would count far more
    exact = ps.exact_decayed(domain, kept, s, N_TICKS)
    committed = await ps.released(s, committed=True)
    uncommitted = await ps.released(s, committed=False)
    bound = bound_of(s)
    # what every record says about the unit (pure DP, b = 0: a node's factor is exactly the
    # most events of one person it can receive; a leaf min(K, k) = 2, any node above min(K,
    # L·k) = 4, so 4 per stream; every layer takes all K = 4 of a period: K·h in total)
    from stream_dp.accounting import Accountant

    h = Accountant.for_domain(domain, s.privacy).nodes_touched
    eps = s.privacy.epsilon
    privacy = {"model": "pure", "epsilon": eps, "unit": "person", "period_ticks": 10,
               "per_person": {"stream": 4 * eps, "total": 4 * h * eps, "exact": True}}
    schema = load_schema("dp.counts.v1")
    for key, want in exact.items():
        assert key in committed, f"{key} never released"
        assert len(committed[key]) == 1, f"{key} released {len(committed[key])} times"
        copies = set(committed[key]) | set(uncommitted.get(key, []))
        assert len(copies) == 1, f"{key}: {len(copies)} different copies"
        msg = json.loads(committed[key][0])
        assert abs(msg["value"] - want) <= bound + 12 * msg["stderr"], (key, msg, want)
        assert msg["privacy"] == privacy, msg["privacy"]
        jsonschema.validate(msg, schema)


async def test_partitions_moving_between_workers_take_their_people_along(
        kafka_broker: str, unique_name: str, tmp_path: Path) -> None:
    """Rebalances: a second and a third worker join while the log arrives, one leaves, one
    is killed; each partition's new owner restores its people with its offsets."""
    s = _user_settings(kafka_broker, tmp_path, unique_name, events_partitions=6, shards=3)
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    log = _people_log(s, ps.hierarchy_paths(2, 3, 4), 12_000)
    parts = [log[i * len(log) // 5:(i + 1) * len(log) // 5] for i in range(5)]
    workers = {w: ps.WorkerProcess(s, w, tmp_path) for w in ("a", "b", "c")}
    try:
        await ps.produce(s, (_message(*e) for e in parts[0]))
        workers["a"].start()
        await asyncio.sleep(3.0)
        await ps.produce(s, (_message(*e) for e in parts[1]))
        workers["b"].start()
        await asyncio.sleep(3.0)
        await ps.produce(s, (_message(*e) for e in parts[2]))
        workers["c"].start()
        await asyncio.sleep(3.0)
        assert workers["a"].terminate() == 0  # graceful: its partitions move
        await ps.produce(s, (_message(*e) for e in parts[3]))
        await asyncio.sleep(3.0)
        workers["b"].kill9()
        await ps.produce(s, (_message(*e) for e in parts[4]))
        await asyncio.sleep(2.0)
        workers["b"].start()
        await ps.close_ticks(s, N_TICKS)
        await ps.wait_for_ticks(s, domain.size, N_TICKS, timeout_s=300,
                                workers=list(workers.values()))
    finally:
        for w in workers.values():
            w.stop()
    for w in workers.values():
        assert w.proc is not None and w.proc.returncode in (0, -9), w.log_path.read_text()[-2000:]
    await _check_bounded_releases(s, log)


#: the line a worker logs when its ingest stage has taken its events partitions
ASSIGNED = "ingest: assigned partitions"


@pytest.mark.parametrize("leaf_bounds", [True, False], ids=["pure-path", "compiled-path"])
async def test_kill9_and_restarts_with_per_person_state(kafka_broker: str, unique_name: str,
                                                        tmp_path: Path, leaf_bounds: bool
                                                        ) -> None:
    leaves = ps.hierarchy_paths(2, 3, 4)
    s = _user_settings(kafka_broker, tmp_path, unique_name, leaf_bounds=leaf_bounds)
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    log = _people_log(s, leaves, 12_000)
    # records keyed by the identifier (aiokafka's default partitioner: Kafka's), plus copies
    # of a heavy person's records put on another partition by hand: wrong_partition
    heavy = [e for e in log if e[0] == "u0"][:50]
    home = kafka_partition(b"u0", s.events_partitions)
    await ps.produce_raw(s, [(*_message(*e), (home + 1) % s.events_partitions, [])
                             for e in heavy])
    # records without a valid identifier (the full classification path): invalid_user
    invalid = [json.dumps({"key": heavy[0][1], "ts": heavy[0][2], **extra}).encode()
               for extra in ({}, {"user": 7}, {"user": ""}, {"user": None}, {"user": "x" * 300})]
    # a lone surrogate: the fast JSON parser refuses it, the full classification decides
    invalid.append(invalid[0].replace(b"}", b', "user": "\\ud800"}'))
    await ps.produce_raw(s, [(b"k", v, None, []) for v in invalid])

    # the log arrives in parts while the worker is killed again and again: each restart
    # restores tables whose people have spent some of their budgets already
    rng = random.Random(23)
    worker = ps.WorkerProcess(s, "w0", tmp_path)
    parts = 6
    try:
        for i in range(parts):
            await ps.produce(s, (_message(*e) for e in log[i * len(log) // parts:
                                                           (i + 1) * len(log) // parts]))
            assigned = worker.log_count(ASSIGNED)
            worker.start()
            # the kill lands while the worker counts, not while it starts: on a loaded machine
            # a start-up can take longer than the whole pause, and a worker killed before its
            # first commit leaves nothing to re-decide
            await worker.wait_log(ASSIGNED, count=assigned + 1, timeout_s=120)
            await asyncio.sleep(rng.uniform(2.5, 5.0))
            assert worker.alive(), worker.log_path.read_text()[-3000:]
            worker.kill9()
        await ps.close_ticks(s, N_TICKS)
        before = worker.starts()
        worker.start()
        await worker.wait_log("release: assigned", count=before + 1, timeout_s=120)
        await ps.wait_for_ticks(s, domain.size, N_TICKS, timeout_s=300, workers=[worker])
        assert worker.alive()
    finally:
        code = worker.terminate()
    text = worker.log_path.read_text()
    assert code == 0, text[-3000:]
    assert ("privacy_unit = user: every record takes the pure Python path" if leaf_bounds else
            "privacy_unit = user: the compiled scanner bounds persons in its own pass") in text
    # the table is written every user_flush_interval_s (30 s): every kill -9 above came
    # between writes, so the restores re-decided the events since the last one
    assert "re-decided the records since the per-person table was last written" in text
    for person in ("u0", "u1", "u17"):  # identifiers are never logged
        assert f'"{person}"' not in text and f"'{person}'" not in text

    await _check_bounded_releases(s, log)
    dead = await ps.read_topic(s.bootstrap, s.dlq_topic)
    reasons = [json.loads(r.value)["reason"] for r in dead]
    assert reasons.count("wrong_partition") == len(heavy), reasons[:20]
    assert reasons.count("invalid_user") == len(invalid), reasons[:20]
