"""The release stage hands its committed compact records to the in-process reconcile agent
(issue #25): the agent takes them instead of fetching them back and publishes exactly the
histograms a reconcile agent reading everything from the topic publishes.

The oracle is a second :class:`Reconciler` run afterwards on the same compact topic, with no
hand-over, into its own chunk topic: every tick's chunk records must match byte for byte
except the solver's wall time (``diagnostics.seconds``, documented as the one field that may
differ between two publications of a tick). With a second worker (no hand-over) owning some of
the shards, the agent must still read those shards from the topic.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agents.config.domain import load_domain
from stream_dp.compact_histograms import decode_histogram_chunk
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

N_TICKS = 8
#: ticks released before the agent leads (read from the topic: a restart's backlog)
BACKLOG_TICKS = 2


def _events(s: Any, leaves: list[str], tick: int, rng: np.random.Generator) -> list[Any]:
    lo, hi = s.tick_bounds(tick)
    return [ps.event_bytes(leaves[int(rng.integers(len(leaves)))],
                           float(rng.uniform(lo, hi)), 1.0) for _ in range(40)]


async def _close(s: Any, tick: int) -> None:
    """Progress close markers (not final: more ticks follow) that close ``tick`` in every
    events partition."""
    from aiokafka import AIOKafkaProducer

    from agents.kafka.codec import close_marker, marker_key

    at = s.tick_bounds(tick)[1] + s.allowed_lateness_s
    prod = AIOKafkaProducer(bootstrap_servers=s.bootstrap)
    await prod.start()
    try:
        for p in range(s.events_partitions):
            headers, value = close_marker(at, False, mac_key=marker_key(s.noise_key()),
                                          topic=s.events_topic, partition=p)
            await prod.send(s.events_topic, value, partition=p, headers=headers)
        await prod.flush()
    finally:
        await prod.stop()


async def _wait(cond: Any, what: str, timeout_s: float = 120.0) -> None:
    for _ in range(int(timeout_s / 0.25)):
        if cond():
            return
        await asyncio.sleep(0.25)
    raise TimeoutError(what)


async def _final_chunks(bootstrap: str, topic: str) -> dict[int, list[tuple[dict[str, Any],
                                                                            bytes]]]:
    """tick -> its chunk records (header without the solver's wall time, column bytes), the
    last publication of each tick."""
    out: dict[int, list[tuple[dict[str, Any], bytes]]] = {}
    for r in await ps.read_topic(bootstrap, topic):
        c = decode_histogram_chunk(r.value)
        h = json.loads(json.dumps(c.header))
        h.get("diagnostics", {}).pop("seconds", None)
        cols = c.values.tobytes() + c.noisy.tobytes() + c.stderr.tobytes()
        if int(h["chunk"]) == 0:
            out[int(h["tick"])] = []
        out[int(h["tick"])].append((h, cols))
    return out


def _crash_once() -> Any:
    """A :class:`Reconciler` with a kill point: after publishing the first tick released while
    it leads, it waits until the next tick's records have been taken over (the consumer moved
    past them) and its offsets committed, then its leading loop dies before adding them. The
    agent restarts the loop from the committed offsets, so it must read them from the topic."""
    from agents.reconcile.agent import Reconciler

    class CrashOnce(Reconciler):
        armed = False
        crashed = False

        async def _publish(self, producer: Any, tick: Any) -> None:
            await super()._publish(producer, tick)
            if not self.armed and tick.tick > BACKLOG_TICKS:
                self.armed = True
                for _ in range(200):  # the test releases the next tick now
                    if self._handed:
                        break
                    await asyncio.sleep(0.05)

        def _ingest(self, assembler: Any, batches: Any, handed: Any = None) -> list[Any]:
            if self.armed and handed and not self.crashed:
                self.crashed = True
                raise RuntimeError("kill point: records taken over, not yet added")
            return super()._ingest(assembler, batches, handed)

    return CrashOnce


@pytest.mark.parametrize("second_worker, crash", [(False, False), (True, False), (False, True)])
async def test_handed_over_records_give_the_histograms_of_the_topic(
    kafka_broker: str, unique_name: str, tmp_path: Path, second_worker: bool, crash: bool
) -> None:
    from agents.reconcile.agent import Reconciler
    from agents.reconcile.config import ReconcilerConfig
    from agents.worker.pipeline import Worker

    leaves = ps.hierarchy_paths(2, 2, 3)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves,
                         compact_topic=f"{unique_name}.compact", counts_json=0,
                         histograms_json=0)
    await ps.create_topics(s)
    oracle_topic = f"{unique_name}.oracle.histograms"
    await ps.create_topic(kafka_broker, oracle_topic)
    domain = load_domain(s.domain_file)
    rng = np.random.default_rng(25)
    for t in range(1, BACKLOG_TICKS + 1):
        await ps.produce(s, _events(s, leaves, t, rng))
    await _close(s, BACKLOG_TICKS)

    stop = asyncio.Event()
    worker = Worker(s)
    rec = (_crash_once() if crash else Reconciler)(ReconcilerConfig.from_settings(s, domain.name, session_timeout_ms=6000,
                                                    histogram_chunk_nodes=5), domain)
    worker.on_compact = rec.hand_over
    tasks = [asyncio.create_task(worker.run(stop)), asyncio.create_task(rec.run(stop))]
    if second_worker:  # owns some shards; its records reach the agent only through the topic
        other = Worker(ps.make_settings(kafka_broker, tmp_path, unique_name, leaves,
                                        compact_topic=s.compact_topic, counts_json=0,
                                        histograms_json=0, worker_id="w1"))
        tasks.append(asyncio.create_task(other.run(stop)))
    try:
        await _wait(lambda: rec.last_tick >= BACKLOG_TICKS, "the backlog's histograms")
        for t in range(BACKLOG_TICKS + 1, N_TICKS + 1):  # released while the agent leads
            await ps.produce(s, _events(s, leaves, t, rng))
            await _close(s, t)
            await _wait(lambda t=t: rec.last_tick >= t, f"the histogram of tick {t}")
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert rec.handed_over > 0, (rec.handed_over, rec.handed_missed)
    if crash:
        assert rec.crashed
    if second_worker:  # it did release shards the agent had to read from the topic
        assert other.stats["shard_ticks_released"] > 0
    print("handed over", rec.handed_over, "missed", rec.handed_missed,
          "released here", worker.stats["shard_ticks_released"])

    # the oracle: everything read from the topic, nothing handed over
    ostop = asyncio.Event()
    oracle = Reconciler(ReconcilerConfig.from_settings(
        s, domain.name, session_timeout_ms=6000, histogram_chunk_nodes=5,
        histogram_blocks_topic=oracle_topic, leader_group=f"{unique_name}.oracle",
        leader_topic=f"{unique_name}.oracle.leader", client_id="oracle",
        instance_id="oracle"), domain)
    otask = asyncio.create_task(oracle.run(ostop))
    try:
        await _wait(lambda: oracle.last_tick >= N_TICKS, "the oracle's histograms")
    finally:
        ostop.set()
        await otask
    assert oracle.handed_over == 0
    got = await _final_chunks(kafka_broker, s.histogram_blocks_topic)
    want = await _final_chunks(kafka_broker, oracle_topic)
    assert set(want) >= set(range(1, N_TICKS + 1))
    assert set(got) >= set(range(1, N_TICKS + 1))
    for t in range(1, N_TICKS + 1):
        assert got[t] == want[t], t
