"""Bad input and the release schedule, against a real broker and an in-process worker.

Every kind of bad message lands in the dead-letter topic with its reason and is counted in the
metrics; accepted events are counted exactly; the worker keeps running. A declared stream that
never sees an event releases at every tick.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from agents.config.domain import load_domain
from agents.kafka.codec import validate
from agents.telemetry.metrics import Metrics
from agents.worker.pipeline import Worker
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_bad_input_goes_to_dlq_and_silent_streams_release_every_tick(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    leaves = [*ps.hierarchy_paths(2, 2, 2), "quiet/q/leaf"]
    s = ps.live_settings(
        kafka_broker, tmp_path, unique_name, leaves, epsilon=1e4, max_message_bytes=2048,
    )
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    o = s.origin
    good = [(leaves[i % 8], o + 0.01 * i, 1.0 if i % 5 else 2.5) for i in range(400)]
    bad: list[tuple[bytes | None, bytes | None, str]] = [
        (b"k", b"{not json", "malformed_json"),
        (b"k", None, "malformed_json"),
        (b"k", json.dumps({"key": 5, "ts": o}).encode(), "invalid_schema"),
        (b"k", json.dumps({"key": "r0/s0/l0", "ts": "noon"}).encode(), "invalid_schema"),
        (b"k", json.dumps([1, 2]).encode(), "invalid_schema"),
        (b"u", json.dumps({"key": "nope/x/y", "ts": o + 1}).encode(), "unknown_key"),
        (b"u", json.dumps({"key": "r0/s0", "ts": o + 1}).encode(), "unknown_key"),
        (b"n", json.dumps({"key": "r0/s0/l0", "ts": o + 1, "value": -1}).encode(), "negative_value"),
        (b"h", json.dumps({"key": "r0/s0/l0", "ts": o + 1, "value": 1e300}).encode(),
         "value_out_of_range"),
        (b"x", f'{{"key": "r0/s0/l0", "ts": {o + 1}, "value": NaN}}'.encode(), "value_not_finite"),
        (b"x", b'{"key": "r0/s0/l0", "ts": Infinity}', "ts_not_finite"),
        (b"p", json.dumps({"key": "r0/s0/l0", "ts": o - 1e6}).encode(), "before_origin"),
        (b"f", json.dumps({"key": "r0/s0/l0", "ts": time.time() + 1e7}).encode(), "future"),
        (b"o", json.dumps({"key": "r0/s0/l0", "ts": o + 1, "pad": "x" * 3000}).encode(),
         "oversize"),
    ]
    mixed: list[tuple[bytes | None, bytes | None]] = []
    for i, ev in enumerate(good):
        mixed.append(ps.event_bytes(*ev))
        if i % 30 == 0 and bad:
            k, v, _ = bad[(i // 30) % len(bad)]
            mixed.append((k, v))
    mixed.extend((k, v) for k, v, _ in bad)  # every kind at least once more
    await ps.produce(s, mixed)

    metrics = Metrics(process=False)
    stop = asyncio.Event()
    worker = Worker(s, metrics=metrics)
    task = asyncio.create_task(worker.run(stop))
    try:
        got = await ps.wait_for_ticks(s, domain.size, 8, timeout_s=60)
        # a late event: its tick (1) closed long ago, and it arrives after the deadline
        await ps.produce(s, [ps.event_bytes("r0/s0/l0", o + 0.5)])
        last = max(t for _, t in got) + 3
        got = await ps.wait_for_ticks(s, domain.size, last, timeout_s=60)
        assert not task.done(), "the worker must stay up"
        assert worker.ready
    finally:
        stop.set()
        await task

    # accepted events: exact (enormous ε)
    exact = ps.exact_decayed(domain, good, s, last)
    bound = worker.mechanism().rounding_bound()
    for key, want in exact.items():
        msg = json.loads(got[key][0])
        assert abs(msg["value"] - want) <= bound + 12 * msg["stderr"], key
    # the schedule: the silent stream and its ancestors released every tick 1..last
    for stream in ("quiet/q/leaf", "quiet/q", "quiet"):
        ticks = sorted(t for (name, t) in got if name == stream)
        assert ticks[:last] == list(range(1, last + 1))
        assert all(abs(json.loads(got[(stream, t)][0])["value"]) < 0.01 for t in ticks[:last])

    # dead letters: one per bad message, each with its reason
    dlq = [json.loads(r.value) for r in await ps.read_topic(s.bootstrap, s.dlq_topic)]
    for d in dlq:
        validate("dp.events.dlq", d)
    reasons: dict[str, int] = {}
    for d in dlq:
        reasons[d["reason"]] = reasons.get(d["reason"], 0) + 1
    want_reasons: dict[str, int] = {}
    for k, v in mixed:
        for bk, bv, reason in bad:
            if (k, v) == (bk, bv):
                want_reasons[reason] = want_reasons.get(reason, 0) + 1
                break
    want_reasons["late"] = 1
    assert reasons == want_reasons
    assert {d["topic"] for d in dlq} == {s.events_topic}
    oversize = next(d for d in dlq if d["reason"] == "oversize")
    assert len(oversize["raw"]) <= 4096

    # metrics count them (totals only; no per-stream labels)
    reg = metrics.registry
    for reason, n in want_reasons.items():
        assert reg.get_sample_value("stream_dp_dead_letters_total", {"reason": reason}) == n
    assert reg.get_sample_value("stream_dp_events_total", {"result": "accepted"}) == len(good)
    assert worker.stats["clamped"] == sum(1 for _, _, v in good if v > s.cap)


async def test_transaction_markers_do_not_block_tick_closing(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """Events written by a transactional producer (commit markers after the data) do not hold
    back the clock schedule; an aborted batch is never counted."""
    from aiokafka import AIOKafkaProducer

    leaves = ps.hierarchy_paths(1, 2, 2)
    s = ps.live_settings(kafka_broker, tmp_path, unique_name, leaves, epsilon=1e4,
                         events_partitions=2, shards=2)
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    good = [(leaves[i % 4], s.origin + 0.05 * i, 1.0) for i in range(40)]  # ticks 1 and 2
    prod = AIOKafkaProducer(bootstrap_servers=kafka_broker, transactional_id=unique_name)
    await prod.start()
    try:
        await prod.begin_transaction()
        for k, ts, v in good:
            key, value = ps.event_bytes(k, ts, v)
            await prod.send(s.events_topic, value, key=key)
        await prod.commit_transaction()
        await prod.begin_transaction()
        for k, ts, v in good:
            key, value = ps.event_bytes(k, ts, v)
            await prod.send(s.events_topic, value, key=key)
        await prod.flush()
        await prod.abort_transaction()
    finally:
        await prod.stop()
    stop = asyncio.Event()
    worker = Worker(s)
    task = asyncio.create_task(worker.run(stop))
    try:
        got = await ps.wait_for_ticks(s, domain.size, 4, timeout_s=60)
    finally:
        stop.set()
        await task
    exact = ps.exact_decayed(domain, good, s, 4)
    for key, want in exact.items():
        msg = json.loads(got[key][0])
        assert ps.within_noise(msg, want), (key, msg, want)
    assert worker.stats["accepted"] == len(good)


async def test_grid_domain_counts_total_marginals_and_cells(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """An attribute grid: one event feeds total, one category per attribute and its cell;
    cell keys may name the attributes in any order."""
    grid = tmp_path / "grid.toml"
    grid.write_text('name = "g"\nkind = "grid"\n[attributes]\nregion = ["n", "s"]\n'
                    'age = ["young", "old", "mid"]\n', encoding="utf-8")
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, ["unused"], epsilon=1e4,
                         tick_seconds=1.0, domain_file=str(grid))
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    assert domain.size == 1 + 5 + 6
    keys = ["region=n|age=young", "age=old|region=s", "region=s|age=mid", "region=n|age=old"]
    events = [(keys[i % 4], s.origin + 0.02 * i, 1.0) for i in range(150)]  # ticks 1..3
    await ps.produce(s, (ps.event_bytes(*e) for e in events))
    await ps.close_ticks(s, 5)
    stop = asyncio.Event()
    worker = Worker(s)
    task = asyncio.create_task(worker.run(stop))
    try:
        got = await ps.wait_for_ticks(s, domain.size, 5, timeout_s=60)
    finally:
        stop.set()
        await task
    exact = ps.exact_decayed(domain, events, s, 5)
    for key, want in exact.items():
        msg = json.loads(got[key][0])
        assert ps.within_noise(msg, want), (key, msg, want)
    assert exact[("total", 3)] > 0 and exact[("age=old", 2)] > 0
