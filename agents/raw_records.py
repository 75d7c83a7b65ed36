"""Hand the ingest stage aiokafka's own decoded records instead of a ``ConsumerRecord`` each.

aiokafka decodes a fetched record batch in compiled code (``aiokafka.record._crecords``), then
builds one Python ``ConsumerRecord`` dataclass per record (topic, partition, offset, timestamp,
timestamp type, key, value, checksum, sizes, headers) in ``PartitionRecords._consumer_record``.
A py-spy profile of ``benchmarks/service.py --only ingest`` put that constructor at about 70 %
of what a bare consumer spends per record. The ingest stage reads six attributes of a record
(``offset``, ``key``, ``value``, ``timestamp``, ``timestamp_type``, ``headers``) — exactly the
attributes of the compiled ``DefaultRecord`` — so for a consumer created with
``value_deserializer=raw_records`` the records are passed through as they were decoded.

Nothing else changes: which batches are skipped (aborted transactions under
``read_committed``, control batches), the positions and offsets the consumer tracks and
commits, and the records' contents are aiokafka's own code and values. Consumers without this
deserializer (every other consumer of the process) get ``ConsumerRecord`` objects as before.
"""

from __future__ import annotations

from typing import Any

__all__ = ["install", "raw_records"]

_state = {"installed": False}


def raw_records(value: bytes | None) -> bytes | None:
    """The value deserializer that marks a consumer whose records are passed through as
    aiokafka decoded them (never called for such a consumer; identity otherwise)."""
    return value


def _passthrough(tp: Any, record: Any) -> Any:
    return record


def install() -> bool:
    """Make consumers created with ``value_deserializer=raw_records`` yield the decoded records
    themselves. Idempotent; False if this aiokafka has another layout (nothing changed then:
    the consumer yields ``ConsumerRecord`` objects, which carry the same attributes)."""
    if _state["installed"]:
        return True
    try:
        from aiokafka.consumer import fetcher
    except ImportError:  # pragma: no cover - the service extra is not installed
        return False
    base = getattr(fetcher, "PartitionRecords", None)
    if base is None or not hasattr(base, "_consumer_record"):  # pragma: no cover
        return False

    class PartitionRecords(base):  # type: ignore[misc, valid-type]
        """aiokafka's ``PartitionRecords``; for a ``raw_records`` consumer the per-record
        ``ConsumerRecord`` is skipped (decided once per fetched partition, not per record)."""

        def __init__(self, tp: Any, records: Any, aborted_transactions: Any,
                     fetch_offset: Any, key_deserializer: Any, value_deserializer: Any,
                     *args: Any) -> None:
            super().__init__(tp, records, aborted_transactions, fetch_offset,
                             key_deserializer, value_deserializer, *args)
            if value_deserializer is raw_records:
                self._consumer_record = _passthrough

    fetcher.PartitionRecords = PartitionRecords
    _state["installed"] = True
    return True
