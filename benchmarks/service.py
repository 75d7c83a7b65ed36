"""Service benchmarks (prints tables; numbers go to benchmarks/RESULTS.md, section "Service").

1. Ingest throughput: one worker (ingest stage; release runs too) vs a bare aiokafka consumer
   draining the same events topic in the same run (same broker, same partitions).
2. Tick latency with 10^5 streams: wall seconds from the last events partition closing a tick
   to the shard's release (10^5 / shards count messages + checkpoint) being committed.
3. Reconcile time per tick at ~10^4 nodes (stream_dp.consistency.reconcile on a 3-level tree).
4. Backlog release speed: a deployment on the clock schedule started with N past ticks of events
   already in the topic (record timestamps from when they happened): ticks released per second.
5. Restart lag: a worker subprocess on the clock schedule (1 s ticks), killed with SIGKILL and
   stopped with SIGTERM and restarted; release lag per tick (the count message's timestamp minus
   the tick's end) before the restarts and in the ticks after each.

Throughput is measured in the steady state, between 20% and 80% of the records consumed, for
both sides (the start includes group joins, restores and a prefetch of up to one fetch per
partition, which would otherwise dominate short runs).

6. Tick latency by output mode (``--only modes``): the same flat domain of ``--streams`` streams
   released with per-stream JSON (as shipped) and compact-only (``compact_topic`` set,
   ``counts_json = 0``), each next to the library's ``CounterBank`` tick for the same mechanism
   and N measured in the same run (ratio = worker p50 / library median tick). Pipeline only:
   no dashboard, no reconcile agent.

7. As shipped at scale (``--only scale``; part of the default run): ``stream-dp worker``'s
   parts (pipeline, reconcile side agent, web server with the dashboard; ``serve`` in this
   process, the pipeline in ``--pipeline-processes`` children or in-process) on a 3-level
   hierarchy of about ``--streams`` nodes with compact output only (``counts_json = 0``,
   ``histograms_json = 0``), live events from a producer subprocess (``--active`` of the leaves
   per tick), ``--tick-seconds`` ticks. Phase 1: the worker alone, release latency next to the
   library's ``CounterBank`` tick for the same mechanism and N. Phase 2: plus three reader
   processes (the plain-Python example consumer, ``stream-dp tail compact --prefix``,
   ``stream-dp tail compact-histograms --prefix``) and dashboard snapshots over HTTP; lag of each
   reader behind the release. Worker RSS sampled every second over both phases. The worker's
   CPU per tick in each phase (process CPU of the benchmark process, which runs the worker's
   parts and nothing else heavy: the producer, the readers and the dashboard poller are
   subprocesses; plus the pipeline child processes), next to the library tick's CPU, the
   budget 10 × library CPU + 2 µs × events per tick, the broker's CPU and the clients'.
   ``--profile PATH``: a py-spy profile of phase 1 (``py-spy`` on PATH).

8. Scale-out (``--only ingest --ingest-processes 1,2 [--pairs 3]``): the ingest table with
   ``pipeline_processes`` = 1 then 2 (order alternating between rounds) instead of the bare
   consumer; rates from the output side (events the children report accepted at their ingest
   commits, every 0.25 s here), 10 % → 90 % of the records, which each run gets in its own
   topic in a transaction committed once every child is ready (no rebalance inside).

9. Idle worker (``--only idle``; issue #35): ``stream-dp worker --no-dashboard`` processes with
   no events at all, at ``--streams``, for each ``--idle-ticks`` tick length and each code tree of
   ``--idle-trees label=PATH,...`` (default: this tree; e.g. ``before=../main,after=.`` measures
   two versions side by side against one broker): the worker's CPU per second between ticks and
   its CPU per tick, from ``/proc`` (``benchmarks/idle_worker.py``; ``--idle-profile DIR``:
   py-spy of one idle window each).

Usage: python benchmarks/service.py [--events 1000000] [--streams 100000] [--ticks 8]
                                   [--backlog-ticks 600] [--only scale,backlog,restart,modes]
                                   [--tick-seconds 5] [--active 0.1] [--scale-ticks 10]
                                   [--pipeline-processes 0] [--release-checkpoint-every 1]
                                   [--profile PATH] [--ingest-processes 1,2 --pairs 3]
                                   [--only idle --idle-ticks 10,20 --idle-windows 3
                                    --idle-trees before=PATH,after=. --idle-profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.kafka.embedded_broker import EmbeddedBroker  # noqa: E402
from agents.kafka.fetch_backoff import fetch_requests  # noqa: E402
from agents.worker.pipeline import Worker  # noqa: E402
from tests.integration import pipeline_support as ps  # noqa: E402


async def bare_drain(bootstrap: str, topic: str, n: int, group: str) -> float:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                         auto_offset_reset="earliest", enable_auto_commit=False,
                         isolation_level="read_committed", max_poll_records=5000,
                         max_partition_fetch_bytes=4 << 20)
    await c.start()
    seen = 0
    t20 = t80 = 0.0
    n20 = n80 = 0
    while seen < n:
        batch = await c.getmany(timeout_ms=100, max_records=5000)
        seen += sum(len(v) for v in batch.values())
        if not t20 and seen >= 0.2 * n:
            t20, n20 = time.perf_counter(), seen
        if not t80 and seen >= 0.8 * n:
            t80, n80 = time.perf_counter(), seen
    dt = (t80 - t20) / max(n80 - n20, 1) * n  # steady state (20% -> 80%), scaled to n
    await c.stop()
    return dt


async def worker_drain(w_settings: Any, n_events: int) -> float:
    """Seconds per ``n_events`` in the worker's steady state (20% -> 80% of the records)."""
    stop = asyncio.Event()
    w = Worker(w_settings)
    task = asyncio.create_task(w.run(stop))
    while w.processed < 0.2 * n_events:
        await asyncio.sleep(0.005)
    t20, n20 = time.perf_counter(), w.processed
    while w.processed < 0.8 * n_events:
        await asyncio.sleep(0.005)
    t80, n80 = time.perf_counter(), w.processed
    # steady state (20% -> 80%), scaled to n records: the records processed between the two
    # observations (the worker counts a handler call's records at once)
    dt = (t80 - t20) / max(n80 - n20, 1) * n_events
    while w.stats["accepted"] < n_events:  # and everything committed
        await asyncio.sleep(0.02)
    stop.set()
    await task
    return dt


async def ingest_bench(bootstrap: str, tmp: Path, n_events: int) -> list[tuple[str, float, float]]:
    leaves = ps.hierarchy_paths(4, 4, 8)
    s = ps.make_settings(bootstrap, tmp, "bench-ingest", leaves, tick_seconds=10.0,
                         commit_interval_s=2.0, events_partitions=4, shards=3)
    await ps.create_topics(s)
    span = n_events / 10_000  # 10k events per second of event time
    evs = [(leaves[i % len(leaves)], s.origin + span * i / n_events, 1.0) for i in range(n_events)]
    await ps.produce(s, (ps.event_bytes(*e) for e in evs))
    await ps.close_ticks(s, int(span / s.tick_seconds) + 1)
    rows = []
    for rep in range(5):
        w_settings = s.replace(app_id=f"bench-ingest-w{rep}",
                               partials_topic=f"bench-ingest.partials{rep}",
                               counts_topic=f"bench-ingest.counts{rep}",
                               ingest_checkpoints_topic=f"bench-ingest.ci{rep}",
                               release_checkpoints_topic=f"bench-ingest.cr{rep}")
        await ps.create_topics(w_settings)
        if rep % 2 == 0:  # alternate the order so that neither side always runs first
            bare = await bare_drain(bootstrap, s.events_topic, n_events, f"bare-{rep}")
            worker = await worker_drain(w_settings, n_events)
        else:
            worker = await worker_drain(w_settings, n_events)
            bare = await bare_drain(bootstrap, s.events_topic, n_events, f"bare-{rep}")
        rows.append((f"rep {rep}", n_events / bare, n_events / worker))
    return rows


def _metric_sum(metrics: list[Any], name: str, **labels: str) -> float:
    """Sum of the samples ``name`` with ``labels`` on the service's metrics (both registries:
    the raw event counters sit on the private one unless ``metrics_event_counts``); NaN before
    the service made them."""
    if not metrics:
        return float("nan")
    total = 0.0
    for registry in (metrics[0].registry, metrics[0].private_registry):
        for family in registry.collect():
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v
                                               for k, v in labels.items()):
                    total += float(sample.value)
    return total


class _CountingMetrics:
    """The parent's metrics for a :class:`agents.worker.processes.PipelineGroup`: counts the
    events its children report accepted (they report at each ingest commit), ignores the rest."""

    def __init__(self) -> None:
        self.accepted = 0

    def event_accepted(self, n: int = 1) -> None:
        self.accepted += int(n)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kw: None


async def processes_drain(w_settings: Any, n_events: int, publish: Any
                          ) -> tuple[float, float, float]:
    """``pipeline_processes = N`` (from ``w_settings``): events per second from the output
    side — the events the children report accepted at their ingest commits (every
    ``commit_interval_s``) — between the first commits at or past 10 % and 90 % of the
    records, both sampled right after a commit (every 20 ms); the same over the whole drain
    (from the commit that made the records visible to the last one accepted); and seconds from
    the start until every child was ready. The events are in an open transaction until every child is ready
    (``await publish()`` commits it): no record is read before the group's last join, so no
    rebalance falls inside the measurement."""
    from agents.worker.processes import PipelineGroup

    metrics = _CountingMetrics()
    group = PipelineGroup(w_settings, int(w_settings.pipeline_processes), metrics,
                          json_lines=True)
    stop = asyncio.Event()
    t_start = time.perf_counter()
    group.start()
    task = asyncio.create_task(group.run(stop))
    t_ready = t_pub = 0.0
    t10 = t90 = 0.0
    n10 = n90 = 0
    try:
        while metrics.accepted < n_events:
            if task.done():
                await task
                raise RuntimeError("the pipeline processes stopped")
            now = time.perf_counter()
            if not t_ready and group.ready:
                t_ready = now - t_start
                await publish()
                t_pub = time.perf_counter()
            got = metrics.accepted
            if not t10 and got >= 0.1 * n_events:
                t10, n10 = now, got
            if not t90 and got >= 0.9 * n_events:
                t90, n90 = now, got
            await asyncio.sleep(0.02)
        t_all = time.perf_counter()
    finally:
        stop.set()
        await task
    whole = n_events / (t_all - t_pub)  # from the commit that made them visible to the last
    if not t90 or t90 <= t10:  # one commit took 10 % to 90 %: the whole drain instead
        return whole, whole, t_ready
    return (n90 - n10) / (t90 - t10), whole, t_ready


async def _produce_pending(s: Any, events: list[tuple[bytes, bytes]], through_tick: int,
                           txn_id: str, by_key: bool = False) -> Any:
    """Write ``events`` (round robin over the events partitions, or with ``by_key`` each on
    its key's partition under Kafka's default partitioner; whole record batches, in order
    within a partition) and a final close marker per partition to ``s.events_topic`` inside
    one transaction, left open; returns an async function that commits it and stops the
    producer."""
    from aiokafka import AIOKafkaProducer

    from agents.kafka.codec import close_marker, marker_key

    prod = AIOKafkaProducer(bootstrap_servers=s.bootstrap, transactional_id=txn_id,
                            linger_ms=20, max_batch_size=1 << 20, max_request_size=1 << 22)
    await prod.start()
    await prod.begin_transaction()
    parts = s.events_partitions
    futs = []
    ts_ms = int(time.time() * 1000)
    if by_key:
        from agents.kafka.partitioner import key_partition

        shares: list[list[tuple[bytes, bytes]]] = [[] for _ in range(parts)]
        for key, value in events:
            shares[key_partition(key, parts)].append((key, value))
    else:
        shares = [events[p::parts] for p in range(parts)]
    for p in range(parts):
        batch = prod.create_batch()
        for key, value in shares[p]:
            if batch.append(key=key, value=value, timestamp=ts_ms) is None:
                futs.append(await prod.send_batch(batch, s.events_topic, partition=p))
                batch = prod.create_batch()
                batch.append(key=key, value=value, timestamp=ts_ms)
        futs.append(await prod.send_batch(batch, s.events_topic, partition=p))
    mac_key = marker_key(s.noise_key())
    for p in range(parts):
        headers, value = close_marker(s.tick_bounds(through_tick)[0], True, mac_key=mac_key,
                                      topic=s.events_topic, partition=p)
        futs.append(await prod.send(s.events_topic, value, partition=p, headers=headers))
    await asyncio.gather(*futs)

    async def publish() -> None:
        await prod.commit_transaction()
        await prod.stop()

    return publish


async def ingest_processes_bench(bootstrap: str, tmp: Path, n_events: int, counts: list[int],
                                 pairs: int) -> list[tuple[int, int, float, float]]:
    """Ingest with ``pipeline_processes`` = each of ``counts`` in turn, ``pairs`` rounds
    (the order alternates between rounds): rows ``(round, N, events/s, seconds to ready)``.
    Each run reads its own copy of the events, committed once all its children are ready."""
    leaves = ps.hierarchy_paths(4, 4, 8)
    s = ps.make_settings(bootstrap, tmp, "bench-procs", leaves, tick_seconds=10.0,
                         commit_interval_s=0.25, events_partitions=4, shards=3)
    span = n_events / 10_000  # 10k events per second of event time
    events = [ps.event_bytes(leaves[i % len(leaves)], s.origin + span * i / n_events, 1.0)
              for i in range(n_events)]
    rows = []
    run = 0
    for rnd in range(pairs):
        for n in (counts if rnd % 2 == 0 else counts[::-1]):
            w = s.replace(app_id=f"bench-procs-w{run}", pipeline_processes=n,
                          events_topic=f"bench-procs.events{run}",
                          partials_topic=f"bench-procs.partials{run}",
                          counts_topic=f"bench-procs.counts{run}",
                          schedule_topic=f"bench-procs.schedule{run}",
                          ingest_checkpoints_topic=f"bench-procs.ci{run}",
                          release_checkpoints_topic=f"bench-procs.cr{run}")
            await ps.create_topics(w)
            publish = await _produce_pending(w, events, int(span / s.tick_seconds) + 1,
                                             f"bench-procs-txn{run}")
            rate, whole, ready = await processes_drain(w, n_events, publish)
            rows.append((rnd + 1, n, rate, ready))
            print(f"| {rnd + 1} | {n} | {rate:,.0f} | {whole:,.0f} | {ready:.1f} | "
                  f"{os.getloadavg()[0]:.2f} |", flush=True)
            run += 1
    return rows


async def latency_bench(bootstrap: str, tmp: Path, n_streams: int, ticks: int,
                        compact: bool = False) -> dict[str, Any]:
    names = [f"s{i}" for i in range(n_streams)]
    dom = tmp / "flat.toml"
    dom.write_text('kind = "flat"\nstreams = [' + ",".join(json.dumps(n) for n in names) + "]\n")
    app = f"bench-lat-{'compact' if compact else 'json'}-{n_streams}"
    extra: dict[str, Any] = {"compact_topic": f"{app}.compact", "counts_json": 0} if compact else {}
    s = ps.make_settings(bootstrap, tmp, app, ["x/y/z"], domain_file=str(dom), **extra,
                         tick_seconds=3.0, origin=float(int(time.time())) - 0.5,
                         schedule="clock", close_grace_s=0.1, allowed_lateness_s=0.0,
                         events_partitions=2,
                         shards=4, counts_partitions=4, strategy="auto", horizon=4095,
                         checkpoint_chunk_bytes=512 * 1024)
    await ps.create_topics(s)
    stop = asyncio.Event()
    steady: list[float] = []
    caught_up: list[float] = []

    def on_release(rel: Any) -> None:
        # Start-up (domain, banks, group joins) lets the clock run ahead: the first ticks are
        # a backlog. Measure only ticks that closed after every shard had released once.
        now = time.time()
        if caught_up and rel.closed_at > caught_up[0]:
            steady.append(now - rel.closed_at)
        elif w.stats["shard_ticks_released"] >= s.shards and not caught_up:
            caught_up.append(now)

    w = Worker(s, on_release=on_release)
    task = asyncio.create_task(w.run(stop))
    while len(steady) < ticks * s.shards:
        await asyncio.sleep(0.2)
    stop.set()
    await task
    lat = sorted(steady)
    import resource

    return {
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "library_tick": library_tick(w.mechanism(), n_streams),
        "streams": n_streams,
        "shards": s.shards,
        "samples": len(lat),
        "p50": statistics.median(lat),
        "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "strategy": w.mechanism().name,
    }


def library_tick(mechanism: Any, n_streams: int, ticks: int = 8) -> float:
    """Median seconds of one ``CounterBank.step`` over ``n_streams`` (sparse counts)."""
    return library_tick_cpu(mechanism, n_streams, ticks)[0]


def library_tick_cpu(mechanism: Any, n_streams: int, ticks: int = 8) -> tuple[float, float]:
    """Median wall seconds and median process CPU seconds of one ``CounterBank.step`` (noise
    included, as ``benchmarks/counter_bank.py`` times it) over ``n_streams`` streams, a tenth
    of them with a count of 1; the first step (plans, caches) is left out."""
    import numpy as np

    from stream_dp.counters import CounterBank

    bank = CounterBank(mechanism, [f"s{i}" for i in range(n_streams)], b"k" * 32)
    counts = np.zeros(n_streams)
    counts[:: 10] = 1.0
    times, cpus = [], []
    for _ in range(ticks):
        t0, c0 = time.perf_counter(), time.process_time()
        bank.step(counts)
        cpus.append(time.process_time() - c0)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]), statistics.median(cpus[1:])


async def backlog_bench(bootstrap: str, tmp: Path, n_ticks: int,
                        shape: tuple[int, int, int] = (4, 4, 8)) -> dict[str, float]:
    """Ticks per second for a backlog of ``n_ticks`` past ticks (clock schedule)."""
    from aiokafka import AIOKafkaProducer

    leaves = ps.hierarchy_paths(*shape)
    now = float(int(time.time()))
    name = "bench-backlog-" + "x".join(map(str, shape))
    s = ps.make_settings(bootstrap, tmp, name, leaves, schedule="clock",
                         tick_seconds=1.0, origin=now - n_ticks - 2, allowed_lateness_s=0.5,
                         close_grace_s=0.2, events_partitions=4, shards=3,
                         events_timestamp_type="CreateTime")
    await ps.create_topics(s)
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await prod.start()
    n_events = 0
    try:  # 20 events per tick, stamped when they happened (as if the workers had been down)
        for tick in range(1, n_ticks + 1):
            for i in range(20):
                ts = s.origin + tick - 1 + i / 20
                key, value = ps.event_bytes(leaves[(tick + i) % len(leaves)], ts)
                await prod.send(s.events_topic, value, key=key, timestamp_ms=int(ts * 1000) + 50)
                n_events += 1
        await prod.flush()
    finally:
        await prod.stop()
    stop = asyncio.Event()
    w = Worker(s)
    t0 = time.perf_counter()
    task = asyncio.create_task(w.run(stop))
    while not w.ready:
        await asyncio.sleep(0.01)
    t_ready = time.perf_counter()
    while w.stats["shard_ticks_released"] < n_ticks * s.shards:
        await asyncio.sleep(0.01)
    dt = time.perf_counter() - t_ready
    stop.set()
    await task
    return {"ticks": n_ticks, "events": n_events, "seconds": dt, "ticks_per_s": n_ticks / dt,
            "accepted": w.stats["accepted"], "startup": t_ready - t0,
            "streams": len(w.domain.names)}


async def restart_lag_bench(bootstrap: str, tmp: Path) -> list[tuple[str, float, float, float]]:
    """Release lag (s) per phase: (phase, first tick after it, p50, max over its last 5 ticks)."""
    s = ps.live_settings(bootstrap, tmp, "bench-restart", ps.hierarchy_paths(2, 4, 4),
                         events_partitions=4, shards=2, origin=float(int(time.time())) + 3)
    await ps.create_topics(s)
    w = ps.WorkerProcess(s, "w0", tmp)
    marks: list[tuple[str, float]] = []
    try:
        w.start()
        marks.append(("start", time.time()))
        await asyncio.sleep(14)
        w.kill9()
        await asyncio.sleep(4)
        w.start()
        marks.append(("after kill -9 (4 s down)", time.time()))
        await asyncio.sleep(14)
        w.terminate()
        await asyncio.sleep(4)
        w.start()
        marks.append(("after SIGTERM (4 s down)", time.time()))
        await asyncio.sleep(14)
    finally:
        w.stop()
    lag: dict[int, float] = {}
    for r in await ps.read_topic(bootstrap, s.counts_topic):
        m = json.loads(r.value)
        lag[m["tick"]] = max(lag.get(m["tick"], 0.0), r.timestamp / 1000 - m["tick_end"])
    rows = []
    bounds = [t for _, t in marks] + [time.time()]
    for i, (name, t_from) in enumerate(marks):
        ticks = sorted(t for t in lag if t_from <= s.tick_bounds(t)[1] + lag[t] < bounds[i + 1])
        if not ticks:
            continue
        vals = [lag[t] for t in ticks]
        rows.append((name, vals[0], statistics.median(vals), max(vals[-5:])))
    return rows


def reconcile_bench(reps: int = 5) -> dict[str, float]:
    import numpy as np

    from stream_dp.consistency import reconcile
    from stream_dp.domain import Domain

    dom = Domain.from_paths([f"a{i}/b{j}/c{k}" for i in range(10) for j in range(10) for k in range(99)])
    rng = np.random.default_rng(1)
    noisy = rng.normal(10.0, 2.0, dom.size)
    var = np.full(dom.size, 4.0)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        reconcile(dom, noisy, var)
        times.append(time.perf_counter() - t0)
    return {"nodes": dom.size, "median_s": statistics.median(times), "min_s": min(times)}


def _hierarchy_shape(n_streams: int) -> tuple[int, int, int]:
    """A 3-level hierarchy of about ``n_streams`` nodes: 10 × 100 × c leaves (10 × b × c below
    10^5)."""
    if n_streams >= 100_000:
        return 10, 100, max(1, round(n_streams / 1000))
    b = max(1, min(100, round((n_streams / 10) ** 0.5)))
    return 10, b, max(1, round(n_streams / (10 * b)))


class _Lines:
    """First time (Unix seconds) each tick showed up in a reader subprocess's JSON lines."""

    def __init__(self, name: str, proc: Any, tick_of: Any) -> None:
        self.name, self.proc, self.tick_of = name, proc, tick_of
        self.first: dict[int, float] = {}
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                return
            now = time.time()
            try:
                tick = int(self.tick_of(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue
            self.first.setdefault(tick, now)


def _rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _group_rss_mb(pgid: int) -> float:
    """Resident MiB of every process in group ``pgid`` (the embedded broker's)."""
    return _proc_usage(pgid)["broker_rss"]


_CLK_TCK: float = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _proc_usage(broker_pgid: int | None) -> dict[str, float]:
    """One walk of /proc: resident MiB and CPU seconds (user + system, since each process
    started) of this process's pipeline children (multiprocessing spawn: ``pipeline_*``), of
    its other children (``clients_*``: the event producer, the readers, the dashboard poller)
    and of process group ``broker_pgid`` (``broker_*``)."""
    me = os.getpid()
    out = dict.fromkeys(("pipeline_rss", "pipeline_cpu", "clients_cpu", "broker_rss",
                         "broker_cpu"), 0.0)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or entry.name == str(me):
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rfind(")") + 2:].split()
            ppid, pgrp = int(fields[1]), int(fields[2])
            cpu = (int(fields[11]) + int(fields[12])) / _CLK_TCK
            if broker_pgid is not None and pgrp == broker_pgid:
                out["broker_rss"] += _rss_mb(entry.name)
                out["broker_cpu"] += cpu
            elif ppid == me:
                if b"spawn_main" in (entry / "cmdline").read_bytes():
                    out["pipeline_rss"] += _rss_mb(entry.name)
                    out["pipeline_cpu"] += cpu
                else:
                    out["clients_cpu"] += cpu
        except (OSError, ValueError, IndexError):
            continue
    return out


def _pid_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _per_tick(samples: list[dict[str, float]], start: float, end: float, tick_seconds: float
              ) -> dict[str, float]:
    """Each sampled counter's increase per ``tick_seconds`` of wall time over the longest
    whole number of ticks that the samples taken in [``start``, ``end``] cover from the first
    one (the steady state: the counters' periodic pattern repeats every tick)."""
    inside = [x for x in samples if start <= x["t"] <= end]
    if len(inside) < 2:
        return {}
    a = inside[0]
    k = int((inside[-1]["t"] - a["t"]) // tick_seconds)
    if k < 1:
        return {}
    target = a["t"] + k * tick_seconds
    b = min(inside, key=lambda x: abs(x["t"] - target))
    n = (b["t"] - a["t"]) / tick_seconds
    out = {key: (b[key] - a[key]) / n for key in a if key != "t"}
    out["ticks"] = n
    return out


def _shipped(*names: str) -> dict[str, Any]:
    """The shipped defaults of these settings (pipeline_support's test values differ)."""
    import dataclasses

    from agents.config.settings import Settings

    defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
    return {n: defaults[n] for n in names}


async def scale_bench(broker: Any, tmp: Path, n_streams: int, ticks: int, tick_seconds: float,
                      active: float, processes: int, checkpoint_every: int = 1,
                      profile: str = "", dashboard_process: bool = False,
                      commit_interval_s: float | None = None,
                      shards: int = 0) -> dict[str, Any]:
    """``stream-dp worker`` as shipped (web server with the dashboard, the reconcile side agent
    and the pipeline — in ``processes`` child processes, or in this process for 0) on a 3-level
    hierarchy of about ``n_streams`` nodes, compact output only, live events (a fresh
    ``active`` fraction of the leaves per tick, from a producer subprocess).

    Phase 1 (``ticks`` ticks): the worker alone. Phase 2 (``ticks`` more): three readers in
    their own processes — the plain-Python example consumer, ``stream-dp tail compact
    --prefix`` and ``stream-dp tail compact-histograms --prefix`` — and the dashboard's
    snapshot polled over HTTP. Release latency = commit time − the tick's close (its last
    events partition closing it), for ticks that closed after every shard had released once
    (start-up lets the clock run ahead). Reader lag = first seen − the tick's release."""
    import os
    import shutil
    import subprocess

    from agents.commands.worker import serve
    from agents.config.domain import load_domain
    from agents.kafka.embedded_broker import free_port
    from agents.release.state import build_mechanism

    load_start = os.getloadavg()
    a, b, c = _hierarchy_shape(n_streams)
    leaves = [f"r{i}/m{j}/l{k}" for i in range(a) for j in range(b) for k in range(c)]
    leaves_file = tmp / "leaves.txt"
    leaves_file.write_text("\n".join(leaves) + "\n", encoding="utf-8")
    app = f"bench-scale-{n_streams}-{processes}-{checkpoint_every}"
    origin = float(int(time.time()))
    # as shipped, not the test helpers' shorter timings (0.5 s commits, 6 s sessions: up to 4x
    # the ingest transactions and checkpoints, 1.7x the heartbeats)
    timings = _shipped("commit_interval_s", "session_timeout_s", "transaction_timeout_s")
    if commit_interval_s is not None:
        timings["commit_interval_s"] = commit_interval_s
    s = ps.make_settings(broker.bootstrap, tmp, app, leaves, compact_topic=f"{app}.compact",
                         counts_json=0, histograms_json=0, tick_seconds=tick_seconds,
                         origin=origin, schedule="clock", close_grace_s=0.2,
                         allowed_lateness_s=0.0, events_partitions=2,
                         # one release shard per ≤ 250 000 streams (a compact record ≈ 4 MB;
                         # the worker refuses more than 600 000 a shard)
                         shards=shards or max(4, -(-n_streams // 250_000)),
                         counts_partitions=4, strategy="auto", horizon=4095,
                         max_events_per_tick=1_000_000, pipeline_processes=processes,
                         release_checkpoint_every=checkpoint_every,
                         web_host="127.0.0.1", web_port=free_port(),
                         **timings)
    t0 = time.time()
    domain = load_domain(s.domain_file)
    t_domain = time.time() - t0
    await ps.create_topics(s)
    env = {**os.environ, "STREAM_DP_BOOTSTRAP": s.bootstrap,
           "STREAM_DP_COMPACT_TOPIC": s.compact_topic, "PYTHONUNBUFFERED": "1"}
    py = sys.executable
    producer = subprocess.Popen([py, str(ROOT / "benchmarks" / "_live_events.py"), s.bootstrap,
                                 s.events_topic, str(leaves_file), str(origin),
                                 str(tick_seconds), str(active)], env=env)
    prefix = "r0/m0/l1"
    readers_cmd = {
        # the example as written, plus the client-side fetch backoff the service's own readers
        # use: the embedded broker answers empty fetches at once (a real one waits)
        "example consumer (all shards decoded)": (
            [py, "-c", "import runpy, sys; from agents.kafka.fetch_backoff import install; "
             "install(0.05); sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], "
             "run_name='__main__')", str(ROOT / "examples" / "subscribe_compact.py"), "--json",
             "--prefix", prefix],
            lambda m: m["tick"]),
        "stream-dp tail compact --prefix": (
            [py, "-m", "agents.cli", "tail", "compact", "--json", "--prefix", prefix],
            lambda m: m["tick"]),
        "stream-dp tail compact-histograms --prefix": (
            [py, "-m", "agents.cli", "tail", "compact-histograms", "--json", "--prefix", prefix],
            lambda m: m["tick"]),
    }
    released: dict[int, list[float]] = {}
    #: (tick, closed_at, latency) of every shard release after the start-up backlog
    latencies: list[tuple[int, float]] = []
    histograms: dict[int, float] = {}
    rss: list[tuple[float, float]] = []
    caught_up: list[float] = []

    def on_release(rel: Any) -> None:
        now = getattr(rel, "committed_at", None) or time.time()
        released.setdefault(rel.tick, []).append(now)
        if caught_up and rel.closed_at > caught_up[0]:
            latencies.append((rel.tick, now - rel.closed_at))
        elif not caught_up and len(released.get(rel.tick, [])) == s.shards:
            caught_up.append(now)

    # Histograms published: seen through the metrics call the reconcile side agent makes for
    # each one, not through serve's on_histogram callback — `stream-dp worker` passes none, and
    # with one the agent would build a 20 000-node JSON view per tick for it.
    from agents.telemetry.metrics import Metrics

    published = Metrics.histogram_published

    def histogram_published(self: Any, tick: int, *args: Any) -> None:
        histograms.setdefault(int(tick), time.time())
        published(self, tick, *args)

    Metrics.histogram_published = histogram_published  # type: ignore[method-assign]

    def complete(since: int) -> list[int]:
        return sorted(t for t, times in released.items() if t >= since
                      and len(times) == s.shards)

    stop = asyncio.Event()
    started_at = time.time()
    ready: list[float] = []
    workers: list[Any] = []
    #: the service's metrics: with pipeline processes the children's counts arrive there
    service_metrics: list[Any] = []
    dash_proc: Any = None
    dash_port = s.web_port
    if dashboard_process:
        # the capacity guide's layout for large deployments: `stream-dp worker --no-dashboard`
        # and `python -m agents.dashboard` beside it (its CPU is reported apart)
        dash_port = free_port()
        dash_proc = subprocess.Popen(
            [py, "-m", "agents.dashboard", "--port", str(dash_port), "--compact-topic",
             s.compact_topic, "--shards", str(s.shards), "--compact-histograms"],
            env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL)
    task = asyncio.create_task(serve(s, stop_event=stop, on_release=on_release,
                                     dashboard=not dashboard_process,
                                     started=lambda _srv: ready.append(time.time()),
                                     worker_created=workers.append,
                                     metrics_created=service_metrics.append))
    readers: list[_Lines] = []
    dash: dict[int, float] = {}
    dash_sizes: list[tuple[int, float]] = []
    last_rss = 0.0
    #: CPU seconds (and accepted events) sampled every 0.5 s: the worker is this process
    #: (pipeline in-process, reconcile side agent, web server + dashboard) plus its pipeline
    #: children; this process's own bookkeeping (these samples) is counted and subtracted
    cpu: list[dict[str, float]] = []
    bookkeeping = [0.0]
    phase_end: list[float] = []
    broker_pgid = broker.proc.pid if getattr(broker, "proc", None) else None

    # garbage-collector pauses of this process (all generations), as CPU of the thread that
    # collects: a large heap makes each full collection long
    import gc

    gc_cpu = [0.0, 0.0]  # total, start of the current collection

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_cpu[1] = time.thread_time()
        else:
            gc_cpu[0] += time.thread_time() - gc_cpu[1]

    gc.callbacks.append(on_gc)

    def sample() -> None:
        t0 = time.thread_time()
        usage = _proc_usage(broker_pgid)
        usage["dashboard_cpu"] = _pid_cpu(dash_proc.pid) if dash_proc is not None else 0.0
        row = {"t": time.time(), "self": time.process_time(), **usage,
               "accepted": (float(workers[0].stats["accepted"]) if workers
                            else _metric_sum(service_metrics, "stream_dp_events_total",
                                             result="accepted")),
               "dead_letters": (float(workers[0].stats["dead_letters"]) if workers
                                else _metric_sum(service_metrics,
                                                 "stream_dp_dead_letters_total")),
               "processed": float(workers[0].processed) if workers else float("nan")}
        bookkeeping[0] += time.thread_time() - t0
        row["bookkeeping"] = bookkeeping[0]
        row["gc"] = gc_cpu[0]
        for cid, (n, empty) in fetch_requests().items():  # which consumer polls how often
            row[f"fetch:{cid}"] = float(n)
            row[f"empty:{cid}"] = float(empty)
        cpu.append(row)

    async def wait_ticks(first: int, n: int) -> list[int]:
        nonlocal last_rss
        while True:
            got = complete(first)
            if len(got) >= n and max(histograms, default=0) >= got[n - 1]:
                sample()
                phase_end.append(cpu[-1]["t"])
                return got[:n]
            if task.done():
                await task
                raise RuntimeError("the worker stopped")
            sample()
            if time.time() - last_rss >= 1.0:
                t0 = time.thread_time()
                last_rss = time.time()
                rss.append((last_rss, _tree_rss_mb()))
                bookkeeping[0] += time.thread_time() - t0
            await asyncio.sleep(0.5)

    async def read_poller(proc: Any) -> None:
        while True:
            line = await proc.stdout.readline()
            if not line:
                return
            try:
                m = json.loads(line)
            except ValueError:
                continue
            dash_sizes.append((int(m["bytes"]), float(m["get_s"])))
            for t in m["ticks"]:
                dash.setdefault(int(t), float(m["t"]))
            if m["histogram"] is not None:
                dash.setdefault(-int(m["histogram"]), float(m["t"]))

    profiler: Any = None
    poller: Any = None
    poller_task: Any = None
    try:
        while not caught_up:
            if task.done():
                await task
                raise RuntimeError("the worker stopped before its first release")
            await asyncio.sleep(0.2)
        # Steady state: a loaded machine (or a slow start) leaves a backlog of ticks; measure
        # from the second tick after two consecutive ticks were released within a tick of
        # closing (at most 30 ticks of waiting)
        give_up = time.time() + 30 * tick_seconds
        while time.time() < give_up:
            if task.done():
                await task
                raise RuntimeError("the worker stopped")
            lat_of: dict[int, float] = {}
            for t, x in latencies:
                lat_of[t] = max(lat_of.get(t, 0.0), x)
            done = [t for t in complete(0) if t in lat_of]
            if len(done) >= 2 and all(lat_of[t] < tick_seconds for t in done[-2:]):
                break
            await asyncio.sleep(0.5)
        first_steady = complete(0)[-1] + 2
        if profile:
            # py-spy on this process over phase 1 only (not the start-up); --nonblocking: the
            # sampled process is not paused, so the CPU figures are not the profiler's
            while complete(first_steady - 1) == [] and not task.done():
                await asyncio.sleep(0.2)
            profiler = subprocess.Popen(
                [shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")), "record", "-r", "50", "-f", "raw", "--nonblocking", "--threads",
                 "-d", str(int(ticks * tick_seconds)), "-o", profile,
                 "--pid", str(os.getpid())], stdout=subprocess.DEVNULL)
        phase1 = await wait_ticks(first_steady, ticks)
        for name, (cmd, tick_of) in readers_cmd.items():
            proc = await asyncio.create_subprocess_exec(*cmd, env=env, cwd=str(ROOT),
                                                        stdout=asyncio.subprocess.PIPE)
            readers.append(_Lines(name, proc, tick_of))
        url = f"http://127.0.0.1:{dash_port}/dashboard/api/snapshot?prefix={prefix}"
        # the dashboard's snapshot polled every 0.5 s from a subprocess (its decoding is the
        # browser's work, not the worker's)
        poller = await asyncio.create_subprocess_exec(
            py, str(ROOT / "benchmarks" / "_poll_dashboard.py"), url, "0.5", env=env,
            cwd=str(ROOT), stdout=asyncio.subprocess.PIPE)
        poller_task = asyncio.create_task(read_poller(poller))
        # readers start live: measure from the second tick after they started
        phase2 = await wait_ticks(phase1[-1] + 3, ticks)
        deadline = time.time() + min(3 * tick_seconds, 20)  # readers finish the last ticks
        while time.time() < deadline and not all(phase2[-1] in r.first for r in readers):
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        producer.terminate()
        for r in readers:
            r.proc.terminate()
        if poller is not None:
            poller.terminate()
        await task
        for r in readers:
            await r.proc.wait()
        if poller is not None:
            await poller.wait()
            await poller_task
        producer.wait()
        if dash_proc is not None:
            dash_proc.terminate()
            dash_proc.wait()
        if profiler is not None:
            profiler.wait()
    Metrics.histogram_published = published  # type: ignore[method-assign]
    gc.callbacks.remove(on_gc)
    rel_at = {t: max(released[t]) for t in phase1 + phase2}
    mech = build_mechanism(s)
    lib, lib_cpu = library_tick_cpu(mech, domain.size, ticks=16)

    def cpu_of(ticks_of: list[int], end: float) -> dict[str, float]:
        """CPU seconds per tick over a phase (from its first tick's release to its end)."""
        got = _per_tick(cpu, rel_at[ticks_of[0]], end, tick_seconds)
        if got:
            got["worker"] = got["self"] - got["bookkeeping"] + got["pipeline_cpu"]
            # the records the ingest read (accepted, dead-lettered or late): each costs work
            got["events"] = (got["processed"] if workers
                             else active * len(leaves))  # by construction of the producer
            got["budget"] = 10 * lib_cpu + 2e-6 * got["events"]
        return got

    def latency(ticks_of: list[int]) -> tuple[float, float, int]:
        lat = sorted(x for t, x in latencies if t in set(ticks_of))
        return (statistics.median(lat), lat[min(len(lat) - 1, int(0.99 * len(lat)))], len(lat))

    def lags(first: dict[int, float], ticks_of: list[int]) -> tuple[int, float, float]:
        got = [first[t] - rel_at[t] for t in ticks_of if t in first]
        return (len(got), statistics.median(got) if got else float("nan"),
                max(got) if got else float("nan"))

    rss_run = [m for t, m in rss if t >= rel_at[phase1[0]]]
    rss_p2 = [m for t, m in rss if t >= rel_at[phase2[0]]]
    breakdown: dict[str, float] = {}
    if workers:  # in-process pipeline: where phase 1's releases spent their time (medians)
        rows = [r for r in workers[0].release_timings if r["tick"] in set(phase1)]
        for k in ("to_stage", "gathered", "step", "begin", "output", "checkpoint", "commit"):
            breakdown[k] = statistics.median(r[k] for r in rows) if rows else float("nan")
        irows = [r for r in workers[0].ingest_timings if r["tick"] in set(phase1)]
        for k in ("to_commit", "outputs", "checkpoint", "commit"):
            breakdown["ingest_" + k] = (statistics.median(r[k] for r in irows) if irows
                                        else float("nan"))
    return {
        "load": (load_start, os.getloadavg()),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started_at)),
        "nodes": domain.size, "leaves": len(leaves), "shape": (a, b, c),
        "tick_seconds": tick_seconds, "active": active, "domain_load_s": t_domain,
        "processes": processes, "dashboard_process": dashboard_process,
        "checkpoint_every": checkpoint_every,
        "commit_interval_s": timings["commit_interval_s"],
        "ready_s": (ready[0] - started_at) if ready else float("nan"),
        "first_release_s": caught_up[0] - started_at, "ticks": len(phase1),
        "phase1": latency(phase1), "phase2": latency(phase2),
        "library_tick": lib, "library_tick_cpu": lib_cpu, "strategy": mech.name,
        "cpu": {1: cpu_of(phase1, phase_end[0]), 2: cpu_of(phase2, phase_end[1])},
        "reconciled": (sum(1 for t in phase1 if t in histograms),
                       sum(1 for t in phase2 if t in histograms)),
        "reconcile_lag": lags(histograms, phase1),
        "readers": {r.name: lags(r.first, phase2) for r in readers},
        "dashboard_counts": lags(dash, phase2),
        "dashboard_histogram": lags({-k: v for k, v in dash.items() if k < 0}, phase2),
        "dashboard_bytes": statistics.median(x for x, _ in dash_sizes) if dash_sizes else 0,
        "dashboard_get_s": statistics.median(y for _, y in dash_sizes) if dash_sizes else 0,
        "rss_first": rss_run[0] if rss_run else float("nan"),
        "rss_last": rss_run[-1] if rss_run else float("nan"),
        "rss_max": max(rss_run) if rss_run else float("nan"),
        "rss_phase2_first": rss_p2[0] if rss_p2 else float("nan"),
        "broker_rss": _group_rss_mb(broker.proc.pid) if broker.proc else float("nan"),
        "breakdown": breakdown,
    }


def _tree_rss_mb() -> float:
    """Resident MiB of this process and its pipeline child processes (multiprocessing spawn)."""
    return _rss_mb() + _proc_usage(None)["pipeline_rss"]


def print_scale(r: dict[str, Any]) -> None:
    a, b, c = r["shape"]
    where = (f"{r['processes']} pipeline processes" if r["processes"]
             else "pipeline in the worker process")
    if r["dashboard_process"]:
        where += "; dashboard in its own process (python -m agents.dashboard)"
    print(f"\n## as shipped at {r['nodes']:,} nodes ({a}×{b}×{c} hierarchy, {r['leaves']:,} "
          f"leaves, {r['active']:.0%} active per tick, {r['tick_seconds']:g} s ticks, compact "
          f"output, 4 shards, dashboard + reconcile on, {where}, full release checkpoint every "
          f"{r['checkpoint_every']} tick(s), ingest commits at most every "
          f"{r['commit_interval_s']:g} s)")
    print(f"started {r['started_utc']} UTC, nproc {os.cpu_count()}, load average (1/5/15 min) "
          f"at the start {'/'.join(f'{x:.2f}' for x in r['load'][0])}, at the end "
          f"{'/'.join(f'{x:.2f}' for x in r['load'][1])}")
    print(f"start-up: domain file {r['domain_load_s']:.1f} s, serving after {r['ready_s']:.1f} s,"
          f" first complete tick after {r['first_release_s']:.1f} s")
    print("| phase | ticks | strategy | release p50 (s) | p99 (s) | library tick (s) | "
          "p50 / library | reconciled ticks |")
    print("|---|---|---|---|---|---|---|---|")
    for i, name in ((1, "1: worker alone"), (2, "2: with 3 reader processes + dashboard polls")):
        p50, p99, n = r[f"phase{i}"]
        print(f"| {name} | {r['ticks']} ({n} shard-ticks) | {r['strategy']} | {p50:.3f} | "
              f"{p99:.3f} | {r['library_tick']:.3f} | {p50 / r['library_tick']:.1f}x | "
              f"{r['reconciled'][i - 1]} / {r['ticks']} |")
    if r["breakdown"]:
        b_ = r["breakdown"]
        print("\nphase 1, median seconds per shard-tick release: " + ", ".join(
            f"{k} {b_[k]:.3f}" for k in ("to_stage", "gathered", "step", "begin", "output",
                                         "checkpoint", "commit")))
        print("(to_stage: tick closed → release stage starts on it = ingest close + partials "
              "transaction + fetch; gathered: tick closed → its last partial read by the "
              "release stage; begin/commit: transaction round trips to the broker; checkpoint: "
              "encode + send the counter state, or the progress record)")
        print("its ingest side, median per events partition: " + ", ".join(
            f"{k} {b_['ingest_' + k]:.3f}" for k in ("to_commit", "outputs", "checkpoint",
                                                     "commit"))
              + " (to_commit: close decided → its transaction starts)")
    print("\nCPU per tick (CPU seconds per tick of wall time over each phase's whole ticks; "
          "worker = this process — pipeline, reconcile side agent, web server with the "
          "dashboard — minus the benchmark's own sampling, plus pipeline child processes; "
          "budget = 10 × the library tick's CPU + 2 µs × events of the tick):")
    print("| phase | ticks | events / tick (accepted, dead letters) | worker CPU (s) | of it pipeline processes (s) | "
          "library tick CPU (s) | budget (s) | worker / budget | broker CPU (s) | "
          "producer + readers + poller CPU (s) | of the worker: garbage collection (s) | "
          "dashboard process CPU (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i in (1, 2):
        c = r["cpu"][i]
        if not c:
            print(f"| {i} | (too few samples) |")
            continue
        print(f"| {i} | {c['ticks']:.1f} | {c['events']:,.0f} ({c['accepted']:,.0f}, "
              f"{c['dead_letters']:,.0f}) | {c['worker']:.3f} | "
              f"{c['pipeline_cpu']:.3f} | {r['library_tick_cpu']:.4f} | {c['budget']:.3f} | "
              f"{c['worker'] / c['budget']:.2f} | {c['broker_cpu']:.3f} | "
              f"{c['clients_cpu'] - c['dashboard_cpu']:.3f} | {c['gc']:.3f} | "
              f"{c['dashboard_cpu']:.3f} |")
    for i in (1, 2):  # fetch round trips per tick of each in-process consumer
        c = r["cpu"][i]
        fetches = sorted((k[6:], v, c.get(f"empty:{k[6:]}", float("nan")))
                         for k, v in c.items() if k.startswith("fetch:"))
        if fetches:
            print(f"\nphase {i}, fetch requests per tick (of them empty) per consumer client_id: "
                  + ", ".join(f"{cid} {n:.0f} ({e:.0f})" for cid, n, e in fetches))
    print(f"\nworker RSS (with its pipeline processes), sampled every second: phase 1 start "
          f"{r['rss_first']:.0f} MiB, phase 2 start {r['rss_phase2_first']:.0f} MiB, end "
          f"{r['rss_last']:.0f} MiB, max {r['rss_max']:.0f} MiB; embedded broker at the end "
          f"{r['broker_rss']:.0f} MiB")
    print("\n| reader, phase 2 (after the tick's release was committed) | ticks seen | p50 (s) | "
          "max (s) |")
    print("|---|---|---|---|")
    n, p50, mx = r["reconcile_lag"]
    print(f"| reconcile side agent: histogram published (phase 1) | {n} / {r['ticks']} | "
          f"{p50:.2f} | {mx:.2f} |")
    rows = [*r["readers"].items(),
            ("dashboard /api/snapshot (counts, polled every 0.5 s)", r["dashboard_counts"]),
            ("dashboard /api/snapshot (histogram)", r["dashboard_histogram"])]
    for name, (n, p50, mx) in rows:
        print(f"| {name} | {n} / {r['ticks']} | {p50:.2f} | {mx:.2f} |")
    print(f"\ndashboard snapshot (prefix filter): {r['dashboard_bytes'] / 1024:.0f} KiB, "
          f"{r['dashboard_get_s'] * 1000:.0f} ms per GET")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--streams", type=int, default=100_000)
    ap.add_argument("--ticks", type=int, default=8)
    ap.add_argument("--backlog-ticks", type=int, default=600)
    ap.add_argument("--tick-seconds", type=float, default=5.0, help="scale: tick length")
    ap.add_argument("--active", type=float, default=0.1,
                    help="scale: fraction of the leaves with an event in each tick")
    ap.add_argument("--scale-ticks", type=int, default=10,
                    help="scale: steady ticks measured in each phase")
    ap.add_argument("--commit-interval-s", type=float, default=None,
                    help="scale: the worker's commit_interval_s (default: the shipped 2 s; "
                         "runs before 2026-11-26 19:50 UTC used the test helpers' 0.5 s)")
    ap.add_argument("--release-checkpoint-every", type=int, default=1,
                    help="scale: the worker's release_checkpoint_every setting")
    ap.add_argument("--shards", type=int, default=0,
                    help="scale: release shards (default 0: 4, or one per 250 000 streams)")
    ap.add_argument("--pipeline-processes", type=int, default=0,
                    help="scale: the worker's pipeline_processes setting (0: in-process)")
    ap.add_argument("--ingest-processes", default="",
                    help="ingest: compare pipeline_processes values instead of the bare "
                    "consumer, e.g. 1,2 (rounds: --pairs)")
    ap.add_argument("--pairs", type=int, default=3, help="ingest: rounds of --ingest-processes")
    ap.add_argument("--dashboard-process", action="store_true",
                    help="scale: the worker without its dashboard, `python -m agents.dashboard` "
                    "beside it (the capacity guide's layout for large deployments)")
    ap.add_argument("--profile", default="",
                    help="scale: write a py-spy raw profile of phase 1 of this process here")
    ap.add_argument("--idle-ticks", default="10,20",
                    help="idle: comma-separated tick lengths (seconds)")
    ap.add_argument("--idle-windows", type=int, default=3,
                    help="idle: ticks measured per worker")
    ap.add_argument("--idle-trees", default="",
                    help="idle: label=PATH,... code trees to run the worker from (default: this)")
    ap.add_argument("--idle-profile", default="",
                    help="idle: write a py-spy raw profile of one idle window per run here")
    ap.add_argument("--idle-dashboard", action="store_true",
                    help="idle: with the worker's in-process dashboard (default: --no-dashboard)")
    ap.add_argument("--only", default="", help="comma-separated: scale,ingest,latency,backlog,"
                    "restart,modes,reconcile,idle (default: all but modes and idle)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))

    def want(name: str) -> bool:
        return not only or name in only

    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        me = asyncio.current_task()
        assert me is not None
        watchdog = asyncio.create_task(_broker_watchdog(broker, me))
        try:
            await _run(args, only, want, broker, tmp)
        finally:
            watchdog.cancel()


async def _broker_watchdog(broker: Any, main_task: asyncio.Task[Any]) -> None:
    """Stop the run when the embedded broker dies (it holds every record in RAM: the kernel's
    OOM killer takes it first on large runs) instead of waiting on it for ever. Its launcher
    exits with its server (a broker killed with -9 mid-run: the run stopped 2 s and 9 s later
    in two tries), so polling the launcher every 2 s is enough and costs the measured
    processes nothing."""
    while broker.proc is None or broker.proc.poll() is None:
        await asyncio.sleep(2.0)
    print(f"the embedded broker exited ({broker.proc.returncode}; out of memory? see dmesg and "
          f"{broker.log_path}): stopping the benchmark", file=sys.stderr, flush=True)
    main_task.cancel()


async def _run(args: Any, only: set[str], want: Any, broker: Any, tmp: str) -> None:
    """The benchmarks ``--only`` selects, against ``broker``."""
    if want("idle") and only:
        from benchmarks.idle_worker import idle_bench, parse_trees, print_idle

        load0 = os.getloadavg()
        idle_rows = await idle_bench(broker, Path(tmp), parse_trees(args.idle_trees),
                                     args.streams,
                                     [float(x) for x in args.idle_ticks.split(",")],
                                     args.idle_windows, args.idle_profile,
                                     args.idle_dashboard)
        print_idle(idle_rows, (load0, os.getloadavg()), args.idle_dashboard)
        if only == {"idle"}:
            return
    if want("scale"):
        r = await scale_bench(broker, Path(tmp), args.streams, args.scale_ticks,
                              args.tick_seconds, args.active, args.pipeline_processes,
                              args.release_checkpoint_every, args.profile,
                              args.dashboard_process, args.commit_interval_s, args.shards)
        print_scale(r)
    if want("backlog"):
        print(f"\n## backlog release, {args.backlog_ticks} past ticks (20 events per tick, "
              "clock schedule, CreateTime records, 3 release shards)")
        print("| streams | start-up until ready (s) | ready -> all released (s) | ticks/s | "
              "count messages/s | events accepted |")
        print("|---|---|---|---|---|---|")
        for shape in ((2, 2, 2), (4, 4, 8)):
            b = await backlog_bench(broker.bootstrap, Path(tmp), args.backlog_ticks, shape)
            print(f"| {b['streams']} | {b['startup']:.1f} | {b['seconds']:.1f} | "
                  f"{b['ticks_per_s']:.0f} | {b['ticks_per_s'] * b['streams']:,.0f} | "
                  f"{b['accepted']} / {b['events']} |")
    if want("restart"):
        lag_rows = await restart_lag_bench(broker.bootstrap, Path(tmp))
        print("\n## release lag around restarts (1 s ticks; lag = count message timestamp "
              "- tick end)")
        print("| phase | first tick (s) | p50 (s) | max of last 5 ticks (s) |")
        print("|---|---|---|---|")
        for name, first, p50, tail in lag_rows:
            print(f"| {name} | {first:.2f} | {p50:.2f} | {tail:.2f} |")
    if want("modes") and only:
        print(f"\n## tick latency by output mode, {args.streams} streams (pipeline only)")
        print("| mode | shards | strategy | p50 (s) | p99 (s) | library tick (s) | "
              "p50 / library | peak RSS (MiB) |")
        print("|---|---|---|---|---|---|---|---|")
        for compact in (True, False):  # compact first: its peak RSS is its own
            lat = await latency_bench(broker.bootstrap, Path(tmp), args.streams, args.ticks,
                                      compact=compact)
            print(f"| {'compact only' if compact else 'per-stream JSON'} | {lat['shards']} | "
                  f"{lat['strategy']} | {lat['p50']:.3f} | {lat['p99']:.3f} | "
                  f"{lat['library_tick']:.3f} | {lat['p50'] / lat['library_tick']:.0f}x | "
                  f"{lat['rss_mb']:.0f} |")
    if not (want("ingest") or want("latency")):
        return
    if args.ingest_processes:
        counts = [int(x) for x in args.ingest_processes.split(",")]
        print(f"\n## ingest with pipeline_processes = {counts}, {args.events} events, "
              f"4 partitions, 149-node hierarchy ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())}"
              f" UTC, nproc {os.cpu_count()}, the broker on the same cores)")
        print("| round | pipeline_processes | events/s (accepted, 10 % -> 90 %) | "
              "events/s (whole drain) | start to every child ready (s) | "
              "load average (1 min) |")
        print("|---|---|---|---|---|---|")
        prow = await ingest_processes_bench(broker.bootstrap, Path(tmp), args.events,
                                            counts, args.pairs)
        for n in counts:
            rates = [r for _, k, r, _ in prow if k == n]
            print(f"\npipeline_processes = {n}: median {statistics.median(rates):,.0f} "
                  f"events/s over {len(rates)} runs")
        if len(counts) == 2:
            ratios = [b / a for (_, _, a, _), (_, _, b, _) in
                      zip(sorted(r for r in prow if r[1] == counts[0]),
                          sorted(r for r in prow if r[1] == counts[1]), strict=True)]
            print(f"ratio N={counts[1]} / N={counts[0]} per round: "
                  + ", ".join(f"{x:.2f}" for x in ratios)
                  + f"; median {statistics.median(ratios):.2f}")
        return
    rows = await ingest_bench(broker.bootstrap, Path(tmp), args.events)
    print(f"\n## ingest, {args.events} events, 4 partitions, 149-node hierarchy")
    print("| run | bare aiokafka consumer (events/s) | worker (events/s) | ratio |")
    print("|---|---|---|---|")
    for name, bare, worker in rows:
        print(f"| {name} | {bare:,.0f} | {worker:,.0f} | {worker / bare:.0%} |")
    ratios = sorted(w / b for _, b, w in rows)
    print(f"\nmedian ratio {statistics.median(ratios):.0%} "
          f"(min {ratios[0]:.0%}, max {ratios[-1]:.0%})")
    # where the status lives (agents.ingest does not re-export it: a getattr on the package
    # printed "pure-Python path" whatever ran)
    from agents.ingest.records import FAST_PATH_STATUS

    print(FAST_PATH_STATUS)
    if not want("latency"):  # --only ingest: the ingest table alone
        return
    lat = await latency_bench(broker.bootstrap, Path(tmp), args.streams, args.ticks)
    print(f"\n## tick latency, {lat['streams']} streams, {lat['shards']} shards, "
          f"strategy {lat['strategy']}")
    print("| samples (shard-ticks) | p50 (s) | p99 (s) |")
    print("|---|---|---|")
    print(f"| {lat['samples']} | {lat['p50']:.3f} | {lat['p99']:.3f} |")
    rec = reconcile_bench()
    print(f"\n## reconcile per tick, {rec['nodes']} nodes (3-level tree)")
    print("| median (s) | min (s) |")
    print("|---|---|")
    print(f"| {rec['median_s']:.4f} | {rec['min_s']:.4f} |")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except asyncio.CancelledError:  # the broker watchdog stopped the run (it said why)
        sys.exit(3)
