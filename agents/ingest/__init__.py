"""Ingest: events -> per-tick partial counts, one per release shard (the first pipeline stage).

For each record, in offset order: decode and validate (:func:`agents.kafka.codec.decode_event`),
reject undeclared keys, times out of range and late events (-> dead letters), clamp the value to
``cap`` and add it to every node the event feeds, in the bucket of its tick. Every decision about
a record uses that record only (its event time, its Kafka record timestamp) plus the partition's
**closing points** (:mod:`agents.ingest.ticks`): "tick ``n`` closes before offset ``c``". When
ticks close, each is split by release shard and handed over as one *partial* per shard — for
**every** shard, even empty ones, so the release schedule never depends on the data.

Holds the pure state of one events partition (:mod:`~agents.ingest.state`: no I/O), the records
and the compiled fast path (:mod:`~agents.ingest.records`, ``csrc/``, built as
``agents.ingest._fastingest``), the keyed schedule digest (:mod:`~agents.ingest.digest`),
closing points (:mod:`~agents.ingest.schedule`, :mod:`~agents.ingest.ticks`), node routing and
partials (:mod:`~agents.ingest.routing`), checkpoint columns
(:mod:`~agents.ingest.bucket_columns`), whole fetched record batches
(:mod:`~agents.ingest.raw_records`) and the stage that runs it all on Kafka
(:mod:`~agents.ingest.stage`).

May import: ``agents.kafka``, ``agents.config``, ``agents.telemetry``, ``stream_dp``. Must not
import ``release``, ``reconcile``, ``worker``, ``dashboard``, ``commands`` or ``cli``. Only the
stage and the record batches talk to Kafka; the state is pure.
"""
