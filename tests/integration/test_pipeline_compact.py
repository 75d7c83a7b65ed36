"""Compact output (``compact_topic``, docs/formats.md) from a real worker and broker.

Every committed ``dp.counts.block.v1`` record, decoded with its shard's manifest from the
manifests topic, gives exactly — byte for byte — the ``dp.counts.v1`` messages the same worker
wrote on the counts topic in the same transactions: one record per (shard, tick), every tick.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from agents.codec import encode, validate
from agents.config import load_domain
from stream_dp.compact import decode_block, decode_manifest
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
