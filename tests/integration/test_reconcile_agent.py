"""The reconcile side agent against a real broker: consistent histograms for a hierarchy and a
grid (checked against a dense GLS oracle), one leader per cluster, leader change without a
missing tick, `every` and resumption without re-publication."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from numpy.typing import NDArray

from agents.kafka.codec import count_message, encode, validate
from agents.reconcile.agent import Reconciler
from agents.reconcile.config import ReconcilerConfig
from agents.telemetry.metrics import Metrics
from stream_dp.domain import Domain

pytestmark = pytest.mark.integration

PATHS = [
    "eu/fr/paris", "eu/fr/lyon", "eu/de/berlin", "eu/de/munich", "eu/de/hamburg",
    "us/ny/nyc", "us/ca/sf", "us/ca/la", "asia/jp/tokyo",
]


@dataclass
class Topics:
    bootstrap: str
    counts: str
    histograms: str
    leader: str
    group: str

    def config(self, domain: Domain, **kw: object) -> ReconcilerConfig:
        return ReconcilerConfig(
            bootstrap=self.bootstrap, counts_topic=self.counts, histograms_topic=self.histograms,
            leader_topic=self.leader, leader_group=self.group, domain_name=domain.name,
            session_timeout_ms=6000, heartbeat_interval_ms=300, poll_ms=100,
            **kw,  # type: ignore[arg-type]
        )


@pytest.fixture()
async def topics(kafka_broker: str, unique_name: str) -> Topics:
    t = Topics(kafka_broker, f"{unique_name}.counts", f"{unique_name}.hist",
               f"{unique_name}.leader", f"{unique_name}.group")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t.counts, 4, 1), NewTopic(t.histograms, 1, 1)])
    finally:
        await admin.close()
    return t


@pytest.fixture()
async def producer(kafka_broker: str) -> AsyncIterator[AIOKafkaProducer]:
    p = AIOKafkaProducer(bootstrap_servers=kafka_broker)
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


def releases(domain: Domain, tick: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Deterministic noisy values and standard errors for one tick (any numbers will do: the
    agent's job is to project whatever was released)."""
    rng = np.random.default_rng([7, tick])
    n = len(domain.names)
    return rng.normal(50.0, 20.0, n), rng.uniform(0.5, 4.0, n)


async def publish_tick(producer: AIOKafkaProducer, topic: str, domain: Domain, tick: int) -> None:
    values, stderr = releases(domain, tick)
    for name, v, s in zip(domain.names, values, stderr, strict=True):
        msg = count_message(
            stream=name, tick=tick, tick_start=1000.0 + tick - 1, tick_end=1000.0 + tick,
            value=float(v), stderr=float(s), strategy="naive", p=0.9,
            privacy={"model": "pure", "epsilon": 1.0}, cap=1.0, horizon=1023,
        )
        await producer.send(topic, encode(msg), key=name.encode())
    await producer.flush()


async def read_histograms(bootstrap: str, topic: str) -> list[dict[str, object]]:
    """Every message on ``topic``, read up to the end offsets taken now."""
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                         enable_auto_commit=False, group_id=None)
    await c.start()
    try:
        await c.topics()  # metadata
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
        c.assign(tps)
        end = await c.end_offsets(tps)
        await c.seek_to_beginning(*tps)
        out: list[dict[str, object]] = []
        deadline = time.monotonic() + 30
        while any([await c.position(tp) < end[tp] for tp in tps]):
            assert time.monotonic() < deadline, "could not read the topic to its end"
            batch = await c.getmany(timeout_ms=200)
            for records in batch.values():
                out.extend(json.loads(r.value) for r in records)
        return out
    finally:
        await c.stop()


async def wait_until(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.1)


def constraint_matrix(domain: Domain) -> NDArray[np.float64]:
    """Rows ``M`` with ``M x = 0`` for consistent ``x``, built from the node names alone."""
    names = list(domain.names)
    idx = {n: i for i, n in enumerate(names)}
    rows: list[NDArray[np.float64]] = []
    if domain.kind == "hierarchy":
        assert domain.parent is not None
        for p in range(len(names)):
            children = [c for c in range(len(names)) if domain.parent[c] == p]
            if children:
                row = np.zeros(len(names))
                row[p] = 1.0
                row[children] = -1.0
                rows.append(row)
    else:  # grid: total = Σ marginals of each attribute; marginal = Σ cells holding it
        cells = [n for n in names if "|" in n]
        marginals = [n for n in names if "=" in n and "|" not in n]
        attrs = sorted({m.split("=")[0] for m in marginals})
        for a in attrs:
            row = np.zeros(len(names))
            row[idx["total"]] = 1.0
            for m in marginals:
                if m.split("=")[0] == a:
                    row[idx[m]] = -1.0
            rows.append(row)
        for m in marginals:
            row = np.zeros(len(names))
            row[idx[m]] = 1.0
            for c in cells:
                if m in c.split("|"):
                    row[idx[c]] = -1.0
            rows.append(row)
    return np.array(rows)


def gls_oracle(M: NDArray[np.float64], x: NDArray[np.float64],
               v: NDArray[np.float64]) -> NDArray[np.float64]:
    """Dense generalised least squares projection ``x − Σ Mᵀ (M Σ Mᵀ)⁺ M x``."""
    S = np.diag(v)
    return x - S @ M.T @ np.linalg.pinv(M @ S @ M.T) @ (M @ x)


def check_histogram(domain: Domain, msg: dict[str, object], tol: float) -> None:
    validate("dp.histograms.v1", msg)
    tick = int(msg["tick"])  # type: ignore[call-overload]
    nodes = msg["nodes"]
    assert isinstance(nodes, list)
    assert [n["stream"] for n in nodes] == list(domain.names)
    noisy, stderr = releases(domain, tick)
    assert [n["noisy"] for n in nodes] == noisy.tolist()
    assert [n["stderr"] for n in nodes] == stderr.tolist()
    value = np.array([n["value"] for n in nodes])
    M = constraint_matrix(domain)
    assert np.max(np.abs(M @ value)) <= tol * max(1.0, float(np.max(np.abs(value))))
    np.testing.assert_allclose(value, gls_oracle(M, noisy, stderr**2), rtol=0, atol=tol * 100)
    diagnostics = msg["diagnostics"]
    assert isinstance(diagnostics, dict)
    assert diagnostics["residual"] == pytest.approx(float(np.linalg.norm(M @ value)), abs=1e-9)
    assert msg["consistent"] is True
    if domain.kind == "hierarchy":  # exact solver: one pass
        assert diagnostics["iterations"] == 1
    assert msg["domain"] == domain.name


async def run_reconcilers(
    *reconcilers: Reconciler,
) -> tuple[list[asyncio.Event], list[asyncio.Task[None]]]:
    stops = [asyncio.Event() for _ in reconcilers]
    tasks = [asyncio.create_task(r.run(s)) for r, s in zip(reconcilers, stops, strict=True)]
    return stops, tasks


async def stop_all(stops: list[asyncio.Event], tasks: list[asyncio.Task[None]]) -> None:
    for s in stops:
        s.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)


@pytest.mark.parametrize("kind", ["hierarchy", "grid"])
async def test_histograms_add_up_and_equal_the_dense_oracle(
    topics: Topics, producer: AIOKafkaProducer, kind: str
) -> None:
    if kind == "hierarchy":
        domain = Domain.from_paths(PATHS, name="sales")
        tol = 1e-9
    else:
        domain = Domain.grid({"age": ["young", "mid", "old"], "tenure": ["own", "rent"],
                              "region": ["n", "s"]}, name="census")
        tol = 1e-5
    metrics = Metrics(process=False)
    r = Reconciler(topics.config(domain), domain, metrics=metrics)
    stops, tasks = await run_reconcilers(r)
    try:
        for t in range(1, 6):
            await publish_tick(producer, topics.counts, domain, t)
        await wait_until(lambda: r.published >= 5)
    finally:
        await stop_all(stops, tasks)
    hists = await read_histograms(topics.bootstrap, topics.histograms)
    assert [h["tick"] for h in hists] == [1, 2, 3, 4, 5]
    for h in hists:
        check_histogram(domain, h, tol)
        assert h["tick_end"] == 1000.0 + int(h["tick"])  # type: ignore[call-overload]
    text = metrics.exposition().decode()
    assert "stream_dp_histograms_published_total 5.0" in text
    assert "stream_dp_reconcile_last_tick 5.0" in text


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
async def test_leader_change_loses_no_tick(
    topics: Topics, producer: AIOKafkaProducer, static: bool
) -> None:
    domain = Domain.from_paths(PATHS, name="sales")
    a = Reconciler(topics.config(domain, client_id="a", instance_id="a" if static else None),
                   domain)
    b = Reconciler(topics.config(domain, client_id="b", instance_id="b" if static else None),
                   domain)
    stops, tasks = await run_reconcilers(a, b)
    try:
        for t in range(1, 5):
            await publish_tick(producer, topics.counts, domain, t)
        await wait_until(lambda: a.last_tick >= 4 or b.last_tick >= 4)
        assert a.is_leader != b.is_leader  # exactly one leader
        leader = 0 if a.is_leader else 1
        follower = (a, b)[1 - leader]
        stops[leader].set()
        await asyncio.wait_for(tasks[leader], 30)
        # Half of the next tick before the hand-over completes, the rest after.
        await publish_tick(producer, topics.counts, domain, 5)
        await wait_until(lambda: follower.is_leader)
        for t in range(6, 9):
            await publish_tick(producer, topics.counts, domain, t)
        await wait_until(lambda: follower.last_tick >= 8)
    finally:
        await stop_all(stops, tasks)
    hists = await read_histograms(topics.bootstrap, topics.histograms)
    by_tick: dict[int, list[dict[str, object]]] = {}
    for h in hists:
        by_tick.setdefault(int(h["tick"]), []).append(h)  # type: ignore[call-overload]
    assert sorted(by_tick) == list(range(1, 9))
    for msgs in by_tick.values():  # any re-publication is identical
        assert all(m["nodes"] == msgs[0]["nodes"] for m in msgs)
        check_histogram(domain, msgs[0], 1e-9)
    assert follower.published >= 4


async def test_every_n_ticks_and_resume_without_republication(
    topics: Topics, producer: AIOKafkaProducer
) -> None:
    domain = Domain.from_paths(PATHS, name="sales")
    first = Reconciler(topics.config(domain, every=2), domain)
    stops, tasks = await run_reconcilers(first)
    try:
        for t in range(1, 7):
            await publish_tick(producer, topics.counts, domain, t)
        await wait_until(lambda: first.last_tick >= 6)
    finally:
        await stop_all(stops, tasks)
    second = Reconciler(topics.config(domain, every=2), domain)
    stops, tasks = await run_reconcilers(second)
    try:
        for t in range(7, 9):
            await publish_tick(producer, topics.counts, domain, t)
        await wait_until(lambda: second.last_tick >= 8)
    finally:
        await stop_all(stops, tasks)
    hists = await read_histograms(topics.bootstrap, topics.histograms)
    assert [h["tick"] for h in hists] == [2, 4, 6, 8]
    assert second.published == 1
    for h in hists:
        check_histogram(domain, h, 1e-9)


async def test_conflicting_republication_is_counted_and_first_value_kept(
    topics: Topics, producer: AIOKafkaProducer
) -> None:
    domain = Domain.from_paths(PATHS, name="sales")
    metrics = Metrics(process=False)
    r = Reconciler(topics.config(domain), domain, metrics=metrics)
    stops, tasks = await run_reconcilers(r)
    try:
        values, stderr = releases(domain, 1)
        first = domain.names[0]
        bad = count_message(
            stream=first, tick=1, tick_start=1000.0, tick_end=1001.0, value=float(values[0]) + 1,
            stderr=float(stderr[0]), strategy="naive", p=0.9,
            privacy={"model": "pure", "epsilon": 1.0}, cap=1.0, horizon=1023,
        )
        await publish_tick(producer, topics.counts, domain, 1)
        await wait_until(lambda: r.published >= 1)
        # Tick 2: a conflicting copy of one release arrives before the rest of the tick.
        values2, stderr2 = releases(domain, 2)
        good2 = count_message(
            stream=first, tick=2, tick_start=1001.0, tick_end=1002.0, value=float(values2[0]),
            stderr=float(stderr2[0]), strategy="naive", p=0.9,
            privacy={"model": "pure", "epsilon": 1.0}, cap=1.0, horizon=1023,
        )
        bad2 = dict(good2, value=float(values2[0]) + 1)
        await producer.send_and_wait(topics.counts, encode(good2), key=first.encode())
        await producer.send_and_wait(topics.counts, encode(bad2), key=first.encode())
        await producer.send_and_wait(topics.counts, encode(bad), key=first.encode())  # old tick
        await publish_tick(producer, topics.counts, domain, 2)
        await wait_until(lambda: r.published >= 2)
    finally:
        await stop_all(stops, tasks)
    hists = await read_histograms(topics.bootstrap, topics.histograms)
    assert [h["tick"] for h in hists] == [1, 2]
    for h in hists:
        check_histogram(domain, h, 1e-9)  # the noisy inputs are the first (correct) values
    assert "stream_dp_release_conflicts_total 1.0" in metrics.exposition().decode()


_CRASHY = """
import asyncio, sys
from agents.reconcile.agent import Reconciler, ReconcilerConfig
from stream_dp.domain import Domain
bootstrap, counts, hist, leader, group, paths = sys.argv[1:7]
domain = Domain.from_paths(paths.split(","), name="sales")
cfg = ReconcilerConfig(bootstrap=bootstrap, counts_topic=counts, histograms_topic=hist,
                       leader_topic=leader, leader_group=group, domain_name="sales",
                       instance_id="crashy", session_timeout_ms=6000, heartbeat_interval_ms=300,
                       poll_ms=100)
asyncio.run(Reconciler(cfg, domain).run(asyncio.Event()))
"""


async def test_kill_9_leader_restarted_with_same_identity_takes_over(
    topics: Topics, producer: AIOKafkaProducer
) -> None:
    """Static membership: a leader killed with SIGKILL and restarted with the same id resumes
    at once (no session timeout to wait for), with no tick missing or changed."""
    import subprocess
    import sys

    domain = Domain.from_paths(PATHS, name="sales")
    argv = [sys.executable, "-c", _CRASHY, topics.bootstrap, topics.counts, topics.histograms,
            topics.leader, topics.group, ",".join(PATHS)]

    async def wait_for_ticks(n: int) -> list[dict[str, object]]:
        deadline = time.monotonic() + 90
        while True:
            hists = await read_histograms(topics.bootstrap, topics.histograms)
            if len({h["tick"] for h in hists}) >= n:
                return hists
            assert time.monotonic() < deadline, "histograms missing"
            await asyncio.sleep(0.5)

    first = subprocess.Popen(argv)
    try:
        for t in range(1, 4):
            await publish_tick(producer, topics.counts, domain, t)
        await wait_for_ticks(3)
        first.kill()  # SIGKILL: no LeaveGroup, no clean shutdown
        first.wait(10)
        for t in range(4, 7):
            await publish_tick(producer, topics.counts, domain, t)
        second = subprocess.Popen(argv)
        try:
            hists = await wait_for_ticks(6)
        finally:
            second.terminate()
            second.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    by_tick: dict[int, list[dict[str, object]]] = {}
    for h in hists:
        by_tick.setdefault(int(h["tick"]), []).append(h)  # type: ignore[call-overload]
    assert sorted(by_tick) == list(range(1, 7))
    for msgs in by_tick.values():
        assert all(m["nodes"] == msgs[0]["nodes"] for m in msgs)
        check_histogram(domain, msgs[0], 1e-9)


async def test_a_histogram_too_large_is_skipped_with_a_metric_not_a_restart_loop(
    topics: Topics, producer: AIOKafkaProducer
) -> None:
    """Ticks whose histogram exceeds the agent's max_message_bytes are skipped with
    stream_dp_reconcile_errors_total{reason="too_large"}: the same leading task goes on (no
    restart loop) and commits its input offsets past the skipped ticks."""
    from prometheus_client import generate_latest

    domain = Domain.from_paths(PATHS, name="sales")
    metrics = Metrics(process=False)
    # about 1 KiB of JSON per histogram here: 200 bytes is too large for every tick
    r = Reconciler(topics.config(domain, max_message_bytes=200), domain, metrics=metrics)
    stops, tasks = await run_reconcilers(r)
    try:
        await publish_tick(producer, topics.counts, domain, 1)
        await wait_until(lambda: r.last_tick >= 1)
        leading = r._lead_task
        for t in range(2, 5):
            await publish_tick(producer, topics.counts, domain, t)
        await wait_until(lambda: r.last_tick >= 4)
        await asyncio.sleep(1.0)
        assert r.published == 0 and r.is_leader and r._lead_task is leading
        text = generate_latest(metrics.registry).decode()
        assert 'stream_dp_reconcile_errors_total{reason="too_large"} 4.0' in text
    finally:
        await stop_all(stops, tasks)
    assert await read_histograms(topics.bootstrap, topics.histograms) == []
    # the offsets group resumes after the skipped ticks: a successor does not retry them
    c = AIOKafkaConsumer(bootstrap_servers=topics.bootstrap, group_id=f"{topics.group}.offsets",
                         enable_auto_commit=False)
    await c.start()
    try:
        tps = [TopicPartition(topics.counts, p) for p in range(4)]
        ends = await c.end_offsets(tps)
        committed = {tp: await c.committed(tp) for tp in tps}
    finally:
        await c.stop()
    assert sum(committed[tp] or 0 for tp in tps) >= sum(ends.values()) - len(domain.names)


async def test_a_json_histogram_too_large_still_goes_out_as_chunks(
    topics: Topics, producer: AIOKafkaProducer, unique_name: str
) -> None:
    """With chunk records configured, a tick whose JSON view is too large is published as
    chunks only (counted as too_large): no tick is lost, every chunk decodes to the solve."""
    from prometheus_client import generate_latest

    from stream_dp.compact import decode_manifest
    from stream_dp.compact_histograms import HistogramAssembler, decode_histogram_chunk

    blocks, manifests = f"{unique_name}.x.histograms", f"{unique_name}.x.manifests"
    admin = AIOKafkaAdminClient(bootstrap_servers=topics.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(blocks, 1, 1), NewTopic(manifests, 1, 1)])
    finally:
        await admin.close()
    domain = Domain.from_paths(PATHS, name="sales")
    metrics = Metrics(process=False)
    # ~1 KiB of JSON per histogram, ~400 bytes per one-node chunk: only the JSON is too large
    r = Reconciler(topics.config(domain, max_message_bytes=700, histogram_blocks_topic=blocks,
                                 histogram_chunk_nodes=1), domain, metrics=metrics)
    stops, tasks = await run_reconcilers(r)
    try:
        for t in range(1, 4):
            await publish_tick(producer, topics.counts, domain, t)
        await wait_until(lambda: r.published >= 3)
        text = generate_latest(metrics.registry).decode()
        assert 'stream_dp_reconcile_errors_total{reason="too_large"} 3.0' in text
    finally:
        await stop_all(stops, tasks)
    assert await read_histograms(topics.bootstrap, topics.histograms) == []
    from tests.integration import pipeline_support as ps

    names = [decode_manifest(m.value) for m in await ps.read_topic(topics.bootstrap, manifests)
             if m.key == b"histogram"][-1]
    asm = HistogramAssembler()
    got = {}
    for rec in await ps.read_topic(topics.bootstrap, blocks):
        hist = asm.add(decode_histogram_chunk(rec.value))
        if hist is not None:
            got[hist.tick] = hist.message(names.streams)
    assert sorted(got) == [1, 2, 3]
    for msg in got.values():
        check_histogram(domain, msg, 1e-9)
