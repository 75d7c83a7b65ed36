"""Release: partial counts -> noisy decayed counts on the counts topic (the second stage).

Holds the pure state of one release shard (:mod:`~agents.release.state`: it gathers a tick's
partials from every events partition, steps the shard's counters and encodes the released
messages; no I/O), the state of a binary-attribute domain's shard
(:mod:`~agents.release.attributes`) and the stage that runs them on Kafka
(:mod:`~agents.release.stage`: one transaction per complete tick holds its counts, compact records
and the shard's checkpoint).

May import: ``agents.ingest`` (the partials and routing it consumes), ``agents.kafka``,
``agents.config``, ``agents.telemetry``, ``stream_dp`` (counters, mechanisms). Must not import
``reconcile``, ``worker``, ``dashboard``, ``commands`` or ``cli``.
"""
