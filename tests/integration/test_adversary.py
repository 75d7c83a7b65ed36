"""The threat model's broker-level attacks, through a real broker (docs/privacy.md, "Threat model").

* An attacker's **open transaction** on the events topic must not push honest on-time events
  past a tick's closing point (they used to be dead-lettered ``tick_closed``).
* A **forged timestamp type**: a worker configured for LogAppendTime refuses a CreateTime
  events topic at start-up (one line, before anything is read).
* A **forged close marker** (no valid MAC) is dead-lettered; it neither closes a tick early nor
  turns honest events into ``tick_closed``.
* **Two deployments, one key** on the same events, differing only in allowed lateness: their
  noise is unrelated, so the difference of their releases is not the count of the late events.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from agents.config.domain import load_domain
from agents.config.settings import Settings
from agents.kafka.codec import close_marker, marker_key
from agents.kafka.topics import TopicConfigMismatch
from agents.worker.pipeline import Worker
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LEAVES = ["a/x", "a/y"]


_send = ps.produce_raw


def _ev(key: str, ts: float) -> bytes:
    return json.dumps({"key": key, "ts": ts, "value": 1.0}).encode()


def _values(got: dict[tuple[str, int], list[bytes]]) -> dict[tuple[str, int], float]:
    return {k: json.loads(v[0])["value"] for k, v in got.items()}


async def _dead(s: Settings) -> list[str]:
    return sorted(json.loads(r.value)["reason"]
                  for r in await ps.read_topic(s.bootstrap, s.dlq_topic))


async def test_an_open_transaction_does_not_move_honest_events_past_the_close(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    from aiokafka import AIOKafkaProducer

    s = ps.live_settings(kafka_broker, tmp_path, unique_name, LEAVES, epsilon=1e4, p=0.5,
                         events_partitions=1, shards=1, origin=float(int(time.time())) + 3.0)
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    attacker = AIOKafkaProducer(bootstrap_servers=kafka_broker,
                                transactional_id=f"{unique_name}-attacker",
                                transaction_timeout_ms=60_000)
    await attacker.start()
    stop = asyncio.Event()
    worker = Worker(s)
    task = asyncio.create_task(worker.run(stop))
    try:
        while time.time() < s.origin + 0.1:
            await asyncio.sleep(0.02)
        # the attacker opens a transaction in tick 1 and leaves it open past the deadline
        await attacker.begin_transaction()
        await attacker.send_and_wait(s.events_topic, _ev("a/x", time.time()), partition=0)
        # honest on-time events of tick 1, after the attacker's first record
        await _send(s, [(b"h", _ev("a/y", time.time()), 0, []) for _ in range(5)])
        # tick 1 closes (deadline + grace) while the transaction is open; then it aborts
        while time.time() < s.origin + s.tick_seconds + s.allowed_lateness_s + 1.5:
            await asyncio.sleep(0.05)
        await attacker.abort_transaction()
        got = await ps.wait_for_ticks(s, domain.size, 3, timeout_s=60, poll_s=0.5)
    finally:
        stop.set()
        await task
        await attacker.stop()
    v = _values(got)
    assert v[("a/y", 1)] == pytest.approx(5.0, abs=0.01)  # every honest event counted
    assert v[("a/x", 1)] == pytest.approx(0.0, abs=0.01)  # the aborted one never
    assert "tick_closed" not in await _dead(s)


async def test_a_create_time_topic_is_refused_by_a_log_append_time_worker(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    s = ps.live_settings(kafka_broker, tmp_path, unique_name, LEAVES, events_partitions=1,
                         shards=1)
    await ps.create_topics(s.replace(events_timestamp_type="CreateTime"))
    worker = Worker(s)
    with pytest.raises(TopicConfigMismatch, match=r"message\.timestamp\.type=CreateTime"):
        await asyncio.wait_for(worker.run(asyncio.Event()), timeout=60)
    # the matching setting starts (and is judged by producers' timestamps, own events only)
    ok = Worker(s.replace(events_timestamp_type="CreateTime"))
    stop = asyncio.Event()
    task = asyncio.create_task(ok.run(stop))
    for _ in range(200):
        if ok.ready or task.done():
            break
        await asyncio.sleep(0.1)
    stop.set()
    await task
    assert ok.fatal is None


async def test_a_forged_marker_is_dead_lettered_and_closes_nothing(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, LEAVES, epsilon=1e4, p=0.5,
                         events_partitions=1, shards=1, tick_seconds=1.0)
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    o = s.origin
    forged = [
        close_marker(o + 0.5, True, mac_key=marker_key(bytes(range(32))),
                     topic=s.events_topic, partition=0),  # another key
        ([("stream-dp-close", b"1")],
         json.dumps({"schema": "dp.close.v1", "time": o + 0.5, "final": True}).encode()),
        close_marker(o + 1e15, True, mac_key=marker_key(bytes.fromhex(ps.KEY_HEX)),
                     topic=s.events_topic, partition=0),  # authentic, 10^15 s ahead
    ]
    items: list[tuple[bytes | None, bytes, int, list[Any]]] = [
        (b"k", _ev("a/x", o + 0.1), 0, [])]
    items += [(None, raw, 0, headers) for headers, raw in forged]
    items += [(b"k", _ev("a/x", o + 0.2), 0, []), (b"k", _ev("a/y", o + 1.5), 0, [])]
    await _send(s, items)
    await ps.close_ticks(s, 3)
    got, _ = await ps.run_worker_until(s, domain.size, 3)
    v = _values(got)
    assert v[("a/x", 1)] == pytest.approx(2.0, abs=0.01)  # the event after the forgeries too
    assert v[("a/y", 2)] == pytest.approx(1.0, abs=0.01)
    assert await _dead(s) == ["forged_marker", "forged_marker", "marker_ahead"]


async def test_two_deployments_with_one_key_never_share_noise(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """Issue #23 item 3: one key, the same events, one deployment with more allowed lateness.
    With shared noise the difference of their releases was the exact count of the late events;
    now every release differs, also at ticks where both counted the same events."""
    a = ps.make_settings(kafka_broker, tmp_path, f"{unique_name}-a", LEAVES, epsilon=1.0, p=0.5,
                         events_partitions=1, shards=1, tick_seconds=1.0)
    b = a.replace(app_id=f"{unique_name}-b", counts_topic=f"{unique_name}-b.counts",
                  dlq_topic=f"{unique_name}-b.dlq", partials_topic=f"{unique_name}-b.partials",
                  ingest_checkpoints_topic=f"{unique_name}-b.ckpt.ingest",
                  release_checkpoints_topic=f"{unique_name}-b.ckpt.release",
                  schedule_topic=f"{unique_name}-b.schedule",
                  leader_topic=f"{unique_name}-b.leader", allowed_lateness_s=0.9)
    for s in (a, b):
        await ps.create_topics(s)
    domain = load_domain(a.domain_file)
    o = a.origin
    await ps.produce(a, (ps.event_bytes("a/x", o + 0.01 * i, 1.0) for i in range(300)))
    await ps.close_ticks(a, 4)
    got_a, _ = await ps.run_worker_until(a, domain.size, 4)
    got_b, _ = await ps.run_worker_until(b, domain.size, 4)
    va, vb = _values(got_a), _values(got_b)
    assert set(va) == set(vb) and len(va) == domain.size * 4
    assert all(va[k] != vb[k] for k in va)


async def test_the_same_configuration_on_another_cluster_draws_fresh_noise(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """Review F2: one configuration and key on two clusters (here: every topic deleted and
    created anew) with different events gave identical noise, so the difference of their
    releases was the exact count difference. The deployment nonce on the schedule topic tells
    the incarnations apart; two workers of one incarnation adopt the same nonce."""
    from aiokafka.admin import AIOKafkaAdminClient

    from agents.kafka.nonce import adopt_nonce
    from agents.kafka.topics import topic_specs

    s = ps.make_settings(kafka_broker, tmp_path, unique_name, LEAVES, epsilon=1.0, p=0.5,
                         events_partitions=1, shards=1, tick_seconds=1.0)
    domain = load_domain(s.domain_file)
    releases = []
    nonces = []
    for _incarnation in range(2):
        await ps.create_topics(s)
        digest = str(domain.digest())
        got = await asyncio.gather(*(adopt_nonce(s, digest, s.noise_key(), {}) for _ in range(3)))
        assert len(set(got)) == 1  # racing workers agree: the earliest record wins
        nonces.append(got[0])
        await ps.produce(s, (ps.event_bytes("a/x", s.origin + 0.01 * i, 1.0) for i in range(50)))
        await ps.close_ticks(s, 3)
        out, _ = await ps.run_worker_until(s, domain.size, 3)
        releases.append(_values(out))
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
        await admin.start()
        try:
            await admin.delete_topics([t.name for t in topic_specs(s)])
            for _ in range(100):
                if not set(await admin.list_topics()) & {t.name for t in topic_specs(s)}:
                    break
                await asyncio.sleep(0.1)
        finally:
            await admin.close()
    assert nonces[0] != nonces[1]
    first, second = releases
    assert set(first) == set(second)
    assert all(first[k] != second[k] for k in first)  # the same counts, unrelated noise
