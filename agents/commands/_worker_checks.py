"""The checks ``stream-dp worker`` makes before it starts anything: the settings, the domain
file, the memory and the noise key (:func:`check_startup`, before connecting), this host's claim
on the worker id (:func:`claim_worker_id`) and the broker's topics and deployment settings
(:func:`check_broker`). Each failure is one line and an exit status in
:mod:`agents.commands.worker`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any


def load_settings(args: argparse.Namespace) -> Any:
    """Settings from defaults < TOML < environment < command-line options."""
    from agents.config.settings import Settings

    overrides: dict[str, Any] = {}
    for opt, name in (("bootstrap", "bootstrap"), ("worker_id", "worker_id"),
                      ("web_host", "web_host"), ("web_port", "web_port"),
                      ("log_level", "log_level")):
        value = getattr(args, opt, None)
        if value is not None:
            overrides[name] = value
    return Settings.load(args.config, **overrides)


class StartupProblem(RuntimeError):
    """The worker cannot start as configured (port in use, topics missing): one line, exit 2."""


def check_startup(args: argparse.Namespace) -> tuple[Any, bytes]:
    """Everything that can be checked before connecting to the broker: the settings and their
    ranges, the domain file, the memory the strategy and streams need, the noise key.
    Returns ``(settings, key)``; raises ``ValueError`` / ``OSError`` with a one-line message."""
    from agents.config.domain import load_domain
    from agents.config.memory import check_memory
    from agents.worker.pipeline import check_backlog

    settings = load_settings(args)
    check_backlog(settings)
    if not Path(settings.domain_file).is_file():
        raise ValueError(
            f"domain_file {settings.domain_file!r} not found (relative paths are resolved "
            "against the current folder, or against the settings file's folder when they "
            "come from one)"
        )
    try:
        domain = load_domain(settings.domain_file)
    except OSError as exc:
        raise ValueError(
            f"domain_file {settings.domain_file!r} cannot be read: {exc.strerror or exc}"
        ) from None
    compact = True
    if settings.privacy_unit == "user":
        from agents.ingest.users import compact_table, user_bounds

        compact = compact_table(user_bounds(settings))
    check_memory(settings, len(domain.names), compact_people=compact)
    from agents.config.domain import check_attribute_settings

    check_attribute_settings(settings, domain)  # binary: the table banks' range, at ε_t
    if getattr(domain, "kind", "") != "binary":
        from agents.release.state import build_mechanism

        build_mechanism(settings)  # refuses a numeric range that cap × max_events_per_tick exceeds
    key: bytes = settings.noise_key()
    return settings, key


async def check_broker(settings: Any, key: bytes | None = None) -> None:
    """Connect once and check that the topics the pipeline reads exist with the partition
    counts of the settings, that the internal topics keep what they hold
    (:func:`agents.kafka.topics.check_internal_topics`), and (with the noise ``key``) that the
    deployment was created with these settings (:mod:`agents.kafka.deployment_settings`). Raises
    aiokafka's connection error (no broker), :class:`StartupProblem` (topics) or
    :class:`agents.kafka.deployment_settings.SettingsChanged`, each reported in one line by
    :func:`run`."""
    from aiokafka import AIOKafkaConsumer

    from agents.config.security import KafkaSecurity
    from agents.kafka.clients import start_client

    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap, group_id=None, enable_auto_commit=False,
        request_timeout_ms=30_000, **KafkaSecurity.from_settings(settings).client_kwargs())
    await start_client(consumer)
    try:
        existing = await consumer.topics()
        want = [(settings.events_topic, settings.events_partitions),
                (settings.ingest_checkpoints_topic, settings.events_partitions),
                (settings.schedule_topic, settings.events_partitions),
                (settings.partials_topic, settings.shards),
                (settings.release_checkpoints_topic, settings.shards)]
        missing = [t for t, _ in want if t not in existing]
        if missing:
            raise StartupProblem(
                f"topics missing on {settings.bootstrap}: {', '.join(missing)} (create the "
                "service's topics first, with the same settings: stream-dp topics create)")
        for topic, n in want:
            have = len(consumer.partitions_for_topic(topic) or ())
            if have != n:
                raise StartupProblem(
                    f"topic {topic!r} has {have} partitions, the settings expect {n} (use the "
                    "settings the topics were created with; new counts are a new deployment, "
                    "docs/runbooks.md)")
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
    from agents.kafka.topics import TopicConfigMismatch, check_internal_topics

    try:  # a retention on the schedule or checkpoint topics would lose them: before anything
        await check_internal_topics(settings.bootstrap, settings)
    except TopicConfigMismatch as exc:
        raise StartupProblem(str(exc)) from None
    if key is not None:
        from agents.config.domain import load_domain
        from agents.kafka.deployment_settings import check_deployment_settings

        digest = str(load_domain(settings.domain_file).digest())
        await check_deployment_settings(
            settings, digest, key, KafkaSecurity.from_settings(settings).client_kwargs())


class WorkerIdTaken(RuntimeError):
    """Another worker process on this host runs with the same app_id and worker_id."""


def claim_worker_id(settings: Any) -> Any:
    """Hold this host's claim on ``(bootstrap, app_id, worker_id)`` for the life of the process.

    Two workers with one ``worker_id`` share one static group membership (``group.instance.id``):
    the broker fences each in turn and neither ever works. On one host (the usual mistake: the
    default ``worker_id`` is the host name) the second worker is refused at start-up. The claim
    is a Linux abstract socket (or a locked file elsewhere), released by the kernel however the
    process ends. Returns the object to keep alive; raises :class:`WorkerIdTaken`.
    """
    import hashlib
    import socket

    ident = f"{settings.bootstrap}|{settings.app_id}|{settings.worker_id}"
    digest = hashlib.sha256(ident.encode("utf-8")).hexdigest()[:32]
    message = (
        f"another worker on this host already runs as worker_id {settings.worker_id!r} of "
        f"app_id {settings.app_id!r} (on {settings.bootstrap}); give each worker its own "
        "--worker-id / STREAM_DP_WORKER_ID (the default is the host name)"
    )
    if sys.platform.startswith("linux"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(f"\0stream-dp-worker-{digest}")
        except OSError:
            sock.close()
            raise WorkerIdTaken(message) from None
        return sock
    import fcntl  # pragma: no cover - not Linux
    import tempfile

    handle = open(Path(tempfile.gettempdir()) / f"stream-dp-worker-{digest}.lock", "w")  # noqa: SIM115
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise WorkerIdTaken(message) from None
    return handle
