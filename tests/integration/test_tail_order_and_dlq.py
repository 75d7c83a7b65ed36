"""`stream-dp tail` read from the beginning prints in tick order across partitions; `tail dlq`
reads the dead-letter topic; counts in its lines agree in number (issue 32 item 13). Run as a
user runs it, against the real broker, with contract-shaped records."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agents.kafka.codec import Rejection, dlq_message
from tests.integration._users import create_topic, stream_dp

pytestmark = pytest.mark.integration


def _count(stream: str, tick: int) -> dict[str, Any]:
    return {
        "stream": stream, "tick": tick, "tick_start": 1_704_067_140.0 + 60 * tick,
        "tick_end": 1_704_067_200.0 + 60 * tick, "value": float(tick), "stderr": 2.0,
        "strategy": "naive", "p": 0.9, "privacy": {"model": "pure", "epsilon": 0.5},
        "cap": 1.0, "horizon": 4095, "schema": "dp.counts.v1",
    }


def _produce(bootstrap: str, topic: str, items: list[tuple[int, bytes, bytes]]) -> None:
    """``(partition, key, value)`` records, in order, each acknowledged before the next."""

    async def go() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for partition, key, value in items:
                await producer.send_and_wait(topic, value, key=key, partition=partition)
        finally:
            await producer.stop()

    asyncio.run(go())


def test_from_the_beginning_is_in_tick_order_across_partitions(
    kafka_broker: str, unique_name: str
) -> None:
    """Shard 0's ticks all published before shard 1's (as after a restart of one worker):
    a plain read printed partition after partition, ticks 1..6 and then 1..6 again."""
    create_topic(kafka_broker, unique_name, partitions=2)
    items = [(p, stream.encode(), json.dumps(_count(stream, t)).encode())
             for p, stream in ((0, "eu"), (1, "us")) for t in range(1, 7)]
    _produce(kafka_broker, unique_name, items)
    for extra in (["--to-end"], ["--timeout", "2"], ["--max-messages", "12"]):
        proc = stream_dp("tail", "counts", "--bootstrap", kafka_broker, "--topic", unique_name,
                         "--from-beginning", "--json", *extra, check=True)
        got = [(m["tick"], m["stream"]) for m in map(json.loads, proc.stdout.splitlines())]
        assert got == sorted((t, s) for s in ("eu", "us") for t in range(1, 7)), (extra, got)
    tick3 = stream_dp("tail", "counts", "--bootstrap", kafka_broker, "--topic", unique_name,
                      "--from-tick", "5", "--json", "--to-end", check=True)
    assert [json.loads(x)["tick"] for x in tick3.stdout.splitlines()] == [5, 5, 6, 6]


def test_a_one_node_one_iteration_histogram_says_so_in_the_singular(
    kafka_broker: str, unique_name: str
) -> None:
    create_topic(kafka_broker, unique_name, partitions=1)
    hist = {"tick": 4, "tick_end": 1_704_067_440.0, "consistent": True,
            "nodes": [{"stream": "all", "value": 3.0, "noisy": 3.5, "stderr": 1.0}],
            "diagnostics": {"iterations": 1, "residual": 0.0, "seconds": 0.0001},
            "schema": "dp.histograms.v1"}
    _produce(kafka_broker, unique_name, [(0, b"d", json.dumps(hist).encode())])
    proc = stream_dp("tail", "histograms", "--bootstrap", kafka_broker, "--topic", unique_name,
                     "--from-beginning", "--to-end", check=True)
    head = proc.stdout.splitlines()[0]
    assert ": 1 node, consistent, 1 iteration, residual" in head, head


def test_tail_dlq_prints_what_the_dead_letter_topic_holds(
    kafka_broker: str, unique_name: str
) -> None:
    create_topic(kafka_broker, unique_name, partitions=2)
    raw = b'{"key": "eu/xx", "ts": 1704067241.5, "user": "secret-user-42"}'
    letters = [
        dlq_message(Rejection("unknown_key", "key 'eu/xx' is not declared in the domain"),
                    raw, "dp.events.v1", 3, 1187),
        dlq_message(Rejection("malformed_json", "not JSON: Expecting value"), b"\x00garbage",
                    "dp.events.v1", 0, 12),
        dlq_message(Rejection("late", "tick 7 closed"), b'{"key": "us/ny", "ts": 1.0}',
                    "dp.events.v1", 1, 5),
    ]
    values = [json.dumps(m).encode() for m in letters]
    _produce(kafka_broker, unique_name, [(i % 2, b"k", v) for i, v in enumerate(values)])
    base = ("tail", "dlq", "--bootstrap", kafka_broker, "--topic", unique_name,
            "--from-beginning", "--to-end")

    table = stream_dp(*base, check=True)
    lines = table.stdout.splitlines()
    assert lines[0].split()[:2] == ["REASON", "FROM"], lines
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {"unknown_key", "malformed_json", "late"}, lines
    assert "dp.events.v1:3@1187" in rows["unknown_key"]
    assert "key 'eu/xx' is not declared in the domain" in rows["unknown_key"]
    # the table adds nothing and leaves the raw bytes to --json
    assert "secret-user-42" not in table.stdout and "garbage" not in table.stdout

    as_stored = stream_dp(*base, "--json", check=True)
    assert sorted(as_stored.stdout.encode().splitlines()) == sorted(values)

    late = stream_dp(*base, "--prefix", "la", "--json", check=True)
    assert [json.loads(x)["reason"] for x in late.stdout.splitlines()] == ["late"]

    refused = stream_dp("tail", "dlq", "--bootstrap", kafka_broker, "--topic", unique_name,
                        "--from-tick", "3")
    assert refused.returncode == 2
    assert refused.stderr.strip() == ("stream-dp tail: dead letters have no tick: use "
                                      "--from-beginning with dlq")
