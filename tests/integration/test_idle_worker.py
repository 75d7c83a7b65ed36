"""An idle worker wakes on work, not on a timer (issue #35), against the real broker.

No timing assertions: the loop passes and fetch requests of an idle spell are counted per second
of the spell's own wall time (a loaded machine stretches both sides alike), and the bound on a
record's wait after an idle spell is read from the pauses the fetcher actually set.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agents.kafka import fetch_backoff

pytestmark = pytest.mark.integration


def _count_waits(consumer: Any) -> list[int]:
    """Count ``consumer.getmany`` calls that may wait (``timeout_ms`` > 0): one per pass of a
    stage's loop that found no records buffered. An instrument around the real consumer."""
    calls = [0]
    getmany = consumer.getmany

    async def counted(*args: Any, **kw: Any) -> Any:
        if kw.get("timeout_ms", 0) > 0:
            calls[0] += 1
        return await getmany(*args, **kw)

    consumer.getmany = counted
    return calls


async def test_an_idle_worker_wakes_on_work(kafka_broker: str, unique_name: str,
                                            tmp_path: Any) -> None:
    """Idle for three 3 s ticks: each stage's loop waits for records at most ~1 s at a time
    (it waited 0.1 s: 10 passes a second) and the events consumer's empty fetches pause up to
    20 × ``empty_fetch_backoff_ms`` (it was 4 ×: 5 round trips a second at the default 50 ms),
    yet every tick is released by every shard; a record produced after the idle spell is
    accepted and released in its tick, and the longest pause any empty fetch of the events
    consumer started — the most a record arriving meanwhile waits — is exactly the documented
    bound, 20 × the backoff."""
    from agents.ingest.stage import INGEST_IDLE_GROWTH
    from agents.worker.pipeline import Worker
    from tests.integration import pipeline_support as ps

    paths = ps.hierarchy_paths(2, 2, 2)
    s = ps.live_settings(kafka_broker, tmp_path, unique_name, paths, tick_seconds=3.0,
                         empty_fetch_backoff_ms=50, events_partitions=2, shards=2,
                         # short: a stall check's deadline that lies in the past (an entry of
                         # a tick released since) once made the release loop spin
                         stall_timeout_s=4.0)
    await ps.create_topics(s)
    released: dict[int, set[int]] = {}

    def on_release(rel: Any) -> None:
        released.setdefault(int(rel.tick), set()).add(int(rel.shard))

    stop = asyncio.Event()
    w = Worker(s, on_release=on_release)
    task = asyncio.create_task(w.run(stop))

    async def until_released(tick: int, limit_s: float = 90.0) -> None:
        end = time.monotonic() + limit_s
        while len(released.get(tick, ())) < s.shards:
            assert not task.done(), task
            assert time.monotonic() < end, (tick, released)
            await asyncio.sleep(0.1)

    try:
        for _ in range(600):
            if w.ready and released:
                break
            await asyncio.sleep(0.1)
        assert w.ready and released
        first = max(released) + 1
        await until_released(first)
        waits = {stage.name: _count_waits(stage.consumer) for stage in (w.ingest, w.release)}
        events_client = w.ingest.consumer._client._client_id
        fetches0 = fetch_backoff.fetch_requests().get(events_client, (0, 0))[0]
        t0 = time.monotonic()
        await until_released(first + 3)
        spell = time.monotonic() - t0
        fetches = fetch_backoff.fetch_requests().get(events_client, (0, 0))[0] - fetches0
        for name, calls in waits.items():
            # ~1 pass a second plus a few per tick (a close, a commit, partials); 10 before
            assert calls[0] / spell <= 4.0, (name, calls[0], spell)
        # ~1 a second (≤ 3 per tick in the ramp after each close); 5 a second before
        assert fetches / spell <= 2.5, (fetches, spell)

        # a record after the idle spell: accepted, and released in its tick
        now = time.time()
        if w.schedule.deadline(w.schedule.tick_of(now)) - now < 1.0:  # mid-tick: never late
            await asyncio.sleep(w.schedule.deadline(w.schedule.tick_of(now)) - now + 0.3)
            now = time.time()
        leaf = next(p for p in paths if p.count("/") == 2)
        await ps.produce(s, [ps.event_bytes(leaf, now)])
        tick = w.schedule.tick_of(now)
        await until_released(tick)
        assert w.stats["accepted"] == 1, w.stats
        assert all(len(released.get(t, ())) == s.shards for t in range(first, tick + 1)), released
        longest = fetch_backoff.longest_pauses()[events_client]
        assert longest == pytest.approx(INGEST_IDLE_GROWTH * s.empty_fetch_backoff_ms / 1000)
    finally:
        stop.set()
        await task
        fetch_backoff.install(0.0)


async def test_the_parent_of_pipeline_processes_waits_after_empty_fetches(
        kafka_broker: str, unique_name: str, tmp_path: Any) -> None:
    """pipeline_processes = 1: the stages run in a child process, and the parent's own
    consumers (the reconcile side agent's) must still pause after an empty fetch. They did not
    (only the pipeline's Worker installed the pause): against a broker that answers empty
    fetches at once they fetched in a busy loop, thousands of round trips a second (8 CPU-s
    per 10 s tick at 10^6 streams). Counted per second of the idle spell's wall time."""
    from agents.commands.worker import serve
    from tests.integration import pipeline_support as ps

    fetch_backoff.install(0.0)  # as a process that never built a Worker: no pause in force
    s = ps.live_settings(kafka_broker, tmp_path, unique_name, ps.hierarchy_paths(2, 2, 2),
                         tick_seconds=2.0, empty_fetch_backoff_ms=50, pipeline_processes=1,
                         shards=2, events_partitions=2)
    await ps.create_topics(s)
    stop = asyncio.Event()
    published: list[int] = []

    async def on_histogram(msg: dict[str, Any]) -> None:
        published.append(int(msg["tick"]))

    task = asyncio.create_task(serve(s, stop_event=stop, web=False, dashboard=False,
                                     on_histogram=on_histogram, json_logs=False))
    try:
        end = time.monotonic() + 120
        while len(published) < 2:  # the child's releases reach the parent's reconcile agent
            assert not task.done(), task
            assert time.monotonic() < end, published
            await asyncio.sleep(0.1)
        assert fetch_backoff.installed_seconds() == pytest.approx(0.05)
        before = sum(n for n, _ in fetch_backoff.fetch_requests().values())
        t0 = time.monotonic()
        await asyncio.sleep(4.0)
        spell = time.monotonic() - t0
        fetches = sum(n for n, _ in fetch_backoff.fetch_requests().values()) - before
        # a few a second per consumer with the pause; a busy loop is hundreds or thousands
        assert fetches / spell <= 40.0, (fetches, spell, fetch_backoff.fetch_requests())
        assert len(published) >= 2
    finally:
        stop.set()
        await task
        fetch_backoff.install(0.0)
