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

**The key and the log's content.** Replay needs the deployment's noise key (``--key-file``,
``$STREAM_DP_KEY_FILE`` or ``$STREAM_DP_KEY``) and refuses to run without it. Before anything is
sent it consults the replay history (:mod:`agents.replay_history`), kept per key check value
(HMAC-SHA256 of a fixed label under the noise key; never the key, never printed) and per log
*content* (SHA-256 of the whole file, and the ``--retime`` shift), wherever the file lies and
whatever it is called: the same key on the very same content reproduces the releases bit for bit
at no new privacy budget; the same key on any other content (edited, extended, a prefix, a
renamed copy of another log) would publish the exact difference, so replay refuses (exit status
3, ``"status": "log_differs"``); another key is said to spend the budget again.

**Close markers.** After the events (and, in between, a progress marker before the first record
whose event time reaches the next multiple of ``--marker-every`` seconds: positions fixed by the
log, the same at any speed), replay writes a
close marker into every partition of the topic (:func:`agents.codec.close_marker`), authenticated
with a MAC under :func:`agents.codec.marker_key` of the noise key, bound to the topic and the
partition: on a deployment with ``schedule = "markers"`` they are its schedule — ticks close
exactly where the log says, however fast the replay runs; a clock-schedule deployment
dead-letters them (pass ``--no-close-markers``). The final marker is at ``--until``, required
whenever markers are written: the last released tick is public, fixed before the replay, never
the last event's tick (removing the last event must not change how many ticks are released).
A ``--until`` in the future is refused (a worker dead-letters a marker whose ticks' deadline +
``close_grace_s`` has not passed on its clock), and progress markers never run ahead of
``--until``.
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

from agents.codec import marker_key
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
from agents.replay_history import Content, ReplayHistory
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
every --marker-every seconds of event time, at positions fixed by the log), signed with a key derived from the noise key, so ticks close where the
log says, whatever the speed, and the worker can be started before or after the replay. The final
marker closes every tick up to the one containing --until TIME, which is required with markers:
the end of the release is public and fixed in advance, never the last event's time (removing the
last event must not change how many ticks are released). --until must not lie in the future: a
worker refuses a final marker whose ticks' deadline + close_grace_s has not passed on its clock.
A clock-schedule deployment (live) judges each event by its record's timestamp and dead-letters
markers: use --no-close-markers; an old log then arrives late, unless retimed (--retime now
--speed 1).

Noise key: required (--key-file, $STREAM_DP_KEY_FILE or $STREAM_DP_KEY, as the worker reads it):
it signs the close markers and identifies the key in the replay history. A key file readable by
group or others is refused (chmod 600).

Replay semantics: noise is keyed by (secret key, deployment, mechanism, stream, node), where the
deployment is its app id, events and schedule topics and every setting that decides what a tick
contains. Replaying the same log with the same noise key into a fresh deployment with that same
identity (e.g. the same topic names on a new cluster, or after deleting the topics) reproduces
the original releases bit for bit and spends no new privacy budget; any other deployment draws
fresh noise and spends the budget again. With a different key the releases differ and the budget for
these events is spent again (replay says so). The replay history (--history-file, one file for
every log, whatever its name or folder) lists, per key, the SHA-256 of every log content (and
--retime shift) replayed under it: the same key on any other content (any changed byte, records
added or removed, a prefix, a renamed copy of another log, another --retime shift) is refused
with exit status 3, because the difference of the two releases would reveal the changed events.
Publish a changed log under another key (fresh noise, new budget). The whole log is read and
checked before anything is sent.

Exit status: 0 done (or nothing to do), 1 error, 2 bad usage, log or key (no key, too open a key
file, --until missing or in the future, a topic whose partitions end with the final close marker
of an earlier replay: its deployment has closed those ticks and would ignore the copy), 3 log
differs from one replayed before under the same key (refused), 130 interrupted (run again to
resume). --json prints one JSON object with the outcome on stdout, its only output there (notes
and progress always go to stderr).

Examples:
  stream-dp simulate restaurant --seed 7 --ticks 60 --out sales.csv --domain-out domain.toml
  export STREAM_DP_KEY_FILE=/run/secrets/noise-key      # the deployment's key (mode 0600)
  stream-dp replay sales.csv --until 2024-01-01T01:00:00Z    # as fast as possible
  stream-dp replay sales.jsonl --speed 3600 --until 2024-01-02T00:00:00Z --bootstrap kafka:9092
  stream-dp replay sales.csv --until 2024-01-01T01:00:00Z --state-dir ~/.cache/stream-dp
  stream-dp replay sales.csv --until 2024-01-01T01:00:00Z --restart --key-file /run/secrets/k
  # into the demo (clock schedule; 'stream-dp demo --data-dir /tmp/demo' keeps its key there):
  stream-dp replay web.csv --retime now --speed 1 --no-close-markers --key-file /tmp/demo/noise.key
  stream-dp replay sales.csv --json --until 2024-01-02T00:00:00Z   # machine-readable
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
        "--marker-every", type=float, default=10.0, metavar="SECONDS",
        help="progress close markers every SECONDS of event time (default 10; the tick length "
        "gives tick-by-tick releases), at positions fixed by the log: the same releases at any "
        "--speed; 0 = only the final marker",
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
        help="the deployment's noise key file (hex or raw, >= 32 bytes, mode 0600; default: "
        "$STREAM_DP_KEY_FILE, then $STREAM_DP_KEY); required: it signs the close markers and "
        "keys the replay history",
    )
    parser.add_argument(
        "--history-file", metavar="FILE",
        help="replay history: per noise key, every log content replayed under it (default: "
        "$STREAM_DP_REPLAY_HISTORY, else $XDG_STATE_HOME/stream-dp/replay-history.json, else "
        "~/.local/state/stream-dp/replay-history.json); share it between every machine that "
        "replays with the same key",
    )
    parser.add_argument(
        "--chunk", type=int, default=2000, metavar="N",
        help="records per acknowledged checkpoint of the state file (default 2000)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument(
        "--until", metavar="TIME",
        help="the final close marker closes every tick up to the one containing TIME (Unix s or "
        "ISO 8601); required unless --no-close-markers: the last released tick is fixed in "
        "advance, never taken from the log. Must not lie in the future",
    )
    parser.add_argument(
        "--no-close-markers", action="store_true",
        help="write no close markers (only for deployments on the clock schedule)",
    )
    parser.add_argument(
        "--json", action="store_true",
        help="print the outcome as one JSON object on stdout (notes and progress go to stderr "
             "either way)",
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
    #: largest (retimed) event time sent so far (informative; never a close marker's time)
    max_ts: float | None = None
    #: (key check value, log SHA-256) pairs of earlier versions, which kept the guard per path:
    #: merged into the replay history (:mod:`agents.replay_history`) when read, never written
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
    """The noise key as the worker loads it (:func:`stream_dp.noise.load_key`: length, entropy
    and file permissions checked), or ``None`` if no key is configured here."""
    from stream_dp.noise import load_key

    key_file = key_file or os.environ.get("STREAM_DP_KEY_FILE") or None
    if key_file is None and not os.environ.get("STREAM_DP_KEY"):
        return None
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
    mac_key: bytes | None = None,
    clock: Callable[[], float] = time.time,
    marker_every: float = 10.0,
) -> SendReport:
    """Produce ``records`` to ``topic`` with an idempotent producer, in order.

    ``speed``: event-time seconds per wall second (None = as fast as possible). Record numbers in
    ``skip`` are not sent. After every ``chunk`` records (or 0.5 s) all outstanding sends are
    awaited and ``on_checkpoint(last acknowledged record, {partition: last offset})`` is called.
    Setting ``stop`` ends the loop after acknowledging what was sent.

    ``markers``: progress close markers at positions fixed by the log alone, the same whether
    paced or not and however fast the sender keeps up: before the first record whose event time
    reaches a multiple ``B`` of ``marker_every`` seconds (event time) beyond the last marker, a
    marker at ``B`` (never past ``final_marker()``) into every partition; after the last record,
    a final one at ``final_marker()`` (skipped if it returns None). Each
    marker is authenticated with ``mac_key`` (:func:`agents.codec.marker_key` of the deployment's
    noise key; required with ``markers``) for its topic and partition.
    """
    from aiokafka import AIOKafkaProducer

    from agents.codec import close_marker

    if chunk < 1:
        raise ValueError(f"chunk must be ≥ 1, got {chunk}")
    if speed is not None and not speed > 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    if markers and mac_key is None:
        raise ValueError("close markers need mac_key (agents.codec.marker_key of the noise key)")
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
    last_boundary: float | None = None

    async def mark(at: float, final: bool) -> None:
        assert mac_key is not None
        for part in partitions:
            headers, value = close_marker(at, final, mac_key=mac_key, topic=topic, partition=part)
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
            if markers and marker_every > 0 and math.isfinite(event.ts):
                # a boundary of event time fixed by the log, not by the wall clock: the same
                # marker positions at any speed (docs/privacy.md, "The release schedule")
                boundary = math.floor(event.ts / marker_every) * marker_every
                if last_boundary is None:
                    last_boundary = boundary
                elif boundary > last_boundary:
                    last_boundary = boundary
                    end = final_marker() if final_marker is not None else None
                    await mark(boundary if end is None else min(boundary, end), False)
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
            if len(pending) >= chunk or loop.time() - last_checkpoint > 0.5:
                await settle(processed)
            if on_progress is not None:
                on_progress(record)
        if markers and not interrupted and final_marker is not None:
            final_at = final_marker()
            if final_at is not None:
                await mark(final_at, True)
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


_KEY_NOTES = {
    "new": "first replay under this noise key: the log's SHA-256 is recorded in the replay "
           "history, and this key may from now on replay only this very log.",
    "same": "same noise key and the very same log as an earlier replay: a fresh deployment "
            "with the same identity (app id, events and schedule topics) and settings "
            "reproduces the original releases bit for bit and spends no new privacy budget; "
            "any other deployment draws fresh noise and spends it again.",
    "different": "WARNING: these events were replayed before under another noise key: the "
                 "releases will differ from the original ones and the privacy budget for these "
                 "events is spent AGAIN.",
}

NO_KEY = ("no noise key: replay needs the deployment's key (--key-file FILE, $STREAM_DP_KEY_FILE "
          "or $STREAM_DP_KEY) to sign its close markers and to refuse a changed log under the "
          "same key")


class _Out:
    """Human messages (stderr, like the progress bar) and the --json outcome object (the only
    thing on stdout: ``replay ... --json | jq`` reads nothing else)."""

    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode
        self.stream: TextIO = sys.stderr
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



def _until_problem(args: argparse.Namespace, now: float) -> str | None:
    """Why ``--until`` is missing, misplaced or ahead of the wall clock ``now``, or ``None``."""
    markers = not getattr(args, "no_close_markers", False)
    if args.until is None:
        if markers:
            return ("--until TIME is required when close markers are written (the default): the "
                    "final marker fixes the last released tick, which must be public and chosen "
                    "in advance, not the last event's (e.g. --until 2024-01-02T00:00:00Z); a "
                    "clock-schedule deployment takes --no-close-markers instead")
        return None
    if not markers:
        return "--until sets the final close marker: it has no effect with --no-close-markers"
    until = parse_ts(args.until)
    if until > now:
        return (f"--until {args.until} is in the future: a worker dead-letters (marker_ahead) a "
                "final marker whose ticks' deadline + close_grace_s has not passed on its clock; "
                "give a past time, or replay again once that time has passed")
    return None


def validate_args(args: argparse.Namespace) -> None:
    """Every option that needs no broker, checked before anything connects (one-line
    ``ValueError`` naming the option and its range)."""
    if args.speed is not None and not (args.speed > 0 and math.isfinite(args.speed)):
        raise ValueError(f"--speed must be a finite number > 0 (event-time seconds per wall "
                         f"second), got {args.speed}")
    if not (math.isfinite(args.marker_every) and 0 <= args.marker_every <= 1e9):
        raise ValueError(f"--marker-every must be a number of seconds in [0, 1e9], got "
                         f"{args.marker_every}")
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
    problem = _until_problem(args, time.time())
    if problem is not None:
        raise ValueError(problem)
    detect_format(args.log, args.format)


def _check_log(log: Path, fmt: LogFormat) -> None:
    """Read the whole log once (``LogFormatError`` naming the first bad line): nothing is
    recorded in the history nor sent for a log that would stop half-way."""
    for _record in read_log(log, fmt):
        pass


def _imported(previous: ReplayState | None) -> list[tuple[str, Content]]:
    """The (key, content) pairs a state file of an earlier version guarded per path."""
    if previous is None:
        return []
    pairs: list[tuple[str, Content]] = []
    if previous.key_fingerprint:
        pairs.append((previous.key_fingerprint,
                      Content(previous.log_sha256, previous.time_offset)))
    for item in previous.history:
        if len(item) == 2:
            fp, digest = item
            offset = previous.time_offset if digest == previous.log_sha256 else 0.0
            pairs.append((fp, Content(digest, offset)))
    return pairs


def _describe(entry: dict[str, Any]) -> str:
    shift = float(entry.get("time_offset", 0.0))
    where = ", ".join(entry.get("paths", [])[:3]) or "an earlier version's state file"
    topics = ", ".join(t.get("topic", "?") for t in entry.get("targets", [])[:3])
    return (f"SHA-256 {str(entry.get('log_sha256'))[:16]}…"
            + (f", retimed {shift:+.3f} s" if shift else "")
            + f", read from {where}" + (f", into {topics}" if topics else ""))


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
    problem = security_problem()
    if problem:
        print(f"stream-dp replay: {problem}", file=sys.stderr)
        return out.finish("error", 2, error=problem)
    markers = not args.no_close_markers
    until = parse_ts(args.until) if args.until is not None else None
    fmt = detect_format(log, args.format)
    bootstrap = bootstrap_from(args.bootstrap)
    topic = args.topic or default_topic("events")
    spath = state_path(log, args.state_dir)
    try:
        key = load_key_for_fingerprint(args.key_file)
    except ValueError as exc:
        print(f"stream-dp replay: {' '.join(str(exc).split())}", file=sys.stderr)
        return out.finish("error", 2, error="noise key refused")
    if key is None:
        print(f"stream-dp replay: {NO_KEY}", file=sys.stderr)
        return out.finish("error", 2, error="no noise key")
    fingerprint = key_fingerprint(key)
    mac_key = marker_key(key) if markers else None
    del key
    # the Kafka client before anything is recorded or said: on the base install the one line
    # naming the service extra (stream_dp.cli), not a history entry and a note first
    import aiokafka  # noqa: F401
    digest = log_digest(log)
    out.result.update(log=str(log), topic=topic, log_sha256=digest)
    history = ReplayHistory(args.history_file)

    previous = ReplayState.load(spath)
    if previous is not None and previous.complete and not args.restart \
            and previous.log_sha256 == digest:
        verdict = history.lookup(fingerprint, Content(digest, previous.time_offset))
        out.result["key"] = verdict.key
        out.say(f"{log}: already replayed completely ({previous.records_acked} records into "
                f"{previous.topic}, {previous.updated}). Nothing to do; --restart replays it "
                "again.")
        if not verdict.refused:
            out.say(_KEY_NOTES[verdict.key])
        return out.finish("already_complete", 0, records=previous.records_acked, sent=0)
    resume = previous is not None and not args.restart and not previous.complete
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
    try:
        _check_log(log, fmt)
    except LogFormatError as exc:
        print(f"stream-dp replay: {exc}; nothing was sent", file=sys.stderr)
        return out.finish("error", 2, error=str(exc), records=0)
    offset = previous.time_offset if resume and previous is not None \
        else _retime_offset(log, fmt, args.retime)
    if mac_key is not None and not resume and not history.lookup(
            fingerprint, Content(digest, offset)).refused:  # another log: exit 3 below first
        # a topic a final marker closed already: the worker would ignore this copy (issue #24)
        from agents.commands._replay_target import earlier_final_marker, refusal

        first = next(iter(read_log(log, fmt)), None)
        earlier = await earlier_final_marker(bootstrap, topic, mac_key)
        why = None if earlier is None or first is None else refusal(
            earlier, topic, first.event.ts + offset)
        if why is not None:
            print(f"stream-dp replay: {why}", file=sys.stderr)
            return out.finish("error", 2, error="topic closed by an earlier replay")
    content = Content(digest, offset)
    where = str(log.resolve())
    verdict = history.check_and_record(
        fingerprint, content, log=where,
        target={"bootstrap": bootstrap, "topic": topic}, imported=_imported(previous))
    if verdict.key == "new" and previous is not None and previous.key_fingerprint \
            and not hmac.compare_digest(previous.key_fingerprint, fingerprint):
        # a first content under this key, but this path was replayed under another key: most
        # of these events were published before (say so; the content check is the guard)
        verdict = dataclasses.replace(verdict, key="different")
    out.result["key"] = verdict.key
    if verdict.refused:
        assert verdict.previous is not None
        print(f"stream-dp replay: REFUSED: this noise key already replayed another log "
              f"({_describe(verdict.previous)}; recorded in {history.path}); {log} "
              f"(SHA-256 {digest[:16]}…" + (f", retimed {offset:+.3f} s" if offset else "")
              + ") differs from it, whatever the file names. Releasing it with the same key "
              "would publish the exact difference. Replay the very same log, or use another key "
              "(fresh noise, new budget).", file=sys.stderr)
        return out.finish("log_differs", EXIT_LOG_DIFFERS, budget="refused")
    budget = {"same": "no_new_budget", "different": "spent_again", "new": "spent"}[verdict.key]
    out.result["budget"] = budget
    out.say(_KEY_NOTES[verdict.key])
    if resume:
        assert previous is not None
        state = previous
        state.key_fingerprint = fingerprint
        state.history = []
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
        state = ReplayState(
            log=str(log.resolve()), log_sha256=digest, topic=topic, run_id=uuid.uuid4().hex,
            key_fingerprint=fingerprint, scan_from=await end_offsets(bootstrap, topic),
            started=_now_iso(), time_offset=offset,
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
        return until  # public, given in advance: never the log's last event

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
            stop=stop, markers=markers, final_marker=final_marker, mac_key=mac_key,
            marker_every=args.marker_every,
        )
    except LogFormatError as exc:
        bar.close()
        print(f"stream-dp replay: {exc}; records before it were sent and recorded in {spath}",
              file=sys.stderr)
        return out.finish("error", 2, error=str(exc), records=state.records_acked)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        try:
            after = log_digest(log)
        except OSError:  # removed meanwhile: what was sent was read before
            after = digest
        if after != digest:
            # the log changed while it was being sent: what reached the topic may be neither
            # content, so both are bound to this key (which then refuses every other replay)
            history.add(fingerprint, Content(after, offset), log=where,
                        target={"bootstrap": bootstrap, "topic": topic})
            print(f"stream-dp replay: WARNING: {log} changed while it was being replayed (SHA-256 "
                  f"{digest[:16]}… before, {after[:16]}… after): both are recorded in "
                  f"{history.path} under this key, which now refuses every further replay. Never "
                  "write to a log that is being replayed.", file=sys.stderr)
    bar.close()
    if report.interrupted:
        out.say(f"interrupted after record {state.records_acked} ({report.sent} sent this run); "
                "run the same command again to resume.")
        return out.finish("interrupted", EXIT_INTERRUPTED, records=state.records_acked,
                          sent=report.sent)
    state.complete = True
    state.save(spath)
    rate = report.sent / report.seconds if report.seconds > 0 else float("inf")
    out.say(f"replayed {state.records_acked} records of {log} into {topic} "
            f"({report.sent} sent, {report.skipped} skipped as already delivered) in "
            f"{report.seconds:.1f} s ({rate:,.0f} records/s).")
    if markers:
        out.say(f"close markers written: the final one closes every tick up to the one "
                f"containing {args.until} (a deployment with schedule = \"markers\" releases "
                "every tick up to it).")
        if state.max_ts is not None and until is not None and state.max_ts > until:
            out.say(f"note: events after --until {args.until} were sent too; their ticks stay "
                    "open (not released) until a later final marker closes them.")
    if state.time_offset:
        out.say(f"Event times were shifted by {state.time_offset:+.3f} s (--retime): only the "
                "same log with the same shift reproduces these releases under this key; another "
                "shift ('now' always gives another) is refused as another log.")
    elif verdict.key == "same":
        out.say("Same log, same key: a fresh deployment with the same identity (app id, events "
                "and schedule topics) and settings publishes the very releases of the earlier "
                "replay, bit for bit, at no new privacy cost; another deployment draws fresh "
                "noise (budget spent again).")
    elif verdict.key == "different":
        out.say("Another key than before: these are new releases; the budget for these events "
                "is spent again.")
    elif verdict.key == "new":
        out.say("Replaying this log again with the same noise key into a fresh deployment with "
                "the same identity (app id, events and schedule topics) and settings reproduces "
                "these releases bit for bit; any other log under this key is refused.")
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

