"""Crashes and scale-out: worker subprocesses killed with SIGKILL, restarted, joined, stopped.

After every run: each (stream, tick) is released; every copy of a (stream, tick) — including
copies from aborted transactions that a ``read_uncommitted`` reader sees — is bit-identical;
``read_committed`` readers see each exactly once; values equal the offline exact decayed
counts (enormous ε).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agents.config.domain import load_domain
from agents.config.settings import Settings
from agents.worker.pipeline import Worker
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.crash,
              pytest.mark.timeout(600)]

N_TICKS = 60


def make_log(s: Settings, leaves: list[str], n: int) -> list[tuple[str, float, float]]:
    rng = np.random.default_rng(7)
    ts = np.sort(rng.uniform(s.origin, s.origin + N_TICKS * s.tick_seconds, n))
    keys = rng.integers(0, len(leaves), n)
    values = rng.choice([1.0, 0.5, 2.0], n, p=[0.8, 0.1, 0.1])
    return [(leaves[k], float(t), float(v)) for k, t, v in zip(keys, ts, values, strict=True)]


async def check_run(s: Settings, domain: Any, log: list[tuple[str, float, float]],
                    mechanism_bound: float) -> dict[str, int]:
    committed = await ps.released(s, committed=True)
    uncommitted = await ps.released(s, committed=False)
    exact = ps.exact_decayed(domain, log, s, N_TICKS)
    dup_committed = sum(len(v) - 1 for v in committed.values())
    dup_uncommitted = 0
    for key, want in exact.items():
        assert key in committed, f"{key} never released"
        copies = set(committed[key]) | set(uncommitted.get(key, []))
        assert len(copies) == 1, f"{key}: {len(copies)} different copies"
        dup_uncommitted += len(uncommitted.get(key, [])) - 1
        msg = json.loads(committed[key][0])
        assert abs(msg["value"] - want) <= mechanism_bound + 12 * msg["stderr"], (key, msg, want)
    assert dup_committed == 0
    return {"releases": len(exact), "uncommitted_duplicates": dup_uncommitted}


def bound_of(s: Settings) -> float:
    from stream_dp.planner import make_mechanism

    return float(make_mechanism(s.strategy, s.p, s.horizon, s.privacy, s.cap).rounding_bound())


@pytest.mark.parametrize("output", ["json", "compact"])
async def test_ten_kill9_and_restarts(kafka_broker: str, unique_name: str, tmp_path: Path,
                                      output: str) -> None:
    """Also for a compact-only deployment (five kills there, to keep the suite's time): every
    copy of every compact record (aborted transactions included) decodes to the same per-stream
    releases, each released once."""
    leaves = ps.hierarchy_paths(4, 4, 8)
    extra: dict[str, Any] = ({"compact_topic": f"{unique_name}.compact", "counts_json": 0}
                             if output == "compact" else {})
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves, epsilon=1e4,
                         tick_seconds=1.0, transaction_timeout_s=10.0, **extra)
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    log = make_log(s, leaves, 100_000)
    await ps.produce(s, (ps.event_bytes(k, t, v) for k, t, v in log))
    await ps.close_ticks(s, N_TICKS)

    rng = random.Random(11)
    worker = ps.WorkerProcess(s, "w0", tmp_path)
    try:
        for _ in range(10 if output == "json" else 5):
            worker.start()
            await asyncio.sleep(rng.uniform(1.5, 5.0))
            assert worker.alive(), worker.log_path.read_text()[-3000:]
            worker.kill9()
        before = worker.starts()
        worker.start()
        await worker.wait_log("release: assigned", count=before + 1)
        await ps.wait_for_ticks(s, domain.size, N_TICKS, timeout_s=240, workers=[worker])
        assert worker.alive()
    finally:
        code = worker.terminate()
    assert code == 0, worker.log_path.read_text()[-3000:]
    stats = await check_run(s, domain, log, bound_of(s))
    print("kill -9 run:", stats)


async def test_three_workers_join_and_leave(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    leaves = ps.hierarchy_paths(4, 4, 8)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves, epsilon=1e4,
                         tick_seconds=1.0, events_partitions=6, shards=6)
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    log = make_log(s, leaves, 60_000)
    await ps.produce(s, (ps.event_bytes(k, t, v) for k, t, v in log))
    await ps.close_ticks(s, N_TICKS)

    workers = {w: ps.WorkerProcess(s, w, tmp_path) for w in ("a", "b", "c")}
    try:
        workers["a"].start()
        await asyncio.sleep(2.5)
        workers["b"].start()
        await asyncio.sleep(2.5)
        workers["c"].start()
        await asyncio.sleep(3.0)
        assert workers["a"].terminate() == 0  # graceful: leaves the group, others take over
        await asyncio.sleep(2.5)
        workers["a"].start()
        await asyncio.sleep(2.0)
        workers["b"].kill9()
        await asyncio.sleep(2.0)
        workers["b"].start()
        await asyncio.sleep(2.0)
        assert workers["c"].terminate() == 0
        await ps.wait_for_ticks(s, domain.size, N_TICKS, timeout_s=240,
                                workers=list(workers.values()))
    finally:
        for w in workers.values():
            w.stop()
    for w in workers.values():
        assert w.proc is not None and w.proc.returncode in (0, -9), w.log_path.read_text()[-2000:]
    # the work really was shared: some worker held a proper, non-empty subset of the partitions
    import re

    shares = [
        set(map(int, re.findall(r"\d+", m)))
        for w in workers.values()
        for m in re.findall(r"ingest: assigned partitions \[([\d, ]*)\]", w.log_path.read_text())
    ]
    assert any(0 < len(p) < s.events_partitions for p in shares), shares
    stats = await check_run(s, domain, log, bound_of(s))
    print("scale-out run:", stats)


async def test_kill9_of_the_group_leader_leaves_no_partition_unowned(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """Clock schedule, two workers with static identities; the first (the groups' leader) is
    killed with SIGKILL and restarted at once. noida-db has been seen to re-run the assignment
    without a new generation then, leaving partitions with no owner; the workers detect
    partitions that make no progress and rejoin. Every tick keeps being released, exactly."""
    leaves = ps.hierarchy_paths(2, 2, 2)
    s = ps.live_settings(kafka_broker, tmp_path, unique_name, leaves, epsilon=1e4,
                         events_partitions=4, shards=4, stall_timeout_s=float(os.environ.get("STALL", "4")),
                         origin=float(int(time.time())) + 4.0)
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    sent: list[tuple[str, float, float]] = []
    stop_traffic = asyncio.Event()

    async def traffic() -> None:
        rng = random.Random(3)
        while not stop_traffic.is_set():
            now = time.time()
            if now >= s.origin:
                batch = [(leaves[rng.randrange(8)], time.time(), 1.0) for _ in range(8)]
                await ps.produce(s, (ps.event_bytes(*e) for e in batch))
                sent.extend(batch)
            await asyncio.sleep(0.25)

    a = ps.WorkerProcess(s, "a", tmp_path)
    b = ps.WorkerProcess(s, "b", tmp_path)
    producer = asyncio.create_task(traffic())
    try:
        a.start()
        await a.wait_log("release: assigned")
        b.start()
        await b.wait_log("release: assigned")
        await asyncio.sleep(3.0)
        a.kill9()
        a.start()
        await asyncio.sleep(2.0)
        target = int((time.time() - s.origin) // s.tick_seconds) + 12
        await ps.wait_for_ticks(s, domain.size, target, timeout_s=120, poll_s=1.0,
                                workers=[a, b])
        stop_traffic.set()
        await producer
        assert a.alive() and b.alive()
    finally:
        stop_traffic.set()
        for w in (a, b):
            w.stop()
    got = await ps.released(s)
    # under load a batch can be produced after its tick's deadline: late, rightly not counted
    kept = await ps.on_time(s, sent)
    assert len(kept) >= 0.9 * len(sent), (len(kept), len(sent))
    exact = ps.exact_decayed(domain, kept, s, target - 6)
    for key, want in exact.items():
        values = {json.loads(v)["value"] for v in got[key]}
        assert len(values) == 1, key
        assert abs(values.pop() - want) < 0.05, key


async def test_partition_left_without_owner_is_detected_and_reassigned(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """The state noida-db leaves after a leader's kill -9, made on purpose: a group leader whose
    first assignment gives events partition 0 to nobody (later ones are correct). The workers
    see partition 0 make no progress, leave and rejoin; the new assignment covers it, and every
    tick is released with every event counted. (STALL=1000000 turns the detection off: then
    this test must fail — the negative control.)"""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

    leaves = ps.hierarchy_paths(2, 2, 2)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves, epsilon=1e4,
                         tick_seconds=1.0, events_partitions=3, shards=2,
                         stall_timeout_s=float(os.environ.get("STALL", "3")))
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    first_members: set[str] = set()
    calls = [0]

    class FirstAssignmentDropsPartition0(RoundRobinPartitionAssignor):  # type: ignore[misc]
        name = "roundrobin"

        @classmethod
        def assign(cls, cluster: Any, members: Any) -> Any:
            workers = {m: md for m, md in members.items() if not m.startswith("rogue-")}
            out = super().assign(cluster, workers)
            if workers and not first_members:
                first_members.update(workers)
            calls[0] += 1
            # broken while the workers are the members it first saw; a member that left and
            # joined again (a new member id) gets a correct assignment
            if workers and set(workers) <= first_members:
                out = {m: ConsumerProtocolMemberAssignment(
                    cls.version,
                    [(t, [p for p in ps_ if not (t == s.events_topic and p == 0)])
                     for t, ps_ in a.assignment], b"") for m, a in out.items()}
            for m in members:
                out.setdefault(m, ConsumerProtocolMemberAssignment(cls.version, [], b""))
            return out

    rogue = AIOKafkaConsumer(
        bootstrap_servers=kafka_broker, group_id=s.ingest_group, enable_auto_commit=False,
        client_id="rogue-leader",
        partition_assignment_strategy=(FirstAssignmentDropsPartition0,),
        session_timeout_ms=6000, heartbeat_interval_ms=500,
    )
    await rogue.start()
    rogue.subscribe([s.events_topic])
    stop_rogue = asyncio.Event()

    async def keep_polling() -> None:
        while not stop_rogue.is_set():
            await rogue.getmany(timeout_ms=200)

    poller = asyncio.create_task(keep_polling())
    await asyncio.sleep(2.0)  # the rogue joins first: it is the group's leader
    log = [(leaves[i % 8], s.origin + 0.02 * i, 1.0) for i in range(300)]  # ticks 1..6
    await ps.produce(s, (ps.event_bytes(*e) for e in log))
    await ps.close_ticks(s, 6)
    stop = asyncio.Event()
    worker = Worker(s)
    task = asyncio.create_task(worker.run(stop))
    try:
        got = await ps.wait_for_ticks(s, domain.size, 6, timeout_s=45, poll_s=0.5)
    finally:
        stop.set()
        stop_rogue.set()
        await task
        await poller
        await rogue.stop()
    assert worker.stats["ownership_recoveries"] >= 1
    exact = ps.exact_decayed(domain, log, s, 6)
    for key, want in exact.items():
        assert abs(json.loads(got[key][0])["value"] - want) < 0.05, key
