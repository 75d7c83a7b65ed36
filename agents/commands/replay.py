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

The state file also holds a **key fingerprint** (HMAC-SHA256 of a fixed label under the noise key,
never the key), so replaying a log again tells whether the releases will be reproduced bit for bit
(same key: no new privacy budget spent) or are new releases (different key: budget spent again).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
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
    default_topic,
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

Replay semantics: noise is keyed by (secret key, stream, node), so replaying the same log into a
fresh deployment with the same noise key reproduces the original releases bit for bit and spends
no new privacy budget. With a different key the releases differ and the budget for these events is
spent again: replay warns when the key fingerprint (from --key-file or $STREAM_DP_KEY, never the
key itself) differs from the one recorded by the previous replay of the log. A replay into a
running deployment whose watermark is past the log's times sends every event to the dead-letter
topic as late; replay into a fresh deployment (or fresh topics).

Examples:
  stream-dp simulate restaurant --seed 7 --out sales.csv --domain-out domain.toml
  stream-dp replay sales.csv                            # as fast as possible
  stream-dp replay sales.jsonl --speed 3600 --bootstrap kafka:9092
  stream-dp replay sales.csv --state-dir ~/.cache/stream-dp    # log folder read-only
  stream-dp replay sales.csv --restart --key-file /run/secrets/noise-key
  stream-dp replay web.csv --retime now --speed 1 --bootstrap 127.0.0.1:40123   # into the demo
"""

STATE_VERSION = 1
HEADER = "stream-dp-replay"
_FINGERPRINT_LABEL = b"stream-dp/noise-key-fingerprint/v1"
_HEAD_BYTES = 65_536
EXIT_INTERRUPTED = 130


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


# ---------------------------------------------------------------------------------- state file
@dataclass
class ReplayState:
    """Progress of one replay of one log; stored as JSON (never holds the key or the data)."""

    log: str
    head_sha256: str
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


def head_digest(log: Path) -> str:
    """SHA-256 of the log's first 64 KiB: detects a log replaced between runs."""
    with open(log, "rb") as fh:
        return hashlib.sha256(fh.read(_HEAD_BYTES)).hexdigest()


def key_fingerprint(key: bytes) -> str:
    """A public fingerprint of the noise key: HMAC-SHA256(key, fixed label), 16 hex digits."""
    return hmac.new(key, _FINGERPRINT_LABEL, hashlib.sha256).hexdigest()[:16]


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
) -> SendReport:
    """Produce ``records`` to ``topic`` with an idempotent producer, in order.

    ``speed``: event-time seconds per wall second (None = as fast as possible). Record numbers in
    ``skip`` are not sent. After every ``chunk`` records (or 0.5 s) all outstanding sends are
    awaited and ``on_checkpoint(last acknowledged record, {partition: last offset})`` is called.
    Setting ``stop`` ends the loop after acknowledging what was sent.
    """
    from aiokafka import AIOKafkaProducer

    if chunk < 1:
        raise ValueError(f"chunk must be ≥ 1, got {chunk}")
    if speed is not None and not speed > 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        max_batch_size=262_144,
        request_timeout_ms=30_000,
    )
    await producer.start()
    loop = asyncio.get_running_loop()
    t_start = loop.time()
    pending: list[tuple[LogRecord, asyncio.Future[Any]]] = []
    offsets: dict[int, int] = {}
    sent = skipped = 0
    last_checkpoint = loop.time()
    ts0: float | None = None
    interrupted = False

    checkpointed = 0

    async def settle(last: LogRecord | None) -> None:
        """Await every outstanding send; everything processed up to ``last`` is then done."""
        nonlocal sent, last_checkpoint, checkpointed
        for _record, fut in pending:
            meta = await fut
            offsets[meta.partition] = max(offsets.get(meta.partition, -1), meta.offset)
        sent += len(pending)
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
                key=event.key.encode(),
                headers=headers,
            )
            pending.append((record, fut))
            processed = record
            if len(pending) >= chunk or loop.time() - last_checkpoint > 0.5:
                await settle(processed)
            if on_progress is not None:
                on_progress(record)
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

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
        auto_offset_reset="earliest",
    )
    await consumer.start()
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

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
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
                        Event(e.key, round((e.ts + offset) * 1000) / 1000.0, e.value))


def _say(out: TextIO, text: str) -> None:
    print(text, file=out, flush=True)


def _key_notes(previous: str | None, current: str | None, out: TextIO) -> None:
    if current is None:
        _say(out, "note: no noise key here (--key-file or $STREAM_DP_KEY), so replay cannot "
                  "check that the worker's key is the one of the previous replay.")
    elif previous is None:
        _say(out, f"noise key fingerprint {current} recorded for later replays of this log.")
    elif previous == current:
        _say(out, f"same noise key as the previous replay (fingerprint {current}): a fresh "
                  "deployment reproduces the original releases bit for bit and spends no new "
                  "privacy budget.")
    else:
        _say(out, f"WARNING: the noise key differs from the previous replay of this log "
                  f"(fingerprint {current}, was {previous}): the releases will differ from the "
                  "original ones and the privacy budget for these events is spent AGAIN.")


async def _async_run(args: argparse.Namespace) -> int:
    log = Path(args.log)
    out = sys.stdout
    if not log.is_file():
        print(f"stream-dp replay: no such log file: {log}", file=sys.stderr)
        return 2
    fmt = detect_format(log, args.format)
    bootstrap = bootstrap_from(args.bootstrap)
    topic = args.topic or default_topic("events")
    spath = state_path(log, args.state_dir)
    head = head_digest(log)
    key = load_key_for_fingerprint(args.key_file)
    fingerprint = key_fingerprint(key) if key is not None else None
    del key

    previous = ReplayState.load(spath)
    resume = previous is not None and not args.restart and not previous.complete
    if previous is not None and previous.complete and not args.restart:
        _say(out, f"{log}: already replayed completely ({previous.records_acked} records into "
                  f"{previous.topic}, {previous.updated}). Nothing to do; --restart replays it "
                  "again.")
        _key_notes(previous.key_fingerprint, fingerprint, out)
        return 0
    if resume:
        assert previous is not None
        if previous.head_sha256 != head:
            print(f"stream-dp replay: {log} changed since the interrupted replay recorded in "
                  f"{spath}; use --restart to replay the new log", file=sys.stderr)
            return 2
        if previous.topic != topic:
            print(f"stream-dp replay: the interrupted replay went to topic {previous.topic!r}, "
                  f"not {topic!r}; pass --topic {previous.topic} or --restart", file=sys.stderr)
            return 2
        state = previous
        if state.key_fingerprint is not None and fingerprint is not None:
            _key_notes(state.key_fingerprint, fingerprint, out)
        state.key_fingerprint = fingerprint or state.key_fingerprint
        found = await find_unacknowledged(
            bootstrap, topic, state.run_id, state.scan_from, state.records_acked
        )
        skip = found | frozenset(n for n in state.delivered if n > state.records_acked)
        state.delivered = sorted(skip)
        state.save(spath)
        _say(out, f"resuming {log} after record {state.records_acked} "
                  f"({len(skip)} later records already delivered before the interruption are "
                  "skipped too)")
    else:
        _key_notes(previous.key_fingerprint if previous else None, fingerprint, out)
        state = ReplayState(
            log=str(log.resolve()), head_sha256=head, topic=topic, run_id=uuid.uuid4().hex,
            key_fingerprint=fingerprint, scan_from=await end_offsets(bootstrap, topic),
            started=_now_iso(), time_offset=_retime_offset(log, fmt, args.retime),
        )
        if state.time_offset:
            _say(out, f"retimed by {state.time_offset:+.3f} s: these are NEW releases (other "
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
            skip=skip, chunk=args.chunk, on_checkpoint=checkpoint,
            on_progress=lambda r: bar.advance_to(r.end_offset, r.number), stop=stop,
        )
    except LogFormatError as exc:
        bar.close()
        print(f"stream-dp replay: {exc}; records before it were sent and recorded in {spath}",
              file=sys.stderr)
        return 2
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    bar.close()
    if report.interrupted:
        _say(out, f"interrupted after record {state.records_acked} ({report.sent} sent this run); "
                  "run the same command again to resume.")
        return EXIT_INTERRUPTED
    state.complete = True
    state.save(spath)
    rate = report.sent / report.seconds if report.seconds > 0 else float("inf")
    _say(out, f"replayed {state.records_acked} records of {log} into {topic} "
              f"({report.sent} sent, {report.skipped} skipped as already delivered) in "
              f"{report.seconds:.1f} s ({rate:,.0f} records/s).")
    if state.time_offset:
        _say(out, f"Event times were shifted by {state.time_offset:+.3f} s (--retime): the same "
                  "log with the same --retime TIME and key reproduces these releases; 'now' "
                  "never does.")
    else:
        _say(out, "Replaying this log again with the same noise key into a fresh deployment "
                  "reproduces these releases bit for bit; a different key spends the budget "
                  "again.")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_async_run(args))
    except KeyboardInterrupt:  # pragma: no cover - signal handlers normally catch it
        return EXIT_INTERRUPTED
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"stream-dp replay: {exc}", file=sys.stderr)
        return 1

