"""``stream-dp marginals``: α-way marginals of a binary-attribute event log, pure ε-DP overall."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from array import array
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

HELP = "DP decayed α-way marginals of binary-attribute events (chosen from noisy dependence)"

DESCRIPTION = """\
Read a log of events with M yes/no attributes, release the decayed counts (decay --decay per
tick) of a few marginal tables at every tick under pure ε-DP, and answer α-way queries (α ≤ 8)
at the last tick from those tables.

How: ε is split explicitly. A bootstrap (--bootstrap-fraction of ε, default 0.2) measures once,
over the whole log, noisy counts from which every pair's 2×2 table follows: the number of events,
each attribute's 1s and each pair's co-occurrences, an event with k > K ones counted with weights
K/k and C(K,2)/C(k,2), so one event moves them by at most 1 + K + C(K,2) in L1 (or the C(M,2)
pair tables themselves, sensitivity C(M,2), when that is smaller). K (--max-ones, default auto)
covers 90% of the events, read from a noisy histogram of ones per event (5% of the bootstrap
budget, sensitivity 1). From it
alone (post-processing) a Chow–Liu spanning forest over the attributes is cut into clusters of at
most --max-cluster attributes (one joint table each) joined by bridge tables: a bridge's two
attributes plus the attributes of their clusters most dependent on them, up to --bridge-size
(auto: as many as the bootstrap's noisy total supports). The rest of ε is split equally over
those K tables; every cell of every table is a decayed DP counter (stream_dp.counters.CounterBank,
--strategy, default auto). One event touches one cell of every table, so the costs add:
ε₀ + K·ε_t ≤ ε, checked in exact rational arithmetic (the exact total is printed on stderr
and written with --report). At the last tick the tables are made consistent (GLS) and every
query is answered by the junction-tree (maximum-entropy) estimator.

Bursts: every cell's count in one tick is clipped to --max-events-per-tick N (default auto: the
largest count the counters' strategy holds exactly, a public function of ε, --decay and
--last-tick), so no burst can stop the run; with a number N, auto picks a strategy whose numeric
range covers N (exit 2 if a named --strategy does not). Clipping never raises what one event
can change (one cell per table, by at most 1).

Input:
  EVENTS.jsonl   one event a line: {"ts": <unix seconds>, "attrs": "<M characters 0/1>"};
                 character i = attribute i. Tick n covers [O + (n-1)S, O + nS); every tick from
                 1 to --last-tick T is released (an event after tick T is an error). Numbers
                 are read exactly, with at most 400 digits around the decimal point.
  QUERIES.json   a list of queries, each a list of distinct 0-based attribute indices (1..8).
Output:
  ANSWERS.json   {"tick": T, "answers": [[c_0, ..., c_{2^α-1}], ...]}: decayed counts
                 of each query's cells at the last tick; cell index = bits of the queried
                 attributes in query order, first attribute most significant.

Released ticks: 1 .. --last-tick T, required: a public end fixed in advance, so how many ticks
are released never depends on the data (taking the last event's tick would let removing the very
last event change the "tick" field and the counters' epoch length).

The noise key is read from --key-file (hex or raw, ≥ 32 bytes after decoding, mode 0600: a key
file readable by group or others is refused); without it a fresh random key is used (said on
stderr) and the run cannot be reproduced. The noise also depends on the log's
digest, so the same key never reuses noise for a different log. Progress goes to stderr; it
names public figures only (the released ticks 1..--last-tick, never the number of events,
the last event's tick or the time taken, which grows with the events: terminal logs get
shared) unless --verbose is given. A numeric
--max-events-per-tick is part of what keys the noise (other bounds, other noise).
Exit status 2 with a one-line message for invalid input.

One person as the unit (--privacy-unit user; docs/privacy.md, "User-level privacy (preview)"):
every event line names its person in --user-field (default "user": a string of 1 to 256 UTF-8
bytes; a line without one is invalid input, exit 2). In file order, after every other check, a
person's first --user-max-events K events of each period of --user-period-ticks T ticks count
(optionally at most --user-max-streams L distinct cells — an event's cell is its attribute
vector —, --user-max-events-per-stream k per cell, --user-min-separation-ticks b ticks apart:
the service's settings of the same names); the rest are dropped before any noise. One event
spends the exact ε printed, over every table, so one person's events of one period spend at
most K times it (an upper bound), printed on the last line "per person per period". The bounds
are part of what keys the noise.

examples:
  stream-dp simulate attributes --attributes 32 --ticks 300 --out events.jsonl
  echo '[[0, 1, 2], [3, 7, 9, 12, 30]]' > queries.json
  stream-dp marginals --events events.jsonl --attributes 32 --epsilon 1 --decay 0.99 \\
      --tick-seconds 60 --origin 1704067200 --last-tick 300 --queries queries.json \\
      --out answers.json
  (umask 077; openssl rand -hex 32 > key.hex)
  stream-dp marginals --events events.jsonl --attributes 32 --epsilon 1 --decay 0.99 \\
      --tick-seconds 60 --origin 1704067200 --last-tick 300 --queries queries.json \\
      --out answers.json --key-file key.hex --report report.json
  # one person as the unit: each line {"ts": ..., "attrs": "...", "user": "<id>"}; at most
  # 10 events per person per day of 60 s ticks
  stream-dp marginals --events events.jsonl --attributes 32 --epsilon 0.1 --decay 0.99 \\
      --tick-seconds 60 --origin 1704067200 --last-tick 300 --queries queries.json \\
      --out answers.json --privacy-unit user --user-max-events 10 --user-period-ticks 1440
"""

#: Largest number of ticks one run may release (guards against a far-future timestamp).
DEFAULT_MAX_TICKS = 10_000_000
MAX_ALPHA = 8


class InputError(ValueError):
    """Invalid input: reported as one line, exit status 2."""


Number = int | float | Decimal


def _number(text: str, option: str) -> int | Decimal:
    """A command-line number exactly as written (``int`` or ``Decimal``); ``InputError`` else."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise InputError(f"{option} must be a number, got {text!r}") from None
    if not value.is_finite():
        raise InputError(f"{option} must be a finite number, got {text!r}")
    if not _plausible(value):
        raise InputError(f"{option} must be a number of at most {MAX_EXPONENT} digits around the "
                         f"decimal point, got {text!r}")
    return value


#: Largest decimal exponent (either side) of a number read exactly: ``1E+999999999`` is a few
#: bytes of JSON, but its exact value is a billion-digit integer (minutes of CPU, a hang).
MAX_EXPONENT = 400


def _plausible(value: Decimal) -> bool:
    """Whether ``value`` can be turned into an exact fraction quickly (module limits)."""
    exponent = value.as_tuple().exponent
    return isinstance(exponent, int) and abs(exponent) <= MAX_EXPONENT \
        and abs(value.adjusted()) <= MAX_EXPONENT


def _typed(text: str, option: str, kind: type[int] | type[float]) -> Any:
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise InputError(f"{option} must be {what}, got {text!r}") from None
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``stream-dp marginals``."""
    parser.add_argument("--events", required=True, metavar="EVENTS.jsonl", help="event log")
    parser.add_argument("--attributes", required=True, metavar="M", help="M in 1..64")
    parser.add_argument(
        "--epsilon",
        required=True,
        metavar="E",
        help="ε per event for the whole run (pure DP), > 0",
    )
    parser.add_argument("--decay", required=True, metavar="P", help="decay per tick, in (0, 1]")
    parser.add_argument(
        "--tick-seconds",
        required=True,
        metavar="S",
        help="tick length in seconds, > 0",
    )
    parser.add_argument(
        "--origin", required=True, metavar="O", help="start of tick 1 (unix seconds)"
    )
    parser.add_argument("--queries", required=True, metavar="QUERIES.json", help="queries")
    parser.add_argument("--out", required=True, metavar="ANSWERS.json", help="answers file")
    parser.add_argument(
        "--key-file", metavar="KEY",
        help="noise key file: hex or raw, >= 32 bytes after decoding, not readable by group or "
        "others (chmod 600) (default: a fresh random key; the run cannot be reproduced)",
    )
    parser.add_argument(
        "--bootstrap-fraction",
        default="0.2",
        metavar="F",
        help="share of ε for the bootstrap measurement, in (0, 1) (default 0.2)",
    )
    parser.add_argument(
        "--max-cluster",
        default="4",
        metavar="G",
        help="largest number of attributes in one joint table, 1..8 (default 4)",
    )
    parser.add_argument(
        "--bridge-size",
        default="auto",
        metavar="B",
        help="attributes of a bridge table, 2..--max-cluster, or auto (default): as many as keep "
        "8× more decayed events per cell than noise, from the bootstrap's noisy total",
    )
    parser.add_argument(
        "--max-ones",
        default="auto",
        metavar="K",
        help="bootstrap: ones of an event counted at full weight, ≥ 2, or auto (default: from a "
        "noisy histogram of ones per event, 5%% of the bootstrap budget)",
    )
    parser.add_argument(
        "--strategy",
        default="auto",
        help="decayed-counter strategy (default auto, see 'stream-dp plan')",
    )
    parser.add_argument(
        "--last-tick",
        required=True,
        metavar="T",
        help="release ticks 1..T (required): a public end fixed in advance, so the number of "
        "released ticks never depends on the data; an event after tick T is an error",
    )
    parser.add_argument(
        "--max-ticks",
        default=str(DEFAULT_MAX_TICKS),
        help=f"refuse logs spanning more ticks (default {DEFAULT_MAX_TICKS})",
    )
    parser.add_argument(
        "--max-events-per-tick",
        default="auto",
        metavar="N",
        help="public bound on one table cell's events in one tick: larger counts are clipped "
        "to it, and auto picks a strategy whose numeric range covers it (default auto: the "
        "range of the strategy picked without a bound)",
    )
    parser.add_argument(
        "--report",
        metavar="FILE",
        help="also write structure, budget split (exact total included) and standard errors "
        "(JSON)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print raw figures of the log on stderr (its number of events and lines, "
        "the last event's tick; at user level the events over their person's bounds): not "
        "private, keep such output to yourself",
    )
    from stream_dp.commands.marginals_user import add_arguments as add_user_arguments

    add_user_arguments(parser)


def _exact(x: Number) -> Fraction | int:
    return x if isinstance(x, int) else Fraction(x)


def tick_of(ts: Number, origin: Number, tick_seconds: Number) -> int:
    """Tick n with ``O + (n−1)S ≤ ts < O + nS``, computed exactly in the decimal values as
    written (JSON and command-line numbers are read as ``int``/``Decimal``, never rounded to
    binary floats: ts 0.3 with O = 0.1, S = 0.2 lies at the start of tick 2)."""
    if isinstance(ts, int) and isinstance(origin, int) and isinstance(tick_seconds, int):
        return (ts - origin) // tick_seconds + 1
    return math.floor((_exact(ts) - _exact(origin)) / _exact(tick_seconds)) + 1


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not a number")


def read_events(
    path: str,
    m: int,
    origin: Number,
    tick_seconds: Number,
    max_ticks: int,
    progress: Callable[[str], None] | None = None,
    person: _Person | None = None,
) -> tuple[NDArray[np.uint8], NDArray[np.int64], str]:
    """``(bits, ticks, sha256 hex of the file)``; ``InputError`` naming the line on bad input.
    ``progress`` is told every 10^6 lines. With ``person`` (``--privacy-unit user``) only the
    events its bounder counts, in file order, after every other check of the line."""
    hasher = hashlib.sha256()
    rows = bytearray()
    ticks = array("q")
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below; lines streamed, bounded memory
    except OSError as exc:
        raise InputError(f"--events: cannot read {path!r}: {exc.strerror}") from None
    with fh:
        for lineno, line in enumerate(fh, start=1):
            hasher.update(line)
            _parse_line(line, lineno, path, m, origin, tick_seconds, max_ticks, rows, ticks,
                        person)
            if progress is not None and lineno % 1_000_000 == 0:
                progress(f"read {lineno} lines")
    # an empty log is released like any other (the ticks to release are public): refusing it
    # made the exit status tell an empty log from a log of one event
    bits = (np.frombuffer(bytes(rows), dtype=np.uint8) - np.uint8(48)).reshape(len(ticks), m)
    return bits, np.frombuffer(ticks, dtype=np.int64).copy(), hasher.hexdigest()


def _parse_line(
    line: bytes,
    lineno: int,
    path: str,
    m: int,
    origin: Number,
    tick_seconds: Number,
    max_ticks: int,
    rows: bytearray,
    ticks: array[int],
    person: _Person | None = None,
) -> None:
    """Validate one line and append its event (blank lines are skipped); with ``person``, only
    when the person's bound counts it (decided last: a bad line is an error, never a count)."""
    if not line.strip():
        return
    try:
        ev = json.loads(line, parse_float=Decimal, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}:{lineno}: not valid JSON ({exc})") from None
    if not isinstance(ev, dict) or "ts" not in ev or "attrs" not in ev:
        raise InputError(f'{path}:{lineno}: an event must be an object with "ts" and "attrs"')
    ts, attrs = ev["ts"], ev["attrs"]
    if isinstance(ts, bool) or not isinstance(ts, (int, Decimal)):
        raise InputError(f"{path}:{lineno}: ts must be a finite number (unix seconds)")
    if isinstance(ts, Decimal) and not _plausible(ts):
        raise InputError(f"{path}:{lineno}: ts must be unix seconds written with at most "
                         f"{MAX_EXPONENT} digits around the decimal point")
    if not isinstance(attrs, str):
        raise InputError(f"{path}:{lineno}: attrs must be a string of {m} characters 0/1")
    if len(attrs) != m:
        raise InputError(f"{path}:{lineno}: attrs has {len(attrs)} characters, --attributes is {m}")
    if attrs.strip("01"):
        bad = next(c for c in attrs if c not in "01")
        raise InputError(f"{path}:{lineno}: attrs may contain only 0 and 1, found {bad!r}")
    t = tick_of(ts, origin, tick_seconds)
    if t < 1:
        raise InputError(f"{path}:{lineno}: ts {ts} is before the origin {origin}")
    if t > max_ticks:
        raise InputError(
            f"{path}:{lineno}: ts {ts} lies after tick {max_ticks} "
            "(the --last-tick given, else --max-ticks)"
        )
    if person is not None:
        from stream_dp.commands.marginals_user import identifier

        try:
            who = identifier(ev, person.field)
        except ValueError as exc:
            raise InputError(f"{path}:{lineno}: {exc}") from None
        # the bound's "stream" is the event's attribute vector (one cell of the full table,
        # as the pattern the service bounds by), here its bits as an integer
        if not person.bounder.admit(who, t, int(attrs, 2)):
            person.dropped += 1
            return
    rows += attrs.encode("ascii")
    ticks.append(t)


class _Person:
    """``--privacy-unit user``: the identifier's field, the bounder (keyed by the identifier's
    bytes: nothing outlives the run), and how many events it dropped (a raw figure)."""

    def __init__(self, field: str, bounds: Any) -> None:
        from stream_dp.user_level import Bounder

        self.field = field
        self.bounder = Bounder(bounds)
        self.dropped = 0


def read_queries(path: str, m: int) -> list[tuple[int, ...]]:
    """The queries, validated (``InputError`` naming the query)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"--queries: cannot read {path!r}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"--queries: {path!r} is not valid JSON ({exc})") from None
    if not isinstance(doc, list):
        raise InputError("--queries: the file must hold a JSON list of queries")
    out: list[tuple[int, ...]] = []
    for k, q in enumerate(doc):
        if not isinstance(q, list):
            raise InputError(f"--queries: query {k} must be a list of attribute indices")
        if not 1 <= len(q) <= MAX_ALPHA:
            raise InputError(
                f"--queries: query {k} has {len(q)} attributes; allowed 1..{MAX_ALPHA}"
            )
        for a in q:
            if isinstance(a, bool) or not isinstance(a, int):
                raise InputError(f"--queries: query {k}: index {a!r} is not an integer")
            if not 0 <= a < m:
                raise InputError(f"--queries: query {k}: index {a} out of range 0..{m - 1}")
        if len(set(q)) != len(q):
            raise InputError(f"--queries: query {k} repeats an attribute: {q}")
        out.append(tuple(q))
    return out


def _check_args(args: argparse.Namespace) -> None:
    """Convert and validate the options in place (``InputError`` with one line)."""
    for name, kind in (
        ("attributes", int),
        ("epsilon", float),
        ("decay", float),
        ("bootstrap_fraction", float),
        ("max_cluster", int),
        ("max_ticks", int),
    ):
        value = getattr(args, name)
        if isinstance(value, str):
            setattr(args, name, _typed(value, "--" + name.replace("_", "-"), kind))
    if isinstance(args.last_tick, str):
        args.last_tick = _typed(args.last_tick, "--last-tick", int)
        if args.last_tick < 1:
            raise InputError(f"--last-tick must be ≥ 1, got {args.last_tick}")
    if args.bridge_size == "auto":
        args.bridge_size = None
    elif isinstance(args.bridge_size, str):
        args.bridge_size = _typed(args.bridge_size, "--bridge-size", int)
    if args.bridge_size is not None and not 2 <= args.bridge_size <= MAX_ALPHA:
        raise InputError(f"--bridge-size must be auto or in 2..{MAX_ALPHA}, got {args.bridge_size}")
    for name in ("tick_seconds", "origin"):
        value = getattr(args, name)
        if isinstance(value, str):
            setattr(args, name, _number(value, "--" + name.replace("_", "-")))
    if not 1 <= args.attributes <= 64:
        raise InputError(f"--attributes must be in 1..64, got {args.attributes}")
    if not (math.isfinite(args.epsilon) and args.epsilon > 0):
        raise InputError(f"--epsilon must be a finite number > 0, got {args.epsilon}")
    if not (math.isfinite(args.decay) and 0 < args.decay <= 1):
        raise InputError(f"--decay must be in (0, 1], got {args.decay}")
    if not args.tick_seconds > 0:
        raise InputError(f"--tick-seconds must be a number > 0, got {args.tick_seconds}")
    if not 0 < args.bootstrap_fraction < 1:
        raise InputError(f"--bootstrap-fraction must be in (0, 1), got {args.bootstrap_fraction}")
    if not 1 <= args.max_cluster <= MAX_ALPHA:
        raise InputError(f"--max-cluster must be in 1..{MAX_ALPHA}, got {args.max_cluster}")
    if args.max_ones == "auto":
        args.max_ones = None
    elif isinstance(args.max_ones, str):
        args.max_ones = _typed(args.max_ones, "--max-ones", int)
    if args.max_ones is not None and args.max_ones < 2:
        raise InputError(f"--max-ones must be auto or ≥ 2, got {args.max_ones}")
    if not 1 <= args.max_ticks <= 1 << 40:
        raise InputError(f"--max-ticks must be in 1..2**40, got {args.max_ticks}")
    if args.max_events_per_tick == "auto":
        args.max_events_per_tick = None
    elif isinstance(args.max_events_per_tick, str):
        args.max_events_per_tick = _typed(args.max_events_per_tick, "--max-events-per-tick", int)
    if args.max_events_per_tick is not None and not 1 <= args.max_events_per_tick <= 1 << 50:
        raise InputError(
            f"--max-events-per-tick must be auto or in 1..2**50, got {args.max_events_per_tick}")


def _key(args: argparse.Namespace) -> bytes:
    if args.key_file is None:
        print(
            "stream-dp marginals: no --key-file: using a fresh random noise key "
            "(this run cannot be reproduced)",
            file=sys.stderr,
        )
        return os.urandom(32)
    from stream_dp.noise.keys import load_key

    try:
        return load_key(args.key_file)
    except ValueError as exc:
        raise InputError(f"--key-file: {exc}") from None


def compute(args: argparse.Namespace) -> dict[str, Any]:
    """Validate, run, and return the answers document (and the report under ``"_report"``)."""
    from stream_dp.attributes.release import run_offline

    _check_args(args)
    from stream_dp.commands.marginals_user import bounds_from_args

    try:
        bounds = bounds_from_args(args)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    person = None if bounds is None else _Person(args.user_field, bounds)
    m = int(args.attributes)
    queries = read_queries(args.queries, m)
    key = _key(args)
    started = time.monotonic()

    verbose = bool(getattr(args, "verbose", False))

    def say(msg: str) -> None:
        # the elapsed time grows with the log's number of events (reading it, measuring the
        # bootstrap, the cells of every tick): a raw figure, printed only with --verbose
        stamp = f"[{time.monotonic() - started:6.1f} s] " if verbose else ""
        print(f"stream-dp marginals: {stamp}{msg}", file=sys.stderr)

    limit = args.max_ticks if args.last_tick is None else args.last_tick
    bits, ticks, digest = read_events(
        args.events, m, args.origin, args.tick_seconds, limit, progress=say if verbose else None,
        person=person,
    )
    if verbose:  # raw statistics of the log: only when asked for
        say(f"{bits.shape[0]} events, the last in tick {int(ticks.max()) if ticks.size else '-'}")
        if person is not None:
            say(f"{person.dropped} events over their person's bounds dropped")
    say(f"releasing ticks 1..{args.last_tick}")
    description = (
        f"marginals/v1/m={m}/epsilon={float(args.epsilon)!r}/p={float(args.decay)!r}"
        f"/tick={args.tick_seconds}/origin={args.origin}"
        f"/bootstrap={float(args.bootstrap_fraction)!r}/max_cluster={args.max_cluster}"
        f"/max_ones={args.max_ones or 'auto'}/bridge_size={args.bridge_size or 'auto'}"
        f"/strategy={args.strategy}/log=sha256:{digest}"
    )
    bound = getattr(args, "max_events_per_tick", None)
    if bound is not None:
        # another clip bound, other noise: two runs that differ only in their clipping must
        # not share noise (the difference of their releases would be exact); the default
        # keeps the description, and so the noise, of earlier versions
        description += f"/max_events_per_tick={bound}"
    if bounds is not None:
        # the same: other bounds, other noise (event level keeps its description)
        from stream_dp.commands.marginals_user import description as user_description

        description += user_description(args, bounds)
    try:
        result = run_offline(
            bits,
            ticks,
            epsilon=float(args.epsilon),
            p=float(args.decay),
            key=key,
            description=description,
            bootstrap_fraction=float(args.bootstrap_fraction),
            max_cluster=int(args.max_cluster),
            max_ones=args.max_ones,
            bridge_size=args.bridge_size,
            last_tick=args.last_tick,
            strategy=args.strategy,
            progress=say,
            max_cell_count=bound,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None
    model = result.model
    answers = [[float(c) for c in model.answer(q)] for q in queries]
    report = {
        "tick": result.tick,
        "tables": [list(t) for t in result.structure.tables],
        "clusters": [list(c) for c in result.structure.clusters],
        "bridges": [list(b) for b in result.structure.bridges],
        "bridge_tables": [list(b) for b in result.structure.bridge_tables or ()],
        "budget": {
            "epsilon": result.split.epsilon,
            "bootstrap": result.split.bootstrap,
            "bootstrap_sensitivity": result.split.bootstrap_sensitivity,
            "bootstrap_method": result.split.bootstrap_method,
            "per_table": result.split.per_table,
            "n_tables": result.split.n_tables,
            "spent": result.split.spent,
            "spent_exact": result.split.spent_text,
        },
        "cell_clip_events_per_tick": (result.release.clip if math.isfinite(result.release.clip)
                                      else None),
        "strategy": result.release.bank.mechanism.name,
        "cell_stderr": math.sqrt(result.release.cell_variance()),
        "estimated_total": model.total,
        "query_stderr_bound": [model.stderr(q) for q in queries],
    }
    if bounds is not None:
        from stream_dp.commands.marginals_user import person_report

        report["privacy"] = person_report(bounds, result.split.spent_exact, int(result.tick))
    return {"tick": result.tick, "answers": answers, "_report": report}


def run(args: argparse.Namespace) -> int:
    """Run the command; exit status 0, or 2 with one line on stderr for invalid input."""
    try:
        doc = compute(args)
    except InputError as exc:
        print(f"stream-dp marginals: error: {exc}", file=sys.stderr)
        return 2
    report = doc.pop("_report")
    try:
        Path(args.out).write_text(json.dumps(doc) + "\n", encoding="utf-8")
        if args.report:
            Path(args.report).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"stream-dp marginals: error: cannot write output: {exc.strerror}", file=sys.stderr)
        return 2
    b = report["budget"]
    line = (f"stream-dp marginals: tick {doc['tick']}: {len(doc['answers'])} answers written to "
            f"{args.out}; {b['n_tables']} tables, ε spent {b['spent_exact']} (exact) of "
            f"{b['epsilon']!r}")
    if "privacy" in report:
        from stream_dp.commands.marginals_user import guarantee

        line += f" per event; {guarantee(report['privacy'])}"
    print(line, file=sys.stderr)
    return 0
