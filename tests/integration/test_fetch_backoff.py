"""The client-side backoff on empty fetches (agents.kafka.fetch_backoff) against the real broker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agents.kafka import fetch_backoff
from tests.integration import pipeline_support as ps

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
    await ps.create_topic(kafka_broker, unique_name)
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
    await ps.create_topic(kafka_broker, unique_name)
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

    from agents.reconcile.agent import Reconciler
    from agents.reconcile.config import ReconcilerConfig

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


async def test_a_paced_consumer_polls_less_and_less_while_idle(kafka_broker: str,
                                                               unique_name: str) -> None:
    """pace(growth): the pause doubles after each empty fetch in a row up to growth × the
    first (50, 100, 200, 400, 400, ... ms here), so an idle consumer sends at most
    ~seconds / 0.4 + 4 empty fetches, while a constant 50 ms pause sends many more; a fetch
    that brings records resets it."""
    await ps.create_topic(kafka_broker, unique_name)
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    tp = TopicPartition(unique_name, 0)

    async def idle_fetches(growth: float) -> tuple[int, int]:
        c = AIOKafkaConsumer(bootstrap_servers=kafka_broker, group_id=None,
                             enable_auto_commit=False)
        await c.start()
        if growth != 1.0:
            fetch_backoff.pace(c, growth)
        try:
            c.assign([tp])
            await c.seek_to_end(tp)
            before = fetch_backoff.empty_fetches()
            await asyncio.sleep(3.0)
            idle = fetch_backoff.empty_fetches() - before
            run = c._fetcher.__dict__.get("_stream_dp_empty_run", 0)
            return idle, run
        finally:
            await c.stop()

    try:
        fetch_backoff.install(0.05)
        paced, run = await idle_fetches(8.0)
        constant, _ = await idle_fetches(1.0)
        # a record resets the run: the next empty fetch pauses 50 ms again
        c = AIOKafkaConsumer(bootstrap_servers=kafka_broker, group_id=None,
                             enable_auto_commit=False)
        await c.start()
        fetch_backoff.pace(c, 8.0)
        prod = AIOKafkaProducer(bootstrap_servers=kafka_broker)
        await prod.start()
        try:
            c.assign([tp])
            await c.seek_to_end(tp)
            await asyncio.sleep(1.5)
            assert c._fetcher.__dict__.get("_stream_dp_empty_run", 0) >= 3
            await prod.send_and_wait(unique_name, b"x", partition=0)
            got = await c.getmany(tp, timeout_ms=10_000)
            assert got.get(tp), "the record never came"
            await asyncio.sleep(0.3)
            # after the record, the run starts again from 0 (a few empties since, not 3+ more)
            assert c._fetcher.__dict__.get("_stream_dp_empty_run", 0) <= 3
        finally:
            await prod.stop()
            await c.stop()
    finally:
        fetch_backoff.install(0.0)
    assert run >= 4, run
    assert 1 <= paced <= 3.0 / 0.4 + 4, paced
    assert constant > 2 * paced, (constant, paced)
    with pytest.raises(ValueError):
        fetch_backoff.pace(object(), 4.0)
    with pytest.raises(ValueError):
        fetch_backoff.pace(c, 0.5)


async def test_wake_ends_a_long_pause_at_once(kafka_broker: str, unique_name: str) -> None:
    """A consumer in a 6 s pause (0.75 s backoff, growth 8, idle long enough) does not see a new
    record for as long as the pause lasts; after wake() it does at once (well before the pause
    would end), and the pause starts again from the first step."""
    await ps.create_topic(kafka_broker, unique_name)
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    tp = TopicPartition(unique_name, 0)
    c = AIOKafkaConsumer(bootstrap_servers=kafka_broker, group_id=None, enable_auto_commit=False)
    prod = AIOKafkaProducer(bootstrap_servers=kafka_broker)
    fetch_backoff.install(0.75)
    await c.start()
    await prod.start()
    try:
        fetch_backoff.pace(c, 8.0)
        c.assign([tp])
        await c.seek_to_end(tp)
        # 0.75 + 1.5 + 3 s of pauses: the fourth empty fetch starts a 6 s pause
        for _ in range(200):
            if c._fetcher.__dict__.get("_stream_dp_empty_run", 0) >= 4:
                break
            await asyncio.sleep(0.05)
        assert c._fetcher.__dict__.get("_stream_dp_empty_run", 0) >= 4
        await prod.send_and_wait(unique_name, b"one", partition=0)
        got = await c.getmany(tp, timeout_ms=1500)
        assert not got.get(tp), "a paused consumer fetched before its pause ended"
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        fetch_backoff.wake(c)
        got = await c.getmany(tp, timeout_ms=4000)
        waited = loop.time() - t0
        assert [r.value for r in got.get(tp, [])] == [b"one"]
        assert waited < 4.0
        assert c._fetcher.__dict__.get("_stream_dp_empty_run", 0) <= 1
        fetch_backoff.wake(object())  # not a consumer: nothing to wake, no error
    finally:
        fetch_backoff.install(0.0)
        await prod.stop()
        await c.stop()


async def test_the_release_stage_is_woken_by_its_own_ingest(kafka_broker: str, unique_name: str,
                                                           tmp_path: Any) -> None:
    """One worker owns every events partition: its partials consumer's pause grows to 20 × the
    backoff between ticks (30 s here), and each ingest commit of partials wakes it, so the
    partials of every tick are read at once (tick closed → last partial read well under the
    1.5 s backoff; without the wake, each tick's partials wait for a pause of 3 s or more)."""
    from agents.worker.pipeline import Worker
    from tests.integration import pipeline_support as ps

    paths = ps.hierarchy_paths(2, 2, 2)
    s = ps.live_settings(kafka_broker, tmp_path, unique_name, paths, tick_seconds=3.0,
                         empty_fetch_backoff_ms=1500, events_partitions=2)
    await ps.create_topics(s)
    leaves = [p for p in paths if p.count("/") == 2]
    stop = asyncio.Event()
    w = Worker(s)
    task = asyncio.create_task(w.run(stop))
    try:
        for _ in range(300):
            if w.ready:
                break
            await asyncio.sleep(0.1)
        assert w.ready
        loop = asyncio.get_running_loop()
        end = loop.time() + 16.0
        while loop.time() < end:  # an event per leaf now and then, as a live source sends them
            import time as _time

            await ps.produce(s, [ps.event_bytes(leaf, _time.time()) for leaf in leaves])
            await asyncio.sleep(1.0)
        timings = [t for t in w.release_timings if t["tick"] >= 3]
        assert len(timings) >= 4 * s.shards // 2, w.release_timings
        assert w.release._growth == 20.0  # every events partition is this worker's
        gathered = sorted(t["gathered"] for t in timings)
        assert gathered[len(gathered) // 2] < 1.0, gathered
    finally:
        stop.set()
        await task
        fetch_backoff.install(0.0)
