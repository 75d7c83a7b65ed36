"""The deployment's identity: what the noise and every checkpoint are bound to.

Two deployments that share a noise key must never draw related noise (DESIGN.md §2.4, §2.7):
if they did, the difference of their releases would be the exact difference of their data — for
example the count of the events one of them accepts as on time and the other as late. So the
noise key's label (:func:`stream_dp.counters.bank_context`, field ``domain``) is not just the
domain's digest but :func:`deployment_id`: the SHA-256 of the canonical JSON of the domain
digest and **every setting that decides what a tick contains**, plus the deployment's identity
(``app_id`` and the events topic), and the deployment's **nonce** (:mod:`agents.kafka.nonce`): a
random value its first worker writes to the schedule topic, so that another cluster or
re-created topics with the very same settings never share noise either.

Every field of :class:`agents.config.settings.Settings` is classified here, either in :data:`BINDING`
(it is part of the identity), in :data:`USER_BINDING` (part of the identity of a deployment
whose unit of privacy is a person, ``privacy_unit = "user"``) or in :data:`NOT_BINDING` with the
reason it cannot change what a tick contains. A unit test enumerates the settings: a setting
added later without a classification fails it, and changing any binding setting must change
the noise.

:data:`USER_BINDING` enters the identity only with ``privacy_unit = "user"``: the identity of an
event-level deployment (and so its noise, its checkpoints and every byte it publishes) is
exactly what it was before the person existed as a unit, and a user-level identity always holds
``privacy_unit``, which no event-level one does — the two never share noise.
"""

from __future__ import annotations

import hashlib
from typing import Any

from agents.config.settings import Settings

__all__ = ["BINDING", "NOT_BINDING", "USER_BINDING", "bound_names", "deployment_context",
           "deployment_id"]

#: settings that decide which events a tick contains, how they count, or which deployment this
#: is; each is part of :func:`deployment_context`
BINDING: tuple[str, ...] = (
    # identity: which deployment and which log
    "app_id", "events_topic", "events_partitions", "events_start", "schedule_topic",
    "events_timestamp_type",
    # the schedule: which tick an event lands in, and when ticks close
    "schedule", "origin", "tick_seconds", "allowed_lateness_s", "close_grace_s",
    "max_future_skew_s", "max_event_age_s", "max_backlog_ticks",
    # what an event may contribute
    "max_message_bytes", "max_event_value", "cap", "max_events_per_tick",
    # the mechanism (also in its own description) and the release split
    "strategy", "p", "horizon", "privacy_model", "epsilon", "rho", "epoch", "shards",
    "attribute_epoch_ticks", "attribute_bootstrap_fraction", "attribute_max_cluster",
)

#: settings that decide which of a person's events count (privacy_unit = user): part of the
#: identity of user-level deployments only (see the module docstring)
USER_BINDING: tuple[str, ...] = (
    "privacy_unit", "user_field", "user_period_ticks", "user_max_events", "user_max_streams",
    "user_max_events_per_stream", "user_min_separation_ticks",
)

#: settings that cannot change what a tick contains, with the reason
NOT_BINDING: dict[str, str] = {
    "bootstrap": "where the brokers are (addresses change); another cluster is another "
                 "incarnation, told apart by the deployment nonce (agents.kafka.nonce)",
    "security_protocol": "transport security", "ssl_cafile": "transport security",
    "ssl_certfile": "transport security", "ssl_keyfile": "transport security",
    "ssl_key_password_file": "transport security", "ssl_check_hostname": "transport security",
    "sasl_mechanism": "authentication", "sasl_username": "authentication",
    "sasl_password_file": "authentication", "sasl_oauth_token_file": "authentication",
    "sasl_oauth_token_command": "authentication",
    "worker_id": "one worker of the deployment; all workers release the same values",
    "counts_topic": "output only", "histograms_topic": "output only",
    "compact_topic": "output only", "counts_json": "output format only",
    "histograms_json": "output format only", "dlq_topic": "output only",
    "counts_partitions": "output only", "histograms_partitions": "output only",
    "dlq_partitions": "output only", "replication_factor": "durability only",
    "partials_topic": "internal transport of sealed, integer partials",
    "partials_retention_s": "internal retention",
    "ingest_checkpoints_topic": "sealed state bound to this identity",
    "ingest_users_topic": "sealed state bound to this identity",
    "release_checkpoints_topic": "sealed state bound to this identity",
    "leader_topic": "reconcile leadership (post-processing)",
    "reconcile_every": "post-processing cadence",
    "domain_file": "its content is bound (the domain digest), not its path",
    "key_file": "the key itself keys the noise; its path does not matter",
    "idle_timeout_s": "not consulted by the schedule (kept for old configuration files)",
    "web_host": "web server", "web_port": "web server", "log_level": "logging",
    "session_timeout_s": "group membership timing", "transaction_timeout_s": "producer timing",
    "stall_timeout_s": "failure detection", "commit_interval_s": "checkpoint cadence",
    "pipeline_processes": "process layout", "empty_fetch_backoff_ms": "fetch pacing",
    "release_checkpoint_every": "checkpoint cadence (re-steps are bit-identical)",
    "max_batch": "fetch size (closing points are offsets, not batches)",
    "checkpoint_chunk_bytes": "checkpoint encoding", "metrics_event_counts": "metrics",
    "max_memory_mb": "resource limit",
    "user_expected_people": "resource estimate (start-up memory check)",
    "user_flush_interval_s": "checkpoint cadence (a restore re-decides the events since the "
                             "last write of the table: bit-identical)",
}


def bound_names(settings: Settings) -> tuple[str, ...]:
    """The settings bound into ``settings``' deployment: :data:`BINDING`, plus
    :data:`USER_BINDING` when the unit of privacy is a person."""
    return BINDING + USER_BINDING if settings.privacy_unit == "user" else BINDING


def deployment_context(settings: Settings, domain_digest: str, nonce: str = ""
                       ) -> dict[str, Any]:
    """Everything the deployment's noise is bound to: the domain digest, every
    :data:`BINDING` setting (and :data:`USER_BINDING` one with ``privacy_unit = "user"``; floats as exact hex, so 1.0 and 1.0000000001 differ) and the
    deployment's nonce (:mod:`agents.kafka.nonce`; ``""`` for the pure states of unit tests)."""
    doc: dict[str, Any] = {"context": "stream-dp/deployment", "version": 1,
                           "domain": str(domain_digest)}
    if nonce:
        doc["nonce"] = nonce
    for name in bound_names(settings):
        v = getattr(settings, name)
        doc[name] = float(v).hex() if isinstance(v, float) else v
    return doc


def deployment_id(settings: Settings, domain_digest: str, nonce: str = "") -> str:
    """SHA-256 (hex) of :func:`deployment_context` as canonical JSON: the ``domain_id`` that
    keys every bank's noise and binds every checkpoint of the deployment."""
    from stream_dp.mechanism import canonical_json

    return hashlib.sha256(canonical_json(deployment_context(settings, domain_digest, nonce))
                          ).hexdigest()
