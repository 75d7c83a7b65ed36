"""The reconcile side agent builds the JSON view of a compact-only histogram (the first 20 000
nodes as ``dp.histograms.v1`` dicts) only for an ``on_histogram`` callback: ``stream-dp worker``
passes none, and the chunk records it publishes are the same either way."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from agents.reconcile import agent as rec
from agents.reconcile import messages
from agents.reconcile.ticks import CompleteTick
from stream_dp.compact_histograms import decode_histogram_chunk
from stream_dp.domain import Domain


def _reconciler(on_histogram: Any) -> rec.Reconciler:
    dom = Domain.from_paths([f"a{i}/b{j}" for i in range(3) for j in range(4)])
    cfg = rec.ReconcilerConfig(bootstrap="127.0.0.1:1", compact_topic="c", shards=2,
                               histograms_json=False, domain_name="d")
    return rec.Reconciler(cfg, dom, on_histogram=on_histogram)


def _tick(n: int) -> CompleteTick:
    rng = np.random.default_rng(3)
    return CompleteTick(tick=7, tick_end=70.0, noisy=rng.normal(5.0, 2.0, n),
                            stderr=np.full(n, 1.5))


def test_no_json_view_without_a_callback(monkeypatch: Any) -> None:
    async def callback(msg: dict[str, Any]) -> None:
        return None

    with_cb = _reconciler(callback)
    tick = _tick(len(with_cb.names))
    _, message, value, chunks = with_cb._solve_and_encode(tick)
    assert value is None and message["nodes"] and message["total_nodes"] == len(with_cb.names)

    def no_view(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the JSON view was built without a callback")

    monkeypatch.setattr(messages, "histogram_message", no_view)
    without = _reconciler(None)
    _, message2, value2, chunks2 = without._solve_and_encode(tick)
    assert message2 == {} and value2 is None
    # the published records are the same (but for the solver's own timing in the header)
    assert len(chunks2) == len(chunks) >= 1
    for a, b in zip(chunks, chunks2, strict=True):
        ca, cb = decode_histogram_chunk(a), decode_histogram_chunk(b)
        for c in (ca, cb):
            c.header["diagnostics"].pop("seconds")
        assert ca.header == cb.header
        for col in ("values", "noisy", "stderr"):
            assert getattr(ca, col).tobytes() == getattr(cb, col).tobytes()


def test_publish_without_a_callback_sends_the_chunks() -> None:
    sent: list[tuple[str, bytes]] = []

    class Producer:
        async def send_and_wait(self, topic: str, value: bytes, **kw: Any) -> None:
            sent.append((topic, value))

        async def send(self, topic: str, value: bytes, **kw: Any) -> Any:
            sent.append((topic, value))
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return fut

    r = _reconciler(None)
    asyncio.run(r._publish(Producer(), _tick(len(r.names))))  # type: ignore[arg-type]
    assert r.published == 1 and r.last_tick == 7
    assert [t for t, _ in sent] == ["c.manifests", "c.histograms"]
