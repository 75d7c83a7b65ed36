"""``stream-dp simulate``: deterministic synthetic event logs, or live traffic into the topic."""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from simulators.base import DEFAULT_START, Simulator, TimeAxis
from simulators.census import ATTRIBUTES, CensusHouseholds
from simulators.logfile import Event, LogRecord, detect_format, write_log
from simulators.restaurant import RestaurantSales
from simulators.web_traffic import PROFILES, WebTraffic

HELP = "generate deterministic synthetic event logs or live traffic"

SCENARIOS = ("restaurant", "census", "attributes", *PROFILES)

DESCRIPTION = f"""\
Generate synthetic events, deterministic given --seed (same arguments, same bytes), to a log file
(CSV or JSON lines, the formats 'stream-dp replay' reads), straight into the events topic, or both;
optionally with the matching domain file and worker settings file.

Scenarios:
  restaurant   paper 000: 5 items sold only in packages, so every day's counts satisfy the
               package constraints B v = 0 (B = [[1,-5,3,4,0],[-1,-1,1,0,2]]); tick = 1 day,
               1024 ticks by default
  census       paper 002: households with k dependent categorical attributes (--attributes,
               1..{len(ATTRIBUTES)}), keys are grid cells like age=18-34|tenure=rent; 365 ticks
  attributes   events with M yes/no attributes (--attributes, default 32): clusters of
               dependent attributes, sparse 1s, drifting rates; JSON lines {"ts", "attrs"} for
               'stream-dp marginals' (--out only); 300 ticks of 60 s, --rate 300 events/tick
  searchlogs   bursty web traffic over site/section paths, 32 768 ticks of 60 s
  nettrace     the same model, 65 536 ticks of 1 s
  worldcup98   the same model, exactly 7 518 579 events over 2 088 hourly ticks

Time: simulated tick t (0-based) covers [start + t*tick, start + (t+1)*tick); --start defaults to
2024-01-01T00:00:00Z ({DEFAULT_START}); --start now aligns to the current tick (for live traffic).
The settings file written by --settings-out sets the worker's origin to --start, so simulated tick t
is released as tick t+1.

Examples:
  stream-dp simulate restaurant --seed 7 --out sales.csv --domain-out domain.toml
  stream-dp simulate census --attributes 4 --ticks 100 --out census.jsonl
  stream-dp simulate attributes --attributes 32 --ticks 300 --out events.jsonl
  stream-dp simulate nettrace --ticks 4096 --out net.csv --domain-out domain.toml \\
      --settings-out stream-dp.toml
  stream-dp simulate searchlogs --start now --ticks 600 --to-topic --speed 60
  stream-dp simulate worldcup98 --out - | gzip > worldcup98.csv.gz
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", choices=SCENARIOS, help="what to simulate")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--ticks", type=int, help="number of ticks (default: the scenario's)")
    parser.add_argument(
        "--tick-seconds", type=float, help="tick length in seconds (default: the scenario's)"
    )
    parser.add_argument(
        "--start", default=str(DEFAULT_START),
        help="start of simulated time: Unix seconds, ISO 8601 or 'now' (default 2024-01-01Z)",
    )
    parser.add_argument(
        "--rate", type=float,
        help="mean events (census: households) per tick; restaurant: multiplier of its rates",
    )
    parser.add_argument(
        "--attributes", type=int, default=None, metavar="K",
        help="census: number of attributes (default 3); attributes: M (default 32)"
    )
    parser.add_argument("--out", metavar="FILE", help="write the log here ('-' = stdout)")
    parser.add_argument(
        "--format", choices=("csv", "jsonl"), help="log format (default: from --out's suffix)"
    )
    parser.add_argument("--domain-out", metavar="FILE", help="write the matching domain TOML")
    parser.add_argument(
        "--settings-out", metavar="FILE",
        help="write worker settings (origin, tick, p, ε, domain_file) for this simulation",
    )
    parser.add_argument("--to-topic", action="store_true", help="produce the events to Kafka")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default $STREAM_DP_BOOTSTRAP)")
    parser.add_argument("--topic", help="events topic (default $STREAM_DP_EVENTS_TOPIC or dp.events.v1)")
    parser.add_argument(
        "--speed", type=float, metavar="F",
        help="with --to-topic: event-time seconds per wall second (default: as fast as possible)",
    )


def _start_time(text: str, tick_seconds: float) -> float:
    if text == "now":
        tick_ms = round(tick_seconds * 1000)
        return (int(time.time() * 1000) // tick_ms) * tick_ms / 1000.0
    from simulators.logfile import parse_ts

    start = parse_ts(text)
    return round(start * 1000) / 1000.0


def build_simulator(args: argparse.Namespace) -> Simulator:
    """The simulator for ``args`` (validates ranges; ``ValueError`` names the parameter)."""
    if args.scenario in PROFILES:
        spec = PROFILES[args.scenario]
        tick_seconds = args.tick_seconds or spec.tick_seconds
        ticks = args.ticks or spec.ticks
        axis = TimeAxis(ticks, tick_seconds, _start_time(args.start, tick_seconds))
        total = spec.total_events
        if total is not None and args.ticks is not None:
            total = round(total * args.ticks / spec.ticks)
        if args.rate is not None:
            total = None
        return WebTraffic(
            axis, args.seed, rate=args.rate or spec.rate, total_events=total, profile=args.scenario
        )
    if args.scenario == "restaurant":
        tick_seconds = args.tick_seconds or 86_400.0
        axis = TimeAxis(args.ticks or 1024, tick_seconds, _start_time(args.start, tick_seconds))
        return RestaurantSales(axis, args.seed, scale=args.rate or 1.0)
    tick_seconds = args.tick_seconds or 86_400.0
    axis = TimeAxis(args.ticks or 365, tick_seconds, _start_time(args.start, tick_seconds))
    k = 3 if args.attributes is None else args.attributes
    return CensusHouseholds(axis, args.seed, k=k, rate=args.rate or 50.0)


def _run_attributes(args: argparse.Namespace) -> int:
    """``stream-dp simulate attributes``: JSON lines for ``stream-dp marginals``."""
    from simulators.attributes import AttributeEvents

    if not args.out or args.to_topic or args.domain_out or args.settings_out:
        print("stream-dp simulate attributes: give --out FILE (only a JSON-lines log is written)",
              file=sys.stderr)
        return 2
    try:
        tick_seconds = args.tick_seconds or 60.0
        gen = AttributeEvents(
            m=32 if args.attributes is None else args.attributes,
            ticks=args.ticks or 300,
            rate=args.rate or 300.0,
            seed=args.seed,
            tick_seconds=tick_seconds,
            start=_start_time(args.start, tick_seconds),
        )
    except ValueError as exc:
        print(f"stream-dp simulate: {exc}", file=sys.stderr)
        return 2
    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")  # noqa: SIM115
    try:
        n = 0
        for line in gen.lines():
            out.write(line + "\n")
            n += 1
    finally:
        if out is not sys.stdout:
            out.close()
    print(f"{gen.describe()}: {n} events written to {args.out} (origin {gen.start:.3f})",
          file=sys.stderr)
    return 0


def _records(events: Iterator[Event]) -> Iterator[LogRecord]:
    for i, event in enumerate(events, start=1):
        yield LogRecord(number=i, end_offset=0, event=event)


def run(args: argparse.Namespace) -> int:
    if args.scenario == "attributes":
        return _run_attributes(args)
    if not (args.out or args.to_topic or args.domain_out or args.settings_out):
        print("stream-dp simulate: nothing to do; give --out, --to-topic, --domain-out or "
              "--settings-out", file=sys.stderr)
        return 2
    if args.speed is not None and not (args.speed > 0 and math.isfinite(args.speed)):
        print("stream-dp simulate: --speed must be a positive number", file=sys.stderr)
        return 2
    try:
        sim = build_simulator(args)
    except ValueError as exc:
        print(f"stream-dp simulate: {exc}", file=sys.stderr)
        return 2
    info = sys.stderr
    domain = sim.domain()
    if args.domain_out:
        Path(args.domain_out).write_text(domain.to_toml(), encoding="utf-8")
        print(f"domain ({len(sim.keys)} event keys) written to {args.domain_out}", file=info)
    if args.settings_out:
        settings_path = Path(args.settings_out)
        domain_ref = args.domain_out or "domain.toml"
        if args.domain_out:
            try:
                domain_ref = str(
                    Path(args.domain_out).resolve().relative_to(settings_path.resolve().parent)
                )
            except ValueError:
                domain_ref = str(Path(args.domain_out).resolve())
        settings_path.write_text(domain.settings_toml(sim.axis.start, domain_ref), encoding="utf-8")
        print(f"worker settings written to {args.settings_out} "
              f"(origin {sim.axis.start:.3f}, tick {sim.axis.tick_seconds:g} s)", file=info)
    if args.out:
        fmt = detect_format(args.out if args.out != "-" else "x.csv", args.format)
        if args.out == "-":
            n = write_log(sim.events(), sys.stdout, fmt)
        else:
            with open(args.out, "w", encoding="utf-8", newline="") as fh:
                n = write_log(sim.events(), fh, fmt)
        print(f"{sim.describe()}: {n} events written to {args.out}", file=info)
    if args.to_topic:
        from agents.commands._client import bootstrap_from, default_topic
        from agents.commands.replay import SendReport, send_events

        topic = args.topic or default_topic("events")

        async def produce() -> SendReport:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            return await send_events(
                _records(sim.events()), bootstrap=bootstrap_from(args.bootstrap), topic=topic,
                speed=args.speed, stop=stop,
            )

        try:
            report = asyncio.run(produce())
        except (RuntimeError, OSError) as exc:
            print(f"stream-dp simulate: {exc}", file=sys.stderr)
            return 1
        what = "stopped after" if report.interrupted else "produced"
        print(f"{sim.describe()}: {report.sent} events {what} to {topic} in "
              f"{report.seconds:.1f} s", file=info)
        return 130 if report.interrupted else 0
    return 0
