"""The service's topics: names, partition counts, configs, and :func:`ensure_topics`.

| topic (default name) | partitions | key | cleanup | who reads it |
|---|---|---|---|---|
| ``dp.events.v1`` | ``events_partitions`` | event key | delete, LogAppendTime | ingest stage |
| ``dp.counts.v1`` | ``counts_partitions`` | stream name | delete | users, reconcile agent |
| ``dp.histograms.v1`` | ``histograms_partitions`` | domain name | delete | users, dashboard |
| ``dp.events.dlq`` | ``dlq_partitions`` | original key | delete | operators |
| ``dp.partials.v1`` (internal) | ``shards`` | tick | delete, short retention | release stage only |
| ``dp.checkpoints.ingest.v1`` (internal) | ``events_partitions`` | chunk id | compact | ingest stage only |
| ``dp.checkpoints.release.v1`` (internal) | ``shards`` | chunk id | compact | release stage only |
| ``dp.schedule.v1`` (internal) | ``events_partitions`` | app id + partition | delete, no time limit | ingest stage only |
| ``dp.ingest-users.v1`` (internal; ``privacy_unit = user`` only) | ``events_partitions`` | a person's keyed hash | compact | ingest stage only |

The events topic is created with ``message.timestamp.type=LogAppendTime`` (setting
``events_timestamp_type``): every record then carries the broker's clock as its timestamp, which no
producer can set, and the clock schedule reads it as the event's arrival (:mod:`agents.ingest.ticks`).

The internal topics that hold state are checked at every start
(:func:`check_internal_topics`): the schedule topic (the deployment nonce, every closing point)
must keep ``cleanup.policy=delete``, ``retention.ms=-1``, ``retention.bytes=-1``, the checkpoint
topics ``cleanup.policy=compact``; a retention given later, or a cluster default applied to a
topic made by hand, is refused (exit status 2) before it can lose them.

Partition counts are explicit (broker auto-create defaults differ); :func:`ensure_topics` creates
missing topics and raises ``ValueError`` if an existing one has a different partition count,
because ingest checkpoints and shard assignment are tied to them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from agents.config.settings import Settings

__all__ = [
    "COUNTS",
    "DLQ",
    "EVENTS",
    "HISTOGRAMS",
    "INGEST_CHECKPOINTS",
    "PARTIALS",
    "RELEASE_CHECKPOINTS",
    "SCHEDULE",
    "TopicConfigMismatch",
    "TopicSpec",
    "check_internal_topics",
    "ensure_topics",
    "internal_topic_problem",
    "internal_topic_roles",
    "started_admin",
    "topic_specs",
]

EVENTS = "dp.events.v1"
COUNTS = "dp.counts.v1"
HISTOGRAMS = "dp.histograms.v1"
DLQ = "dp.events.dlq"
PARTIALS = "dp.partials.v1"
INGEST_CHECKPOINTS = "dp.checkpoints.ingest.v1"
RELEASE_CHECKPOINTS = "dp.checkpoints.release.v1"
SCHEDULE = "dp.schedule.v1"


@dataclass(frozen=True)
class TopicSpec:
    """One topic to create: name, partitions, replication and broker configs."""

    name: str
    partitions: int
    replication: int
    configs: tuple[tuple[str, str], ...] = ()
    internal: bool = False


#: Largest histogram message (the reconcile agent's ``max_message_bytes``, gzip-compressed).
HISTOGRAM_MAX_BYTES = 64 * 1024 * 1024
#: Largest compact record or manifest (the release producer's ``max_request_size``).
_COMPACT_MAX_BYTES = 16 * 1024 * 1024


#: most nodes in one release shard: a tick's partial (~25 bytes of JSON per node) must fit
#: the partials topic's 16 MiB records
MAX_SHARD_NODES = 600_000


def check_shard_size(router: object) -> None:
    """Refuse at start-up a shard too large for one partial record (raise ``shards``)."""
    for shard, nodes in enumerate(router.shard_nodes):  # type: ignore[attr-defined]
        if len(nodes) > MAX_SHARD_NODES:
            raise ValueError(
                f"shard {shard} has {len(nodes)} streams; at most {MAX_SHARD_NODES} fit one "
                "partial record per tick: raise shards (about 250 000 streams per shard is a "
                "good size)")


def check_compact_size(domain: object, router: object) -> None:
    """Refuse at start-up a deployment whose compact records or manifests could not be sent:
    16 bytes per stream of the largest shard (plus the header), and its names, must fit
    :data:`_COMPACT_MAX_BYTES`. More shards make each record smaller."""
    import json

    names = list(domain.names)  # type: ignore[attr-defined]
    for shard, nodes in enumerate(router.shard_nodes):  # type: ignore[attr-defined]
        record = 4096 + 16 * len(nodes)
        manifest = 256 + len(json.dumps([names[i] for i in nodes], ensure_ascii=False)
                             .encode("utf-8"))
        if max(record, manifest) > _COMPACT_MAX_BYTES:
            raise ValueError(
                f"compact_topic: shard {shard} has {len(nodes)} streams, its records or manifest "
                f"would exceed {_COMPACT_MAX_BYTES} bytes; raise shards")


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """Every topic the service uses, with its partition count and configs."""
    rf = settings.replication_factor
    compact = (("cleanup.policy", "compact"), ("min.compaction.lag.ms", "60000"))
    return [
        TopicSpec(settings.events_topic, settings.events_partitions, rf,
                  (("message.timestamp.type", settings.events_timestamp_type),)),
        TopicSpec(settings.counts_topic, settings.counts_partitions, rf),
        # one consistent histogram per tick holds every node: up to the reconcile agent's 64 MiB
        TopicSpec(settings.histograms_topic, settings.histograms_partitions, rf,
                  (("max.message.bytes", str(HISTOGRAM_MAX_BYTES)),)),
        TopicSpec(settings.dlq_topic, settings.dlq_partitions, rf),
        # a tick's partial for a shard holds up to every node of the shard (~25 bytes each)
        TopicSpec(
            settings.partials_topic,
            settings.shards,
            rf,
            (("retention.ms", str(settings.partials_retention_s * 1000)),
             ("max.message.bytes", str(_COMPACT_MAX_BYTES))),
            internal=True,
        ),
        TopicSpec(settings.ingest_checkpoints_topic, settings.events_partitions, rf, compact, True),
        TopicSpec(settings.release_checkpoints_topic, settings.shards, rf, compact, True),
        TopicSpec(settings.schedule_topic, settings.events_partitions, rf,
                  (("retention.ms", "-1"),), internal=True),
    ] + ([
        # one record per (shard, tick), partition = shard; records up to the producer's 16 MiB
        TopicSpec(settings.compact_topic, settings.shards, rf,
                  (("max.message.bytes", str(_COMPACT_MAX_BYTES)),)),
        # the shard manifests and the histogram's node manifest (~15 bytes per node)
        TopicSpec(settings.manifests_topic, settings.shards, rf,
                  (*compact, ("max.message.bytes", str(HISTOGRAM_MAX_BYTES)))),
        # the reconcile agent's chunk records: at most CHUNK_NODES nodes (6 MiB) each
        TopicSpec(settings.histogram_blocks_topic, settings.histograms_partitions, rf,
                  (("max.message.bytes", str(_COMPACT_MAX_BYTES)),)),
    ] if settings.compact_topic else []) + ([
        # the per-person table's changelog (agents.ingest.users): one partition per events
        # partition, compacted (one live record per person)
        TopicSpec(settings.ingest_users_topic, settings.events_partitions, rf, compact, True),
    ] if settings.privacy_unit == "user" else [])


async def ensure_topics(bootstrap: str, settings: Settings, timeout_s: float = 30.0) -> list[str]:
    """Create the missing topics of :func:`topic_specs`; return the names created.

    Raises ``ValueError`` if an existing topic's partition count differs from the settings.
    """
    from aiokafka.admin import NewTopic

    admin = await started_admin(bootstrap, settings, timeout_s)
    try:
        specs = topic_specs(settings)
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            await admin.create_topics(
                [
                    NewTopic(
                        s.name,
                        num_partitions=s.partitions,
                        replication_factor=s.replication,
                        topic_configs=dict(s.configs),
                    )
                    for s in missing
                ],
                timeout_ms=int(timeout_s * 1000),
            )
        present = [s for s in specs if s.name in existing]
        if present:
            described = await admin.describe_topics([s.name for s in present])
            counts = {d["topic"]: len(d["partitions"]) for d in described}
            for s in present:
                if counts.get(s.name, s.partitions) != s.partitions:
                    raise ValueError(
                        f"topic {s.name!r} has {counts[s.name]} partitions but the settings "
                        f"ask for {s.partitions}; fix the settings or recreate the topic"
                    )
        return [s.name for s in missing]
    finally:
        await admin.close()


class TopicConfigMismatch(ValueError):
    """A topic's broker-side configuration contradicts the settings (the worker refuses to
    start: exit status 2). ``unreported``: the broker did not report the setting at all (at
    start-up a refusal too; while the worker runs, a broker that is coming back may answer so:
    the periodic re-check tries again instead of stopping the worker)."""

    def __init__(self, message: str, *, unreported: bool = False) -> None:
        super().__init__(message)
        self.unreported = unreported


async def started_admin(bootstrap: str, settings: Settings, timeout_s: float) -> Any:
    """A started admin client; closed again if it does not start (a broker that is away must
    not leave an unclosed client behind)."""
    from aiokafka.admin import AIOKafkaAdminClient

    from agents.config.security import KafkaSecurity

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap,
                                request_timeout_ms=int(timeout_s * 1000),
                                **KafkaSecurity.from_settings(settings).client_kwargs())
    try:
        await admin.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await admin.close()
        raise
    return admin


async def _describe(bootstrap: str, settings: Settings, timeout_s: float, admin: Any,
                    resources: list[Any]) -> Any:
    """DescribeConfigs of ``resources`` through ``admin`` (left open: the caller's), or
    through a client started for this one request when ``admin`` is ``None``."""
    if admin is not None:
        return await admin.describe_configs(resources)
    own = await started_admin(bootstrap, settings, timeout_s)
    try:
        return await own.describe_configs(resources)
    finally:
        await own.close()


async def topic_config(bootstrap: str, settings: Settings, topic: str, name: str,
                       timeout_s: float = 30.0, admin: Any = None) -> str | None:
    """The value of config ``name`` of ``topic`` as the broker reports it (DescribeConfigs),
    or ``None`` if the broker does not report it. ``admin``: a started admin client to ask
    through (a periodic re-check keeps one), else one is started for the request."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    responses = await _describe(bootstrap, settings, timeout_s, admin, [
        ConfigResource(ConfigResourceType.TOPIC, topic, configs={name: None})])
    for resp in responses:
        for res in resp.resources:
            if res[3] != topic:
                continue
            if res[0] == 3:  # UNKNOWN_TOPIC_OR_PARTITION
                raise RuntimeError(
                    f"topic {topic!r} does not exist; create the topics first (stream-dp topics)")
            for entry in res[4]:
                if entry[0] == name:
                    return str(entry[1])
    return None


async def check_events_topic(bootstrap: str, settings: Settings,
                             timeout_s: float = 30.0, admin: Any = None) -> None:
    """Refuse an events topic whose ``message.timestamp.type`` is not the setting
    ``events_timestamp_type``: the LogAppendTime closing rule trusts broker timestamps, and a
    CreateTime topic lets producers claim any timestamp (and on some brokers the LogAppendTime
    bit). Raises :class:`TopicConfigMismatch`."""
    found = await topic_config(bootstrap, settings, settings.events_topic,
                               "message.timestamp.type", timeout_s=timeout_s, admin=admin)
    want = settings.events_timestamp_type
    if found is None:
        raise TopicConfigMismatch(
            f"the broker does not report message.timestamp.type of the events topic "
            f"{settings.events_topic!r}; cannot check it against events_timestamp_type = {want}",
            unreported=True)
    if found != want:
        raise TopicConfigMismatch(
            f"the events topic {settings.events_topic!r} has message.timestamp.type={found}, "
            f"the settings say events_timestamp_type = {want}: set the topic's config "
            f"(kafka-configs --alter --add-config message.timestamp.type={want}) or the setting")


#: What the internal topics that hold state must keep, per role: ``(config, required value,
#: why)``. The schedule topic holds the deployment nonce and every closing point (the noise and
#: the reproduction of a replay depend on them), the checkpoint topics the authenticated state:
#: a retention, compaction of the schedule, or time-based deletion of a checkpoint topic loses
#: them for good (issue #32).
_KEEPS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "schedule": (
        ("cleanup.policy", "delete", "it holds the deployment nonce and every closing point, "
         "several per key, which compaction would drop"),
        ("retention.ms", "-1", "it holds the deployment nonce and every closing point, which "
         "must never expire"),
        ("retention.bytes", "-1", "it holds the deployment nonce and every closing point, "
         "which a size limit would delete"),
    ),
    "checkpoints": (
        ("cleanup.policy", "compact", "it holds the stage's state, which time- or size-based "
         "deletion would lose"),
    ),
}


def internal_topic_roles(settings: Settings) -> list[tuple[str, str]]:
    """``(topic, role)`` of the internal topics whose settings :func:`check_internal_topics`
    checks (role: ``schedule`` or ``checkpoints``)."""
    return [(settings.schedule_topic, "schedule"),
            (settings.ingest_checkpoints_topic, "checkpoints"),
            (settings.release_checkpoints_topic, "checkpoints")] + (
        [(settings.ingest_users_topic, "checkpoints")] if settings.privacy_unit == "user"
        else [])


def internal_topic_problem(topic: str, role: str, configs: dict[str, str]) -> str | None:
    """The one-line refusal for ``topic`` (``role`` as in :func:`internal_topic_roles`) with
    broker configs ``configs`` (name → value as DescribeConfigs reports them), or ``None``."""
    for name, want, why in _KEEPS[role]:
        found = configs.get(name)
        if found is None:
            return (f"the broker does not report {name} of the {role} topic {topic!r}, so "
                    f"the worker cannot check it ({why}): it must be {name}={want}")
        if found.strip().lower().replace(" ", "") != want:
            return (f"the {role} topic {topic!r} has {name}={found}, but {why}: set it back "
                    f"(kafka-configs --alter --entity-type topics --entity-name {topic} "
                    f"--add-config {name}={want}); if records are gone already, the deployment "
                    "cannot be continued: start a new one (new app_id and topics)")
    return None


async def check_internal_topics(bootstrap: str, settings: Settings,
                                timeout_s: float = 30.0, admin: Any = None) -> None:
    """Refuse internal topics whose broker-side settings would lose what they hold (a
    retention on the schedule topic, a checkpoint topic that is not compacted only): one
    DescribeConfigs request for all of them. Raises :class:`TopicConfigMismatch` (exit
    status 2) naming the topic, the setting and the fix."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    roles = internal_topic_roles(settings)
    names = sorted({name for keeps in _KEEPS.values() for name, _, _ in keeps})
    responses = await _describe(bootstrap, settings, timeout_s, admin, [
        ConfigResource(ConfigResourceType.TOPIC, topic, configs=dict.fromkeys(names))
        for topic, _ in dict(roles).items()])
    found: dict[str, dict[str, str]] = {}
    for resp in responses:
        for res in resp.resources:
            if res[0] == 3:  # UNKNOWN_TOPIC_OR_PARTITION
                raise TopicConfigMismatch(
                    f"topic {res[3]!r} does not exist; create the topics first (stream-dp "
                    "topics create)")
            found.setdefault(res[3], {}).update(
                {str(e[0]): str(e[1]) for e in res[4] if e[1] is not None})
    for topic, role in roles:
        configs = found.get(topic, {})
        problem = internal_topic_problem(topic, role, configs)
        if problem is not None:
            raise TopicConfigMismatch(problem, unreported=any(
                name not in configs for name, _, _ in _KEEPS[role]))
