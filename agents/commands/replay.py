"""``stream-dp replay LOG``: replay a CSV / JSON-lines event log into the events topic.

Each log record becomes one ``dp.events.v1`` message (key = event key, value =
``{"key", "ts", "value"}``), so the worker buckets it into the same tick as the original event.
The Kafka record timestamp is the time of sending, not the event time: brokers delete segments by
record timestamp (``retention.ms``), so old event times would make the broker drop a replayed log
before the worker reads it. The event time travels in the value, where the worker reads it. Delivery is resumable and exactly-once in effect:

* an idempotent producer (``acks=all``) delivers each run's records in order per partition;
* a **state file** records the last acknowledged record (number and byte offset), the
  partitions' offsets at that point and a run id; every message carries a header
  ``stream-dp-replay: <run id>:<record number>``;
* on resume, records up to the acknowledged one are skipped, and the few sent after it but before
  the interruption are found by their headers in the topic and skipped too. No record is sent
  twice and none is lost.

The state file also holds the SHA-256 of the **whole log** and a key check value (HMAC-SHA256 of
a fixed label under the noise key; never the key, never printed), so replaying a log again says
truthfully whether the releases will be reproduced bit for bit (same log, same key: no new privacy
budget), are new releases (another key: budget spent again), or must not happen: the same key on
a log that differs from the one replayed before would publish the exact difference, so replay
refuses (exit status 3, ``"status": "log_differs"``).

**Close markers.** After the events (and, when paced, every second of wall time), replay writes a
close marker into every partition of the topic (:func:`agents.codec.close_marker`): on a
deployment with ``schedule = "markers"`` they are its schedule — ticks close exactly where the log
says, however fast the replay runs; a clock-schedule deployment skips them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import math
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from agents.commands._client import (
    add_bootstrap_argument,
    bootstrap_from,
    connection_problem,
    default_topic,
    is_kafka_error,
    security_problem,
    start_client,
    topic_partitions,
)
from agents.commands._progress import ProgressBar
from simulators.logfile import (
    Event,
    LogFormat,
    LogFormatError,
    LogRecord,
    detect_format,
    parse_ts,
    read_log,
)

HELP = "replay a CSV / JSON-lines event log into the events topic"

DESCRIPTION = """\
Replay an event log into the events topic (default dp.events.v1), keeping each event's time, so
the worker reproduces the original ticks.

Log formats (one event per line, in time order):
  CSV         header line naming the columns ts, key and optionally value:
                ts,key,value
                1704067200.250,www/news,1
              ts is Unix seconds or ISO 8601 (2024-01-01T00:00:00.250Z; no offset = UTC).
  JSON lines  {"key": "www/news", "ts": 1704067200.25, "value": 1}   (value optional, default 1)
The format comes from the suffix (.csv, .jsonl, .ndjson) or --format.

Pace: as fast as possible (default), or --speed F to keep the log's event-time gaps divided by F
(1 = real time, 60 = one hour of log per minute).

Retiming: --retime now shifts all event times by one constant so the first event happens now
(gaps kept); with --speed 1 an old log then plays into a running deployment (e.g. the demo)
instead of being dead-lettered as late. Retimed events fall into other ticks: the releases are
new ones, not a reproduction of the original run, and they spend privacy budget.

Resuming: progress goes to a state file (LOG.replay.json, or in --state-dir). After an interruption
(Ctrl-C, a crash, kill -9) run the same command again: acknowledged records are skipped and the
rest is sent, each record exactly once. --restart starts over (a new replay of the whole log).

Schedule: a historical log is replayed into a deployment with schedule = "markers" (what
'stream-dp simulate --settings-out' writes). Replay writes close markers after the events (and
every second when paced), so ticks close where the log says, whatever the speed, and the worker
can be started before or after the replay. The final marker closes the tick of the last event, or
of --until TIME. A clock-schedule deployment (live) skips markers and judges each event by its
record's timestamp: an old log then arrives late, unless retimed (--retime now --speed 1).

Replay semantics: noise is keyed by (secret key, mechanism, stream, node), so replaying the same
log into a fresh deployment with the same noise key reproduces the original releases bit for bit
and spends no new privacy budget. With a different key the releases differ and the budget for
these events is spent again (replay says so). The SHA-256 of the whole log is recorded: the same
key on a log that differs from the one replayed before (any byte, added or removed records) is
refused with exit status 3, because the difference of the two releases would reveal the changed
events. Publish a changed log under a new epoch or another key (fresh noise, new budget).

Exit status: 0 done (or nothing to do), 1 error, 2 bad usage or log, 3 log differs from the one
replayed before under the same key (refused), 130 interrupted (run again to resume). --json prints
one JSON object with the outcome on stdout (messages go to stderr).

Examples:
  stream-dp simulate restaurant --seed 7 --out sales.csv --domain-out domain.toml
  stream-dp replay sales.csv                            # as fast as possible
  stream-dp replay sales.jsonl --speed 3600 --bootstrap kafka:9092
  stream-dp replay sales.csv --state-dir ~/.cache/stream-dp    # log folder read-only
  stream-dp replay sales.csv --restart --key-file /run/secrets/noise-key
  stream-dp replay web.csv --retime now --speed 1 --bootstrap 127.0.0.1:40123   # into the demo
  stream-dp replay sales.csv --json --until 2024-01-02T00:00:00Z   # machine-readable, fixed end
"""

STATE_VERSION = 2
HEADER = "stream-dp-replay"
_FINGERPRINT_LABEL = b"stream-dp/noise-key-fingerprint/v1"
EXIT_INTERRUPTED = 130
#: the log differs from the one replayed before under the same key: refused
EXIT_LOG_DIFFERS = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", metavar="LOG", help="event log: .csv or .jsonl/.ndjson")
    parser.add_argument("--format", choices=("csv", "jsonl"), help="log format (default: suffix)")
    add_bootstrap_argument(parser)
    parser.add_argument(
        "--topic", help="events topic (default: $STREAM_DP_EVENTS_TOPIC or dp.events.v1)"
    )
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument(
        "--speed", type=float, metavar="F",
        help="replay speed factor: 1 = real time, 10 = ten times faster",
    )
    pace.add_argument(
        "--as-fast-as-possible", action="store_true", help="no pacing (the default)"
    )
    parser.add_argument(
        "--retime", metavar="now|TIME",
        help="shift every event time by one constant so the first event is at TIME (Unix s, "
        "ISO 8601 or 'now'): replays an old log into a live deployment (use with --speed 1). "
        "Retimed releases are new releases, not a reproduction of the original ones",
    )
    parser.add_argument(
        "--state-dir", metavar="DIR", help="keep the state file here instead of next to the log"
    )
    parser.add_argument(
        "--restart", action="store_true", help="ignore earlier progress and replay the whole log"
    )
    parser.add_argument(
        "--key-file", metavar="FILE",
        help="noise key file, only to compare its fingerprint with the previous replay "
        "(default: $STREAM_DP_KEY_FILE, then $STREAM_DP_KEY)",
    )
    parser.add_argument(
        "--chunk", type=int, default=2000, metavar="N",
        help="records per acknowledged checkpoint of the state file (default 2000)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument(
        "--until", metavar="TIME",
        help="the final close marker closes the tick containing TIME (Unix s or ISO 8601; "
        "default: the last event's time). Fixing it makes the set of released ticks independent "
        "of the log's contents",
    )
    parser.add_argument(
        "--no-close-markers", action="store_true",
        help="write no close markers (only for deployments on the clock schedule)",
    )
    parser.add_argument(
        "--json", action="store_true",
        help="print the outcome as one JSON object on stdout (messages go to stderr)",
    )


# ---------------------------------------------------------------------------------- state file
@dataclass
class ReplayState:
    """Progress of one replay of one log; stored as JSON (never holds the key or the data)."""

    log: str
    log_sha256: str
    topic: str
    run_id: str
    records_acked: int = 0
    byte_offset: int = 0
    complete: bool = False
    key_fingerprint: str | None = None
    #: partition -> offset from which a resume scans for this run's unacknowledged messages
    scan_from: dict[str, int] = field(default_factory=dict)
    #: record numbers > records_acked known to be in the topic already (found by a resume scan)
    delivered: list[int] = field(default_factory=list)
    #: seconds added to every event time (``--retime``); 0 keeps the original times
    time_offset: float = 0.0
    #: largest (retimed) event time sent so far: the final close marker's default time
    max_ts: float | None = None
    #: every (key check value, log SHA-256) ever replayed from this path: the same key on another
    #: log is refused even after replays under other keys in between
    history: list[list[str]] = field(default_factory=list)
    started: str = ""
    updated: str = ""
    version: int = STATE_VERSION

    @classmethod
    def load(cls, path: Path) -> ReplayState | None:
        if not path.exists():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"{path}: unsupported replay state version {data.get('version')!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def save(self, path: Path) -> None:
        """Atomic write (temporary file + rename), so a crash never leaves a torn state file."""
        self.updated = _now_iso()
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)


def state_path(log: Path, state_dir: str | None) -> Path:
    """``LOG.replay.json`` next to the log, or ``DIR/<name>-<hash of path>.replay.json``."""
    if state_dir is None:
        return log.with_name(log.name + ".replay.json")
    digest = hashlib.sha256(str(log.resolve()).encode()).hexdigest()[:12]
    directory = Path(state_dir).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{log.name}-{digest}.replay.json"


def log_digest(log: Path) -> str:
    """SHA-256 of the whole log file: any changed, added or removed byte changes it."""
    h = hashlib.sha256()
    with open(log, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def key_fingerprint(key: bytes) -> str:
    """Key check value kept in the state file (HMAC-SHA256 of a fixed label; never printed)."""
    return hmac.new(key, _FINGERPRINT_LABEL, hashlib.sha256).hexdigest()


def load_key_for_fingerprint(key_file: str | None) -> bytes | None:
    """The noise key as the worker loads it, or ``None`` if no key is configured here."""
    key_file = key_file or os.environ.get("STREAM_DP_KEY_FILE") or None
    if key_file is None and not os.environ.get("STREAM_DP_KEY"):
        return None
    try:
        from stream_dp.noise import load_key  # type: ignore[attr-defined,unused-ignore]
    except ImportError:  # pragma: no cover - library without the noise module yet
        if key_file:
            return Path(key_file).read_bytes().strip()
        return os.environ["STREAM_DP_KEY"].encode()
    key: bytes = load_key(key_file, env="STREAM_DP_KEY")
    return key


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------- sending
@dataclass(frozen=True)
class SendReport:
    """What a send loop did: ``sent`` records acknowledged, ``skipped`` already present,
    ``interrupted`` if stopped before the end."""

    sent: int
    skipped: int
    interrupted: bool
    seconds: float


def encode_event(event: Event) -> bytes:
    """The ``dp.events.v1`` message value (compact JSON)."""
    return json.dumps(event.to_message(), separators=(",", ":")).encode()


async def send_events(
    records: Iterable[LogRecord],
    *,
    bootstrap: str,
    topic: str,
    speed: float | None = None,
    run_id: str | None = None,
    skip: frozenset[int] = frozenset(),
    chunk: int = 2000,
    on_checkpoint: Callable[[LogRecord, dict[int, int]], None] | None = None,
    on_progress: Callable[[LogRecord], None] | None = None,
    stop: asyncio.Event | None = None,
    markers: bool = False,
    final_marker: Callable[[], float | None] | None = None,
) -> SendReport:
    """Produce ``records`` to ``topic`` with an idempotent producer, in order.

    ``speed``: event-time seconds per wall second (None = as fast as possible). Record numbers in
    ``skip`` are not sent. After every ``chunk`` records (or 0.5 s) all outstanding sends are
    awaited and ``on_checkpoint(last acknowledged record, {partition: last offset})`` is called.
    Setting ``stop`` ends the loop after acknowledging what was sent.

    ``markers``: when paced, write a progress close marker into every partition once per wall
    second (time = the replay clock); after the last record, a final one at ``final_marker()``
    (skipped if it returns None).
    """
    from aiokafka import AIOKafkaProducer

    from agents.codec import close_marker

    if chunk < 1:
        raise ValueError(f"chunk must be ≥ 1, got {chunk}")
    if speed is not None and not speed > 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    from agents.security import client_kwargs

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **client_kwargs(),
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        max_batch_size=262_144,
        request_timeout_ms=30_000,
    )
    await start_client(producer)
    partitions = sorted(await producer.partitions_for(topic)) if markers else []
    loop = asyncio.get_running_loop()
    t_start = loop.time()
    pending: list[tuple[LogRecord, asyncio.Future[Any]]] = []
    offsets: dict[int, int] = {}
    sent = skipped = 0
    last_checkpoint = loop.time()
    ts0: float | None = None
    interrupted = False

    checkpointed = 0
    last_marker = loop.time()

    async def mark(at: float, final: bool) -> None:
        headers, value = close_marker(at, final)
        for part in partitions:
            pending.append((None, await producer.send(  # type: ignore[arg-type]
                topic, value=value, partition=part, headers=headers)))

    async def settle(last: LogRecord | None) -> None:
        """Await every outstanding send; everything processed up to ``last`` is then done."""
        nonlocal sent, last_checkpoint, checkpointed
        for _record, fut in pending:
            meta = await fut
            offsets[meta.partition] = max(offsets.get(meta.partition, -1), meta.offset)
        sent += sum(1 for record, _ in pending if record is not None)  # events, not markers
        pending.clear()
        last_checkpoint = loop.time()
        if last is not None and last.number > checkpointed and on_checkpoint is not None:
            checkpointed = last.number
            on_checkpoint(last, dict(offsets))

    processed: LogRecord | None = None
    try:
        for record in records:
            if stop is not None and stop.is_set():
                interrupted = True
                break
            if record.number in skip:
                skipped += 1
                processed = record
                if on_progress is not None:
                    on_progress(record)
                continue
            event = record.event
            if speed is not None:
                if ts0 is None:
                    ts0 = event.ts
                    t_start = loop.time()
                delay = t_start + (event.ts - ts0) / speed - loop.time()
                if delay > 0:
                    await settle(processed)
                    if stop is None:
                        await asyncio.sleep(delay)
                    else:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), timeout=delay)
                        if stop.is_set():
                            interrupted = True
                            break
            headers = [] if run_id is None else [(HEADER, f"{run_id}:{record.number}".encode())]
            fut = await producer.send(
                topic,
                value=encode_event(event),
                key=event.partition_key.encode(),
                headers=headers,
            )
            pending.append((record, fut))
            processed = record
            if markers and speed is not None and ts0 is not None \
                    and loop.time() - last_marker >= 1.0:
                last_marker = loop.time()
                await mark(ts0 + (loop.time() - t_start) * speed, False)
            if len(pending) >= chunk or loop.time() - last_checkpoint > 0.5:
                await settle(processed)
            if on_progress is not None:
                on_progress(record)
        if markers and not interrupted and final_marker is not None:
            at = final_marker()
            if at is not None:
                await mark(at, True)
        await settle(processed)
    except LogFormatError:
        await settle(processed)  # what came before the bad line is delivered and recorded
        raise
    finally:
        await producer.stop()
    return SendReport(sent, skipped, interrupted, loop.time() - t_start)


async def find_unacknowledged(
    bootstrap: str, topic: str, run_id: str, scan_from: dict[str, int], after: int
) -> frozenset[int]:
    """Record numbers > ``after`` of run ``run_id`` already in ``topic`` (sent, not checkpointed).

    Reads each partition from ``scan_from[partition]`` (missing: from the beginning) to its end.
    """
    from aiokafka import AIOKafkaConsumer

    from agents.security import client_kwargs

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
        auto_offset_reset="earliest", **client_kwargs(),
    )
    await start_client(consumer)
    found: set[int] = set()
    prefix = f"{run_id}:".encode()
    try:
        tps = await topic_partitions(consumer, topic)
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        todo = {}
        for tp in tps:
            start = scan_from.get(str(tp.partition))
            if start is None:
                await consumer.seek_to_beginning(tp)
                start = await consumer.position(tp)
            else:
                consumer.seek(tp, start)
            if start < ends[tp]:
                todo[tp] = ends[tp]
            else:
                consumer.pause(tp)
        while todo:
            batch = await consumer.getmany(*todo.keys(), timeout_ms=1000)
            for tp, messages in batch.items():
                for msg in messages:
                    for name, value in msg.headers or ():
                        if name == HEADER and value.startswith(prefix):
                            number = int(value[len(prefix):])
                            if number > after:
                                found.add(number)
                    if msg.offset + 1 >= todo.get(tp, 0):
                        todo.pop(tp, None)
                        consumer.pause(tp)
            if not batch:
                # offsets past the last record (e.g. transaction markers) may never be returned
                for tp in list(todo):
                    if await consumer.position(tp) >= todo[tp]:
                        todo.pop(tp)
    finally:
        await consumer.stop()
    return frozenset(found)


async def end_offsets(bootstrap: str, topic: str) -> dict[str, int]:
    """Current end offset of every partition of ``topic`` (keys are partition numbers as text)."""
    from aiokafka import AIOKafkaConsumer

    from agents.security import client_kwargs

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                                **client_kwargs())
    await start_client(consumer)
    try:
        tps = await topic_partitions(consumer, topic)
        ends = await consumer.end_offsets(tps)
        return {str(tp.partition): int(off) for tp, off in ends.items()}
    finally:
        await consumer.stop()


# ---------------------------------------------------------------------------------- command
def _retime_offset(log: Path, fmt: LogFormat, retime: str | None) -> float:
    """Seconds to add to every event time so the first record is at ``retime`` (0 if None)."""
    if retime is None:
        return 0.0
    target = time.time() if retime == "now" else parse_ts(retime)
    first = next(iter(read_log(log, fmt)), None)
    if first is None:
        return 0.0
    return round((target - first.event.ts) * 1000) / 1000.0


def _shifted(records: Iterable[LogRecord], offset: float) -> Iterator[LogRecord]:
    for r in records:
        e = r.event
        yield LogRecord(r.number, r.end_offset,
                        Event(e.key, round((e.ts + offset) * 1000) / 1000.0, e.value, e.attrs))


def _say(out: TextIO, text: str) -> None:
    print(text, file=out, flush=True)


def _key_outcome(previous: str | None, current: str | None) -> str:
    """``unknown`` (no key here), ``new`` (first replay), ``same`` or ``different``."""
    if current is None:
        return "unknown"
    if previous is None:
        return "new"
    return "same" if hmac.compare_digest(previous, current) else "different"


_KEY_NOTES = {
    "unknown": "note: no noise key here (--key-file or $STREAM_DP_KEY), so replay cannot check "
               "that the worker's key is the one of the previous replay, nor refuse a changed "
               "log under the same key.",
    "new": "first replay of this log with this noise key (its key check value and the log's "
           "SHA-256 are recorded for later replays).",
    "same": "same noise key and the very same log as the previous replay: a fresh deployment "
            "with the same settings reproduces the original releases bit for bit and spends no "
            "new privacy budget.",
    "different": "WARNING: the noise key differs from the previous replay of this log: the "
                 "releases will differ from the original ones and the privacy budget for these "
                 "events is spent AGAIN.",
}


class _Out:
    """Human messages (stdout, or stderr with --json) and the --json outcome object."""

    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode
        self.stream: TextIO = sys.stderr if json_mode else sys.stdout
        self.result: dict[str, Any] = {"schema": "stream-dp.replay.v1"}

    def say(self, text: str) -> None:
        _say(self.stream, text)

    def finish(self, status: str, code: int, **fields: Any) -> int:
        self.result.update(fields)
        self.result["status"] = status
        self.result["exit_status"] = code
        if self.json_mode:
            print(json.dumps(self.result, sort_keys=True), flush=True)
        return code


def validate_args(args: argparse.Namespace) -> None:
    """Every option that needs no broker, checked before anything connects (one-line
    ``ValueError`` naming the option and its range)."""
    if args.speed is not None and not (args.speed > 0 and math.isfinite(args.speed)):
        raise ValueError(f"--speed must be a finite number > 0 (event-time seconds per wall "
                         f"second), got {args.speed}")
    if not 1 <= args.chunk <= 10_000_000:
        raise ValueError(f"--chunk must be an integer in [1, 10000000] (records per "
                         f"checkpoint), got {args.chunk}")
    for option, value in (("--until", args.until), ("--retime", getattr(args, "retime", None))):
        if value is None or (option == "--retime" and value == "now"):
            continue
        try:
            ts = parse_ts(value)
        except (ValueError, LogFormatError) as exc:
            raise ValueError(f"{option}: {' '.join(str(exc).split())}") from None
        if not math.isfinite(ts):
            raise ValueError(f"{option} must be a finite time, got {value!r}")
    detect_format(args.log, args.format)


async def _async_run(args: argparse.Namespace) -> int:
    log = Path(args.log)
    out = _Out(bool(getattr(args, "json", False)))
    try:
        validate_args(args)
    except ValueError as exc:
        print(f"stream-dp replay: {exc}", file=sys.stderr)
        return out.finish("error", 2, error=str(exc))
    if not log.is_file():
        print(f"stream-dp replay: no such log file: {log}", file=sys.stderr)
        return out.finish("error", 2, error=f"no such log file: {log}")
    if args.speed is not None and not (args.speed > 0 and args.speed < float("inf")):
        print(f"stream-dp replay: --speed must be a number > 0, got {args.speed}", file=sys.stderr)
        return out.finish("error", 2, error="--speed must be > 0")
    if args.chunk < 1:
        print(f"stream-dp replay: --chunk must be an integer >= 1, got {args.chunk}",
              file=sys.stderr)
        return out.finish("error", 2, error="--chunk must be >= 1")
    problem = security_problem()
    if problem:
        print(f"stream-dp replay: {problem}", file=sys.stderr)
        return out.finish("error", 2, error=problem)
    until: float | None = None
    if args.until is not None:
        try:
            until = parse_ts(args.until)
        except (ValueError, LogFormatError) as exc:
            print(f"stream-dp replay: --until: {exc}", file=sys.stderr)
            return out.finish("error", 2, error=f"--until: {exc}")
    fmt = detect_format(log, args.format)
    bootstrap = bootstrap_from(args.bootstrap)
    topic = args.topic or default_topic("events")
    spath = state_path(log, args.state_dir)
    digest = log_digest(log)
    try:
        key = load_key_for_fingerprint(args.key_file)
    except ValueError as exc:
        print(f"stream-dp replay: {exc}", file=sys.stderr)
        return out.finish("error", 2, error="noise key refused")
    fingerprint = key_fingerprint(key) if key is not None else None
    del key
    out.result.update(log=str(log), topic=topic, log_sha256=digest)

    previous = ReplayState.load(spath)
    outcome = _key_outcome(previous.key_fingerprint if previous else None, fingerprint)
    out.result["key"] = outcome
    history = [list(h) for h in previous.history] if previous is not None else []
    if previous is not None and previous.key_fingerprint is not None and [
            previous.key_fingerprint, previous.log_sha256] not in history:
        history.append([previous.key_fingerprint, previous.log_sha256])
    clash = fingerprint is not None and any(
        hmac.compare_digest(f, fingerprint) and d != digest for f, d in history)
    if clash:
        assert previous is not None
        print(f"stream-dp replay: REFUSED: {log} differs from the log replayed before with the "
              f"same noise key (SHA-256 {digest[:16]}… vs {previous.log_sha256[:16]}…, recorded "
              f"in {spath}). Releasing a changed log with the same key would publish the exact "
              "difference. Use a new epoch or another key (fresh noise, new budget), or restore "
              "the original log.", file=sys.stderr)
        return out.finish("log_differs", EXIT_LOG_DIFFERS, budget="refused")
    budget = {"same": "no_new_budget", "different": "spent_again", "new": "spent",
              "unknown": "unknown"}[outcome]
    out.result["budget"] = budget
    resume = previous is not None and not args.restart and not previous.complete
    if previous is not None and previous.complete and not args.restart:
        out.say(f"{log}: already replayed completely ({previous.records_acked} records into "
                f"{previous.topic}, {previous.updated}). Nothing to do; --restart replays it "
                "again.")
        out.say(_KEY_NOTES[outcome])
        return out.finish("already_complete", 0, records=previous.records_acked, sent=0)
    if resume:
        assert previous is not None
        if previous.log_sha256 != digest:
            print(f"stream-dp replay: {log} changed since the interrupted replay recorded in "
                  f"{spath}; use --restart to replay the new log", file=sys.stderr)
            return out.finish("error", 2, error="log changed since the interrupted replay")
        if previous.topic != topic:
            print(f"stream-dp replay: the interrupted replay went to topic {previous.topic!r}, "
                  f"not {topic!r}; pass --topic {previous.topic} or --restart", file=sys.stderr)
            return out.finish("error", 2, error="interrupted replay went to another topic")
        state = previous
        if fingerprint is not None and state.key_fingerprint is not None:
            out.say(_KEY_NOTES[outcome])
        state.key_fingerprint = fingerprint or state.key_fingerprint
        state.history = history
        found = await find_unacknowledged(
            bootstrap, topic, state.run_id, state.scan_from, state.records_acked
        )
        skip = found | frozenset(n for n in state.delivered if n > state.records_acked)
        state.delivered = sorted(skip)
        state.save(spath)
        out.say(f"resuming {log} after record {state.records_acked} "
                f"({len(skip)} later records already delivered before the interruption are "
                "skipped too)")
    else:
        out.say(_KEY_NOTES[outcome])
        state = ReplayState(
            log=str(log.resolve()), log_sha256=digest, topic=topic, run_id=uuid.uuid4().hex,
            key_fingerprint=fingerprint, scan_from=await end_offsets(bootstrap, topic),
            started=_now_iso(), time_offset=_retime_offset(log, fmt, args.retime),
            history=history,
        )
        if state.time_offset:
            out.say(f"retimed by {state.time_offset:+.3f} s: these are NEW releases (other "
                    "ticks), not a reproduction of the original run.")
        state.save(spath)
        skip = frozenset()

    total_bytes = log.stat().st_size
    bar = ProgressBar(total_bytes, enabled=not args.no_progress, stream=sys.stderr)
    bar.advance_to(state.byte_offset, state.records_acked)
    speed = None if args.as_fast_as_possible else args.speed

    def checkpoint(record: LogRecord, offsets: dict[int, int]) -> None:
        state.records_acked = record.number
        state.byte_offset = record.end_offset
        for partition, offset in offsets.items():
            state.scan_from[str(partition)] = max(state.scan_from.get(str(partition), 0), offset + 1)
        state.delivered = [n for n in state.delivered if n > record.number]
        state.save(spath)

    def progress(record: LogRecord) -> None:
        ts = record.event.ts
        if state.max_ts is None or ts > state.max_ts:
            state.max_ts = ts
        bar.advance_to(record.end_offset, record.number)

    def final_marker() -> float | None:
        return until if until is not None else state.max_ts

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    records = read_log(log, fmt, start_offset=state.byte_offset, start_number=state.records_acked)
    if state.time_offset:
        records = _shifted(records, state.time_offset)
    try:
        report = await send_events(
            records, bootstrap=bootstrap, topic=topic, speed=speed, run_id=state.run_id,
            skip=skip, chunk=args.chunk, on_checkpoint=checkpoint, on_progress=progress,
            stop=stop, markers=not args.no_close_markers, final_marker=final_marker,
        )
    except LogFormatError as exc:
        bar.close()
        print(f"stream-dp replay: {exc}; records before it were sent and recorded in {spath}",
              file=sys.stderr)
        return out.finish("error", 2, error=str(exc), records=state.records_acked)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    bar.close()
    if report.interrupted:
        out.say(f"interrupted after record {state.records_acked} ({report.sent} sent this run); "
                "run the same command again to resume.")
        return out.finish("interrupted", EXIT_INTERRUPTED, records=state.records_acked,
                          sent=report.sent)
    state.complete = True
    if state.key_fingerprint is not None and [state.key_fingerprint, digest] not in state.history:
        state.history.append([state.key_fingerprint, digest])
    state.save(spath)
    rate = report.sent / report.seconds if report.seconds > 0 else float("inf")
    out.say(f"replayed {state.records_acked} records of {log} into {topic} "
            f"({report.sent} sent, {report.skipped} skipped as already delivered) in "
            f"{report.seconds:.1f} s ({rate:,.0f} records/s).")
    if not args.no_close_markers:
        out.say(f"close markers written: the final one closes the tick containing "
                f"{final_marker()!r} (a deployment with schedule = \"markers\" releases every "
                "tick up to it).")
    if state.time_offset:
        out.say(f"Event times were shifted by {state.time_offset:+.3f} s (--retime): the same "
                "log with the same --retime TIME and key reproduces these releases; 'now' "
                "never does.")
    elif outcome == "same":
        out.say("Same log, same key: a fresh deployment with the same settings publishes the "
                "very releases of the earlier replay, bit for bit, at no new privacy cost.")
    elif outcome == "different":
        out.say("Another key than before: these are new releases; the budget for these events "
                "is spent again.")
    elif outcome == "new":
        out.say("Replaying this log again with the same noise key into a fresh deployment with "
                "the same settings reproduces these releases bit for bit; a changed log under "
                "this key is refused.")
    return out.finish("replayed", 0, records=state.records_acked, sent=report.sent,
                      skipped=report.skipped, final_marker=final_marker(),
                      retimed=bool(state.time_offset))


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_async_run(args))
    except KeyboardInterrupt:  # pragma: no cover - signal handlers normally catch it
        return EXIT_INTERRUPTED
    except Exception as exc:  # connection and TLS/SASL failures: one line, no traceback
        if not is_kafka_error(exc):
            if isinstance(exc, ValueError | RuntimeError | OSError):
                print(f"stream-dp replay: {exc}", file=sys.stderr)
                return 1
            raise
        print(f"stream-dp replay: {connection_problem(exc, bootstrap_from(args.bootstrap))}",
              file=sys.stderr)
        return 1

