"""The checks ``stream-dp replay`` makes before anything connects: options
(:func:`validate_args`, ``--until``) and the whole log's format.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from simulators.logfile import LogFormat, LogFormatError, detect_format, parse_ts, read_log


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
    if not (math.isfinite(args.broker_timeout) and 0 < args.broker_timeout <= 86_400):
        raise ValueError(f"--broker-timeout must be a number of seconds in (0, 86400], got "
                         f"{args.broker_timeout}")
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


def _check_log(log: Path, fmt: LogFormat, user_field: str | None = None) -> None:
    """Read the whole log once (``LogFormatError`` naming the first bad line): nothing is
    recorded in the history nor sent for a log that would stop half-way.

    ``user_field`` (a user-level deployment): every record must carry a valid identifier in
    that field; the records that do not are all counted and the error names the first one (a
    worker would dead-letter each ``invalid_user``)."""
    bad: list[str] = []
    total = 0
    for _record in read_log(log, fmt, user_field=user_field, on_bad_user=bad.append):
        total += 1
    if bad:
        raise LogFormatError(
            f"{len(bad)} of {len(bad) + total} records carry no valid person identifier in the "
            f"field {user_field!r} that the user-level deployment keys and bounds by (its worker "
            f"would dead-letter them invalid_user); the first: {bad[0]}. Give every record the "
            "identifier, or replay into an event-level deployment")
