"""Compact output (``compact_topic``, docs/formats.md) from a real worker and broker.

Every committed ``dp.counts.block.v1`` record, decoded with its shard's manifest from the
manifests topic, gives exactly — byte for byte — the ``dp.counts.v1`` messages the same worker
wrote on the counts topic in the same transactions: one record per (shard, tick), every tick.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agents.config.domain import load_domain
from agents.kafka.codec import encode, validate
from stream_dp.compact import decode_block, decode_manifest
from stream_dp.compact_histograms import HistogramAssembler, decode_histogram_chunk
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

N_TICKS = 6


async def test_compact_records_equal_the_per_stream_messages(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    leaves = ps.hierarchy_paths(2, 2, 3)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves,
                         compact_topic=f"{unique_name}.compact")
    await ps.create_topics(s)
    rng = np.random.default_rng(5)
    events = [(leaves[int(rng.integers(len(leaves)))],
               s.origin + float(rng.uniform(0, N_TICKS * s.tick_seconds)), 1.0)
              for _ in range(300)]
    await ps.produce(s, (ps.event_bytes(k, t, v) for k, t, v in sorted(events, key=lambda e: e[1])))
    await ps.close_ticks(s, N_TICKS)
    n_streams = load_domain(s.domain_file).size
    got, _ = await ps.run_worker_until(s, n_streams, N_TICKS)

    manifests = {}
    for r in await ps.read_topic(s.bootstrap, s.manifests_topic):
        m = decode_manifest(r.value)
        validate("dp.manifest.v1", json.loads(r.value))
        assert r.key == m.shard.encode()
        manifests[m.shard] = m
    assert len(manifests) == s.shards
    per_key: Counter[tuple[str, int]] = Counter()
    for r in await ps.read_topic(s.bootstrap, s.compact_topic):
        block = decode_block(r.value)
        validate("dp.counts.block.v1", block.header)
        shard = block.header["shard"]
        assert r.key == shard.encode() and r.partition == int(shard.split("-")[1])
        if block.tick > N_TICKS:
            continue
        per_key[(shard, block.tick)] += 1
        for msg in block.records(manifests[shard]):
            copies = got[(msg["stream"], msg["tick"])]
            assert set(copies) == {encode(msg)}, (msg["stream"], msg["tick"])
    # exactly one committed record per (shard, tick), every tick
    assert per_key == Counter({(f"shard-{i}", t): 1 for i in range(s.shards)
                               for t in range(1, N_TICKS + 1)})
    assert sum(len(m.streams) for m in manifests.values()) == n_streams

    # `stream-dp tail compact` prints exactly the counts topic's messages (JSON lines)
    import argparse
    import io

    from agents.commands import tail as tail_cmd

    parser = argparse.ArgumentParser()
    tail_cmd.add_arguments(parser)
    args = parser.parse_args(["compact", "--bootstrap", s.bootstrap, "--topic", s.compact_topic,
                              "--from-beginning", "--to-end", "--json", "--prefix", leaves[0][:1]])
    out = io.StringIO()
    assert await tail_cmd.tail(args, out) == 0
    lines = [line.encode() for line in out.getvalue().splitlines()]
    want = {v for (stream, tick), copies in got.items() for v in copies
            if stream.startswith(leaves[0][:1])}
    assert lines and set(lines) <= want
    assert {json.loads(x)["tick"] for x in lines} >= set(range(1, N_TICKS + 1))


@pytest.mark.parametrize(("histograms_json", "piece_bytes"), [(1, None), (0, None), (0, 200)],
                         ids=["json", "chunks", "chunks-manifest-in-pieces"])
async def test_compact_only_deployment_reconciles_from_the_compact_records(
    kafka_broker: str, unique_name: str, tmp_path: Path, histograms_json: int,
    piece_bytes: int | None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """counts_json = 0: no per-stream JSON at all; the reconcile side agent reads the compact
    records (placing each shard's values by its manifest) and publishes, for every tick, the
    same histogram as a solve on the decoded records (an independent oracle). With
    histograms_json = 0 only as chunk records (3 nodes each here), read back with the node
    manifest by the library and by ``stream-dp tail compact-histograms``; with a node manifest
    record limit of ``piece_bytes`` (a 10^7-node manifest's situation at 15 nodes) the manifest
    is published in pieces, which both join back."""
    import asyncio

    if piece_bytes is not None:
        monkeypatch.setattr("stream_dp.node_manifest.NODE_MANIFEST_MAX_BYTES", piece_bytes)

    from agents.reconcile.agent import Reconciler
    from agents.reconcile.config import ReconcilerConfig
    from agents.worker.pipeline import Worker
    from stream_dp.consistency import reconcile

    leaves = ps.hierarchy_paths(2, 2, 2)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves,
                         compact_topic=f"{unique_name}.compact", counts_json=0,
                         histograms_json=histograms_json)
    await ps.create_topics(s)
    rng = np.random.default_rng(8)
    events = sorted(((leaves[int(rng.integers(len(leaves)))],
                      s.origin + float(rng.uniform(0, N_TICKS * s.tick_seconds)), 1.0)
                     for _ in range(200)), key=lambda e: e[1])
    await ps.produce(s, (ps.event_bytes(k, t, v) for k, t, v in events))
    await ps.close_ticks(s, N_TICKS)
    domain = load_domain(s.domain_file)
    stop = asyncio.Event()
    worker = Worker(s)
    rec = Reconciler(ReconcilerConfig.from_settings(s, domain.name, session_timeout_ms=6000,
                                                    histogram_chunk_nodes=3), domain)
    tasks = [asyncio.create_task(worker.run(stop)), asyncio.create_task(rec.run(stop))]
    try:
        for _ in range(240):
            if rec.last_tick >= N_TICKS:
                break
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert await ps.read_topic(s.bootstrap, s.counts_topic) == []  # no JSON view
    manifests = {decode_manifest(r.value).shard: decode_manifest(r.value)
                 for r in await ps.read_topic(s.bootstrap, s.manifests_topic)}
    noisy: dict[int, dict[str, tuple[float, float]]] = {}
    for r in await ps.read_topic(s.bootstrap, s.compact_topic):
        block = decode_block(r.value)
        for msg in block.records(manifests[block.header["shard"]]):
            noisy.setdefault(block.tick, {})[msg["stream"]] = (msg["value"], msg["stderr"])
    jsons = await ps.read_topic(s.bootstrap, s.histograms_topic)
    hists = {json.loads(r.value)["tick"]: json.loads(r.value) for r in jsons}
    chunks = await ps.read_topic(s.bootstrap, s.histogram_blocks_topic)
    assert len(chunks) >= N_TICKS * -(-domain.size // 3)
    if not histograms_json:
        assert jsons == []
        node_records = [r for r in await ps.read_topic(s.bootstrap, s.manifests_topic)
                        if r.key == b"histogram" or r.key.startswith(b"histogram/")]
        assert all(len(r.value) <= (piece_bytes or 1 << 25) for r in node_records)
        if piece_bytes is None:
            node_manifest = decode_manifest(node_records[-1].value)
        else:
            assert len(node_records) >= 2 and b"histogram" not in {r.key for r in node_records}
            from agents.kafka.manifests import read_manifests

            node_manifest = (await read_manifests(s.bootstrap, {}, s.manifests_topic,
                                                  histogram=True))["histogram"]
        assert node_manifest.streams == tuple(domain.names)
        asm = HistogramAssembler()
        for r in chunks:
            hist = asm.add(decode_histogram_chunk(r.value))
            if hist is not None:
                assert hist.manifest == node_manifest.sha256
                hists[hist.tick] = hist.message(node_manifest.streams)
        tailed = await _tail_json(s, "compact-histograms", "r1")
        assert [m["tick"] for m in tailed] == sorted(hists)
        for m in tailed:
            assert m["nodes"] == [n for n in hists[m["tick"]]["nodes"]
                                  if n["stream"].startswith("r1")]
    assert set(hists) >= set(range(1, N_TICKS + 1))
    for t in range(1, N_TICKS + 1):
        x = [noisy[t][n][0] for n in domain.names]
        v = [noisy[t][n][1] ** 2 for n in domain.names]
        want = reconcile(domain, x, v).values
        nodes = hists[t]["nodes"]
        assert [n["stream"] for n in nodes] == list(domain.names)
        assert [n["noisy"] for n in nodes] == x
        assert np.allclose([n["value"] for n in nodes], want, rtol=0, atol=1e-9)


async def _tail_json(s: Any, what: str, prefix: str) -> list[dict[str, Any]]:
    """``stream-dp tail WHAT --from-beginning --to-end --json --prefix P`` of deployment ``s``."""
    import io
    import os

    from agents.cli import build_parser
    from agents.commands.tail import tail

    args = build_parser("tail").parse_args(["tail", what, "--from-beginning", "--to-end", "--json",
                                      "--prefix", prefix, "--bootstrap", s.bootstrap])
    out = io.StringIO()
    old = os.environ.get("STREAM_DP_COMPACT_TOPIC")
    os.environ["STREAM_DP_COMPACT_TOPIC"] = s.compact_topic
    try:
        assert await tail(args, out) == 0
    finally:
        if old is None:
            del os.environ["STREAM_DP_COMPACT_TOPIC"]
        else:
            os.environ["STREAM_DP_COMPACT_TOPIC"] = old
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def test_dashboard_follows_the_compact_records(kafka_broker: str, unique_name: str) -> None:
    """The dashboard with compact input: manifests read on first need, each record's values
    shown for the streams it follows, equal to the record's."""
    import asyncio

    from aiohttp import ClientSession, web
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from agents.config.settings import Settings
    from agents.dashboard.app import DashboardConfig, make_dashboard_app
    from agents.kafka.embedded_broker import free_port
    from agents.release.state import Release

    compact, hist = f"{unique_name}.compact", f"{unique_name}.hist"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(compact, 2, 1), NewTopic(f"{compact}.manifests", 2, 1),
                                   NewTopic(hist, 1, 1)])
    finally:
        await admin.close()
    app = make_dashboard_app(config=DashboardConfig(kafka_broker, "unused", hist,
                                                    compact_topic=compact, shards=2))
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}/api/snapshot"
    s = Settings(origin=1000.0)
    streams = {0: ("a", "b/c"), 1: ("d",)}
    try:
        async with ClientSession() as http:
            for _ in range(200):
                async with http.get(url) as resp:
                    if (await resp.json())["status"]["connected"]:
                        break
                await asyncio.sleep(0.1)
            prod = AIOKafkaProducer(bootstrap_servers=kafka_broker)
            await prod.start()
            try:
                for shard, names in streams.items():
                    for tick in (1, 2):
                        rel = Release(tick, 1000.0 + tick, 1001.0 + tick, shard, names,
                                      np.arange(len(names)) + 10.0 * tick + shard, 0.5, "naive",
                                      0.0)
                        if tick == 1:
                            await prod.send_and_wait(f"{compact}.manifests", rel.manifest(),
                                                     key=rel.shard_name().encode(),
                                                     partition=shard)
                        await prod.send_and_wait(compact, rel.compact(s, {"model": "pure",
                                                                          "epsilon": 1.0}),
                                                 key=rel.shard_name().encode(), partition=shard)
            finally:
                await prod.stop()
            for _ in range(200):
                async with http.get(url) as resp:
                    snap = await resp.json()
                got = {n: [p[2] for p in v["points"]] for n, v in snap["streams"].items()}
                if all(len(v) == 2 for v in got.values()) and len(got) == 3:
                    break
                await asyncio.sleep(0.1)
            assert got == {"a": [10.0, 20.0], "b/c": [11.0, 21.0], "d": [11.0, 21.0]}
    finally:
        await runner.cleanup()


async def test_a_subscriber_written_from_the_spec_decodes_every_tick_exactly(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """``examples/subscribe_compact.py`` (aiokafka + numpy, no stream-dp import, written from
    docs/formats.md) run as a subprocess against a compact-only worker's output: every tick it
    prints holds, bit for bit, the values and standard errors the library's decoder reads from
    the same records, and (enormous ε) the exact decayed counts."""
    import asyncio
    import os
    import sys

    leaves = ps.hierarchy_paths(2, 3, 4)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves, epsilon=1e4,
                         compact_topic=f"{unique_name}.compact", counts_json=0, shards=3)
    await ps.create_topics(s)
    rng = np.random.default_rng(9)
    events = sorted(((leaves[int(rng.integers(len(leaves)))],
                      s.origin + float(rng.uniform(0, N_TICKS * s.tick_seconds)),
                      float(rng.choice([1.0, 0.5]))) for _ in range(400)), key=lambda e: e[1])
    await ps.produce(s, (ps.event_bytes(k, t, v) for k, t, v in events))
    await ps.close_ticks(s, N_TICKS)
    domain = load_domain(s.domain_file)
    await ps.run_worker_until(s, domain.size, N_TICKS)

    root = Path(__file__).resolve().parents[2]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(root / "examples" / "subscribe_compact.py"), "--topic",
        s.compact_topic, "--from-beginning", "--json", "--ticks", str(N_TICKS),
        cwd=str(tmp_path), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "STREAM_DP_BOOTSTRAP": s.bootstrap, "PYTHONPATH": ""})
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    printed = {m["tick"]: m for m in map(json.loads, out.decode().splitlines())}
    assert sorted(printed) == list(range(1, N_TICKS + 1))

    manifests = {m.shard: m for m in (decode_manifest(r.value) for r in
                                      await ps.read_topic(s.bootstrap, s.manifests_topic))}
    library: dict[tuple[str, int], tuple[float, float]] = {}
    for r in await ps.read_topic(s.bootstrap, s.compact_topic):
        block = decode_block(r.value)
        for msg in block.records(manifests[block.header["shard"]]):
            library[(msg["stream"], msg["tick"])] = (msg["value"], msg["stderr"])
    exact = ps.exact_decayed(domain, events, s, N_TICKS)
    for tick, m in printed.items():
        assert m["shards"] == s.shards and m["streams"] == domain.size
        for stream, (value, stderr) in m["values"].items():
            want = library[(stream, tick)]
            assert np.array_equal(np.array([value, stderr]).view(np.int64),
                                  np.array(want).view(np.int64)), (stream, tick)
            assert abs(value - exact[(stream, tick)]) <= 12 * stderr + 1e-9, (stream, tick)
