"""Ingest: events -> per-tick partial counts, one per release shard (the first pipeline stage).

For each record, in offset order: decode and validate (:func:`agents.kafka.codec.decode_event`),
reject undeclared keys, times out of range and late events (-> dead letters), clamp the value to
``cap`` and add it to every node the event feeds, in the bucket of its tick. Every decision about
a record uses that record only (its event time, its Kafka record timestamp) plus the partition's
**closing points** (:mod:`agents.ingest.ticks`): "tick ``n`` closes before offset ``c``". A
closing point comes from the public clock, from a broker timestamp past the deadline on
LogAppendTime topics, from a close marker (markers schedule), or from the schedule topic, where
every applied closing point is persisted with a digest of the records it closes over so that
restarts and replays make the same decisions and refuse a changed log. When ticks close, each is
split by release shard and handed over as one *partial* per shard — for **every** shard, even
empty ones, so the release schedule never depends on the data. The state (offset, next open
tick, open buckets, running digest) round-trips through the ingest checkpoint, so a restarted
worker resumes exactly where the last committed checkpoint left off.

**Two implementations, one result.** The Python hot loop (:mod:`~agents.ingest.processing`) is
the authoritative definition of every decision; the compiled scanner (``csrc/``, built as
``agents.ingest._fastingest`` by ``pip install``) handles the records it is sure about and hands
every other one to it (a property test shows both leave identical state).

Holds the pure state of one events partition (:mod:`~agents.ingest.state`: closing points,
hand-over, checkpoint; no I/O) and its hot loop (:mod:`~agents.ingest.processing`), the records
and the compiled path's loader (:mod:`~agents.ingest.records`), the keyed schedule digest
(:mod:`~agents.ingest.digest`), the person as unit of privacy (:mod:`~agents.ingest.users`:
identifier, partition check, per-person table), closing points (:mod:`~agents.ingest.schedule`,
:mod:`~agents.ingest.ticks`), node routing (a stream belongs to shard ``crc32(name) mod shards``)
and partials (:mod:`~agents.ingest.routing`), checkpoint columns
(:mod:`~agents.ingest.bucket_columns`), whole fetched record batches
(:mod:`~agents.ingest.raw_records`) and the stage that runs it all on Kafka
(:mod:`~agents.ingest.stage`).

May import: ``agents.kafka``, ``agents.config``, ``agents.telemetry``, ``stream_dp``. Must not
import ``release``, ``reconcile``, ``worker``, ``dashboard``, ``commands`` or ``cli``. Only the
stage and the record batches talk to Kafka; the state and the hot loop are pure.
"""
