"""``stream-dp marginals --privacy-unit user``: one person, not one event, as the unit (issue #34;
docs/privacy.md, "User-level privacy (preview)").

Each event line carries the person's identifier in ``--user-field`` (default ``user``): a string
of 1 to 256 UTF-8 bytes, bytes are the identity (nothing is normalised) — the rule of the
service's setting ``user_field``. In file order, after every other check of the line, the
library's :class:`stream_dp.user_level.Bounder` keeps a person's first ``--user-max-events`` K
events of each aligned period of ``--user-period-ticks`` T ticks (optionally at most L distinct
cells, k per cell, b ticks apart: the "stream" of the bound is the event's attribute vector, one
cell of the full table); the others are dropped before any noise. The run is pure ε-DP per
event over every table and the bootstrap (the exact ``spent``), so one person's counted events
of one period spend at most ``K·spent`` (:class:`stream_dp.user_level.GroupBudget`, an upper
bound), and ``n·K·spent`` over the ``n`` periods of ticks ``1 … --last-tick``.

A line without a valid identifier is invalid input like any other bad line (exit 2, one line
naming the line, never the identifier).
"""

from __future__ import annotations

import argparse
from fractions import Fraction
from typing import Any

from stream_dp.commands.plan_user import BOUND_OPTIONS, bound_values

#: longest identifier, in UTF-8 bytes (the service's rule for its identifiers)
MAX_ID_BYTES = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The user-level options of ``stream-dp marginals`` (the names and meanings of the
    service's settings)."""
    group = parser.add_argument_group(
        "user level", "one person as the unit: events bounded per person and period, in file "
        "order, before any noise")
    group.add_argument("--privacy-unit", choices=("event", "user"), default="event",
                       help="unit of privacy: one event (default) or one person (as the "
                       "setting privacy_unit)")
    group.add_argument("--user-field", default=None, metavar="F",
                       help="event field holding the person's identifier, a string of 1 to 256 "
                       "UTF-8 bytes (user_field; default user)")
    group.add_argument("--user-max-events", default=None, metavar="K",
                       help="K: counted events per person per period, >= 1, the first in file "
                       "order (user_max_events; required with --privacy-unit user)")
    group.add_argument("--user-period-ticks", default=None, metavar="T",
                       help="ticks per period: period P holds ticks P*T+1 .. (P+1)*T; 0 = the "
                       "whole run (user_period_ticks; required with --privacy-unit user)")
    group.add_argument("--user-max-streams", default=None, metavar="L",
                       help="distinct cells (attribute vectors) per person per period; 0 = no "
                       "bound (user_max_streams; default 0)")
    group.add_argument("--user-max-events-per-stream", default=None, metavar="k",
                       help="counted events per person and cell per period; 0 = K "
                       "(user_max_events_per_stream; default 0)")
    group.add_argument("--user-min-separation-ticks", default=None, metavar="b",
                       help="ticks between two counted events of one person; 0 = none "
                       "(user_min_separation_ticks; default 0)")


def bounds_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~stream_dp.user_level.UserBounds` the options declare (``None`` at event
    level); a one-line ``ValueError`` naming the option otherwise. Sets ``args.user_field``."""
    from stream_dp.user_level import UserBounds

    if getattr(args, "privacy_unit", "event") != "user":
        for key, (flag, _, _) in {**BOUND_OPTIONS,
                                  "user_field": ("--user-field", "", 0)}.items():
            if getattr(args, key, None) is not None:
                raise ValueError(f"{flag} belongs to --privacy-unit user; add --privacy-unit user")
        return None
    if args.user_field is None:
        args.user_field = "user"
    if not args.user_field:
        raise ValueError("--user-field must name a field, got ''")
    values = bound_values(args, "the whole run")
    return UserBounds(**values)


def identifier(event: dict[str, Any], field: str) -> bytes:
    """The identifier's UTF-8 bytes, or a ``ValueError`` saying what is wrong with it (never
    repeating it)."""
    got = event.get(field)
    what = f"the person's identifier (field {field!r})"
    if got is None:
        raise ValueError(f"{what} is {'null' if field in event else 'missing'}")
    if not isinstance(got, str):
        raise ValueError(f"{what} must be a string, got {type(got).__name__}")
    try:
        raw = got.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid Unicode (a lone surrogate)") from None
    if not raw:
        raise ValueError(f"{what} is empty")
    if len(raw) > MAX_ID_BYTES:
        raise ValueError(f"{what} is {len(raw)} bytes long, more than {MAX_ID_BYTES}")
    return raw


def description(args: argparse.Namespace, bounds: Any) -> str:
    """What the bounds add to the text keying the noise (other bounds, other noise)."""
    b = bounds
    return (f"/unit=user/user_field={args.user_field!r}/K={b.max_events}/T={b.period_ticks}"
            f"/L={b.max_streams}/k={b.max_events_per_stream}/b={b.min_separation_ticks}")


def person_report(bounds: Any, spent: Fraction, last_tick: int) -> dict[str, Any]:
    """The person's figures for ``--report`` and the last line: per period and over the run's
    periods (both upper bounds, floats rounded up; the per-period one also exactly)."""
    from stream_dp.exact_budget import exact_decimal
    from stream_dp.user_level import GroupBudget, float_up

    g = GroupBudget(spent, bounds)
    periods = g.periods_in(last_tick)
    return {
        "unit": "person", "period_ticks": bounds.period_ticks,
        "bounds": {"max_events": bounds.max_events, "max_streams": bounds.max_streams,
                   "max_events_per_stream": bounds.max_events_per_stream,
                   "min_separation_ticks": bounds.min_separation_ticks},
        "per_person": {"period": float_up(g.per_period),
                       "period_exact": exact_decimal(g.per_period),
                       "run": float_up(g.over_periods(periods)), "periods": periods,
                       "exact": False},
    }


def guarantee(person: dict[str, Any]) -> str:
    """The per-person part of the command's last line."""
    per = person["per_person"]
    t = person["period_ticks"]
    period = f"period of {t} ticks" if t else "period (the whole run)"
    return (f"per person per {period}: ε ≤ {per['period']!r} (K = "
            f"{person['bounds']['max_events']} counted events × the exact ε per event; an "
            f"upper bound), ε ≤ {per['run']!r} over the run's {per['periods']} period(s)")
