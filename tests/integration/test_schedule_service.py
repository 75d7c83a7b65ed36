"""The public release schedule against the real broker (issue: P1–P4).

P1 — neighbouring logs: two deployments on the clock schedule read the same events, one of them
plus nasty extra records (far-future, beyond-skew, before-origin, malformed, a forged close
marker, one ordinary event, inside a burst, on several partitions); the released ticks are the
same and the values differ only by the one accepted event's own decayed contribution.
P2 — a fresh deployment reading the same log later (a backlog, at processing speed) publishes
the very same values; a deployment following persisted closing points on a copy of the log too.
P3 — partitions without events do not hold back releases.
P4 — the same deployment on a changed copy of its log refuses to release (worker stops).
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
from agents.ingest.schedule import ScheduleMismatch
from agents.kafka.codec import close_marker, marker_key
from agents.worker.pipeline import Worker
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LEAVES = ps.hierarchy_paths(2, 2, 2)


def _values(got: dict[tuple[str, int], list[bytes]], through: int) -> dict[tuple[str, int], float]:
    return {k: json.loads(v[0])["value"] for k, v in got.items() if k[1] <= through}


_produce_raw = ps.produce_raw


def _rename(s: Settings, name: str, **kw: Any) -> Settings:
    return s.replace(
        app_id=name, counts_topic=f"{name}.counts", dlq_topic=f"{name}.dlq",
        partials_topic=f"{name}.partials", ingest_checkpoints_topic=f"{name}.ckpt.ingest",
        release_checkpoints_topic=f"{name}.ckpt.release", schedule_topic=f"{name}.schedule",
        leader_topic=f"{name}.leader", **kw,
    )


async def test_p1_p2_p3_neighbouring_logs_backlog_and_silent_partitions(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    a = ps.live_settings(kafka_broker, tmp_path, f"{unique_name}-a", LEAVES, epsilon=1e4, p=0.8,
                         events_partitions=3, shards=2, allowed_lateness_s=1.0,
                         max_future_skew_s=60.0)
    b = _rename(a, f"{unique_name}-b", events_topic=f"{unique_name}-b.events")
    for s in (a, b):
        await ps.create_topics(s)
    # The waves below are stamped with the wall clock and expected in ticks 1..4: tick 1 must
    # still lie ahead once the topics exist (on a loaded machine creating six topics took longer
    # than the 1-2 s live_settings leaves, and tick 1's wave was stamped into tick 2).
    o = float(int(time.time())) + 2.0
    a, b = a.replace(origin=o), b.replace(origin=o)
    domain = load_domain(a.domain_file)
    stop = asyncio.Event()
    workers = [Worker(a), Worker(b)]
    tasks = [asyncio.create_task(w.run(stop)) for w in workers]
    e_tick = 3
    try:
        # Live traffic for ticks 1..4, only on partition 0 and 1 (partition 2 stays silent),
        # each wave sent to both deployments; a burst of 1500 events in tick 2.
        for tick in range(1, 5):
            while time.time() < o + tick - 1 + 0.1:
                await asyncio.sleep(0.02)
            n = 1500 if tick == 2 else 30
            wave = [(LEAVES[i % 8].encode(),
                     json.dumps({"key": LEAVES[i % 8], "ts": time.time(), "value": 1.0}).encode(),
                     i % 2, []) for i in range(n)]
            extra: list[Any] = []
            if tick == e_tick:
                now = time.time()
                # forged: signed with a key derived from another noise key than the worker's
                marker_headers, marker = close_marker(
                    o + 1e5, True, mac_key=marker_key(bytes.fromhex("5e" * 16 + "a7" * 16)),
                    topic=a.events_topic, partition=1)
                extra = [
                    (b"e", json.dumps({"key": LEAVES[0], "ts": now}).encode(), 2, []),  # counted
                    (b"e", json.dumps({"key": LEAVES[1], "ts": now + 50}).encode(), 0, []),
                    (b"e", json.dumps({"key": LEAVES[2], "ts": now + 1e6}).encode(), 1, []),
                    (b"e", json.dumps({"key": LEAVES[3], "ts": o - 5e5}).encode(), 2, []),
                    (b"e", b"{not json", 0, []),
                    (None, marker, 1, marker_headers),  # a forged close marker: ignored
                ]
            half = len(wave) // 2
            await asyncio.gather(
                _produce_raw(a, wave),
                _produce_raw(b, wave[:half] + extra + wave[half:]),
            )
        last = 7
        got_a = await ps.wait_for_ticks(a, domain.size, last, timeout_s=60, poll_s=0.5)
        got_b = await ps.wait_for_ticks(b, domain.size, last, timeout_s=60, poll_s=0.5)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    va, vb = _values(got_a, last), _values(got_b, last)
    assert set(va) == set(vb) == {(n, t) for n in domain.names for t in range(1, last + 1)}
    nodes_e = {domain.names[int(i)] for i in domain.nodes_for_event(LEAVES[0])}
    for (name, t), x in va.items():
        want = a.p ** (t - e_tick) if (name in nodes_e and t >= e_tick) else 0.0
        assert vb[(name, t)] - x == pytest.approx(want, abs=5e-3), (name, t)
    # everything sent on time was counted: ticks 1..4 exact (ε = 10^4)
    total = [va[("all", t)] for t in range(1, 5)]
    expect, acc = [], 0.0
    for t, n in enumerate([30, 1500, 30, 30], start=1):
        acc = a.p * acc + n
        expect.append(acc)
        assert total[t - 1] == pytest.approx(acc, abs=0.05)
    reasons = sorted(json.loads(r.value)["reason"] for r in await ps.read_topic(kafka_broker,
                                                                                b.dlq_topic))
    assert reasons == ["before_origin", "future", "malformed_json", "unexpected_marker"]
    assert workers[1].stats["accepted"] == workers[0].stats["accepted"] + 2  # +now, +50 s ahead

    # P2: a fresh deployment reads A's events topic later: a backlog of past ticks, released
    # at processing speed, with the very same values.
    c = _rename(a, f"{unique_name}-c", events_topic=a.events_topic)
    await ps.create_topics(c)
    stop = asyncio.Event()
    worker = Worker(c)
    task = asyncio.create_task(worker.run(stop))
    try:
        got_c = await ps.wait_for_ticks(c, domain.size, last, timeout_s=60, poll_s=0.5)
    finally:
        stop.set()
        await task
    # another deployment (app id, schedule topic) draws its own noise (docs/privacy.md,
    # "Threat model"): the same decisions, hence the same counts up to the noise (ε = 10^4)
    vc = _values(got_c, last)
    assert set(vc) == set(va)
    assert all(vc[k] == pytest.approx(va[k], abs=5e-3) for k in va)
    assert any(vc[k] != va[k] for k in va)


def _fresh_state(s: Settings, tag: str) -> Settings:
    """The same deployment (app id, schedule topic) with fresh state, reading events topic
    ``<name>.<tag>``, publishing to its own counts topic."""
    name = s.app_id
    return s.replace(
        events_topic=f"{name}.{tag}", counts_topic=f"{name}.counts-{tag}",
        partials_topic=f"{name}.partials-{tag}",
        ingest_checkpoints_topic=f"{name}.ckpt-{tag}.ingest",
        release_checkpoints_topic=f"{name}.ckpt-{tag}.release",
    )


_run_until = ps.run_worker_until


async def test_p2_p4_persisted_closing_points_reproduce_a_copy_and_refuse_a_changed_one(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    x = ps.make_settings(kafka_broker, tmp_path, unique_name, LEAVES, epsilon=1.0, p=0.7,
                         tick_seconds=1.0, events_partitions=2, shards=2)
    await ps.create_topics(x)
    domain = load_domain(x.domain_file)
    log = [(LEAVES[i % 8], x.origin + 0.013 * i, 1.0) for i in range(600)]  # ticks 1..8
    await ps.produce(x, (ps.event_bytes(*e) for e in log))
    await ps.close_ticks(x, 8)
    first, _ = await _run_until(x, domain.size, 8)

    # the same deployment (app id, events and schedule topics) from scratch: fresh state
    # topics, the persisted closing points followed, the same releases byte for byte
    copy = _fresh_state(x, "copy").replace(events_topic=x.events_topic)
    await ps.create_topics(copy)
    records = await ps.read_topic(kafka_broker, x.events_topic)
    again, _ = await _run_until(copy, domain.size, 8)
    assert {k: again[k][0] for k in first} == {k: v[0] for k, v in first.items()}

    # ... and on a copy with one event changed (value 1 -> 0.5): refused, nothing published
    changed = _fresh_state(x, "changed")
    await ps.create_topics(changed)
    ordered = sorted(records, key=lambda r: (r.partition, r.offset))
    victim = len(ordered) // 2
    items = []
    for i, r in enumerate(ordered):
        value = r.value
        if i == victim:
            body = json.loads(value)
            body["value"] = 0.5
            value = json.dumps(body).encode()
        items.append((r.key, value, r.partition, list(r.headers or ())))
    await _produce_raw(changed, items)
    stop = asyncio.Event()
    worker = Worker(changed)
    task = asyncio.create_task(worker.run(stop))
    try:
        with pytest.raises(ScheduleMismatch, match="differ"):
            await asyncio.wait_for(task, timeout=60)
    finally:
        stop.set()
    published = await ps.released(changed)
    # the partition without the changed record may release its share up to the change; the
    # changed range itself never is: no tick of the victim's partition is complete
    assert len(published) < domain.size * 8
