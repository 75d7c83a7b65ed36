"""Helpers of the users' tools integration tests: topics and a plain reader on the real broker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Message:
    key: bytes | None
    value: bytes
    timestamp: int
    partition: int
    offset: int
    headers: tuple[tuple[str, bytes], ...]

    def json(self) -> Any:
        return json.loads(self.value)


def create_topic(bootstrap: str, name: str, partitions: int = 3) -> None:
    from tests.integration.pipeline_support import create_topic as create

    asyncio.run(create(bootstrap, name, partitions))


def read_all(bootstrap: str, topic: str) -> list[Message]:
    """Every message currently in ``topic`` (all partitions, from the beginning to the end)."""

    async def go() -> list[Message]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        out: list[Message] = []
        try:
            await consumer.topics()
            parts = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            todo = {tp for tp in tps if ends[tp] > 0}
            idle = 0
            while todo and idle < 50:
                batch = await consumer.getmany(*todo, timeout_ms=200)
                idle = 0 if batch else idle + 1
                for msgs in batch.values():
                    for m in msgs:
                        out.append(Message(m.key, m.value, m.timestamp, m.partition, m.offset,
                                           tuple(m.headers or ())))
                for tp in list(todo):
                    if await consumer.position(tp) >= ends[tp]:
                        todo.discard(tp)
        finally:
            await consumer.stop()
        return out

    return asyncio.run(go())


def produce_json(bootstrap: str, topic: str, items: list[tuple[str, dict[str, Any]]]) -> None:
    """Produce ``(key, value)`` JSON messages in order and wait for their acknowledgement."""

    async def go() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for key, value in items:
                await producer.send_and_wait(
                    topic, json.dumps(value).encode(), key=key.encode()
                )
        finally:
            await producer.stop()

    asyncio.run(go())


def stream_dp(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
              check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the ``stream-dp`` console entry point as a child process."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "agents.cli", *args], capture_output=True, text=True,
        env=full_env, timeout=timeout, cwd=ROOT,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"stream-dp {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def read_events(bootstrap: str, topic: str) -> list[Message]:
    """:func:`read_all` without the close markers that ``stream-dp replay`` writes."""
    from agents.kafka.codec import CLOSE_HEADER

    return [m for m in read_all(bootstrap, topic)
            if not any(k == CLOSE_HEADER for k, _ in m.headers)]


def close_markers(bootstrap: str, topic: str) -> list[Message]:
    """The close markers in ``topic``."""
    from agents.kafka.codec import CLOSE_HEADER

    return [m for m in read_all(bootstrap, topic)
            if any(k == CLOSE_HEADER for k, _ in m.headers)]
