"""``stream-dp plan --privacy-unit user``: the per-person guarantee of a deployment that bounds
each person's contribution (issue #34; docs/design/user-level.md).

The options mirror the settings of the design's table (``--user-max-events`` K,
``--user-period-ticks`` T, ``--user-max-streams`` L, ``--user-max-events-per-stream`` k,
``--user-min-separation-ticks`` b); ``--tick-seconds`` only converts periods to a year. Printed:
each strategy's per-person factor on one leaf stream and its error at the user-level calibration,
the strategy ``auto`` would pick by that error, and for it the per-person budget per stream, in
total per period over every node a person reaches, and over a year — each said exact or an upper
bound. ``--user-target-epsilon``/``--user-target-rho`` solves for the per-event budget whose
per-person total per period is at most the target (checked in exact rational arithmetic on the
floats, stepped down by one ulp at a time until it holds).
"""

from __future__ import annotations

import argparse
import math
from fractions import Fraction
from typing import Any

from stream_dp.accounting import Accountant
from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.exact_budget import exact_decimal

#: the user-level options and the UserBounds field each sets (docs/design/user-level.md §1)
BOUND_OPTIONS = {
    "user_max_events": ("--user-max-events", "max_events", 1),
    "user_period_ticks": ("--user-period-ticks", "period_ticks", 0),
    "user_max_streams": ("--user-max-streams", "max_streams", 0),
    "user_max_events_per_stream": ("--user-max-events-per-stream", "max_events_per_stream", 0),
    "user_min_separation_ticks": ("--user-min-separation-ticks", "min_separation_ticks", 0),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The user-level options of ``stream-dp plan``."""
    group = parser.add_argument_group(
        "user level", "the per-person guarantee under contribution bounds "
        "(docs/budget.md, 'Per person')")
    group.add_argument("--privacy-unit", choices=("event", "user"), default="event",
                       help="unit of privacy: one event (default) or one person with bounded "
                       "contributions (as the setting privacy_unit)")
    group.add_argument("--user-max-events", type=int, default=None, metavar="K",
                       help="counted events per person per period, >= 1 (user_max_events; "
                       "required with --privacy-unit user)")
    group.add_argument("--user-period-ticks", type=int, default=None, metavar="T",
                       help="ticks per period, aligned; 0 = the whole epoch (user_period_ticks; "
                       "required with --privacy-unit user)")
    group.add_argument("--user-max-streams", type=int, default=None, metavar="L",
                       help="distinct leaf streams per person per period; 0 = no bound "
                       "(user_max_streams; default 0)")
    group.add_argument("--user-max-events-per-stream", type=int, default=None, metavar="k",
                       help="counted events per person and leaf per period; 0 = K "
                       "(user_max_events_per_stream; default 0)")
    group.add_argument("--user-min-separation-ticks", type=int, default=None, metavar="b",
                       help="ticks between two counted events of one person; 0 = none "
                       "(user_min_separation_ticks; default 0)")
    group.add_argument("--tick-seconds", type=float, default=None, metavar="S",
                       help="seconds per tick, > 0, for the periods in a year (tick_seconds; "
                       "default 60)")
    group.add_argument("--user-target-epsilon", type=float, default=None, metavar="E",
                       help="solve for the per-event ε whose total per person per period is at "
                       "most E (pure)")
    group.add_argument("--user-target-rho", type=float, default=None, metavar="R",
                       help="solve for the per-event ρ whose total per person per period is at "
                       "most R (zcdp)")


def _given(args: argparse.Namespace) -> list[str]:
    flags = [flag for key, (flag, _, _) in BOUND_OPTIONS.items()
             if getattr(args, key, None) is not None]
    for key, flag in (("tick_seconds", "--tick-seconds"),
                      ("user_target_epsilon", "--user-target-epsilon"),
                      ("user_target_rho", "--user-target-rho")):
        if getattr(args, key, None) is not None:
            flags.append(flag)
    return flags


def bounds_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~stream_dp.user_level.bounds.UserBounds` the options declare, ``None`` at
    event level; one-line ``ValueError`` naming the option otherwise."""
    from stream_dp.user_level.bounds import UserBounds

    unit = getattr(args, "privacy_unit", "event")
    if unit != "user":
        given = _given(args)
        if given:
            raise ValueError(f"{given[0]} belongs to --privacy-unit user; add --privacy-unit user")
        return None
    values = bound_values(args, "the whole epoch")
    tick = tick_seconds(args)
    if not (math.isfinite(tick) and tick > 0):
        raise ValueError(f"--tick-seconds must be a finite number > 0, got {tick!r}")
    return UserBounds(**values)


def bound_values(args: argparse.Namespace, whole: str) -> dict[str, int]:
    """The :class:`~stream_dp.user_level.bounds.UserBounds` fields the ``--user-*`` options of
    ``args`` give (integers or their text), checked; one-line ``ValueError`` naming the option.
    ``whole``: what a period of 0 ticks means to the command."""
    values: dict[str, int] = {}
    for key, (flag, field, minimum) in BOUND_OPTIONS.items():
        text = getattr(args, key, None)
        if text is None:
            if key in ("user_max_events", "user_period_ticks"):
                what = ("counted events per person per period, >= 1" if minimum else
                        f"ticks per period, 0 = {whole}")
                raise ValueError(f"--privacy-unit user needs {flag} ({what})")
            text = 0
        try:
            value = int(str(text))
        except ValueError:
            raise ValueError(f"{flag} must be an integer, got {text!r}") from None
        if not minimum <= value < 1 << 32:
            raise ValueError(f"{flag} must be an integer in [{minimum}, {(1 << 32) - 1}], "
                             f"got {value}")
        values[field] = value
    return values


def tick_seconds(args: argparse.Namespace) -> float:
    """Seconds per tick (``--tick-seconds``, default 60 as the setting ``tick_seconds``)."""
    value = getattr(args, "tick_seconds", None)
    return 60.0 if value is None else float(value)


def _layer_leaves(args: argparse.Namespace) -> tuple[int, ...]:
    from stream_dp.domain import Domain
    from stream_dp.user_level.accounting import layer_leaves

    path = getattr(args, "domain", None)
    if path is None:
        return (1,)
    try:
        return layer_leaves(Domain.from_file(path))
    except OSError as exc:
        raise ValueError(f"--domain: cannot read {path!r}: {exc.strerror}") from exc


def bounds_dict(bounds: Any) -> dict[str, int]:
    """The bounds as the JSON report names them."""
    return {"max_events": bounds.max_events, "period_ticks": bounds.period_ticks,
            "max_streams": bounds.max_streams,
            "max_events_per_stream": bounds.max_events_per_stream,
            "min_separation_ticks": bounds.min_separation_ticks}


def user_report(args: argparse.Namespace, privacy: Privacy, accountant: Accountant,
                bounds: Any) -> dict[str, Any]:
    """Everything the user-level section prints: candidates, pick, accounting (and a solved
    per-event budget with a target)."""
    from stream_dp.planner import make_mechanism, pick, user_compare
    from stream_dp.user_level.accounting import UserAccountant

    integer_counts = bool(getattr(args, "integer_counts", False))
    candidates = user_compare(args.p, args.horizon, privacy, bounds, args.cap,
                              integer_counts=integer_counts)
    chosen = pick(args.p, args.horizon, privacy, args.cap, integer_counts=integer_counts,
                  user_bounds=bounds)
    mech = make_mechanism(chosen, args.p, args.horizon, privacy, args.cap, user_bounds=bounds)
    leaves = _layer_leaves(args)
    acc = UserAccountant(accountant, bounds, leaves, mech, tick_seconds(args))
    report: dict[str, Any] = {
        "bounds": bounds_dict(bounds),
        "tick_seconds": tick_seconds(args),
        "strategies": [
            {"strategy": c.strategy, "factor": c.factor.value, "exact": c.factor.exact,
             "method": c.factor.method,
             "per_event_at_person_budget": _scaled(privacy, 1.0 / c.factor.value).as_dict(),
             "mse": c.error_mse, "rmse": math.sqrt(c.error_mse),
             "unbounded_ok": c.figures.unbounded_ok}
            for c in sorted(candidates, key=lambda c: c.error_mse)
        ],
        "pick": chosen,
        "accounting": acc.figures(),
        "lines": acc.summary(getattr(args, "delta", None) if isinstance(privacy, ZCDP) else None),
    }
    target = _target(args, privacy)
    if target is not None:
        # The solved budget is deployed as the declared one, and `strategy = auto` picks by the
        # user-level error at *that* budget, which can be another strategy than the pick at the
        # budget given here (grid effects reorder close candidates): solve for what auto runs
        # at each budget tried, and say which strategy it is.
        used: dict[str, str] = {}
        rate = getattr(args, "max_events_per_tick", None)  # the worker's range filter, if given
        limit = None if rate is None else float(args.cap) * rate

        def total_factor(per: Privacy) -> float:
            name = pick(args.p, args.horizon, per, args.cap, integer_counts=integer_counts,
                        max_tick_count=limit, user_bounds=bounds)
            used["strategy"] = name
            return float(UserAccountant(
                _with_budget(accountant, per), bounds, leaves,
                make_mechanism(name, args.p, args.horizon, per, args.cap, user_bounds=bounds),
                tick_seconds(args)).period_factor()[0])

        report["solved"] = solve(target, total_factor)
        report["solved"]["strategy"] = used["strategy"]
    return report


def _target(args: argparse.Namespace, privacy: Privacy) -> Privacy | None:
    eps = getattr(args, "user_target_epsilon", None)
    rho = getattr(args, "user_target_rho", None)
    if eps is not None and rho is not None:
        raise ValueError("give one of --user-target-epsilon and --user-target-rho")
    if eps is not None:
        if not isinstance(privacy, PureDP):
            raise ValueError("--user-target-epsilon belongs to --privacy pure; give "
                             "--user-target-rho R for zcdp")
        if not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"--user-target-epsilon must be a finite number > 0, got {eps!r}")
        return PureDP(eps)
    if rho is not None:
        if not isinstance(privacy, ZCDP):
            raise ValueError("--user-target-rho belongs to --privacy zcdp; give "
                             "--user-target-epsilon E for pure")
        if not (math.isfinite(rho) and rho > 0):
            raise ValueError(f"--user-target-rho must be a finite number > 0, got {rho!r}")
        return ZCDP(rho)
    return None


def _scaled(privacy: Privacy, factor: float) -> Privacy:
    if isinstance(privacy, PureDP):
        return PureDP(privacy.epsilon * factor)
    assert isinstance(privacy, ZCDP)
    return ZCDP(privacy.rho * factor)


def _with_budget(accountant: Accountant, per: Privacy) -> Accountant:
    return Accountant(per, nodes_touched=accountant.nodes_touched, cap=accountant.cap)


def solve(target: Privacy, total_factor: Any) -> dict[str, Any]:
    """The largest per-event budget (found by float division, then stepped down one ulp at a
    time) whose per-person total per period, ``budget × total_factor(budget)``, is at most
    ``target`` in exact rational arithmetic on the floats. ``total_factor`` maps a per-event
    budget to the total factor (it may depend on the mechanism built for that budget).

    >>> from stream_dp.budget import PureDP
    >>> solve(PureDP(1.0), lambda per: 10.0)["per_event"]  # 0.1 × 10 > 1 in the rationals
    {'model': 'pure', 'epsilon': 0.09999999999999999}
    """
    goal = Fraction(target.value)
    kind = type(target)
    per = target.value / float(total_factor(target))
    for _ in range(64):
        factor = float(total_factor(kind(per)))
        if Fraction(per) * Fraction(factor) <= goal:
            product = Fraction(per) * Fraction(factor)
            return {"per_event": kind(per).as_dict(), "factor": factor,
                    "target": target.as_dict(), "per_person_period_exact": exact_decimal(product)}
        # the factor moved with the budget, or the float product rounds above the target
        per = min(math.nextafter(per, 0.0), target.value / factor)
    raise ValueError("could not solve for a per-event budget under the target (the factor "
                     "keeps moving with the budget); give the per-event budget instead")


def lines(report: dict[str, Any], privacy: Privacy) -> list[str]:
    """The text form of :func:`user_report`."""
    sym = "ε" if isinstance(privacy, PureDP) else "ρ"
    out = [
        "",
        f"user level: each strategy at the noise that gives one person {sym} = "
        f"{privacy.value:g} on a leaf stream per period",
        f"{'strategy':<14}{'factor/stream':>15}{'exact':>7}{'RMSE/release':>14}",
    ]
    for r in report["strategies"]:
        mark = "  <- pick (user level)" if r["strategy"] == report["pick"] else ""
        if not r["unbounded_ok"]:
            mark += "  (error grows linearly past the horizon)"
        out.append(f"{r['strategy']:<14}{r['factor']:>15.4f}{'yes' if r['exact'] else 'no':>7}"
                   f"{r['rmse']:>14.4f}{mark}")
    out += [f"pick (user level): {report['pick']}",
            "  factor/stream: per-person budget on one leaf stream per period over the per-event "
            "budget; exact = some pattern of the person's events reaches it (else an upper bound)",
            f"  RMSE/release: at the per-event {sym} = declared / factor, so that one person spends "
            "the declared budget on the stream",
            f"below: the pick at the declared {sym} per event (the service's meaning of the "
            "budget), per person",
            ""]
    out += report["lines"]
    solved = report.get("solved")
    if solved is not None:
        per = solved["per_event"]
        value = next(v for k, v in per.items() if k != "model")
        out.append(f"solved:                  {sym} = {value!r} per event and stream gives at "
                   f"most the target per person per period with strategy {solved['strategy']} "
                   f"(what auto picks at that budget; exactly "
                   f"{solved['per_person_period_exact']} in rationals)")
    return out
