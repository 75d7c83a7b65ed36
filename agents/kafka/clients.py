"""Shared plumbing of the users' commands (``tail``, ``replay``, ``simulate --to-topic``).

Broker address and topic names follow the worker's settings variables (``agents.config``):
``--bootstrap`` beats ``STREAM_DP_BOOTSTRAP`` beats ``127.0.0.1:9092``; topic defaults come from
``STREAM_DP_EVENTS_TOPIC`` / ``STREAM_DP_COUNTS_TOPIC`` / ``STREAM_DP_HISTOGRAMS_TOPIC`` or the
contract names (docs/CONTRACTS.md). Only user-facing topics are ever read here.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from aiokafka import AIOKafkaConsumer, TopicPartition

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "STREAM_DP_BOOTSTRAP"

#: setting name -> (environment variable, contract default)
TOPIC_DEFAULTS: dict[str, tuple[str, str]] = {
    "events": ("STREAM_DP_EVENTS_TOPIC", "dp.events.v1"),
    "counts": ("STREAM_DP_COUNTS_TOPIC", "dp.counts.v1"),
    "histograms": ("STREAM_DP_HISTOGRAMS_TOPIC", "dp.histograms.v1"),
    # binary-attribute domains: their tables on the counts topic, consistent ones on histograms
    "tables": ("STREAM_DP_COUNTS_TOPIC", "dp.counts.v1"),
    "marginals": ("STREAM_DP_HISTOGRAMS_TOPIC", "dp.histograms.v1"),
    # no contract name: compact output is off unless the deployment sets compact_topic
    "compact": ("STREAM_DP_COMPACT_TOPIC", ""),
    # operators only: rejected raw events (docs/privacy.md, "Operator data")
    "dlq": ("STREAM_DP_DLQ_TOPIC", "dp.events.dlq"),
}


def default_topic(kind: str) -> str:
    """The topic name for ``kind`` (events, counts, histograms) from the environment or contract."""
    var, default = TOPIC_DEFAULTS[kind]
    return os.environ.get(var) or default


def bootstrap_from(value: str | None) -> str:
    """``--bootstrap`` if given, else ``STREAM_DP_BOOTSTRAP``, else ``127.0.0.1:9092``.

    A malformed address ends the command with one line naming where it came from, status 2."""
    from agents.config.values import bootstrap_problem

    where, chosen = ("--bootstrap", value) if value else (BOOTSTRAP_ENV, os.environ.get(BOOTSTRAP_ENV))
    problem = bootstrap_problem(chosen) if chosen else None
    if problem:
        print(f"stream-dp: error: {where}: {problem}", file=sys.stderr)
        raise SystemExit(2)
    return chosen or DEFAULT_BOOTSTRAP


def bootstrap_argument(text: str) -> str:
    from agents.config.values import bootstrap_problem

    problem = bootstrap_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        type=bootstrap_argument,
        metavar="HOST:PORT[,...]",
        help=f"Kafka bootstrap servers (default: ${BOOTSTRAP_ENV} or {DEFAULT_BOOTSTRAP})",
    )


def security_problem() -> str | None:
    """One line describing why the ``STREAM_DP_SECURITY_*`` / ``SSL_*`` / ``SASL_*`` variables
    cannot work (checked before any connection), or ``None``."""
    from agents.config.security import KafkaSecurity

    try:
        KafkaSecurity.from_env().validate()
    except ValueError as exc:
        return str(exc)
    return None


def is_kafka_error(exc: BaseException) -> bool:
    """True for aiokafka's errors (connection, TLS handshake, authentication, timeouts)."""
    try:
        from aiokafka.errors import KafkaError
    except ImportError:  # pragma: no cover - the service extra is installed with the commands
        return False
    return isinstance(exc, KafkaError)


def connection_problem(exc: BaseException, bootstrap: str | None = None) -> str:
    """One line for a failed connection, with a hint: how to start a development broker when
    nothing answers, what to check for TLS problems."""
    name = type(exc).__name__
    text = " ".join(str(exc).split()) or name
    while text.startswith(name + ": "):  # aiokafka repeats the class name in the message
        text = text[len(name) + 2:]
    bootstrap_failed = text.startswith("Unable to bootstrap from")
    if bootstrap_failed:  # a list of socket addresses: noise; the cause is in the client's log
        cause = _last_client_error.text
        text = "no broker answered" + (f" ({cause})" if cause else "")
    security = os.environ.get("STREAM_DP_SECURITY_PROTOCOL", "").upper()
    if "CERTIFICATE_VERIFY_FAILED" in text:
        hint = (" (the broker's certificate is not signed by STREAM_DP_SSL_CAFILE, or names "
                "another host: check the CA file and the bootstrap address)")
    elif "SSL" in text or "TLS" in text or (security.endswith("SSL") and bootstrap_failed):
        hint = (" (TLS handshake failed: the broker's certificate is not signed by "
                "STREAM_DP_SSL_CAFILE, or the port is not the broker's TLS listener: check both, "
                "and STREAM_DP_SECURITY_PROTOCOL)")
    elif "bootstrap" in text or "Connect call failed" in text or name == "KafkaConnectionError":
        hint = (" (is a broker running there? check --bootstrap / STREAM_DP_BOOTSTRAP; for "
                "development: stream-dp broker start)")
    else:
        hint = ""
    where = f" at {bootstrap}" if bootstrap else ""
    return f"cannot connect to the broker{where}: {name}: {text}{hint}"


async def start_client(client: Any) -> Any:
    """``await client.start()``; on failure stop it again (no 'Unclosed AIOKafka...' warning
    at exit) and re-raise. Returns ``client``. A consumer's committed reads are made exact on
    a broker that lists stale aborted transactions first
    (:mod:`~agents.kafka.aborted_transactions`)."""
    from agents.kafka.aborted_transactions import install

    install()
    try:
        await client.start()
    except BaseException:
        closer = getattr(client, "stop", None) or getattr(client, "close", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()
        raise
    return client


class _LastClientError(logging.Handler):
    """Keeps the cause of the client library's last failed connection (e.g. the TLS error
    behind aiokafka's 'Unable to bootstrap'), for :func:`connection_problem`; prints nothing."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.text = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # malformed arguments: nothing to keep
            return
        if message.startswith("Unable connect to"):
            # 'Unable connect to "host:port": <cause>': keep the cause, one line, short
            cause = message.split(": ", 1)[-1]
            self.text = " ".join(cause.split())[:200]


_last_client_error = _LastClientError()


def quiet_client_logs() -> None:
    """Client commands report connection problems themselves, in one line: aiokafka's own
    records ('Unable connect to ...') must not reach the terminal through logging's
    last-resort handler; their cause is kept for that line. (A command that configures
    logging still sees them.)"""
    for name in ("aiokafka", "kafka"):
        logger = logging.getLogger(name)
        if _last_client_error not in logger.handlers:
            logger.addHandler(_last_client_error)


class TopicMissingError(RuntimeError):
    """The topic does not exist on the broker."""


async def topic_partitions(
    consumer: AIOKafkaConsumer, topic: str, timeout_s: float = 5.0
) -> list[TopicPartition]:
    """The partitions of ``topic`` (sorted); :class:`TopicMissingError` if it does not exist."""
    import asyncio

    from aiokafka import TopicPartition

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        topics = await consumer.topics()
        parts = consumer.partitions_for_topic(topic) if topic in topics else None
        if parts:
            return [TopicPartition(topic, p) for p in sorted(parts)]
        if loop.time() > deadline:
            raise TopicMissingError(
                f"topic {topic!r} does not exist on the broker (create the service's topics with "
                "'stream-dp topics', or pass --topic)"
            )
        await asyncio.sleep(0.2)
