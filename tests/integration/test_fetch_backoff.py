"""The client-side backoff on empty fetches (agents.fetch_backoff) against the real broker."""

from __future__ import annotations

import asyncio

import pytest

from agents import fetch_backoff

pytestmark = pytest.mark.integration


async def _empty_fetches(bootstrap: str, topic: str, seconds: float,
                         factor: float = 1.0) -> int:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await c.start()
    if factor != 1.0:
        fetch_backoff.slow_down(c, factor)
    try:
        c.assign([TopicPartition(topic, 0)])
        await c.seek_to_end(TopicPartition(topic, 0))
        before = fetch_backoff.empty_fetches()
        await asyncio.sleep(seconds)
        return fetch_backoff.empty_fetches() - before
    finally:
        await c.stop()


async def test_an_idle_consumer_waits_between_empty_fetches(kafka_broker: str,
                                                            unique_name: str) -> None:
    """After an empty fetch the fetcher sends the next one to that broker only after the
    backoff: at most seconds / backoff (+1) empty fetches, whatever the broker answers; without
    it a broker that answers at once (the embedded one) gets many more."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(unique_name, 1, 1)])
    finally:
        await admin.close()
    try:
        fetch_backoff.install(0.25)
        with_backoff = await _empty_fetches(kafka_broker, unique_name, 2.0)
        fetch_backoff.install(0.0)
        without = await _empty_fetches(kafka_broker, unique_name, 2.0)
    finally:
        fetch_backoff.install(0.0)
    assert 1 <= with_backoff <= 2.0 / 0.25 + 2
    assert without > 4 * with_backoff, (without, with_backoff)
    with pytest.raises(ValueError):
        fetch_backoff.install(-1.0)


async def test_a_slowed_down_consumer_waits_longer(kafka_broker: str, unique_name: str) -> None:
    """slow_down (the reconcile side agent's and the dashboard's consumers): factor × the
    process's pause after each empty fetch, so at most seconds / (factor × backoff) (+2) empty
    fetches, while a consumer beside it keeps the process's pace."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(unique_name, 1, 1)])
    finally:
        await admin.close()
    try:
        fetch_backoff.install(0.05)
        slowed = await _empty_fetches(kafka_broker, unique_name, 2.0, factor=8.0)
        normal = await _empty_fetches(kafka_broker, unique_name, 2.0)
    finally:
        fetch_backoff.install(0.0)
    assert 1 <= slowed <= 2.0 / 0.4 + 2, slowed
    assert normal > 2 * slowed, (normal, slowed)
    with pytest.raises(ValueError):
        fetch_backoff.slow_down(object(), 5.0)


async def test_the_reconcile_election_sends_no_fetches(kafka_broker: str, unique_name: str
                                                       ) -> None:
    """Nothing is ever written to the leader topic: the election consumer keeps its partition
    paused, so a leading agent sends no fetch requests for it (it sent one per backoff, as many
    as the busiest idle consumer, issue #25); fetches counted per client id."""
    from types import SimpleNamespace

    from agents.reconcile import Reconciler, ReconcilerConfig

    fetch_backoff.install(0.05)
    cfg = ReconcilerConfig(bootstrap=kafka_broker, counts_topic=f"{unique_name}.counts",
                           histograms_topic=f"{unique_name}.histograms",
                           leader_topic=f"{unique_name}.leader",
                           leader_group=f"{unique_name}.reconcile", client_id=unique_name,
                           session_timeout_ms=6000)
    rec = Reconciler(cfg, SimpleNamespace(names=("a",)))
    stop = asyncio.Event()
    task = asyncio.create_task(rec.run(stop))
    election = f"{unique_name}-election"
    try:
        for _ in range(200):
            if rec.is_leader:
                break
            await asyncio.sleep(0.1)
        assert rec.is_leader
        await asyncio.sleep(1.0)  # at most one fetch between an assignment and its pause
        before = fetch_backoff.fetch_requests().get(election, (0, 0))[0]
        await asyncio.sleep(2.0)  # ~40 empty fetches at the 50 ms backoff if it polled
        assert fetch_backoff.fetch_requests().get(election, (0, 0))[0] == before
        assert rec.is_leader
    finally:
        stop.set()
        await task
