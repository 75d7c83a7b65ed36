"""Reading with a long-running consumer (the reconcile agent's): the partitions of a topic, a
range of offsets, and a client start-up that is let finish before a cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

__all__ = ["finish_before_cancel", "partitions_of", "read_range"]

_T = TypeVar("_T")


async def finish_before_cancel(coro: Coroutine[Any, Any, _T], grace_s: float) -> _T:
    """Await ``coro``; if the caller is cancelled meanwhile, let ``coro`` finish first (at most
    ``grace_s`` seconds more, then cancel it too) and re-raise the cancellation.

    aiokafka does not close a connection whose handshake is cancelled half way (the leader
    being stepped down while its consumer looks up the group coordinator): the object is
    collected later and asyncio logs ``Unclosed AIOKafkaConnection`` at error level on a clean
    stop. Letting the start-up complete means ``stop()`` then closes every connection."""
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, grace_s)
        raise


async def partitions_of(consumer: AIOKafkaConsumer, topic: str) -> list[int]:
    """The partitions of ``topic`` (sorted; ``[]`` if it does not exist yet)."""
    topics = await consumer.topics()  # refreshes metadata
    if topic not in topics:
        return []
    return sorted(consumer.partitions_for_topic(topic) or ())


async def read_range(
    consumer: AIOKafkaConsumer, tp: TopicPartition, lo: int, hi: int
) -> list[ConsumerRecord[Any, Any]]:
    """Records of ``tp`` with offsets in ``[lo, hi)`` (the partition must be assigned)."""
    consumer.seek(tp, lo)
    out: list[ConsumerRecord[Any, Any]] = []
    deadline = time.monotonic() + 30.0
    while await consumer.position(tp) < hi and time.monotonic() < deadline:
        batch = await consumer.getmany(tp, timeout_ms=500)
        out.extend(r for r in batch.get(tp, []) if r.offset < hi)
    return out
