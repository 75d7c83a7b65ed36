"""The service's settings (:class:`Settings`): every field with its default and documentation,
loading from the environment and TOML files, derived topic names, and validation.

The settings table of :mod:`agents.config` and ``docs/configuration.md`` are generated from
these fields (``python -m agents.config``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.config.env import check_environment, did_you_mean
from agents.config.values import _check_float, _check_int, _coerce, _read_toml, env_var
from stream_dp.budget import ZCDP, Privacy, PureDP

_STRATEGIES = ("naive", "naive-int", "dm", "dmfda", "fenwick-opt", "tree", "binary-tree", "sqrt",
               "tree-ls", "blt", "blt-horizon", "auto")


#: internal topic name -> (default with the default app id, suffix for any other app id)
_INTERNAL_TOPICS = {
    "partials_topic": ("dp.partials.v1", "partials.v1"),
    "ingest_checkpoints_topic": ("dp.checkpoints.ingest.v1", "checkpoints.ingest.v1"),
    "release_checkpoints_topic": ("dp.checkpoints.release.v1", "checkpoints.release.v1"),
    "schedule_topic": ("dp.schedule.v1", "schedule.v1"),
    "leader_topic": ("dp.reconcile.leader", "reconcile.leader"),
    "ingest_users_topic": ("dp.ingest-users.v1", "ingest-users.v1"),
}
_DEFAULT_APP_ID = "stream-dp"
_DERIVED = (" With another app_id than the default, the default name is `<app_id>.{suffix}`, so "
            "a new deployment never shares internal state by accident.")


def _s(default: Any, doc: str, shown: str | None = None) -> Any:
    return field(default=default, metadata={"doc": doc, "shown": shown})


@dataclass(frozen=True)
class Settings:
    """Every setting of a worker; see the module docstring for the table. Immutable, validated."""

    bootstrap: str = _s("127.0.0.1:9092", "Kafka bootstrap servers, comma-separated host:port.")
    security_protocol: str = _s(
        "PLAINTEXT",
        "Kafka connection security for every client: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL "
        "(see docs/operations.md, 'Connecting to a secured cluster').",
    )
    ssl_cafile: str = _s(
        "", "SSL: CA bundle (PEM) that signs the brokers' certificates; empty: the system CAs.",
        "(system CAs)",
    )
    ssl_certfile: str = _s(
        "", "SSL: client certificate (PEM) for mutual TLS; goes with ssl_keyfile.", "(none)"
    )
    ssl_keyfile: str = _s("", "SSL: the client certificate's private key (PEM).", "(none)")
    ssl_key_password_file: str = _s(
        "", "SSL: file holding the private key's password (never logged).", "(none)"
    )
    ssl_check_hostname: bool = _s(
        True, "SSL: check that the broker's certificate names the host connected to.", "true"
    )
    sasl_mechanism: str = _s(
        "", "SASL: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (SASL_* protocols).",
        "(none)",
    )
    sasl_username: str = _s("", "SASL PLAIN / SCRAM: the user name.", "(none)")
    sasl_password_file: str = _s(
        "", "SASL PLAIN / SCRAM: file holding the password (never logged).", "(none)"
    )
    sasl_oauth_token_file: str = _s(
        "", "SASL OAUTHBEARER: file holding a bearer token, re-read at every connection "
        "(rotate it in place).", "(none)",
    )
    sasl_oauth_token_command: str = _s(
        "", "SASL OAUTHBEARER: command that prints a bearer token (run at every connection, "
        "30 s limit); instead of sasl_oauth_token_file.", "(none)",
    )
    app_id: str = _s(
        "stream-dp",
        "Application id: prefix of the consumer groups (`<app_id>.ingest`, `<app_id>.release`) "
        "and of the transactional ids. All workers of one deployment share it.",
    )
    worker_id: str = _s(
        "",
        "This worker's stable identity: Kafka static membership `group.instance.id` (a restarted "
        "worker takes its own place at once). Unique per worker, stable across restarts (e.g. the "
        "StatefulSet pod name). Empty means the host name.",
        "(host name)",
    )
    events_topic: str = _s("dp.events.v1", "Input topic of events, keyed by event key.")
    counts_topic: str = _s(
        "dp.counts.v1", "Output topic of noisy decayed counts, one message per (stream, tick)."
    )
    histograms_topic: str = _s(
        "dp.histograms.v1", "Output topic of consistent histograms (reconcile side agent)."
    )
    compact_topic: str = _s(
        "",
        "Optional output topic of compact counts: one dp.counts.block.v1 record per (shard, "
        "tick), key = shard name, values and standard errors as little-endian arrays "
        "(docs/formats.md), written in the same transaction as the per-stream messages. The "
        "shard manifests (dp.manifest.v1) go to `<compact_topic>.manifests` (compacted). "
        "Empty = off.",
        "(off)",
    )
    counts_json: int = _s(
        1,
        "1: publish one dp.counts.v1 JSON message per stream and tick on counts_topic (the "
        "default). 0: publish only the compact records (needs compact_topic): the mode for "
        "large deployments; the reconcile side agent, the dashboard and `stream-dp tail "
        "compact` read the compact records instead.",
    )
    histograms_json: int = _s(
        1,
        "1: the reconcile side agent publishes each consistent histogram as one dp.histograms.v1 "
        "JSON message on histograms_topic (the default; about 100 bytes per node, so up to about "
        "500 000 nodes). 0: only as compact chunk records (dp.histograms.block.v1, needs "
        "compact_topic). With compact_topic set the chunk records are always written, to "
        "`<compact_topic>.histograms`, their node manifest to `<compact_topic>.manifests` "
        "(key `histogram`); docs/formats.md.",
    )
    dlq_topic: str = _s("dp.events.dlq", "Dead-letter topic for rejected events, with a reason.")
    partials_topic: str = _s(
        "",
        "INTERNAL: per-tick raw partial counts from ingest to release shards. Never expose it to "
        "users; short retention." + _DERIVED.format(suffix="partials.v1"),
        "dp.partials.v1",
    )
    ingest_checkpoints_topic: str = _s(
        "",
        "INTERNAL: ingest-stage checkpoints (offsets, open tick buckets); one partition per "
        "events partition." + _DERIVED.format(suffix="checkpoints.ingest.v1"),
        "dp.checkpoints.ingest.v1",
    )
    release_checkpoints_topic: str = _s(
        "",
        "INTERNAL: release-stage checkpoints (CounterBank state, offsets); one partition per "
        "release shard." + _DERIVED.format(suffix="checkpoints.release.v1"),
        "dp.checkpoints.release.v1",
    )
    events_timestamp_type: str = _s(
        "LogAppendTime",
        "`message.timestamp.type` that `stream-dp topics` gives the events topic: `LogAppendTime` "
        "(the broker stamps every record; producers cannot move an event's arrival) or "
        "`CreateTime` (producers' timestamps; see docs/privacy.md for what then holds).",
    )
    events_partitions: int = _s(
        8, "Partitions of the events topic (ingest parallelism). Must match the existing topic."
    )
    shards: int = _s(
        8,
        "Release shards = partitions of the partials topic (release parallelism). Fixed for a "
        "deployment's lifetime: streams are assigned to shards by a stable hash of their name.",
    )
    counts_partitions: int = _s(8, "Partitions of the counts topic.")
    histograms_partitions: int = _s(1, "Partitions of the histograms topic.")
    dlq_partitions: int = _s(1, "Partitions of the dead-letter topic.")
    replication_factor: int = _s(
        1, "Replication factor for topics created by `stream-dp topics` (3 in production)."
    )
    partials_retention_s: int = _s(
        3600,
        "Retention of the internal partials topic, seconds (keep it short: it carries raw counts).",
    )
    domain_file: str = _s(
        "examples/domain.toml",
        "Path of the domain TOML declaring the streams (see docs/configuration.md).",
    )
    key_file: str = _s(
        "",
        "File holding the noise key. If unset the key is read from the variable STREAM_DP_KEY. "
        "Never logged.",
        "(unset)",
    )
    tick_seconds: float = _s(60.0, "Tick length L, seconds of event time.")
    origin: float = _s(
        math.nan,
        "Start of tick 1, Unix seconds; tick n covers [origin + (n-1)L, origin + nL). Every tick "
        "from 1 on is released, so choose the deployment's start.",
        "(required)",
    )
    allowed_lateness_s: float = _s(
        5.0,
        "Allowed lateness, seconds: tick n's deadline is its end plus this. An event whose Kafka "
        "record timestamp is at or after its tick's deadline is dead-lettered (reason `late`); "
        "decided from that record alone.",
    )
    close_grace_s: float = _s(
        1.0,
        "Clock schedule: a worker closes tick n once its clock passes the deadline plus this "
        "many seconds (covers clock skew between producers, brokers and workers), at the "
        "partition's end offset read then.",
    )
    schedule: str = _s(
        "clock",
        "Release schedule: `clock` (live: ticks close on the public clock, see docs/privacy.md) "
        "or `markers` (replays of historical logs: ticks close only at the close markers that "
        "`stream-dp replay` writes; record timestamps are not consulted).",
    )
    schedule_topic: str = _s(
        "",
        "INTERNAL: every applied closing point (events partition, ticks, offset, digest of the "
        "records) is persisted here with the release, so restarts and replays make the same "
        "decisions and a changed log is refused. One partition per events partition."
        + _DERIVED.format(suffix="schedule.v1"),
        "dp.schedule.v1",
    )
    max_backlog_ticks: int = _s(
        1_000_000,
        "Clock schedule: refuse to start if the origin lies more than this many ticks in the "
        "past (every tick from 1 on is released; a far-away origin is almost always a mistake).",
    )
    idle_timeout_s: float = _s(
        10.0,
        "Deprecated and ignored (the old event-time watermark's idle timeout); kept so that "
        "existing configuration files still load.",
    )
    max_future_skew_s: float = _s(
        300.0,
        "Events whose time is more than this many seconds ahead of their record's Kafka "
        "timestamp are rejected (reason `future`; clock schedule).",
    )
    max_event_age_s: float = _s(
        0.0,
        "Events whose record's Kafka timestamp is more than this many seconds after their event "
        "time are rejected (reason `too_old`; clock schedule); 0 disables the check.",
    )
    max_message_bytes: int = _s(
        4096, "Larger event messages are rejected (reason `oversize`)."
    )
    max_event_value: float = _s(
        1e6,
        "Event values above this are rejected as implausible (reason `value_out_of_range`); "
        "values in (cap, max] are clamped to cap.",
    )
    cap: float = _s(1.0, "Contribution bound: one event adds min(value, cap) to each node it feeds.")
    strategy: str = _s(
        "auto",
        "Release strategy (naive, naive-int, dm, dmfda, fenwick-opt, tree, binary-tree, sqrt, "
        "tree-ls, blt, blt-horizon, auto; sqrt, blt and blt-horizon need privacy_model = zcdp; "
        "auto never picks blt-horizon). naive-int releases "
        "whole-number counts with discrete Laplace noise: it needs a "
        "whole-number cap, and events with fractional values are dead-lettered "
        "(`value_not_integer`).",
    )
    p: float = _s(0.95, "Decay per tick, in [1e-6, 1]; 1 = plain running count.")
    horizon: int = _s(
        4095, "Ticks the strategy plans its noise for (2^m - 1); a stream rolls over into the "
        "strategy's next horizon period after it (nothing to do; docs/runbooks.md)."
    )
    privacy_model: str = _s("pure", "Privacy model: `pure` (epsilon) or `zcdp` (rho).")
    epsilon: float = _s(
        1.0,
        "Pure-DP epsilon per event, per released stream (an event feeding h nodes spends h times "
        "it).",
    )
    rho: float = _s(
        0.5, "zCDP rho per event, per released stream (used when privacy_model = zcdp)."
    )
    epoch: int = _s(
        0,
        "A label bound into the deployment's identity, like every setting that decides what a "
        "tick contains (epsilon, rho, strategy, p, horizon, cap, the schedule, the domain): "
        "changing any of them on a running deployment is refused (exit status 4, naming the "
        "setting). To change them start a new deployment, with its own app id, topics, key "
        "and privacy budget: `stream-dp deployment new` (docs/runbooks.md).",
    )
    max_events_per_tick: int = _s(
        10_000,
        "Declared maximum number of events one released stream receives in one tick (all "
        "events partitions together), at most 2^29. Each stream's count in a tick is clipped to "
        "cap × this before it is released (clipping never raises the sensitivity; clipped "
        "stream-ticks are counted in the operator-only metric stream_dp_clipped_total, exported "
        "with metrics_event_counts = 1), so a burst can never "
        "stop or change the releases except through the noisy value. The worker refuses at "
        "start-up a configuration in which cap × this exceeds the strategy's numeric range "
        "(docs/accuracy.md, 'Numeric range'). Binary-attribute domains: each table cell's "
        "count in a tick is clipped to this, and the range checked is that of the tables' "
        "counters at their per-table budget, for every epoch (docs/guide.md, 'High-dimensional "
        "binary attributes').",
    )
    privacy_unit: str = _s(
        "event",
        "Unit of privacy: `event` (one event is protected; the budget is per event) or `user` "
        "(preview: one person, named by the event field user_field, is protected; each person's "
        "counted events are bounded per period by the user_* settings, in log order, before "
        "any noise; records must be keyed by that identifier so that Kafka's default "
        "partitioner puts all of a person's records on one events partition, others are "
        "dead-lettered `wrong_partition`). The compiled ingest path bounds persons in its own "
        "pass (32 bytes a person) unless a leaf bound is set (user_max_streams, or "
        "user_max_events_per_stream below user_max_events) or user_max_events > 65535: then "
        "the pure path does. "
        "docs/privacy.md, 'User-level privacy (preview)'.",
    )
    user_field: str = _s(
        "user",
        "privacy_unit = user: the event JSON field holding the person's identifier, a string "
        "of 1 to 256 UTF-8 bytes (bytes are the identity: nothing is normalised). An event "
        "without it, or with another value, is dead-lettered (`invalid_user`). The identifier "
        "is never stored, logged or exported: the per-person state is keyed by a keyed hash. "
        "A field name with a control character, a quote or backslash, or more than 256 UTF-8 "
        "bytes runs every record on the pure Python ingest path (slower; the start-up log "
        "says so).",
    )
    ingest_users_topic: str = _s(
        "",
        "INTERNAL, privacy_unit = user only: the per-person table of ingest as a compacted "
        "changelog (key: the person's keyed hash, never the identifier; one sealed record per "
        "person changed since the last commit, a tombstone when a closed period frees them), "
        "written in the ingest transaction; one partition per events partition; `stream-dp "
        "topics` creates it only for user-level deployments." + _DERIVED.format(
            suffix="ingest-users.v1"),
        "dp.ingest-users.v1",
    )
    user_period_ticks: int = _s(
        -1,
        "privacy_unit = user: ticks per bounding period; period P holds ticks P·T + 1 .. "
        "(P+1)·T (aligned, public). 0 = one period, the whole deployment.",
        "(required with user)",
    )
    user_max_events: int = _s(
        0,
        "privacy_unit = user: K, the most events of one person counted per period (the first "
        "K in log order; later ones are dropped, counted in the operator-only metric "
        "stream_dp_user_bounded_events_total).",
        "(required with user)",
    )
    user_max_streams: int = _s(
        0,
        "privacy_unit = user: L, the most distinct streams (event keys) one person's counted "
        "events reach per period; 0 = no bound beyond user_max_events. On a binary-attribute "
        "domain a stream is an event's attribute vector (one cell of the full table), for "
        "user_max_events_per_stream too.",
    )
    user_max_events_per_stream: int = _s(
        0,
        "privacy_unit = user: k, the most events of one person counted per stream and period; "
        "0 = user_max_events.",
    )
    user_min_separation_ticks: int = _s(
        0,
        "privacy_unit = user: b, the fewest ticks between two counted events of one person "
        "(any period; an event for a tick before one already counted is dropped); 0 = none.",
    )
    user_flush_interval_s: float = _s(
        30.0,
        "privacy_unit = user: longest time (seconds) between writes of the per-person table to "
        "its changelog topic (ingest_users_topic); the commits in between carry the offsets "
        "and sums but not the table, and a restore after a crash re-decides the events since "
        "the last write (about this many seconds of the events topic, read again) instead. "
        "A table changed at every commit costs one changelog record per person changed per "
        "commit (~1 µs each); written this often, one per person changed per interval. Every "
        "graceful stop and hand-over writes it; 0 = with every commit. Releases are the same "
        "whatever it is (a restore re-decides exactly). The events since the last write must "
        "still be in the events topic at a restore: keep its retention above the worker's "
        "lag + this interval + the longest time a worker may be down (a restore that finds "
        "them gone refuses to start).",
    )
    user_expected_people: int = _s(
        1_000_000,
        "privacy_unit = user: the active persons (those with state in the current or last "
        "period) one worker holds over all its events partitions, for the start-up memory "
        "check only: it reserves 640 bytes a person with the compact table or 1344 with the pure "
        "path's (leaf bounds, K > 65535): the table and, at a commit that changes everyone (a "
        "period's close), its changelog records and the producer's batches of them (measured "
        "in a worker at 10^6 people: 573 bytes with the compact table; plus a tenth). Never a limit: more people are all counted (refusing one would make a "
        "person's fate depend on others); size max_memory_mb for them. 0 = reserve nothing.",
    )
    leader_topic: str = _s(
        "",
        "One-partition topic of the reconcile side agent's leader election (never written to)."
        + _DERIVED.format(suffix="reconcile.leader"),
        "dp.reconcile.leader",
    )
    reconcile_every: int = _s(
        1, "The reconcile side agent publishes a consistent histogram every N ticks."
    )
    attribute_epoch_ticks: int = _s(
        1440,
        "Binary-attribute domains: ticks per structure epoch. Each epoch's events are also "
        "measured once by a bootstrap (attribute_bootstrap_fraction of epsilon), from which the "
        "next epoch's tables are chosen (docs/guide.md, 'High-dimensional binary attributes').",
    )
    attribute_bootstrap_fraction: float = _s(
        0.2,
        "Binary-attribute domains: share of epsilon each event spends on its epoch's bootstrap "
        "(0: keep the first epoch's tables for good and give the tables all of epsilon).",
    )
    attribute_max_cluster: int = _s(
        4,
        "Binary-attribute domains: most attributes of one measured table (1..8; a table has "
        "2^size cells).",
    )
    web_host: str = _s(
        "127.0.0.1", "Bind address of the web server (/healthz, /readyz, /metrics, dashboard)."
    )
    web_port: int = _s(6066, "Port of the web server.")
    log_level: str = _s("info", "Log level: debug, info, warning, error.")
    session_timeout_s: float = _s(10.0, "Consumer group session timeout, seconds.")
    transaction_timeout_s: float = _s(
        60.0,
        "Kafka transaction timeout, seconds (an abandoned transaction is aborted after it).",
    )
    stall_timeout_s: float = _s(
        30.0,
        "A partition of a stage's input that makes no progress for this many seconds while it "
        "has work (or a tick that misses partials this long) makes the worker leave and rejoin "
        "the stage's consumer group, so a partition left without an owner (seen on noida-db "
        "after a kill -9 of the group leader) is assigned again.",
    )
    commit_interval_s: float = _s(
        2.0,
        "Longest time between ingest commits (checkpoint + offsets + dead letters) when no tick "
        "closes; a partition whose open state takes long to encode (with privacy_unit = user: "
        "its checkpoint and its per-person changelog records) is committed at most every "
        "20 times its encoding time (checkpoints then cost at most 5% of the time; every tick "
        "close commits anyway).",
    )
    pipeline_processes: int = _s(
        0,
        "0: `stream-dp worker` runs the pipeline (ingest and release) in its own process, next "
        "to the web server, dashboard and reconcile side agent. N ≥ 1: in N child processes "
        "(consumer group members `<worker_id>.p<i>`; Kafka spreads partitions and shards over "
        "them), so the pipeline never waits for the dashboard or a reconcile solve and a worker "
        "uses N + 1 cores; their metrics are relayed to the parent's /metrics.",
    )
    empty_fetch_backoff_ms: int = _s(
        50,
        "Client-side pause after a fetch that returned no records, milliseconds (every consumer "
        "of the process): an idle worker then costs almost no CPU even against a broker that "
        "answers empty fetches at once; records arriving meanwhile wait at most this long "
        "(5x as long, 250 ms by default, for the reconcile side agent and the dashboard, "
        "which lag releases by seconds anyway). The worker's own consumers let it grow while "
        "idle, doubling after each empty fetch in a row: the events consumer's up to 20x (1 s "
        "by default: an event arriving after an idle spell is read within that; a clock close "
        "whose closing point lies ahead of it ends the pause, and what a tick contains never "
        "depends on when an event was read), the release "
        "stage's up to 20x while the worker's own ingest owns every events partition (each of "
        "its partials commits ends the pause; otherwise it stays 1x), the reconcile side "
        "agent's and the dashboard's up to 4x their 5x. 0 disables it. `stream-dp tail` and the standalone "
        "dashboard read the same variable.",
    )
    release_checkpoint_every: int = _s(
        1,
        "Release shards write their full counter state with every K-th released tick (K = this; "
        "1 = every tick). The transactions in between commit a small sealed progress record "
        "instead; a restarted shard restores the last full state and re-steps the ticks since "
        "then silently from the retained partials (the noise is a function of the key, stream "
        "and tick, so the state is bit-identical and nothing is published twice). Large-state "
        "strategies at 10^6 streams save most of a checkpoint's time per tick. A shard also "
        "writes its full state when its last one is older than a quarter of "
        "`partials_retention_s`. Binary-attribute domains always checkpoint every tick.",
    )
    max_batch: int = _s(5000, "Most records taken per fetch from one consumer (the events "
                         "consumer on the compiled ingest path takes max_batch / 100 record "
                         "batches, about as many records).")
    checkpoint_chunk_bytes: int = _s(
        524288, "Checkpoints are split into messages of at most this many bytes."
    )
    events_start: str = _s(
        "earliest",
        "Where ingest starts on a partition without a checkpoint: `earliest` or `latest`.",
    )
    metrics_event_counts: int = _s(
        0,
        "1 exports the operator-only metrics that move with raw counts "
        "(`stream_dp_events_total`, `stream_dp_dead_letters_total`, "
        "`stream_dp_consumer_lag_messages`, `stream_dp_clipped_total`, "
        "`stream_dp_ingest_checkpoint_seconds`, `stream_dp_user_bounded_events_total`) on "
        "/metrics, and the log lines that move with "
        "them (the `tick_closed` warning; the events offsets, ingest checkpoint numbers and "
        "closing-point counts of the ingest stage's restore lines). They are exact counts "
        "without noise (or a raw threshold bit): operator data, never for publication "
        "(docs/privacy.md). 0 (default) keeps them off the endpoint and out of the logs.",
    )
    max_memory_mb: int = _s(
        0,
        "Refuse to start when the estimated memory of the strategy's tables and of all declared "
        "streams (`stream_dp.limits.estimate_memory`, an upper bound), with privacy_unit = user "
        "plus user_expected_people persons (agents.config.memory), exceeds this many MiB; 0 = "
        "the memory available to the process (cgroup limit, else physical memory).",
    )

    @property
    def manifests_topic(self) -> str:
        """Topic of the shard manifests of :attr:`compact_topic` (empty when that is off)."""
        return f"{self.compact_topic}.manifests" if self.compact_topic else ""

    @property
    def histogram_blocks_topic(self) -> str:
        """Topic of the compact histogram chunks (``dp.histograms.block.v1``; empty when
        :attr:`compact_topic` is off)."""
        return f"{self.compact_topic}.histograms" if self.compact_topic else ""

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        if not self.worker_id:
            object.__setattr__(self, "worker_id", socket.gethostname() or "worker")
        for name, (default, suffix) in _INTERNAL_TOPICS.items():
            if not getattr(self, name):
                derived = default if self.app_id == _DEFAULT_APP_ID else f"{self.app_id}.{suffix}"
                object.__setattr__(self, name, derived)
        for name in ("bootstrap", "app_id", "events_topic", "counts_topic", "histograms_topic",
                     "dlq_topic", "partials_topic", "ingest_checkpoints_topic",
                     "release_checkpoints_topic", "domain_file", "schedule_topic",
                     "leader_topic"):
            if not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")
        from agents.config.values import bootstrap_problem

        problem = bootstrap_problem(self.bootstrap)
        if problem:
            raise ValueError(f"bootstrap: {problem}")
        for name in ("events_partitions", "shards", "counts_partitions",
                     "histograms_partitions", "dlq_partitions", "replication_factor",
                     "partials_retention_s", "max_message_bytes", "reconcile_every",
                     "max_batch", "checkpoint_chunk_bytes", "horizon", "max_backlog_ticks",
                     "max_events_per_tick"):
            _check_int(name, getattr(self, name), 1, 2**31 - 1)
        _check_int("max_events_per_tick", self.max_events_per_tick, 1, 2**29)
        _check_int("epoch", self.epoch, 0, 2**31 - 1)
        _check_int("attribute_epoch_ticks", self.attribute_epoch_ticks, 1, 2**31 - 1)
        _check_int("counts_json", self.counts_json, 0, 1)
        _check_int("empty_fetch_backoff_ms", self.empty_fetch_backoff_ms, 0, 10_000)
        _check_int("pipeline_processes", self.pipeline_processes, 0, 256)
        _check_int("release_checkpoint_every", self.release_checkpoint_every, 1, 1_000_000)
        _check_int("histograms_json", self.histograms_json, 0, 1)
        if not self.histograms_json and not self.compact_topic:
            raise ValueError("histograms_json = 0 needs compact_topic: the histograms would not "
                             "be published at all")
        if not self.counts_json and not self.compact_topic:
            raise ValueError("counts_json = 0 needs compact_topic: without either nothing would "
                             "be published")
        _check_int("attribute_max_cluster", self.attribute_max_cluster, 1, 8)
        if not 0.0 <= self.attribute_bootstrap_fraction < 1.0:
            raise ValueError("attribute_bootstrap_fraction must be in [0, 1), got "
                             f"{self.attribute_bootstrap_fraction!r}")
        _check_int("web_port", self.web_port, 0, 65535)
        if math.isnan(self.origin):
            raise ValueError(
                "origin must be set (STREAM_DP_ORIGIN or `origin` in the TOML file): the Unix "
                "time in seconds at which tick 1 starts"
            )
        _check_float("origin", self.origin, lo=0.0, lo_open=False)
        _check_float("tick_seconds", self.tick_seconds, lo=0.0)
        for name in ("allowed_lateness_s", "max_event_age_s", "close_grace_s",
                     "user_flush_interval_s"):
            _check_float(name, getattr(self, name), lo=0.0, lo_open=False)
        for name in ("idle_timeout_s", "max_future_skew_s", "session_timeout_s",
                     "transaction_timeout_s", "commit_interval_s", "cap", "max_event_value",
                     "stall_timeout_s",
                     "epsilon", "rho"):
            _check_float(name, getattr(self, name), lo=0.0)
        if not (0.0 < self.p <= 1.0) or math.isnan(self.p):
            raise ValueError(f"p must be in (0, 1], got {self.p!r}")
        if self.p < 1e-6:
            raise ValueError(f"p must be at least 1e-6 (decay per tick), got {self.p!r}")
        if self.strategy not in _STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(_STRATEGIES)}, got {self.strategy!r}")
        if self.strategy == "naive-int" and not float(self.cap).is_integer():
            raise ValueError(f"cap must be a whole number with strategy naive-int, got {self.cap!r}")
        if self.privacy_model not in ("pure", "zcdp"):
            raise ValueError(f"privacy_model must be 'pure' or 'zcdp', got {self.privacy_model!r}")
        if self.log_level.lower() not in ("debug", "info", "warning", "warn", "error", "critical"):
            raise ValueError(
                f"log_level must be one of debug, info, warning, error, critical, got {self.log_level!r}"
            )
        if self.events_timestamp_type not in ("LogAppendTime", "CreateTime"):
            raise ValueError("events_timestamp_type must be 'LogAppendTime' or 'CreateTime', "
                             f"got {self.events_timestamp_type!r}")
        if self.schedule not in ("clock", "markers"):
            raise ValueError(f"schedule must be 'clock' or 'markers', got {self.schedule!r}")
        if self.events_start not in ("earliest", "latest"):
            raise ValueError(f"events_start must be 'earliest' or 'latest', got {self.events_start!r}")
        _check_user_settings(self)
        from agents.config.security import KafkaSecurity

        KafkaSecurity.from_settings(self).validate()
        if self.max_event_value < self.cap:
            raise ValueError(
                f"max_event_value must be >= cap ({self.cap!r}), got {self.max_event_value!r}"
            )
        _check_inputs(self)

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"Settings({shown})"

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(
        cls,
        toml_path: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Settings:
        """Defaults < TOML file (``toml_path`` or ``STREAM_DP_CONFIG``) < ``env`` < ``overrides``.

        ``env`` defaults to ``os.environ``. Raises ``ValueError`` naming the offending setting.
        """
        environ: Mapping[str, str] = os.environ if env is None else env
        # a misspelt variable would otherwise leave its setting at the default, unnoticed
        check_environment(environ, (env_var(f.name) for f in dataclasses.fields(cls)))
        values: dict[str, Any] = {}
        path = toml_path if toml_path is not None else environ.get("STREAM_DP_CONFIG") or None
        base: Path | None = None
        if path is not None:
            base = Path(path).resolve().parent
            data = _read_toml(path, "settings file")
            known = {f.name: f for f in dataclasses.fields(cls)}
            for key, raw in data.items():
                if key not in known:
                    raise ValueError(f"unknown setting {key!r} in {path}"
                                     f"{did_you_mean(key, known)}")
                values[key] = _coerce(key, known[key].type, raw)
        for f in dataclasses.fields(cls):
            var = env_var(f.name)
            if var in environ:
                values[f.name] = _coerce(f.name, f.type, environ[var])
        for key, raw in overrides.items():
            values[key] = raw
        if base is not None:
            for key in ("domain_file", "key_file", "ssl_cafile", "ssl_certfile", "ssl_keyfile",
                        "ssl_key_password_file", "sasl_password_file", "sasl_oauth_token_file"):
                if values.get(key) and not Path(values[key]).is_absolute():
                    values[key] = str(base / values[key])
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (validated again).

        Internal topic names that were derived from the app id follow a changed ``app_id``.
        """
        if "app_id" in changes:
            for name, (default, suffix) in _INTERNAL_TOPICS.items():
                derived = default if self.app_id == _DEFAULT_APP_ID else f"{self.app_id}.{suffix}"
                if name not in changes and getattr(self, name) == derived:
                    changes[name] = ""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ derived values
    @property
    def privacy(self) -> Privacy:
        """The per-event, per-stream budget: ``PureDP(epsilon)`` or ``ZCDP(rho)``."""
        return PureDP(self.epsilon) if self.privacy_model == "pure" else ZCDP(self.rho)

    @property
    def ingest_group(self) -> str:
        return f"{self.app_id}.ingest"

    @property
    def release_group(self) -> str:
        return f"{self.app_id}.release"

    def tick_bounds(self, tick: int) -> tuple[float, float]:
        """``(start, end)`` of tick ``tick`` (1-based) in Unix seconds."""
        return (
            self.origin + (tick - 1) * self.tick_seconds,
            self.origin + tick * self.tick_seconds,
        )

    def noise_key(self) -> bytes:
        """The secret noise key, from ``key_file`` or the variable ``STREAM_DP_KEY``. Never log it."""
        from stream_dp.noise.keys import load_key

        key: bytes = load_key(self.key_file or None, env="STREAM_DP_KEY")
        return key


#: the settings of the person as unit of privacy (privacy_unit = user), in checking order
USER_SETTINGS = ("privacy_unit", "user_field", "user_period_ticks", "user_max_events",
                 "user_max_streams", "user_max_events_per_stream", "user_min_separation_ticks")
#: the largest bound (a count or a tick distance that fits 32 bits, as stream_dp.user_level)
_USER_MAX = (1 << 32) - 1
#: fields of the event itself, which cannot hold the identifier
_EVENT_FIELDS = ("key", "ts", "value", "attrs")


def _check_user_settings(settings: Settings) -> None:
    """``privacy_unit`` and the person's bounds: all valid, the required ones set with
    ``user``, none of them set with ``event`` (a bound that would be silently ignored is a
    privacy mistake waiting to happen)."""
    unit = settings.privacy_unit
    if unit not in ("event", "user"):
        raise ValueError(f"privacy_unit must be 'event' or 'user', got {unit!r}")
    field_name = settings.user_field
    if not isinstance(field_name, str) or not field_name or len(field_name) > 256:
        raise ValueError("user_field must be the name of an event field (1 to 256 characters), "
                         f"got {field_name!r}")
    if field_name in _EVENT_FIELDS:
        raise ValueError(f"user_field must not be one of the event's own fields "
                         f"({', '.join(_EVENT_FIELDS)}), got {field_name!r}")
    if settings.user_period_ticks != -1:  # -1: not set
        _check_int("user_period_ticks", settings.user_period_ticks, 0, _USER_MAX)
    _check_int("user_max_events", settings.user_max_events, 0, _USER_MAX)
    for name in ("user_max_streams", "user_max_events_per_stream",
                 "user_min_separation_ticks"):
        _check_int(name, getattr(settings, name), 0, _USER_MAX)
    if unit == "user":
        if settings.user_period_ticks < 0:
            raise ValueError("privacy_unit = user needs user_period_ticks (ticks per bounding "
                             "period, e.g. 1440 for a day of 60 s ticks; 0 = the whole "
                             "deployment)")
        if settings.user_max_events < 1:
            raise ValueError("privacy_unit = user needs user_max_events >= 1 (the most events "
                             "of one person counted per period)")
        return
    defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
    for name in USER_SETTINGS[1:]:
        if getattr(settings, name) != defaults[name]:
            raise ValueError(f"{name} = {getattr(settings, name)!r} needs privacy_unit = user "
                             "(with privacy_unit = event no person is bounded): set "
                             "privacy_unit = user, or remove it")


def _check_inputs(settings: Settings) -> None:
    """Text is valid Unicode and the mechanism's parameters lie in the library's documented
    ranges (:mod:`stream_dp.limits`), so nothing fails after the worker joined its groups."""
    from stream_dp.limits import check_parameters

    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(
                    f"{f.name} must be valid UTF-8 text (no undecodable bytes or lone "
                    f"surrogates), got {value!r}"
                ) from None
    _check_int("max_memory_mb", settings.max_memory_mb, 0, 2**40)
    _check_int("user_expected_people", settings.user_expected_people, 0, 1 << 40)
    _check_int("metrics_event_counts", settings.metrics_event_counts, 0, 1)
    pure = settings.privacy_model == "pure"
    check_parameters(
        p=settings.p, horizon=settings.horizon, cap=settings.cap,
        epsilon=settings.epsilon if pure else None, rho=None if pure else settings.rho,
    )
