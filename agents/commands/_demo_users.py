"""``stream-dp demo --privacy-unit user``: the same traffic, with people, at user level next to
event level (issue #34).

The demo then runs a second deployment (its own app id, topics, worker and key use) on the
same broker: ``privacy_unit = "user"``, each person's first K events per period counted, and
the per-event budget ε / K, so that one person's whole bounded contribution to a stream costs
what one event costs at event level (pure DP at b = 0: a stream's factor is exactly K, docs/
budget.md "Per person"). The terminal shows each stream's user-level release ± its standard
error beside the event-level one, and how many events the bound dropped so far: that figure is
the operator-only counter ``stream_dp_user_bounded_events_total`` of the user-level worker, read
from its own ``/metrics`` on 127.0.0.1 (``metrics_event_counts = 1`` in that worker's settings
only; the demo's terminal is the operator's console, never a published surface).
"""

from __future__ import annotations

import argparse
import re
import urllib.request
from typing import Any

__all__ = ["DEFAULTS", "add_arguments", "bounded_events", "dropped_line", "marginals_block",
           "user_columns", "user_settings", "validate"]

#: the demo's people and bounds when not given: a heavy tail over 1 000 people, at most 10
#: counted events per person per minute of 1 s ticks
DEFAULTS = {"people": 1000, "user_max_events": 10, "user_period_ticks": 60}
APP_ID = "stream-dp-demo-user"
_METRIC = re.compile(r"^stream_dp_user_bounded_events_total\s+([0-9.e+]+)\s*$", re.M)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--privacy-unit", choices=("event", "user"), default="event",
        help="user: feed the traffic with people (heavy-tailed events per person) to a second, "
             "user-level deployment too, and show its releases ± stderr next to the "
             "event-level ones with the events its bound dropped (default event: the demo as "
             "before)")
    parser.add_argument(
        "--people", type=int, metavar="N",
        help=f"--privacy-unit user: people behind the events (default {DEFAULTS['people']})")
    parser.add_argument(
        "--user-max-events", type=int, metavar="K",
        help=f"--privacy-unit user: events of one person counted per period (default "
             f"{DEFAULTS['user_max_events']}); the user-level ε per event is --epsilon / K")
    parser.add_argument(
        "--user-period-ticks", type=int, metavar="T",
        help=f"--privacy-unit user: ticks per bounding period (default "
             f"{DEFAULTS['user_period_ticks']})")


def validate(args: argparse.Namespace) -> None:
    """The user-level options (one-line ``ValueError``); fills in their defaults."""
    given = [f"--{name.replace('_', '-')}" for name in DEFAULTS
             if getattr(args, name, None) is not None]
    if getattr(args, "privacy_unit", "event") != "user":
        if given:
            raise ValueError(f"{given[0]} needs --privacy-unit user")
        return
    if args.offline:
        raise ValueError("--privacy-unit user needs the live demo (not --offline: the "
                         "library-only simulation has no people)")
    for name, default in DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, default)
    from simulators.people import MAX_PEOPLE

    if not 1 <= args.people <= MAX_PEOPLE:
        raise ValueError(f"--people must be an integer in [1, {MAX_PEOPLE}], got {args.people}")
    if not 1 <= args.user_max_events <= 65_535:
        raise ValueError(f"--user-max-events must be an integer in [1, 65535], got "
                         f"{args.user_max_events}")
    if not 1 <= args.user_period_ticks <= 2**32 - 1:
        raise ValueError(f"--user-period-ticks must be an integer in [1, {2**32 - 1}], got "
                         f"{args.user_period_ticks}")


def user_settings(event_level: dict[str, Any], args: argparse.Namespace,
                  web_port: int) -> dict[str, Any]:
    """The user-level deployment's settings: the event-level demo's, on its own app id and
    topics, with the person as unit and ε / K per event."""
    out = dict(event_level)
    out |= {
        "app_id": APP_ID,
        "worker_id": "demo-worker-user",
        "events_topic": f"{APP_ID}.events",
        "counts_topic": f"{APP_ID}.counts",
        "histograms_topic": f"{APP_ID}.histograms",
        "dlq_topic": f"{APP_ID}.dlq",
        "web_port": web_port,
        "epsilon": float(args.epsilon) / args.user_max_events,
        "privacy_unit": "user",
        "user_field": "user",
        "user_period_ticks": int(args.user_period_ticks),
        "user_max_events": int(args.user_max_events),
        # the operator's view in the demo's terminal: the bound's drops (never published)
        "metrics_event_counts": 1,
    }
    return out


def bounded_events(web_port: int, timeout: float = 2.0) -> int | None:
    """``stream_dp_user_bounded_events_total`` of the user-level worker (its /metrics on
    127.0.0.1), or None while it cannot be read."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/metrics",
                                    timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    found = _METRIC.search(text)
    return int(float(found.group(1))) if found else None


def user_columns(row: dict[str, tuple[float, float]] | None, stream: str) -> str:
    """The user-level columns of one table row: released ± stderr, or … while pending."""
    if row is None or stream not in row:
        return f"   {'…':>10} {'':>9}"
    value, stderr = row[stream]
    return f"   {value:10.1f} {'±':>2}{stderr:7.1f}"


def header_line(per_person: dict[str, Any] | None, args: argparse.Namespace) -> str:
    """The user-level half of the header: what a release record's ``privacy`` block says per
    person (the worker's own accounting), with the bounds."""
    bound = f"K = {args.user_max_events} per person per {args.user_period_ticks} ticks"
    if not per_person:
        return f"user level: {bound}"
    return (f"user level: ε = {per_person['stream']:g} per person per stream per period, "
            f"{per_person['total']:g} in total ({bound}, {args.people} people)")


def dropped_line(dropped: int | None) -> str:
    """The operator's line under the user-level figures: the events the bound dropped so far."""
    return ("user level: the bound dropped "
            + ("… (waiting for the worker's /metrics)" if dropped is None else
               f"{dropped:,} events so far")
            + " (operator view: stream_dp_user_bounded_events_total)")


def marginals_block(msg: dict[str, Any] | None, args: argparse.Namespace,
                    dropped: int | None) -> str:
    """``--scenario attributes``: the user-level deployment's latest consistent marginals
    (``dp.marginals.v1``, its per-person guarantee on the first line), or a pending line."""
    from agents.commands._tail_format import format_marginals

    bound = (f"K = {args.user_max_events} per person per {args.user_period_ticks} ticks, "
             f"{args.people} people, ε / K per event")
    body = (format_marginals(msg) if msg is not None
            else "… (waiting for the user-level worker's first consistent tables)")
    return f"user level ({bound}):\n{body}\n{dropped_line(dropped)}"
