"""``stream-dp topics create|list``: the service's topics, with explicit partition counts."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from agents.kafka.clients import bootstrap_argument, start_client

HELP = "create the service's topics with explicit partitions"

DESCRIPTION = """\
Create every topic the service uses, with the partition counts and configs from the settings
(defaults < TOML file < STREAM_DP_* environment variables; see docs/configuration.md), plus the
one-partition leader-election topic of the reconcile side agent. Existing topics are kept; an
existing topic whose partition count differs from the settings is an error (ingest checkpoints
and shard assignment are tied to it). Brokers' auto-create defaults differ, so create topics
before the first worker starts. 'list' shows the topics with their partition counts.

Configs it sets: the events topic gets message.timestamp.type = events_timestamp_type
(LogAppendTime by default: the broker stamps every record on arrival, which the release schedule
reads as the event's arrival; docs/privacy.md, "The release schedule"); the internal partials
topic a short retention (partials_retention_s); the checkpoint topics compaction; the schedule
topic (schedule_topic, closing points) no time limit. Topic names are settings, so several
deployments can share one cluster.

examples:
  stream-dp topics create                                   # broker from STREAM_DP_BOOTSTRAP
  stream-dp topics create --bootstrap 127.0.0.1:19092 --partitions 16
  STREAM_DP_REPLICATION_FACTOR=3 stream-dp topics create --config prod.toml
  stream-dp topics list --bootstrap 127.0.0.1:19092
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("create", "list"), help="what to do")
    parser.add_argument("--config", type=Path, default=None,
                        help="settings TOML file (default: $STREAM_DP_CONFIG)")
    parser.add_argument("--bootstrap", default=None, type=bootstrap_argument,
                        help="Kafka bootstrap servers (default: settings / STREAM_DP_BOOTSTRAP)")
    parser.add_argument("--partitions", type=int, default=None,
                        help="partitions of the events, counts and partials topics and shards "
                             "(default: the settings')")
    parser.add_argument("--replication-factor", type=int, default=None,
                        help="replication factor (default: settings, 1)")


def _settings(args: argparse.Namespace) -> object:
    import math
    import time

    from agents.config.settings import Settings

    overrides: dict[str, Any] = {}
    if args.bootstrap:
        overrides["bootstrap"] = args.bootstrap
    if args.partitions is not None:
        n = args.partitions
        overrides.update(events_partitions=n, counts_partitions=n, shards=n)
    if args.replication_factor is not None:
        overrides["replication_factor"] = args.replication_factor
    try:
        return Settings.load(args.config, **overrides)
    except ValueError as exc:
        if "origin" not in str(exc):
            raise
    # Creating topics does not need the tick origin; any value passes validation.
    return Settings.load(args.config, origin=float(math.floor(time.time())), **overrides)


async def create_topics(settings: object) -> list[str]:
    """Create the missing service topics and the reconcile leader topic; return created names."""
    from agents.kafka.topics import ensure_topics
    from agents.reconcile.leader import LEADER_TOPIC, ensure_leader_topic

    bootstrap: str = settings.bootstrap  # type: ignore[attr-defined]
    created = await ensure_topics(bootstrap, settings)  # type: ignore[arg-type]
    from aiokafka.admin import AIOKafkaAdminClient

    from agents.config.security import KafkaSecurity

    security = KafkaSecurity.from_settings(settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await start_client(admin)
    try:
        leader_topic = getattr(settings, "leader_topic", LEADER_TOPIC)
        had_leader = leader_topic in set(await admin.list_topics())
    finally:
        await admin.close()
    if not had_leader:
        await ensure_leader_topic(bootstrap, leader_topic, security)
        created.append(leader_topic)
    return created


async def list_topics(bootstrap: str, security: Any = None) -> list[tuple[str, int]]:
    from aiokafka.admin import AIOKafkaAdminClient

    from agents.config.security import client_kwargs

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_kwargs(security))
    await start_client(admin)
    try:
        names = sorted(n for n in await admin.list_topics() if not n.startswith("__"))
        described = await admin.describe_topics(names) if names else []
        return sorted((d["topic"], len(d["partitions"])) for d in described)
    finally:
        await admin.close()


def run(args: argparse.Namespace) -> int:
    try:
        settings = _settings(args)
    except ValueError as exc:
        print(f"stream-dp topics: {exc}", file=sys.stderr)
        return 2
    bootstrap: str = settings.bootstrap  # type: ignore[attr-defined]
    try:
        if args.action == "list":
            from agents.config.security import KafkaSecurity

            security = KafkaSecurity.from_settings(settings)
            for name, parts in asyncio.run(list_topics(bootstrap, security)):
                print(f"{name}\t{parts}")
            return 0
        created = asyncio.run(create_topics(settings))
    except ValueError as exc:
        print(f"stream-dp topics: {exc}", file=sys.stderr)
        return 1
    except ImportError:
        raise  # no Kafka client installed: the console script names the extra to install
    except Exception as exc:  # connection errors: say what failed, no traceback
        from agents.kafka.clients import connection_problem

        print(f"stream-dp topics: {connection_problem(exc, bootstrap)}", file=sys.stderr)
        return 1
    if created:
        for name in created:
            print(f"created {name}")
    else:
        print("all topics exist")
        try:
            held = asyncio.run(records_held(settings))
        except Exception:  # a note only
            held = {}
        if held:
            what = ", ".join(f"{t}: {n:,} records" for t, n in held.items())
            print(f"note: they hold the data of earlier runs ({what}); a worker with another "
                  "noise key or other settings refuses those checkpoints (exit status 4). For a "
                  "fresh start use a fresh broker (stream-dp broker start --data-dir NEW_DIR) or "
                  "a new app_id and topic names", file=sys.stderr)
    return 0


async def records_held(settings: Any) -> dict[str, int]:
    """Records in the events and checkpoint topics (end - beginning offsets), non-empty only."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from agents.config.security import KafkaSecurity

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, group_id=None,
                                enable_auto_commit=False,
                                **KafkaSecurity.from_settings(settings).client_kwargs())
    await start_client(consumer)
    out: dict[str, int] = {}
    try:
        await consumer.topics()
        for topic in (settings.events_topic, settings.ingest_checkpoints_topic,
                      settings.release_checkpoints_topic):
            tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
            if not tps:
                continue
            ends = await consumer.end_offsets(tps)
            begins = await consumer.beginning_offsets(tps)
            n = sum(int(ends[tp]) - int(begins[tp]) for tp in tps)
            if n > 0:
                out[topic] = n
    finally:
        await consumer.stop()
    return out
