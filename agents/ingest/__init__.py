"""Ingest stage state for one events partition (pure: no I/O; the pipeline does the Kafka part).

For each record, in offset order: decode and validate (:func:`agents.codec.decode_event`),
reject undeclared keys, times out of range and late events (→ dead letters), clamp the value to
``cap`` and add it to every node the event feeds, in the bucket of its tick. Every decision about
a record uses that record only (its event time, its Kafka record timestamp) plus the partition's
**closing points** (:mod:`agents.ticks`): "tick ``n`` closes before offset ``c``". A closing
point comes from the public clock (the pipeline reads the end offset once the clock has passed
the tick's deadline, :meth:`IngestState.schedule_close`), from a broker timestamp past the
deadline on LogAppendTime topics, from a close marker (markers schedule), or from the schedule
topic, where every applied closing point is persisted with a digest of the records it closes
over so that restarts and replays make the same decisions and refuse a changed log
(:class:`ScheduleMismatch`). When ticks close, each is split by release shard and handed over as
one *partial* per shard — for **every** shard, even empty ones, so the release schedule never
depends on the data.

The state (offset, next open tick, open buckets, running digest) round-trips through
:meth:`IngestState.to_bytes` so that a restarted worker resumes exactly where the last committed
checkpoint left off.

**Two implementations, one result.** :meth:`IngestState.process_batch` is written in Python
and is the authoritative definition of every decision. When the C extension
``agents._fastingest`` is built (``pip install``), its scanner handles, in compiled code, the
records it is sure about — no headers, the plain ``{"key", "ts", "value"}`` shape in strict
JSON, a declared key, in range and on time: digest, checks, integer units into the bucket — and
hands every other record to the Python code (``FAST_PATH_STATUS`` says which path runs; a
property test, ``tests/unit/test_fastingest.py``, shows that both leave identical state). The
events consumer delivers whole fetched batches as record blocks (:mod:`agents.raw_records`),
which :meth:`IngestState.process_fetched` passes to the scanner without a Python object per
record.

Node routing (:class:`Router`): a stream belongs to shard ``crc32(name) mod shards`` — stable
across processes and releases (Python's ``hash`` is salted per process, so it is not used).

Where the code lives (this module re-exports every name listed here): the partition state in
:mod:`agents.ingest_state` (:class:`IngestState`, :class:`IngestOutput`), records and the
compiled fast path in :mod:`agents.ingest_records`, the keyed digest in
:mod:`agents.ingest_digest`, routing and partials in :mod:`agents.ingest_routing`, closing
points in :mod:`agents.ingest_schedule`.
"""

from __future__ import annotations

from agents.ingest.digest import _DIGEST_MOD as _DIGEST_MOD
from agents.ingest.digest import _UNKEYED as _UNKEYED
from agents.ingest.digest import DIGEST_PURPOSE as DIGEST_PURPOSE
from agents.ingest.digest import _header_bytes as _header_bytes
from agents.ingest.digest import digest_key as digest_key
from agents.ingest.digest import entry_key as entry_key
from agents.ingest.digest import record_digest as record_digest
from agents.ingest.records import _NO_STOP as _NO_STOP
from agents.ingest.records import FAST_PATH_STATUS as FAST_PATH_STATUS
from agents.ingest.records import Record as Record
from agents.ingest.records import RecordBlock as RecordBlock
from agents.ingest.records import _fast_dumps as _fast_dumps
from agents.ingest.records import _fast_loads as _fast_loads
from agents.ingest.records import _fastingest as _fastingest
from agents.ingest.routing import Partial as Partial
from agents.ingest.routing import Router as Router
from agents.ingest.routing import shard_of as shard_of
from agents.ingest.schedule import Close as Close
from agents.ingest.schedule import ScheduleEntry as ScheduleEntry
from agents.ingest.schedule import ScheduleMismatch as ScheduleMismatch
from agents.ingest.state import IngestOutput as IngestOutput
from agents.ingest.state import IngestState as IngestState
from agents.ingest.state import _is_marker as _is_marker

__all__ = [
    "FAST_PATH_STATUS",
    "Close",
    "IngestState",
    "Partial",
    "Router",
    "ScheduleEntry",
    "ScheduleMismatch",
    "digest_key",
    "entry_key",
    "record_digest",
    "shard_of",
]


