"""What every Kafka client of the service shares: the plumbing under the stages and the agent.

Holds clients and their errors (:mod:`~agents.kafka.clients`), the service's topics
(:mod:`~agents.kafka.topics`), consumer-group helpers aiokafka lacks
(:mod:`~agents.kafka.groups`), fetch pacing (:mod:`~agents.kafka.fetch_backoff`), committed reads
past stale aborted-transaction listings (:mod:`~agents.kafka.aborted_transactions`), the
transactional producer that refuses a failed record (:mod:`~agents.kafka.checked_producer`),
produce requests with one copy (:mod:`~agents.kafka.produce_encoding`), chunked checkpoints in
compacted topics (the format in :mod:`~agents.kafka.checkpoints`, reading them back in
:mod:`~agents.kafka.checkpoint_reader`), the shard manifests (:mod:`~agents.kafka.manifests`),
the deployment nonce and the settings it was created with, kept on the schedule topic
(:mod:`~agents.kafka.nonce`, :mod:`~agents.kafka.deployment_settings`), the wire formats of
every topic (:mod:`~agents.kafka.codec`, with the JSON Schemas in ``agents/schemas/``), Kafka's
default partitioner for keyed records (:mod:`~agents.kafka.partitioner`, pure: where a record
keyed by a person lands), the
exactly-once machinery both pipeline stages share (:mod:`~agents.kafka.stage`: group consumer,
transactional producers, restore, fencing; its health checks in
:mod:`~agents.kafka.stage_health`), all a stage sees of the process that runs it
(:mod:`~agents.kafka.stage_host`), the reconcile agent's consumer helpers
(:mod:`~agents.kafka.reading`) and the embedded development broker
(:mod:`~agents.kafka.embedded_broker`, :mod:`~agents.kafka.processes`).

May import: ``agents.config``, ``agents.telemetry``, ``stream_dp``, ``aiokafka``. Must not import
``ingest``, ``release``, ``reconcile``, ``worker``, ``dashboard``, ``commands`` or ``cli``: a
stage comes to this machinery, never the other way round.
"""
