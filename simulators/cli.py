"""``stream-dp simulate``: deterministic synthetic event logs, or live traffic into the topic."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from simulators.atomic import atomic_text
from simulators.base import DEFAULT_START, Simulator, TimeAxis
from simulators.census import ATTRIBUTES, CensusHouseholds
from simulators.logfile import Event, LogRecord, detect_format, write_log
from simulators.people import DEFAULT_EXPONENT, DEFAULT_USER_FIELD, MAX_EXPONENT, People
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
               dependent attributes, sparse 1s, drifting rates (--domain-out writes the binary
               domain a0..aM-1, --to-topic feeds a worker); JSON lines {"ts", "attrs"} for
               'stream-dp marginals' or 'stream-dp replay'; 300 ticks of 60 s, --rate 300/tick
  searchlogs   bursty web traffic over site/section paths, 32 768 ticks of 60 s
  nettrace     the same model, 65 536 ticks of 1 s
  worldcup98   the same model, exactly 7 518 579 events over 2 088 hourly ticks

Time: simulated tick t (0-based) covers [start + t*tick, start + (t+1)*tick); --start defaults to
2024-01-01T00:00:00Z ({DEFAULT_START}); --start now aligns to the current tick (for live traffic).
The settings file written by --settings-out sets the worker's origin to --start, so simulated tick t
is released as tick t+1.

People (user-level privacy): --people N gives every event the identifier of one of N people,
u1 … uN, in the JSON field (CSV column) --user-field (default "user"), and keys its Kafka record
by the identifier's UTF-8 bytes, so Kafka's default partitioner puts all of one person's records
on one partition: (murmur2(key) & 0x7fffffff) mod partitions. Activity is heavy-tailed, a Zipf
law: the person of rank r causes each event with probability proportional to r^-S
(--people-exponent S, default 1; 0 = all alike): most people a few events, a few people
thousands. The events themselves (keys, times, values) are those of the same run without
--people; the people are deterministic given --seed. Without --people nothing changes.
With --settings-out the settings are user-level, so 'stream-dp worker' runs the log at user
level as written: privacy_unit = "user", user_field, user_period_ticks (--user-period-ticks T,
default a day of ticks) and user_max_events K, suggested from the simulated people: the 99th
percentile of events per person and period (stated in the output line with how many events it
drops). On real data, choose K from public knowledge, never from the data.

Examples:
  stream-dp simulate restaurant --seed 7 --out sales.csv --domain-out domain.toml
  stream-dp simulate census --attributes 4 --ticks 100 --out census.jsonl
  stream-dp simulate attributes --attributes 32 --ticks 300 --out events.jsonl
  stream-dp simulate nettrace --ticks 4096 --out net.csv --domain-out domain.toml \\
      --settings-out stream-dp.toml
  stream-dp simulate searchlogs --start now --ticks 600 --to-topic --speed 60
  stream-dp simulate worldcup98 --out - | gzip > worldcup98.csv.gz
  stream-dp simulate searchlogs --ticks 1440 --people 10000 --out visits.jsonl \\
      --domain-out domain.toml --settings-out stream-dp.toml
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
    parser.add_argument(
        "--people", type=int, metavar="N",
        help="give every event the identifier of one of N people (u1 … uN, heavy-tailed: "
             "see --people-exponent), in the field --user-field, and key its record by it "
             "(default: no people, events as before)",
    )
    parser.add_argument(
        "--people-exponent", type=float, metavar="S",
        help=f"with --people: Zipf exponent, person of rank r causes an event with probability "
             f"∝ r^-S; 0 = all alike, up to {MAX_EXPONENT:g} (default {DEFAULT_EXPONENT:g})",
    )
    parser.add_argument(
        "--user-field", metavar="NAME",
        help=f"with --people: the JSON field (CSV column) holding the identifier "
             f"(default {DEFAULT_USER_FIELD!r})",
    )
    parser.add_argument(
        "--user-period-ticks", type=int, metavar="T",
        help="with --people and --settings-out: the user-level bounding period in ticks "
             "(user_period_ticks; default: the ticks of a day, at least 1)",
    )


def _start_time(text: str, tick_seconds: float) -> float:
    if text == "now":
        tick_ms = round(tick_seconds * 1000)
        return (int(time.time() * 1000) // tick_ms) * tick_ms / 1000.0
    from simulators.logfile import parse_ts

    start = parse_ts(text)
    return round(start * 1000) / 1000.0


#: Most ticks one simulation may cover (the largest scenario has 65 536).
MAX_TICKS = 10_000_000


def validate_args(args: argparse.Namespace) -> None:
    """Every option in range, before anything is generated or connected (one-line
    ``ValueError`` naming the option and its range)."""
    if args.ticks is not None and not 1 <= args.ticks <= MAX_TICKS:
        raise ValueError(f"--ticks must be an integer in [1, {MAX_TICKS}], got {args.ticks}")
    if args.tick_seconds is not None:
        ts = args.tick_seconds
        if not (math.isfinite(ts) and 0.001 <= ts <= 10 * 365 * 86_400):
            raise ValueError(f"--tick-seconds must be a number in [0.001, {10 * 365 * 86_400}] "
                             f"seconds, got {ts}")
        if round(ts * 1000) != ts * 1000:
            raise ValueError(f"--tick-seconds must be a whole number of milliseconds, got {ts}")
    if args.rate is not None and not (math.isfinite(args.rate) and 0 < args.rate <= 1e9):
        raise ValueError(f"--rate must be a number in (0, 1e9], got {args.rate}")
    if args.attributes is not None:
        most = len(ATTRIBUTES) if args.scenario == "census" else 4096
        if not 1 <= args.attributes <= most:
            raise ValueError(f"--attributes must be an integer in [1, {most}] for "
                             f"{args.scenario}, got {args.attributes}")
    if not 0 <= args.seed < 2**63:
        raise ValueError(f"--seed must be an integer in [0, 2**63), got {args.seed}")
    if args.speed is not None and not (args.speed > 0 and math.isfinite(args.speed)):
        raise ValueError(f"--speed must be a finite number > 0, got {args.speed}")
    if args.start != "now":
        from simulators.logfile import LogFormatError, parse_ts

        try:
            start = parse_ts(args.start)
        except (ValueError, LogFormatError) as exc:
            raise ValueError(f"--start: {' '.join(str(exc).split())}") from None
        if not (math.isfinite(start) and 0 <= start < 2**33):
            raise ValueError(f"--start must be a time between 1970 and 2242, got {args.start!r}")
    people(args)  # --people and its options (the law's table is built later, once)
    for option in ("out", "domain_out", "settings_out", "topic", "bootstrap"):
        value = getattr(args, option, None)
        if value is not None:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"--{option.replace('_', '-')} must be valid UTF-8 text, "
                                 f"got {value!r}") from None


def people(args: argparse.Namespace, *, build: bool = False) -> People | None:
    """The people of ``--people`` (None without it); checks the options in any case (one-line
    ``ValueError``). ``build``: return the :class:`People` (its table takes 8 bytes a person)."""
    from simulators.people import MAX_PEOPLE, check_user_field

    n = getattr(args, "people", None)
    exponent = getattr(args, "people_exponent", None)
    field = getattr(args, "user_field", None)
    period = getattr(args, "user_period_ticks", None)
    if period is not None and not 1 <= period <= 2**32 - 1:
        raise ValueError(f"--user-period-ticks must be an integer in [1, {2**32 - 1}], got "
                         f"{period}")
    if n is None:
        for given, option in ((exponent, "--people-exponent"), (field, "--user-field"),
                              (period, "--user-period-ticks")):
            if given is not None:
                raise ValueError(f"{option} needs --people N (the number of people)")
        return None
    if not 1 <= n <= MAX_PEOPLE:
        raise ValueError(f"--people must be an integer in [1, {MAX_PEOPLE}], got {n}")
    exponent = DEFAULT_EXPONENT if exponent is None else exponent
    if not (math.isfinite(exponent) and 0 <= exponent <= MAX_EXPONENT):
        raise ValueError(f"--people-exponent must be a number in [0, {MAX_EXPONENT:g}], "
                         f"got {exponent}")
    field = check_user_field(DEFAULT_USER_FIELD if field is None else field)
    if not build:
        return None
    return People(n, exponent, seed=args.seed, user_field=field)


def period_ticks(args: argparse.Namespace, sim: Simulator) -> int:
    """``--user-period-ticks``, else the ticks of a day (at least 1)."""
    from simulators.person_settings import default_period_ticks

    given = getattr(args, "user_period_ticks", None)
    return default_period_ticks(sim.axis.tick_seconds) if given is None else int(given)


def _with_people(events: Iterator[Event], crowd: People | None) -> Iterator[Event]:
    return events if crowd is None else crowd.attach(events)


def _what(what: str, crowd: People | None) -> str:
    return what if crowd is None else f"{what}, {crowd.describe()}"


def build_simulator(args: argparse.Namespace) -> Simulator:
    """The simulator for ``args`` (validates ranges; ``ValueError`` names the parameter)."""
    validate_args(args)
    if args.scenario in PROFILES:
        spec = PROFILES[args.scenario]
        tick_seconds = spec.tick_seconds if args.tick_seconds is None else args.tick_seconds
        ticks = spec.ticks if args.ticks is None else args.ticks
        axis = TimeAxis(ticks, tick_seconds, _start_time(args.start, tick_seconds))
        total = spec.total_events
        if total is not None and args.ticks is not None:
            total = round(total * args.ticks / spec.ticks)
        if args.rate is not None:
            total = None
        rate = spec.rate if args.rate is None else args.rate
        return WebTraffic(axis, args.seed, rate=rate, total_events=total, profile=args.scenario)
    tick_seconds = 86_400.0 if args.tick_seconds is None else args.tick_seconds
    if args.scenario == "restaurant":
        ticks = 1024 if args.ticks is None else args.ticks
        axis = TimeAxis(ticks, tick_seconds, _start_time(args.start, tick_seconds))
        return RestaurantSales(axis, args.seed, scale=1.0 if args.rate is None else args.rate)
    ticks = 365 if args.ticks is None else args.ticks
    axis = TimeAxis(ticks, tick_seconds, _start_time(args.start, tick_seconds))
    rate = 50.0 if args.rate is None else args.rate
    k = 3 if args.attributes is None else args.attributes
    return CensusHouseholds(axis, args.seed, k=k, rate=rate)


def _write(path: str | Path, text: str) -> None:
    """``path`` gets ``text`` whole, or is left as it was (see :mod:`simulators.atomic`)."""
    with atomic_text(path) as fh:
        fh.write(text)


def _run_attributes(args: argparse.Namespace, produce: Producer | None) -> int:
    """``stream-dp simulate attributes``: a JSON-lines log (for ``stream-dp marginals`` or
    ``stream-dp replay``), the matching binary domain and settings, or events to Kafka."""
    from simulators.attributes import (
        AttributeEvents,
        attribute_domain_toml,
        attribute_settings_toml,
    )

    if not (args.out or args.to_topic or args.domain_out or args.settings_out):
        print("stream-dp simulate: nothing to do; give --out, --to-topic, --domain-out or "
              "--settings-out", file=sys.stderr)
        return 2
    if args.format == "csv":
        print("stream-dp simulate attributes: events with attributes are JSON lines only",
              file=sys.stderr)
        return 2
    try:
        tick_seconds = 60.0 if args.tick_seconds is None else args.tick_seconds
        gen = AttributeEvents(
            m=32 if args.attributes is None else args.attributes,
            ticks=300 if args.ticks is None else args.ticks,
            rate=300.0 if args.rate is None else args.rate,
            seed=args.seed,
            tick_seconds=tick_seconds,
            start=_start_time(args.start, tick_seconds),
        )
    except ValueError as exc:
        print(f"stream-dp simulate: {exc}", file=sys.stderr)
        return 2
    crowd = people(args, build=True)
    info = sys.stderr
    if args.domain_out:
        _write(args.domain_out, attribute_domain_toml(gen.m))
        print(f"binary domain ({gen.m} attributes a0..a{gen.m - 1}) written to {args.domain_out}",
              file=info)
    if args.settings_out:
        settings_path = Path(args.settings_out)
        ref = args.domain_out or "domain.toml"
        if args.domain_out:
            try:
                ref = str(Path(args.domain_out).resolve().relative_to(
                    settings_path.resolve().parent))
            except ValueError:
                ref = str(Path(args.domain_out).resolve())
        text = attribute_settings_toml(gen.start, tick_seconds, ref)
        unit = ""
        if crowd is not None:  # user level, as for the other scenarios
            from simulators.person_settings import default_period_ticks, suggest, user_settings_toml

            given = getattr(args, "user_period_ticks", None)
            hint = suggest(crowd.attach(gen.log_events()), period_ticks=(
                default_period_ticks(tick_seconds) if given is None else int(given)),
                origin=gen.start, tick_seconds=tick_seconds)
            text += user_settings_toml(crowd.user_field, hint)
            unit = f"; user level, field {crowd.user_field!r}, {hint.describe()}"
        _write(settings_path, text)
        print(f"worker settings written to {args.settings_out} (origin {gen.start:.3f}, "
              f"tick {tick_seconds:g} s{unit})", file=info)
    if args.out:
        n = 0
        with contextlib.nullcontext(sys.stdout) if args.out == "-" else atomic_text(args.out) as out:
            lines = gen.lines() if crowd is None else (
                json.dumps(e.to_message()) for e in crowd.attach(gen.log_events()))
            for line in lines:
                out.write(line + "\n")
                n += 1
        print(f"{_what(gen.describe(), crowd)}: {n} events written to {args.out} "
              f"(origin {gen.start:.3f})", file=info)
    if args.to_topic:
        return _produce(args, produce, _with_people(gen.log_events(), crowd),
                        _what(gen.describe(), crowd))
    return 0


def _produce(args: argparse.Namespace, produce: Producer | None, events: Iterator[Event],
             what: str) -> int:
    if produce is None:
        print("stream-dp simulate: --to-topic needs a Kafka producer: run it as "
              "'stream-dp simulate' (service install)", file=sys.stderr)
        return 2

    async def run_producer() -> Produced:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await produce(_records(events), args, stop)

    try:
        report = asyncio.run(run_producer())
    except (RuntimeError, OSError) as exc:
        print(f"stream-dp simulate: {exc}", file=sys.stderr)
        return 1
    done = "stopped after" if report.interrupted else "produced"
    print(f"{what}: {report.sent} events {done} to {report.topic} in "
          f"{report.seconds:.1f} s", file=sys.stderr)
    return 130 if report.interrupted else 0


def _records(events: Iterator[Event]) -> Iterator[LogRecord]:
    for i, event in enumerate(events, start=1):
        yield LogRecord(number=i, end_offset=0, event=event)


class Produced(NamedTuple):
    """What a producer did with the simulated events."""

    sent: int
    interrupted: bool
    seconds: float
    topic: str


#: Sends the records to the events topic named by ``args`` (``--bootstrap``, ``--topic``,
#: ``--speed``) until done or ``stop`` is set. Supplied by the layer that owns Kafka (the
#: service's ``stream-dp simulate`` command); the simulators depend only on the library.
Producer = Callable[[Iterator[LogRecord], argparse.Namespace, asyncio.Event], Awaitable[Produced]]


def run(args: argparse.Namespace, produce: Producer | None = None) -> int:
    """Run ``stream-dp simulate``; ``produce`` sends events for ``--to-topic``."""
    try:
        validate_args(args)
    except ValueError as exc:
        print(f"stream-dp simulate: {exc}", file=sys.stderr)
        return 2
    if args.scenario == "attributes":
        return _run_attributes(args, produce)
    if not (args.out or args.to_topic or args.domain_out or args.settings_out):
        print("stream-dp simulate: nothing to do; give --out, --to-topic, --domain-out or "
              "--settings-out", file=sys.stderr)
        return 2
    try:
        fmt = detect_format(args.out if args.out not in (None, "-") else "x.csv", args.format)
        sim = build_simulator(args)
        crowd = people(args, build=True)
    except ValueError as exc:
        print(f"stream-dp simulate: {exc}", file=sys.stderr)
        return 2
    info = sys.stderr
    domain = sim.domain()
    if args.domain_out:
        _write(args.domain_out, domain.to_toml())
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
        text = domain.settings_toml(sim.axis.start, domain_ref)
        unit = ""
        if crowd is not None:  # user level: the person's field, a period and K from the people
            from simulators.person_settings import suggest, user_settings_toml

            hint = suggest(crowd.attach(sim.events()), period_ticks=period_ticks(args, sim),
                           origin=sim.axis.start, tick_seconds=sim.axis.tick_seconds)
            text += user_settings_toml(crowd.user_field, hint)
            unit = f"; user level, field {crowd.user_field!r}, {hint.describe()}"
        _write(settings_path, text)
        print(f"worker settings written to {args.settings_out} "
              f"(origin {sim.axis.start:.3f}, tick {sim.axis.tick_seconds:g} s{unit})", file=info)
    if args.out:
        if args.out == "-":
            n = write_log(_with_people(sim.events(), crowd), sys.stdout, fmt)
        else:
            with atomic_text(args.out, newline="") as fh:
                n = write_log(_with_people(sim.events(), crowd), fh, fmt)
        print(f"{_what(sim.describe(), crowd)}: {n} events written to {args.out}", file=info)
    if args.to_topic:
        return _produce(args, produce, _with_people(sim.events(), crowd),
                        _what(sim.describe(), crowd))
    return 0
