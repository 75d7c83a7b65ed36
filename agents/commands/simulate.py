"""``stream-dp simulate``: the simulators' command (:mod:`simulators.cli`) with a Kafka producer.

The simulators depend only on the library; this wrapper gives ``--to-topic`` the service's
idempotent producer (:func:`agents.commands.replay.send_events`) and the service's defaults for
the broker and the events topic (``STREAM_DP_BOOTSTRAP``, ``STREAM_DP_EVENTS_TOPIC``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

from simulators import cli as _sim
from simulators.logfile import LogRecord

#: seconds between two progress lines of --to-topic
PROGRESS_EVERY_S = 5.0

HELP = _sim.HELP
DESCRIPTION = _sim.DESCRIPTION
add_arguments = _sim.add_arguments
build_simulator = _sim.build_simulator


async def produce(
    records: Iterator[LogRecord], args: argparse.Namespace, stop: asyncio.Event
) -> _sim.Produced:
    """Send ``records`` to the events topic with the service's idempotent producer."""
    from agents.commands._replay_send import send_events
    from agents.kafka.clients import (
        bootstrap_from,
        connection_problem,
        default_topic,
        is_kafka_error,
    )

    topic = args.topic or default_topic("events")
    loop = asyncio.get_running_loop()
    started = loop.time()
    last = [started, 0]

    def progress(record: LogRecord) -> None:
        """One line on stderr at least every PROGRESS_EVERY_S seconds (the guide's example runs
        for 10 minutes: it printed nothing until the end)."""
        last[1] += 1
        now = loop.time()
        if now - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = now
        ts = datetime.fromtimestamp(record.event.ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
        print(f"stream-dp simulate: {last[1]:,} events sent to {topic} in "
              f"{now - started:.0f} s (event time {ts} UTC)", file=sys.stderr, flush=True)

    bootstrap = bootstrap_from(args.bootstrap)
    try:
        report = await send_events(
            records, bootstrap=bootstrap, topic=topic, speed=args.speed,
            stop=stop, on_progress=progress,
        )
    except Exception as exc:
        if not is_kafka_error(exc):
            raise
        # the client's text lists socket tuples; the simulator prints this one line instead
        raise RuntimeError(connection_problem(exc, bootstrap)) from None
    return _sim.Produced(report.sent, report.interrupted, report.seconds, topic)


def run(args: argparse.Namespace) -> int:
    return _sim.run(args, produce=produce)
