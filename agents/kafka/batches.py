"""Records sent as whole record batches to one partition (:func:`send_batched`).

Sending many small records one ``send`` at a time costs a future and an accumulator round per
record (about 10 µs of CPU each here); a batch costs one future per ~1 MiB. The release stage
sends a backlog's count messages this way, the ingest stage the per-person changelog of a
commit (10^5 records and more after a busy tick, issue #34)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["send_batched"]


async def send_batched(prod: Any, topic: str, partition: int,
                       items: Iterable[tuple[bytes | None, bytes | None]]) -> int:
    """Send ``(key, value)`` records (``value`` ``None``: a tombstone) to ``topic``'s
    ``partition`` through ``prod`` (an aiokafka producer, or the transaction's
    :class:`agents.kafka.checked_producer.CheckedProducer`), in order, in as few record batches
    as fit. Returns how many records were sent. ``ValueError`` for a record that does not fit
    an empty batch."""
    n = 0
    batch = prod.create_batch()
    for key, value in items:
        if batch.append(key=key, value=value, timestamp=None) is None:
            await prod.send_batch(batch, topic, partition=partition)
            batch = prod.create_batch()
            if batch.append(key=key, value=value, timestamp=None) is None:
                raise ValueError(f"a record for {topic!r} does not fit an empty batch")
        n += 1
    if batch.record_count():
        await prod.send_batch(batch, topic, partition=partition)
    return n
