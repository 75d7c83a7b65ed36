"""agents.kafka.produce_encoding: the same bytes as aiokafka's own encoding, one join."""

from __future__ import annotations

import os
import random
import struct
from typing import Any

import pytest

from agents.kafka import produce_encoding as pe


def _originals() -> dict[Any, Any]:
    pe.install()
    assert pe._state["originals"], "no produce request class was patched"
    return pe._state["originals"]


def _request(cls: Any, rng: random.Random) -> Any:
    def batch() -> Any:
        kind = rng.randrange(4)
        data = os.urandom(rng.choice([0, 1, 61, 4096, 70_000]))
        return (None if kind == 0 else bytearray(data) if kind == 1 else
                memoryview(data) if kind == 2 else data)

    topics = [(f"t{i}-é", [(rng.randrange(2**31), batch()) for _ in range(rng.randrange(4))])
              for i in range(rng.randrange(4))]
    kw: dict[str, Any] = {"required_acks": rng.choice([-1, 0, 1]),
                          "timeout": rng.randrange(2**31), "topics": topics}
    if "transactional_id" in cls.SCHEMA.names:
        kw["transactional_id"] = rng.choice([None, "", "tx-1", "tx-ü" * 20])
    return cls(**kw)


@pytest.mark.parametrize("seed", range(12))
def test_flat_encoding_equals_aiokafka_for_every_produce_version(seed: int) -> None:
    rng = random.Random(seed)
    for cls, original in _originals().items():
        req = _request(cls, rng)
        want = original(req)
        assert req.encode() == want == pe.encode_flat(req)
        header = req.build_request_header(correlation_id=rng.randrange(2**31),
                                          client_id=rng.choice([None, "c", "client-ö"]))
        body = header.encode() + want
        assert pe.frame(req, header) == struct.pack(">i", len(body)) + body


def test_install_is_idempotent_and_leaves_other_requests_alone() -> None:
    from aiokafka.protocol.fetch import FetchRequest_v4
    from aiokafka.protocol.produce import ProduceRequest_v7

    assert pe.install() and pe.install()
    assert ProduceRequest_v7.encode is pe.encode_flat
    assert "encode" not in FetchRequest_v4.__dict__
    with pytest.raises(ValueError):  # a malformed request fails as aiokafka's does
        pe.encode_flat(ProduceRequest_v7(transactional_id=None, required_acks=1, timeout=1,
                                         topics=[("t", [(0,)])]))
