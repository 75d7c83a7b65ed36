"""Reading with a long-running consumer (the reconcile agent's, the pipeline stages'): the
partitions of a topic, a range of offsets, a client start-up that is let finish before a
cancellation, and a wait for records that a wake ends early.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

__all__ = ["finish_before_cancel", "getmany_or_wake", "partitions_of", "read_range"]

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


async def getmany_or_wake(consumer: AIOKafkaConsumer, woken: asyncio.Event, timeout_s: float,
                          max_records: int | None = None) -> dict[TopicPartition, list[Any]]:
    """``consumer.getmany`` of what is buffered now; if nothing is, wait for records up to
    ``timeout_s`` seconds or until ``woken`` is set, whichever comes first (``{}`` then).

    A loop that waits here instead of polling with a short timeout runs when there is work:
    records, its own next deadline (``timeout_s``), or whatever sets ``woken`` (records handed
    over in-process, a clock close, a stop). The caller clears ``woken`` as soon as this
    returns and then does its pass, so a wake never goes unseen. Records already buffered are taken without a
    wait (the busy path: one plain ``getmany`` per batch). A ``getmany`` cancelled by the wake
    loses no records: aiokafka takes them from its fetch buffer only after its wait ends, in the
    same step as it returns, so they stay buffered for the next call. Only one task may call
    ``getmany`` on ``consumer`` (the caller's loop): see :func:`_drop_waiters`."""
    batch: dict[TopicPartition, list[Any]] = await consumer.getmany(timeout_ms=0,
                                                                    max_records=max_records)
    if batch or woken.is_set():
        return batch
    get = asyncio.ensure_future(consumer.getmany(timeout_ms=max(1, int(timeout_s * 1000)),
                                                 max_records=max_records))
    wake = asyncio.ensure_future(woken.wait())
    try:
        await asyncio.wait({get, wake}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        wake.cancel()
        if not get.done():
            get.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await get
            _drop_waiters(consumer)
    return {} if get.cancelled() else get.result()


def _drop_waiters(consumer: AIOKafkaConsumer) -> None:
    """Cancel the fetch waiter a cancelled ``getmany`` leaves behind in aiokafka's fetcher.

    aiokafka cancels it itself only when its own timeout ends the wait: left pending, it later
    receives the group's errors (a fenced static member: ``WorkerIdShared``) that nobody
    retrieves, and asyncio logs 'Future exception was never retrieved' at error level. Only
    the caller's loop calls ``getmany`` on its consumer, so every pending waiter is its own."""
    waiters = getattr(getattr(consumer, "_fetcher", None), "_fetch_waiters", None)
    for fut in list(waiters or ()):
        if not fut.done():
            fut.cancel()


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
