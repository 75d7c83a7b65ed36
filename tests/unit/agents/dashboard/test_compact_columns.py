"""The in-process dashboard's compact path (columns, no message per stream) holds, shows and
broadcasts exactly what the per-stream path did: ``add_counts`` of each record's
``dp.counts.v1`` view (``Block.records``), the oracle."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import numpy as np

from agents.dashboard import app as dash
from agents.dashboard.state import DashboardState
from stream_dp.compact import decode_block, decode_manifest, encode_block, encode_manifest


class _Rec:
    def __init__(self, value: bytes) -> None:
        self.value = value


def _records(tick: int, manifests: dict[str, Any], n: int, rng: np.random.Generator
             ) -> list[_Rec]:
    out = []
    for shard, man in manifests.items():
        out.append(_Rec(encode_block(
            shard=shard, tick=tick, tick_start=10.0 * (tick - 1), tick_end=10.0 * tick, epoch=0,
            strategy="naive", p=0.9, privacy={"epsilon": 1.0, "model": "pure"}, cap=1.0,
            horizon=4095, manifest=man.sha256, values=rng.normal(0, 1e3, n),
            stderr=np.full(n, 1.25))))
    return out


def test_columns_match_the_per_stream_messages(monkeypatch: Any) -> None:
    monkeypatch.setattr(dash, "COMPACT_STREAMS", 300)  # 150 per shard of 400 streams
    n, rng = 400, np.random.default_rng(5)
    manifests = {str(s): decode_manifest(encode_manifest(str(s), [f"r{s}/x{i}" for i in range(n)]))
                 for s in range(2)}
    config = dash.DashboardConfig(bootstrap="127.0.0.1:1", compact_topic="c", shards=2)
    old, new = DashboardState(history=4), DashboardState(history=4)
    for tick in (1, 2, 3, 5, 4, 6, 7, 3):  # out of order and a re-published tick included
        recs = _records(tick, manifests, n, rng)
        # oracle: the dp.counts.v1 view of each record, the first 150 streams of each shard
        msgs = [m for r in recs
                for m in itertools.islice(
                    decode_block(r.value).records(manifests[str(decode_block(
                        r.value).header["shard"])]), 150)]
        want_rows = old.add_counts(msgs)
        rows: list[list[Any]] = []
        for cols in asyncio.run(dash._compact_columns(config, recs, dict(manifests))):
            new.add_columns(*cols, rows)
        assert rows == want_rows
        assert new.snapshot() == old.snapshot()
        assert new.snapshot("r1/x1", limit=7) == old.snapshot("r1/x1", limit=7)
    assert len(new.series) == 300 and new.messages == old.messages
    unsubscribed = DashboardState(history=4)
    for cols in asyncio.run(dash._compact_columns(config, _records(9, manifests, n, rng),
                                                  dict(manifests))):
        unsubscribed.add_columns(*cols, None)  # no subscriber: no rows built, series stored
    assert len(unsubscribed.series) == 300
