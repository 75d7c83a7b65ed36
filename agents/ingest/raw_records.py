"""Hand the ingest stage whole record batches, or aiokafka's own decoded records, instead of a
``ConsumerRecord`` per record.

aiokafka decodes a fetched record batch in compiled code (``aiokafka.record._crecords``), then
builds one Python ``ConsumerRecord`` dataclass per record in
``PartitionRecords._consumer_record``. A py-spy profile of
``benchmarks/service.py --only ingest`` put that constructor at about 70 % of what a bare
consumer spends per record, and the per-record objects (garbage-collector tracked) most of the
rest. For a consumer created with ``value_deserializer=raw_records``:

* with the compiled fast path (:mod:`agents.ingest._fastingest`), every uncompressed record batch
  (message format v2, not a control batch) is yielded as **one**
  ``agents.ingest._fastingest.RecordBlock``: the records located in the fetched bytes, read in place by
  the ingest scanner; a record the pure path must decide is built on demand as an
  :class:`agents.ingest.records.Record`;
* otherwise (a compressed batch, another format, or no compiled module), the records aiokafka
  decoded are passed through as they are: they carry every attribute ingest reads (``offset``,
  ``key``, ``value``, ``timestamp``, ``timestamp_type``, ``headers``).

Nothing else changes: aiokafka's own loop still validates CRCs, skips aborted transactions under
``read_committed`` and control batches, drops records below the fetch position and moves the
position (a block carries its last record's ``offset``). Consumers without this deserializer
(every other consumer of the process) get ``ConsumerRecord`` objects as before. A unit test
compares blocks with aiokafka's decoding record by record, and ingest state both ways.
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


class _BlockBatch:
    """One fetched record batch: aiokafka's batch object for everything aiokafka asks of it,
    and, when iterated, one ``RecordBlock`` of its records at or past the fetch position."""

    __slots__ = ("_batch", "_block_type", "_owner", "_pos", "_raw")

    def __init__(self, batch: Any, raw: bytes, pos: int, owner: Any, block_type: Any) -> None:
        self._batch = batch
        self._raw = raw
        self._pos = pos
        self._owner = owner
        self._block_type = block_type

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __iter__(self) -> Any:
        try:
            block = self._block_type(self._raw, self._pos, self._owner.next_fetch_offset)
        except ValueError:  # compressed, another format, anything odd: aiokafka decodes it
            return iter(self._batch)
        return iter((block,) if len(block) else ())


class _BlockRecords:
    """aiokafka's ``MemoryRecords`` of one fetch, following the byte position of each batch."""

    __slots__ = ("_block_type", "_owner", "_pos", "_raw", "_records")

    def __init__(self, records: Any, raw: bytes, owner: Any, block_type: Any) -> None:
        self._records = records
        self._raw = raw
        self._pos = 0
        self._owner = owner
        self._block_type = block_type

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        pos = self._pos
        raw = self._raw
        if batch is None or pos < 0 or pos + 17 > len(raw):
            self._pos = -1
            return batch
        # every batch format starts with (base offset: 8 bytes, length of the rest: 4 bytes)
        # and has its format version ("magic") at byte 16; an old format's batch object has no
        # base_offset: aiokafka decodes it
        end = pos + 12 + int.from_bytes(raw[pos + 8:pos + 12], "big", signed=True)
        if raw[pos + 16] != 2:
            self._pos = end
            return batch
        if int.from_bytes(raw[pos:pos + 8], "big", signed=True) != batch.base_offset:
            self._pos = -1  # lost track of the bytes: aiokafka decodes the rest itself
            return batch
        self._pos = end
        if getattr(batch, "magic", None) != 2 or batch.is_control_batch:
            return batch
        return _BlockBatch(batch, raw, pos, self._owner, self._block_type)


def install() -> bool:
    """Make consumers created with ``value_deserializer=raw_records`` yield record blocks (or
    the decoded records). Idempotent; False if this aiokafka has another layout (nothing changed
    then: the consumer yields ``ConsumerRecord`` objects, which carry the same attributes)."""
    if _state["installed"]:
        return True
    try:
        from aiokafka.consumer import fetcher
    except ImportError:  # pragma: no cover - the service extra is not installed
        return False
    base = getattr(fetcher, "PartitionRecords", None)
    memory = getattr(fetcher, "MemoryRecords", None)
    if base is None or memory is None or not hasattr(base, "_consumer_record"):  # pragma: no cover
        return False
    from agents.ingest.records import RecordBlock

    class MemoryRecords(memory):  # type: ignore[misc, valid-type]
        """aiokafka's ``MemoryRecords``, keeping the fetched bytes (for record blocks)."""

        def __init__(self, data: Any) -> None:
            super().__init__(data)
            self.raw = data

    class PartitionRecords(base):  # type: ignore[misc, valid-type]
        """aiokafka's ``PartitionRecords``; for a ``raw_records`` consumer batches come as
        record blocks and records without a ``ConsumerRecord`` (decided once per fetch)."""

        def __init__(self, tp: Any, records: Any, aborted_transactions: Any,
                     fetch_offset: Any, key_deserializer: Any, value_deserializer: Any,
                     *args: Any) -> None:
            super().__init__(tp, records, aborted_transactions, fetch_offset,
                             key_deserializer, value_deserializer, *args)
            if value_deserializer is raw_records:
                self._consumer_record = _passthrough
                raw = getattr(records, "raw", None)
                if RecordBlock is not None and type(raw) is bytes:
                    # what the class below hands out (agents.kafka.aborted_transactions may
                    # have read the fetched batches already and cut them): its batches, from
                    # the response's first, over the same bytes
                    handed = getattr(self, "_records")  # noqa: B009 - untyped in aiokafka
                    self._records = _BlockRecords(handed, raw, self, RecordBlock)

    fetcher.MemoryRecords = MemoryRecords
    fetcher.PartitionRecords = PartitionRecords
    _state["installed"] = True
    return True
