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
sent it consults the replay history (:mod:`agents.commands.replay_history`), kept per key check value
(HMAC-SHA256 of a fixed label under the noise key; never the key, never printed) and per log
*content* (SHA-256 of the whole file, and the ``--retime`` shift), wherever the file lies and
whatever it is called, and per **deployment** (the cluster's id and the events topic): the same
key on the very same content reproduces the releases bit for bit at no new privacy budget; the
same key on any other content (edited, extended, a prefix, a renamed copy of another log) into a
deployment that already got one would publish the exact difference, so replay refuses (exit
status 3, ``"status": "log_differs"``); into another deployment (its own noise) it goes on;
another key is said to spend the budget again.

**Close markers.** After the events (and, in between, a progress marker before the first record
whose event time reaches the next multiple of ``--marker-every`` seconds: positions fixed by the
log, the same at any speed), replay writes a
close marker into every partition of the topic (:func:`agents.kafka.codec.close_marker`), authenticated
with a MAC under :func:`agents.kafka.codec.marker_key` of the noise key, bound to the topic and the
partition: on a deployment with ``schedule = "markers"`` they are its schedule — ticks close
exactly where the log says, however fast the replay runs; a clock-schedule deployment
dead-letters them (pass ``--no-close-markers``). The final marker is at ``--until``, required
whenever markers are written: the last released tick is public, fixed before the replay, never
the last event's tick (removing the last event must not change how many ticks are released).
A ``--until`` in the future is refused (a worker dead-letters a marker whose ticks' deadline +
``close_grace_s`` has not passed on its clock), and progress markers never run ahead of
``--until``.

Where the code lives (this module keeps the command itself):
the state file and replay history in :mod:`agents.commands._replay_state`, sending in
:mod:`agents.commands._replay_send`, the checks made before connecting in
:mod:`agents.commands._replay_checks`, the notes and the ``--json`` outcome in
:mod:`agents.commands._replay_messages`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hmac
import os
import signal
import sys
import uuid
from pathlib import Path

from agents.commands._progress import ProgressBar
from agents.commands._replay_checks import _check_log, validate_args
from agents.commands._replay_messages import (
    _KEY_NOTES,
    NO_KEY,
    _Out,
    _retime_argument,
    _shift_request,
    _shift_text,
)
from agents.commands._replay_send import (
    BrokerLost,
    _retime_offset,
    _shifted,
    end_offsets,
    find_unacknowledged,
    send_events,
)
from agents.commands._replay_state import (
    ReplayState,
    _describe,
    _imported,
    _now_iso,
    key_fingerprint,
    load_key_for_fingerprint,
    log_digest,
    state_path,
)
from agents.commands._replay_target import _deployment
from agents.commands.replay_history import ANY, Content, Deployment, ReplayHistory
from agents.kafka.clients import (
    add_bootstrap_argument,
    bootstrap_from,
    connection_problem,
    default_topic,
    is_kafka_error,
    security_problem,
)
from agents.kafka.codec import marker_key
from simulators.logfile import LogFormatError, LogRecord, detect_format, parse_ts, read_log

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
every --marker-every seconds of event time, at positions fixed by the log), signed with a key
derived from the noise key, so ticks close where the log says, whatever the speed, and the
worker can be started before or after the replay. The final marker closes every tick up to the
one containing --until TIME, which is required with markers: the end of the release is public
and fixed in advance, never the last event's time (removing the last event must not change how
many ticks are released). --until must not lie in the future: a worker refuses a final marker
whose ticks' deadline + close_grace_s has not passed on its clock. A clock-schedule deployment
(live) judges each event by its record's timestamp and dead-letters markers: use
--no-close-markers; an old log then arrives late, unless retimed (--retime now --speed 1).

People (user-level deployments): with settings saying privacy_unit = "user" (--config FILE or
$STREAM_DP_CONFIG, the file 'stream-dp simulate --people N --settings-out FILE' writes), each log
record must carry the person's identifier in the field user_field (JSON lines: that field; CSV: a
column of that name) and is keyed by it (its UTF-8 bytes), so Kafka's default partitioner puts
all of one person's records on the one partition the worker checks (else it dead-letters them
wrong_partition). Records without a valid identifier (missing, empty, not a string, over 256
bytes) are counted and refused before anything is sent. Event-level replays are unchanged.

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
--retime shift) replayed under it and the deployments it went to (the cluster's id, whatever
address reaches it, and the events topic): the same key on any other content (any changed byte,
records added or removed, a prefix, a renamed copy of another log, another --retime shift) into
the same deployment is refused with exit status 3, because the difference of the two releases
would reveal the changed events. Publish a changed log into another deployment (new app id and
topics: its own noise and budget) or under another key. The whole log is read and
checked before anything is sent.

If the broker goes away mid-run (nothing acknowledged for --broker-timeout seconds, default 30)
replay stops with one line and exit status 1; Ctrl-C stops it at once (a second Ctrl-C does not
even wait for outstanding acknowledgements), exit status 130. Either way what was acknowledged
is recorded in the state file: run the same command again to resume.

Exit status: 0 done (or nothing to do), 1 error (also: the broker went away), 2 bad usage, log
or key (no key, too open a key file, --until missing or in the future, a topic whose partitions
hold the final close marker
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
  stream-dp replay visits.jsonl --config stream-dp.toml --until 2024-01-02T00:00:00Z  # people
"""

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
        help="replay history: per noise key, every log content replayed under it and the "
        "deployments (cluster, events topic) it went to (default: "
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
        "--broker-timeout", type=float, default=30.0, metavar="SECONDS",
        help="give up (exit status 1, resumable) when the broker acknowledges nothing for this "
        "long while records are outstanding (default 30)",
    )
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
    parser.add_argument(
        "--config", type=Path, default=None, metavar="FILE",
        help="the deployment's settings TOML (default: $STREAM_DP_CONFIG; STREAM_DP_* variables "
             "apply as for the worker): with privacy_unit = \"user\" every record is keyed by "
             "the person's identifier, read from the field user_field of each log record, and a "
             "record without a valid one is refused before anything is sent. Without settings "
             "(no --config, no $STREAM_DP_CONFIG, no $STREAM_DP_PRIVACY_UNIT) replay is "
             "event-level",
    )


def _user_field(args: argparse.Namespace) -> str | None:
    """The event field that names the person when the deployment's settings (``--config``,
    ``$STREAM_DP_CONFIG`` and the ``STREAM_DP_*`` variables, as the worker reads them) say
    ``privacy_unit = "user"``; ``None`` for event level, or when no settings are given.
    ``ValueError`` (one line) for settings that do not load."""
    from agents.config.settings import Settings

    path = getattr(args, "config", None) or os.environ.get("STREAM_DP_CONFIG") or None
    if path is None and "STREAM_DP_PRIVACY_UNIT" not in os.environ:
        return None  # no deployment settings: event level, as before
    try:
        settings = Settings.load(path)
    except (ValueError, OSError) as exc:
        where = f"--config {path}" if getattr(args, "config", None) else (
            f"$STREAM_DP_CONFIG={path}" if path else "the STREAM_DP_* settings")
        raise ValueError(f"the deployment's settings ({where}) do not load: "
                         f"{' '.join(str(exc).split())}") from None
    return settings.user_field if settings.privacy_unit == "user" else None


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
    try:
        user_field = _user_field(args)
    except ValueError as exc:
        print(f"stream-dp replay: {exc}", file=sys.stderr)
        return out.finish("error", 2, error=str(exc))
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
        verdict = history.lookup(fingerprint, Content(digest, previous.time_offset),
                                 Deployment(ANY, previous.topic))
        out.result["key"] = verdict.key
        shift = previous.time_offset
        wanted = _retime_offset(log, fmt, args.retime) if args.retime is not None else 0.0
        if wanted != shift:
            # another shift ('--retime now' always asks for one): --restart would be refused
            out.say(f"{log}: already replayed completely ({previous.records_acked} records into "
                    f"{previous.topic}, {previous.updated}, {_shift_text(shift, 'unshifted')}). Nothing "
                    "sent: "
                    f"{_shift_request(args.retime, wanted)}, and this key replays this log "
                    f"only {_shift_text(shift, 'unshifted')} (another shift puts "
                    "other counts into the same ticks: refused, --restart too). A new shift "
                    "needs another key and a fresh deployment.")
        else:
            out.say(f"{log}: already replayed completely ({previous.records_acked} records into "
                    f"{previous.topic}, {previous.updated}). Nothing to do; --restart replays "
                    "it again.")
            if shift:
                out.say(f"Event times were shifted by {shift:+.3f} s (--retime): the same log "
                        "with the same shift reproduces these releases under this key.")
            elif not verdict.refused:
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
        if previous.user_field != user_field:
            def unit(field: str | None) -> str:
                return "event level" if field is None else f"keyed by the person's {field!r}"

            print(f"stream-dp replay: the interrupted replay recorded in {spath} was "
                  f"{unit(previous.user_field)}, these settings say {unit(user_field)}; resume "
                  "with the same settings, or --restart", file=sys.stderr)
            return out.finish("error", 2, error="interrupted replay had another privacy unit")
    try:
        _check_log(log, fmt, user_field)
    except LogFormatError as exc:
        print(f"stream-dp replay: {exc}; nothing was sent", file=sys.stderr)
        return out.finish("error", 2, error=str(exc), records=0)
    offset = previous.time_offset if resume and previous is not None \
        else _retime_offset(log, fmt, args.retime)
    # another log under this key into this deployment (in the history, or in an earlier
    # version's state file) is refused with exit 3 below: that refusal comes first
    deployment = await _deployment(bootstrap, topic, history, fingerprint,
                                   Content(digest, offset), previous)
    other_log = history.lookup(fingerprint, Content(digest, offset), deployment).refused or any(
        hmac.compare_digest(fp, fingerprint) and c != Content(digest, offset)
        for fp, c in _imported(previous))
    if mac_key is not None and not resume and not other_log:
        # a topic a final marker closed already: the worker would ignore this copy (issue #24)
        from agents.commands._replay_target import (
            earlier_final_marker,
            refusal,
            unverified_note,
        )

        first = next(iter(read_log(log, fmt)), None)
        earlier = await earlier_final_marker(bootstrap, topic, mac_key)
        why = None if earlier is None or first is None else refusal(
            earlier, topic, first.event.ts + offset)
        note = None if earlier is None or first is None else unverified_note(
            earlier, topic, first.event.ts + offset)
        if note is not None:  # a marker this key does not verify decides nothing (rule 7)
            print(f"stream-dp replay: {note}", file=sys.stderr)
        if why is not None:
            print(f"stream-dp replay: {why}", file=sys.stderr)
            return out.finish("error", 2, error="topic closed by an earlier replay")
    content = Content(digest, offset)
    where = str(log.resolve())
    verdict = history.check_and_record(
        fingerprint, content, log=where,
        target={"bootstrap": bootstrap, "topic": topic}, deployment=deployment,
        imported=_imported(previous))
    if verdict.key == "new" and previous is not None and previous.key_fingerprint \
            and not hmac.compare_digest(previous.key_fingerprint, fingerprint):
        # a first content under this key, but this path was replayed under another key: most
        # of these events were published before (say so; the content check is the guard)
        verdict = dataclasses.replace(verdict, key="different")
    out.result["key"] = verdict.key
    if verdict.refused and verdict.previous is not None \
            and verdict.previous.get("log_sha256") == digest:
        # the very file under another --retime shift: two equal hash prefixes explain nothing
        before = float(verdict.previous.get("time_offset", 0.0))
        again = _retime_argument(log, fmt, before)
        print(f"stream-dp replay: REFUSED: this noise key already replayed this very log "
              f"{_shift_text(before, 'unshifted')} (recorded in {history.path}); this run "
              f"{_shift_text(offset, 'unshifted')} would put other counts into the same ticks "
              "and publish the exact difference. Replay it "
              + (f"with the earlier shift ({again}) " if again else "as before ")
              + "or use another key (fresh noise, new budget).", file=sys.stderr)
        return out.finish("log_differs", EXIT_LOG_DIFFERS, budget="refused")
    if verdict.refused:
        assert verdict.previous is not None
        print(f"stream-dp replay: REFUSED: this noise key already replayed another log "
              f"into this deployment (events topic {topic} on this cluster) "
              f"({_describe(verdict.previous)}; recorded in {history.path}); {log} "
              f"(SHA-256 {digest[:16]}…" + (f", retimed {offset:+.3f} s" if offset else "")
              + ") differs from it, whatever the file names. Releasing it with the same key "
              "would publish the exact difference. Replay the very same log, or into another "
              "deployment (new app_id and topics: its own noise), or use another key (fresh "
              "noise, new budget).", file=sys.stderr)
        return out.finish("log_differs", EXIT_LOG_DIFFERS, budget="refused")
    budget = {"same": "no_new_budget", "different": "spent_again", "new": "spent"}[verdict.key]
    if verdict.key == "same" and not verdict.here:
        # the same content went under this key only into other deployments: this one draws
        # its own noise (its identity and nonce key it), so these releases are new
        budget = "spent_again"
    out.result["budget"] = budget
    elsewhere = budget == "spent_again" and verdict.key == "same"
    if verdict.key == "same" and offset and not elsewhere:
        out.say(f"same noise key, same log and same --retime shift ({offset:+.3f} s) as an "
                "earlier replay: a fresh deployment with the same identity and settings "
                "reproduces that replay's releases bit for bit and spends no new privacy budget.")
    else:
        out.say(_KEY_NOTES["same_elsewhere" if elsewhere else verdict.key])
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
            started=_now_iso(), time_offset=offset, user_field=user_field,
        )
        if state.time_offset and verdict.key != "same":
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

    def on_signal() -> None:
        if stop.is_set():  # a second Ctrl-C: do not wait for the acknowledgements
            bar.close()
            print(f"stream-dp replay: interrupted; progress up to record {state.records_acked} "
                  f"is recorded in {spath}: run the same command again to resume",
                  file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    records = read_log(log, fmt, start_offset=state.byte_offset, start_number=state.records_acked,
                       user_field=user_field)
    if state.time_offset:
        records = _shifted(records, state.time_offset)
    try:
        report = await send_events(
            records, bootstrap=bootstrap, topic=topic, speed=speed, run_id=state.run_id,
            skip=skip, chunk=args.chunk, on_checkpoint=checkpoint, on_progress=progress,
            stop=stop, markers=markers, final_marker=final_marker, mac_key=mac_key,
            marker_every=args.marker_every, ack_timeout=args.broker_timeout,
        )
    except BrokerLost as exc:
        bar.close()
        print(f"stream-dp replay: {exc} (progress: record {state.records_acked}, in {spath})",
              file=sys.stderr)
        return out.finish("error", 1, error=str(exc), records=state.records_acked)
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
                        target={"bootstrap": bootstrap, "topic": topic}, deployment=deployment)
            print(f"stream-dp replay: WARNING: {log} changed while it was being replayed (SHA-256 "
                  f"{digest[:16]}… before, {after[:16]}… after): both are recorded in "
                  f"{history.path} under this key for this deployment, which now refuses every "
                  "further replay into it. Never "
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
    if user_field is not None:
        out.say(f"user level: every record keyed by its person's identifier (field "
                f"{user_field!r}), so each person's records are on one partition.")
    if markers:
        out.say(f"close markers written: the final one closes every tick up to the one "
                f"containing {args.until} (a deployment with schedule = \"markers\" releases "
                "every tick up to it).")
        if state.max_ts is not None and until is not None and state.max_ts > until:
            # the final marker closes the whole tick containing --until: its later events are
            # released with it; only ticks after that one stay open
            out.say(f"note: events after --until {args.until} were sent too: those in the "
                    "tick containing it are released with that tick; those in later ticks "
                    "stay open (not released) until a later final marker closes them.")
    if state.time_offset:
        out.say(f"Event times were shifted by {state.time_offset:+.3f} s (--retime): only the "
                "same log with the same shift reproduces these releases under this key; another "
                "shift ('now' always gives another) is refused as another log.")
    elif verdict.key == "same" and not verdict.here:
        out.say("Same log, same key, another deployment: these are new releases; the budget "
                "for these events is spent again.")
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

