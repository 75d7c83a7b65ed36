"""The reconcile agent's configuration (:class:`ReconcilerConfig`) and its default solver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agents.reconcile.leader import LEADER_GROUP, LEADER_TOPIC, _security_of

#: ``(domain, noisy, variances) -> result`` (numbers in domain order: sequences or arrays)
SolveFn = Callable[[Any, Any, Any], Any]


def _default_solve() -> SolveFn:
    from stream_dp.consistency import reconcile

    solve: SolveFn = reconcile
    return solve


@dataclass(frozen=True)
class ReconcilerConfig:
    """Where the reconciler reads, writes and elects.

    ``every`` is in ticks (publish ticks divisible by it); timeouts in milliseconds.
    """

    bootstrap: str
    counts_topic: str = "dp.counts.v1"
    histograms_topic: str = "dp.histograms.v1"
    #: read the compact records (``dp.counts.block.v1``) of this topic instead of the per-stream
    #: messages of ``counts_topic``; manifests on ``<compact_topic>.manifests``. Empty: JSON.
    compact_topic: str = ""
    #: release shards (one compact record per shard and tick)
    shards: int = 1
    #: publish each histogram as one dp.histograms.v1 JSON message on ``histograms_topic``
    histograms_json: bool = True
    #: with ``compact_topic``: the histogram's chunk records (dp.histograms.block.v1) go here
    #: (default ``<compact_topic>.histograms``), its node manifest to
    #: ``<compact_topic>.manifests`` under the key ``histogram``
    histogram_blocks_topic: str = ""
    #: nodes per chunk record (:data:`stream_dp.compact_histograms.CHUNK_NODES`)
    histogram_chunk_nodes: int = 262_144
    leader_topic: str = LEADER_TOPIC
    leader_group: str = LEADER_GROUP
    domain_name: str = "default"
    every: int = 1
    client_id: str = "stream-dp-reconcile"
    #: Static membership id for the election: a restarted worker (same id) takes its old
    #: place at once, even after ``kill -9``; a graceful stop still leaves the group explicitly.
    #: ``None``: dynamic membership.
    instance_id: str | None = None
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    #: longest wait of the agent's loops for records (ms): the leading loop also runs when this
    #: process's release stage hands over a record and when records come, the election's ends
    #: at a stop and otherwise only surfaces a crashed leading task (restarted within this);
    #: 200 made an idle worker's agent wake 10 times a second (issue #35)
    poll_ms: int = 5_000
    #: Largest uncompressed histogram message (bytes); messages are gzip-compressed, and the
    #: compressed batch must fit the broker's / topic's ``max.message.bytes`` (1 MiB default).
    #: A node takes about 104 bytes of JSON, about 33 gzip-compressed (so ~30 000 nodes fit
    #: the 1 MiB default).
    max_message_bytes: int = 64 << 20
    #: Most ticks buffered while waiting for every node's release (see :class:`TickAssembler`).
    max_pending_ticks: int = 256
    #: TLS / SASL of the agent's Kafka clients (:class:`agents.config.security.KafkaSecurity`);
    #: ``None``: from the ``STREAM_DP_*`` environment
    security: Any = None

    def kafka_kwargs(self) -> dict[str, Any]:
        from agents.config.security import client_kwargs

        return client_kwargs(self.security)

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"every must be an integer >= 1 (ticks), got {self.every!r}")
        if not self.bootstrap:
            raise ValueError("bootstrap must be a non-empty 'host:port[,host:port]' string")
        if not self.domain_name:
            raise ValueError("domain_name must be non-empty (it keys the histograms)")
        if self.compact_topic and not self.histogram_blocks_topic:
            object.__setattr__(self, "histogram_blocks_topic", f"{self.compact_topic}.histograms")
        if not self.histograms_json and not self.histogram_blocks_topic:
            raise ValueError("histograms_json = False needs compact_topic (or "
                             "histogram_blocks_topic): nothing would be published")

    @property
    def manifests_topic(self) -> str:
        """Where the compact records' manifests (and the histogram's node manifest) live:
        ``<compact_topic>.manifests``; without ``compact_topic``, beside an explicitly set
        ``histogram_blocks_topic`` (``X.histograms`` → ``X.manifests``)."""
        if self.compact_topic:
            return f"{self.compact_topic}.manifests"
        if self.histogram_blocks_topic:
            from agents.kafka.manifests import histogram_manifests_topic

            return histogram_manifests_topic(self.histogram_blocks_topic)
        return ""

    @classmethod
    def from_settings(cls, settings: Any, domain_name: str, **changes: Any) -> ReconcilerConfig:
        """The configuration for an :class:`agents.config.settings.Settings` and the domain's name.

        The election group is ``<app_id>.reconcile``; static membership id
        ``<worker_id>.reconcile``.
        """
        values: dict[str, Any] = {
            "bootstrap": settings.bootstrap,
            "counts_topic": settings.counts_topic,
            "histograms_topic": settings.histograms_topic,
            "compact_topic": getattr(settings, "compact_topic", ""),
            "shards": getattr(settings, "shards", 1),
            "histograms_json": bool(getattr(settings, "histograms_json", 1)),
            "leader_topic": getattr(settings, "leader_topic", LEADER_TOPIC),
            "security": _security_of(settings),
            "leader_group": f"{settings.app_id}.reconcile",
            "domain_name": domain_name,
            "every": settings.reconcile_every,
            "client_id": f"{settings.app_id}-reconcile-{settings.worker_id}",
            "instance_id": f"{settings.worker_id}.reconcile",
            "session_timeout_ms": int(settings.session_timeout_s * 1000),
            "heartbeat_interval_ms": max(100, int(settings.session_timeout_s * 1000) // 10),
        }
        values.update(changes)
        return cls(**values)
