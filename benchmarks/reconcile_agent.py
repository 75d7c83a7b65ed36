"""Reconcile side agent: time per tick for ~10^3 and ~10^4-node domains, against a real broker.

For each domain (a 3-level hierarchy and a 3-attribute grid) the script publishes TICKS ticks of
synthetic releases to a counts topic on the embedded broker, runs one
:class:`agents.reconcile.agent.Reconciler` until it has published every histogram, and prints:

* ``solve ms``: the consistency solve per tick (``diagnostics.seconds``), median and max;
* ``agent ms/tick``: wall time of the whole agent per tick (decode, assemble, solve, encode,
  publish and commit), measured over the run from the first to the last histogram, next to the
  solve time measured in the same run;
* ``direct ms``: ``stream_dp.consistency.reconcile`` called directly on the same inputs
  (no Kafka), the baseline for the agent's overhead.

Usage: ``python benchmarks/reconcile_agent.py [--ticks 20] [--sizes 1000,10000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import signal
import statistics
import sys
import time
import uuid

import numpy as np
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]

from agents.kafka.codec import count_message, encode
from agents.kafka.embedded_broker import EmbeddedBroker
from agents.reconcile.agent import Reconciler
from agents.reconcile.config import ReconcilerConfig
from stream_dp.consistency import reconcile
from stream_dp.domain import Domain


def hierarchy(n_target: int) -> Domain:
    """A 3-level tree (root, a regions, a·b cities, a·b·c leaves) with about n_target nodes."""
    a = max(2, round(n_target ** (1 / 3) / 2))
    c = max(2, round(math.sqrt(n_target / (a * a))))
    b = a
    while 1 + a + a * b + a * b * c < n_target:
        b += 1
    paths = [f"r{i}/c{j}/l{k}" for i in range(a) for j in range(b) for k in range(c)]
    return Domain.from_paths(paths, name=f"tree-{len(paths)}")


def grid(n_target: int) -> Domain:
    """A 3-attribute grid with about n_target nodes (total + marginals + cells)."""
    k = max(2, round(n_target ** (1 / 3)))
    sizes = (k, k, max(2, round(n_target / (k * k))))
    attrs = {f"a{i}": [f"v{j}" for j in range(s)] for i, s in enumerate(sizes)}
    return Domain.grid(attrs, name=f"grid-{math.prod(sizes)}")


def releases(domain: Domain, tick: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([11, tick])
    n = len(domain.names)
    return rng.normal(100.0, 30.0, n), rng.uniform(1.0, 5.0, n)


async def run_one(bootstrap: str, domain: Domain, ticks: int) -> dict[str, float]:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    counts, hist = f"{name}.counts", f"{name}.hist"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(counts, 4, 1), NewTopic(hist, 1, 1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20,
                                max_batch_size=1 << 20)
    await producer.start()
    for t in range(1, ticks + 1):
        values, stderr = releases(domain, t)
        for s, v, e in zip(domain.names, values.tolist(), stderr.tolist(), strict=True):
            msg = count_message(stream=s, tick=t, tick_start=t - 1.0, tick_end=float(t), value=v,
                                stderr=e, strategy="naive", p=0.9,
                                privacy={"model": "pure", "epsilon": 1.0}, cap=1.0, horizon=1023)
            await producer.send(counts, encode(msg), key=s.encode())
    await producer.flush()
    await producer.stop()

    stamps: list[float] = []

    async def on_hist(msg: dict[str, object]) -> None:
        stamps.append(time.perf_counter())

    cfg = ReconcilerConfig(bootstrap=bootstrap, counts_topic=counts, histograms_topic=hist,
                           leader_topic=f"{name}.leader", leader_group=f"{name}.group",
                           domain_name=domain.name, session_timeout_ms=6000,
                           heartbeat_interval_ms=500, poll_ms=100)
    r = Reconciler(cfg, domain, on_histogram=on_hist)
    stop = asyncio.Event()
    task = asyncio.create_task(r.run(stop))
    while r.published < ticks:
        await asyncio.sleep(0.05)
        if task.done():
            task.result()
    stop.set()
    await task
    direct = []
    for t in range(1, ticks + 1):
        values, stderr = releases(domain, t)
        t0 = time.perf_counter()
        reconcile(domain, values, stderr**2)
        direct.append(time.perf_counter() - t0)
    per_tick = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else math.nan
    return {
        "nodes": len(domain.names),
        "solve_med": statistics.median(r.solve_seconds) * 1e3,
        "solve_max": max(r.solve_seconds) * 1e3,
        "agent": per_tick * 1e3,
        "direct_med": statistics.median(direct) * 1e3,
    }


async def main_async(ticks: int, sizes: list[int]) -> None:
    with EmbeddedBroker() as broker:
        print(f"{'domain':<12} {'nodes':>7} {'solve ms med':>13} {'solve ms max':>13} "
              f"{'agent ms/tick':>14} {'direct ms med':>14}")
        for size, make in itertools.product(sizes, (hierarchy, grid)):
            domain = make(size)
            row = await run_one(broker.bootstrap, domain, ticks)
            print(f"{domain.kind:<12} {row['nodes']:>7} {row['solve_med']:>13.2f} "
                  f"{row['solve_max']:>13.2f} {row['agent']:>14.1f} {row['direct_med']:>14.2f}",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--sizes", default="1000,10000")
    args = parser.parse_args()
    # SIGTERM unwinds normally, so the embedded broker is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    asyncio.run(main_async(args.ticks, [int(s) for s in args.sizes.split(",")]))


if __name__ == "__main__":
    main()
