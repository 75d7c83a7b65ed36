"""``stream-dp plan``: compare the strategies' exact error for (p, horizon, privacy, cap)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stream_dp.accounting import Accountant
from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.commands import plan_user

HELP = "compare strategies' exact error for (p, horizon, privacy)"

DESCRIPTION = """\
Print, for every registered strategy, its exact L1 sensitivity (per event of size --cap, grid
slack included), the expected RMSE of one release (root of the mean per-release MSE over ticks
1..horizon, analytic, no simulation) and its MSE ratio to the best strategy and to the
factorisation lower bound ("x bound"); then the strategy that `--strategy auto` would pick: the
lowest error among strategies whose error stays bounded past the horizon (others are marked;
--all-strategies also lists, marked, the ones auto never picks: blt-horizon, docs/choosing.md). ε
is per event and per stream (pure differential privacy). The column "range/tick" is the
strategy's numeric range (Mechanism.max_count()): the largest count per stream and tick, in
value units, that it releases forever — at least 10^6 × cap for every strategy at ε = 1 / ρ =
0.5 (docs/accuracy.md, "Numeric range"); --max-events-per-tick N restricts the pick to
strategies whose range covers cap × N.

examples:
  stream-dp plan --p 0.9 --epsilon 1 --horizon 32767
  stream-dp plan --p 0.999 --epsilon 0.5 --horizon 1048575 --cap 2
  stream-dp plan --p 1 --epsilon 1 --horizon 65535 --format json
  stream-dp plan --p 0.99 --privacy zcdp --rho 0.5 --horizon 4095
  stream-dp plan --p 0.999 --privacy zcdp --rho 0.5 --horizon 32767 --all-strategies
  stream-dp plan --p 0.9 --epsilon 0.25 --horizon 4095 --domain examples/domain.toml
  stream-dp plan --p 0.9 --epsilon 1 --horizon 4095 --integer-counts
  stream-dp plan --p 0.99 --privacy zcdp --rho 0.01 --horizon 4095 --privacy-unit user \\
      --user-max-events 10 --user-period-ticks 1440 --user-min-separation-ticks 5
  stream-dp plan --p 0.9 --epsilon 0.1 --horizon 4095 --privacy-unit user \\
      --user-max-events 10 --user-period-ticks 1440 --user-target-epsilon 1

Valid ranges (docs/accuracy.md): --p in (0, 1], --horizon in [1, 16777215], --epsilon in
[1e-6, 1e6], --rho in [1e-12, 1e12], --cap in [1e-6, 1e9] (whole with --integer-counts), --delta
in (0, 1); anything else exits with status 2 and one line. The MSE includes the grid rounding
(negligible unless ε is huge), so no strategy is ever reported below the lower bound.

Privacy models: --privacy pure --epsilon E (default; Laplace noise, L1 sensitivity) or
--privacy zcdp --rho R (Gaussian noise, L2 sensitivity; the (ε, δ)-DP implied by ρ is printed for
--delta). Giving the other model's parameter is refused. Below the table: the factorisation lower
bound (no strategy that adds i.i.d. noise to linear measurements can beat it, see
stream_dp/lower_bound.py) and how far the pick is above it; then the accountant's summary: the
budget per stream, the streams one event feeds (1, or the domain's count with --domain) and the
total per event.

A binary-attribute domain (kind = "binary") spends --epsilon per event for the whole run, split
between each structure epoch's bootstrap (--attribute-bootstrap-fraction of ε, default 0.2; none
with one attribute) and the epoch's K tables (ε_t each; K depends on the data, at most 2m − 1):
the summary then prints ε₀, ε_t of the first epoch's tables and of every K, and the largest
exact total ε₀ + K·ε_t over every K, as its full decimal expansion (≤ ε in exact arithmetic).
The strategy table above is for --epsilon per stream; the tables' counters run at ε_t.

User level (--privacy-unit user, docs/budget.md "Per person"): the declared ε or ρ stays per
event and stream; with the contribution bounds (--user-max-events K per --user-period-ticks T,
optionally --user-max-streams L, --user-max-events-per-stream k, --user-min-separation-ticks b,
as the settings user_max_events, user_period_ticks, ...) plan adds each strategy's per-person
factor on one leaf stream (exact, or an upper bound: said per row), its error at the per-event
budget declared / factor, the strategy auto picks by that error, and for it the per-person
budget per stream, in total per period over every node a person reaches (--domain), and over a
year of periods (--tick-seconds, default 60), each marked exact or an upper bound; under zCDP
each ρ also as (ε, δ) at --delta. --user-target-epsilon E (or --user-target-rho R) prints the
per-event budget whose per-person total per period is at most the target, checked exactly,
for the strategy auto picks at that budget (named on the line).
Missing or out-of-range bounds exit with status 2 and one line.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``stream-dp plan``."""
    parser.add_argument("--p", type=float, required=True, help="decay per tick, in (0, 1]")
    parser.add_argument(
        "--epsilon", type=float, default=None, help="ε per event and stream (pure DP), > 0"
    )
    parser.add_argument(
        "--privacy",
        choices=("pure", "zcdp"),
        default="pure",
        help="privacy model: pure ε-DP (default) or ρ-zCDP",
    )
    parser.add_argument(
        "--rho", type=float, default=None, help="ρ per event and stream (zCDP), > 0"
    )
    parser.add_argument(
        "--delta",
        type=float,
        default=1e-6,
        help="δ for the (ε, δ)-DP implied by ρ (zCDP only; default 1e-6)",
    )
    parser.add_argument(
        "--horizon", type=int, required=True, help="ticks per epoch (and averaging window), ≥ 1"
    )
    parser.add_argument(
        "--cap", type=float, default=1.0, help="largest contribution of one event (default 1)"
    )
    parser.add_argument(
        "--integer-counts",
        action="store_true",
        help="every count is a whole number (whole-number event values and cap): also consider "
        "the integer-grid strategies (naive-int)",
    )
    parser.add_argument(
        "--all-strategies",
        action="store_true",
        help="also list the strategies auto never picks, built by name only (blt-horizon: "
        "plans the horizon as a run of its own, the horizons after it pay; docs/choosing.md)",
    )
    parser.add_argument(
        "--max-events-per-tick",
        type=int,
        default=None,
        metavar="N",
        help="declared maximum events per stream and tick: only strategies whose numeric range "
        "covers cap × N are picked (error if none does; docs/accuracy.md, 'Numeric range')",
    )
    parser.add_argument(
        "--domain",
        default=None,
        metavar="FILE",
        help="domain TOML: account for the nodes one event feeds (default: one stream)",
    )
    parser.add_argument(
        "--attribute-bootstrap-fraction",
        type=float,
        default=0.2,
        metavar="F",
        help="binary-attribute domains: share of ε for each epoch's bootstrap, in [0, 1) "
        "(default 0.2, as the setting attribute_bootstrap_fraction)",
    )
    parser.add_argument(
        "--attribute-max-cluster",
        type=int,
        default=4,
        metavar="G",
        help="binary-attribute domains: attributes per joint table, 1..8 (default 4, as the "
        "setting attribute_max_cluster; sets the first epoch's table count)",
    )
    parser.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format (default table)"
    )
    plan_user.add_arguments(parser)


def binary_domain(path: str | None) -> Any:
    """The :class:`~stream_dp.attributes.BinaryDomain` of a ``kind = "binary"`` domain file,
    else ``None`` (other files, unreadable ones included, are left to :class:`Domain`)."""
    from stream_dp import _toml

    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            doc = _toml.load(fh)
    except (OSError, ValueError):  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        return None
    section = doc.get("domain", doc)
    if not (isinstance(section, dict) and section.get("kind") == "binary"):
        return None
    from stream_dp.attributes.domain import BinaryDomain

    return BinaryDomain.from_file(path)


def attribute_accounting(args: argparse.Namespace, domain: Any, privacy: Privacy
                         ) -> dict[str, Any]:
    """The exact ε split of a binary-attribute deployment (pure DP only)."""
    from fractions import Fraction

    from stream_dp.attributes.live import initial_structure
    from stream_dp.attributes.release import max_tables, split_budget, worst_spent
    from stream_dp.exact_budget import exact_decimal

    if not isinstance(privacy, PureDP):
        raise ValueError("a binary-attribute domain runs pure ε-DP: give --privacy pure "
                         "--epsilon E")
    fraction = float(args.attribute_bootstrap_fraction)
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"--attribute-bootstrap-fraction must be in [0, 1), got {fraction!r}")
    group = int(args.attribute_max_cluster)
    if not 1 <= group <= 8:
        raise ValueError(f"--attribute-max-cluster must be in 1..8, got {group}")
    eps, m = privacy.epsilon, int(domain.m)
    eps0 = fraction * eps if m > 1 else 0.0
    first = len(initial_structure(m, group).tables)
    counts = [first] if eps0 == 0 else list(range(1, max_tables(m) + 1))
    per = {k: split_budget(eps, k, eps0).per_table for k in counts}
    total = worst_spent(eps, m, eps0) if eps0 > 0 else split_budget(eps, first, 0.0).spent_exact
    return {
        "model": "pure", "attributes": m, "epsilon": eps, "bootstrap": eps0,
        "first_epoch_tables": first, "max_tables": counts[-1],
        "per_table": {str(k): v for k, v in per.items()},
        "spent_exact": exact_decimal(total), "spent": float(total),
        "epsilon_exact": exact_decimal(Fraction(eps)),
    }


def attribute_lines(acc: dict[str, Any]) -> list[str]:
    """The text form of :func:`attribute_accounting`."""
    per = acc["per_table"]
    first = str(acc["first_epoch_tables"])
    lines = [
        "privacy model:           pure ε-DP, event level, for the whole run "
        f"(binary attributes, m = {acc['attributes']})",
        f"bootstrap per epoch:     ε₀ = {acc['bootstrap']!r}"
        + (" (one attribute: no bootstrap, the first tables for good)"
           if acc["bootstrap"] == 0 else ""),
        f"tables:                  first epoch {first} tables, ε_t = {per[first]!r} each; "
        f"later epochs 1..{acc['max_tables']} tables (from the data), ε_t = "
        f"{per[str(acc['max_tables'])]!r} .. {per['1']!r}"
        if acc["bootstrap"] > 0 else
        f"tables:                  {first} tables, ε_t = {per[first]!r} each",
        f"total per event:         ε = {acc['spent_exact']} (exact, the largest over every "
        "table count)",
        f"                         ≤ ε = {acc['epsilon']!r} (the float, exactly "
        f"{acc['epsilon_exact']})",
    ]
    return lines


def accountant_from_args(args: argparse.Namespace, privacy: Privacy) -> Accountant:
    """The accountant for the options: per-stream budget × nodes one event feeds (``--domain``)."""
    domain_file = getattr(args, "domain", None)
    if domain_file is None or binary_domain(domain_file) is not None:
        return Accountant(privacy, nodes_touched=1, cap=args.cap)
    from stream_dp.domain import Domain

    try:
        domain = Domain.from_file(domain_file)
    except OSError as exc:
        raise ValueError(f"--domain: cannot read {domain_file!r}: {exc.strerror}") from exc
    return Accountant.for_domain(domain, privacy, cap=args.cap)


def privacy_from_args(args: argparse.Namespace) -> Privacy:
    """The budget the options describe; mixing models (e.g. --rho with pure) is refused."""
    model = getattr(args, "privacy", "pure")
    rho = getattr(args, "rho", None)
    if model == "zcdp":
        if args.epsilon is not None:
            raise ValueError("--epsilon belongs to --privacy pure; give --rho R for zcdp")
        if rho is None:
            raise ValueError("--privacy zcdp needs --rho R (ρ per event, > 0)")
        return ZCDP(rho)
    if rho is not None:
        raise ValueError("--rho belongs to --privacy zcdp; give --epsilon E for pure")
    if args.epsilon is None:
        raise ValueError("--privacy pure needs --epsilon E (ε per event, > 0)")
    return PureDP(args.epsilon)


#: Largest horizon at which the lower bound is computed (O(n) memory, milliseconds per 10^5).
_LB_MAX = 1 << 20


def lower_bound_row(args: argparse.Namespace, privacy: Privacy) -> dict[str, object]:
    """The factorisation lower bound on the mean per-release MSE (at min(horizon, 2**20))."""
    from stream_dp.lower_bound import mean_mse_bound

    n = min(int(args.horizon), _LB_MAX)
    return {"horizon": n, "mse": mean_mse_bound(n, args.p, privacy, args.cap)}


_OPTION_NAMES = {
    "p": "--p", "horizon": "--horizon", "epsilon": "--epsilon", "rho": "--rho", "cap": "--cap",
    "delta": "--delta", "integer_counts": "--integer-counts",
}


def validate(args: argparse.Namespace) -> None:
    """Every option in its documented range (:mod:`stream_dp.limits`), else a one-line
    ``ValueError`` naming the option."""
    from stream_dp.limits import check_parameters

    check_parameters(
        p=args.p, horizon=args.horizon, cap=args.cap,
        epsilon=args.epsilon, rho=getattr(args, "rho", None),
        delta=getattr(args, "delta", None),
        integer_counts=bool(getattr(args, "integer_counts", False)),
        names=_OPTION_NAMES,
    )


def rows(args: argparse.Namespace) -> tuple[list[dict[str, object]], str]:
    """Table rows (one per strategy, best first by MSE) and the planner's pick."""
    from stream_dp.planner import compare, make_mechanism, pick
    from stream_dp.strategies.registry import get

    validate(args)
    privacy = privacy_from_args(args)
    integer_counts = bool(getattr(args, "integer_counts", False))
    rate = getattr(args, "max_events_per_tick", None)
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate < 1):
        raise ValueError(f"--max-events-per-tick must be an integer ≥ 1, got {rate!r}")
    limit = None if rate is None else float(args.cap) * rate
    figs = compare(args.p, args.horizon, privacy, args.cap, integer_counts=integer_counts,
                   by_name=bool(getattr(args, "all_strategies", False)))
    best = min(f.error_mse for f in figs)
    bound = float(lower_bound_row(args, privacy)["mse"])  # type: ignore[arg-type]
    out: list[dict[str, object]] = [
        {
            "strategy": f.strategy,
            "sensitivity": f.sensitivity,
            "rmse": f.rmse,
            "mse": f.error_mse,
            "noise_mse": f.mean_mse,
            "rounding_mse": f.rounding_mse,
            "ratio": f.error_mse / best,
            # MSE over the factorisation lower bound (the bound at min(horizon, 2**20) ticks;
            # it does not cover integer-grid strategies, which may go below 1)
            "bound_ratio": f.error_mse / bound if bound > 0 else float("inf"),
            "unbounded_ok": f.unbounded_ok,
            "integer_only": get(f.strategy).integer_only,
            # auto never picks a strategy registered with auto=False (blt-horizon: it trades
            # the next horizon's error for this one's; docs/choosing.md)
            "auto_candidate": get(f.strategy).auto,
            "max_count": make_mechanism(
                f.strategy, args.p, args.horizon, privacy, args.cap
            ).max_count(),
        }
        for f in sorted(figs, key=lambda f: f.error_mse)
    ]
    chosen = pick(args.p, args.horizon, privacy, cap=args.cap, integer_counts=integer_counts,
                  max_tick_count=limit)
    return out, chosen


#: the table's legend (printed under it; docs/accuracy.md has the details); the sensitivity
#: line is the privacy model's (SENSITIVITY)
COLUMNS = (
    "columns:",
    "  sensitivity   {sensitivity}",
    "  RMSE/release  expected error of one release (root of the mean MSE over ticks "
    "1..horizon; analytic, no simulation), in counts",
    "  MSE/release   its square",
    "  ratio         MSE / the MSE of the best strategy in this table (1.000 = best)",
    "  x bound       MSE / the lower bound for any factorisation (how far from optimal)",
    "  range/tick    the largest count per stream and tick the strategy's exact arithmetic "
    "holds (cap x events; see --max-events-per-tick)",
    "  <- pick       what --strategy auto chooses",
)

#: what the sensitivity column holds, per privacy model (pure DP: Laplace noise, an L1 norm;
#: zCDP: Gaussian noise, an L2 norm)
SENSITIVITY = {
    "pure": "L1 sensitivity of one event of size cap (the largest L1 norm of a column of the "
            "strategy's measurements), with the rounding slack of the noise grid (hence "
            "1.000008, not 1)",
    "zcdp": "L2 sensitivity of one event of size cap (the largest L2 norm of a column of the "
            "strategy's measurements), with the rounding slack of the noise grid",
}


def _bound_ratio(table: list[dict[str, object]], chosen: str, bound: float) -> tuple[str, float]:
    """The strategy compared with the lower bound and its MSE ratio to it.

    The bound holds for noise on real-valued measurements: the pick unless it is an
    integer-grid strategy (whole-number counts can beat it), then the best other strategy.
    """
    row = next(r for r in table if r["strategy"] == chosen)
    if row["integer_only"]:
        row = next((r for r in table if not r["integer_only"]), row)
    return str(row["strategy"]), float(row["mse"]) / bound  # type: ignore[arg-type]


def _num(value: object, width: int, decimals: int = 4) -> str:
    """Fixed-point when readable, else scientific (tiny errors at a huge ε, huge ratios)."""
    v = float(value)  # type: ignore[arg-type]
    text = f"{v:.{decimals}f}"
    if len(text) > width - 1 or (v != 0.0 and abs(v) < 10.0**-decimals):
        text = f"{v:.3g}"
    return f"{text:>{width}}"


def run(args: argparse.Namespace) -> int:
    """Print the comparison; exit code 2 on invalid parameters."""
    try:
        table, chosen = rows(args)
        privacy = privacy_from_args(args)
        accountant = accountant_from_args(args, privacy)
        accountant.summary(args.delta)
        binary = binary_domain(getattr(args, "domain", None))
        attributes = None if binary is None else attribute_accounting(args, binary, privacy)
        user: dict[str, Any] | None = None
        bounds = plan_user.bounds_from_args(args)
        if bounds is not None:
            if binary is not None:  # K × the exact ε per event, over every table
                from fractions import Fraction

                from stream_dp.user_level import GroupBudget

                assert attributes is not None
                group = GroupBudget(Fraction(attributes["spent_exact"]), bounds)
                user = {"bounds": plan_user.bounds_dict(bounds),
                        "tick_seconds": plan_user.tick_seconds(args),
                        "per_person": group.report(plan_user.tick_seconds(args)),
                        "_lines": group.summary(plan_user.tick_seconds(args))}
            else:
                user = plan_user.user_report(args, privacy, accountant, bounds)
    except ValueError as exc:
        print(f"stream-dp plan: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if args.format == "json":
        doc = {
            "p": args.p,
            "horizon": args.horizon,
            "cap": args.cap,
            "privacy": privacy.as_dict(),
            "strategies": table,
            "pick": chosen,
            "lower_bound": lower_bound_row(args, privacy),
            "lower_bound_applies_to": [r["strategy"] for r in table if not r["integer_only"]],
            "accounting": (accountant.summary(args.delta) if attributes is None
                           else attribute_lines(attributes)),
        }
        if attributes is not None:
            doc["attributes"] = attributes
        if user is not None:
            doc["user_level"] = {k: v for k, v in user.items() if k != "_lines"}
        if isinstance(privacy, ZCDP):
            doc["implied_approx_dp"] = {
                "epsilon": privacy.to_approx_dp(args.delta),
                "delta": args.delta,
            }
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"p = {args.p:g}, horizon = {args.horizon} ticks, {privacy} per event, cap = {args.cap:g}"
    )
    print(f"{'strategy':<14}{'sensitivity':>13}{'RMSE/release':>14}{'MSE/release':>14}{'ratio':>11}"
          f"{'x bound':>10}{'range/tick':>12}")
    for r in table:
        mark = "  <- pick" if r["strategy"] == chosen else ""
        if not r["unbounded_ok"]:
            mark += "  (error grows linearly past the horizon)"
        if not r["auto_candidate"]:
            mark += "  (by name only: later horizons pay; docs/choosing.md)"
            if getattr(args, "privacy_unit", "event") == "user":
                # a user-level deployment runs the registry's user-level factory (blt-horizon:
                # blt's plain filter), whose figure the user-level table below shows
                mark += " (user level: runs blt's plain filter)"
        print(
            f"{r['strategy']!s:<14}{r['sensitivity']:>13.6f}{_num(r['rmse'], 14)}"
            f"{_num(r['mse'], 14)}{_num(r['ratio'], 11, 3)}"
            f"{_num(r['bound_ratio'], 9, 3)}{'*' if r['integer_only'] else ' '}"
            f"{float(r['max_count']):>12.3g}{mark}"  # type: ignore[arg-type]
        )
    print(f"pick: {chosen}")
    lb = lower_bound_row(args, privacy)
    compared, ratio = _bound_ratio(table, chosen, float(lb["mse"]))  # type: ignore[arg-type]
    who = "pick is" if compared == chosen else f"best real-valued strategy ({compared}) is"
    print(
        f"lower bound (any factorisation, horizon {lb['horizon']}): MSE/release "
        f"{lb['mse']:.4g}; {who} {ratio:.3f}x the bound"
    )
    if any(r["integer_only"] for r in table):
        print("  * integer grid: the bound for real-valued measurements does not cover it")
    if compared != chosen:
        print(
            f"  ({chosen} adds noise on the integer grid to whole-number counts, which the "
            "bound for real-valued measurements does not cover)"
        )
    print()
    for line in COLUMNS:
        print(line.format(sensitivity=SENSITIVITY["zcdp" if isinstance(privacy, ZCDP)
                                                   else "pure"]))
    print()
    for line in (accountant.summary(args.delta) if attributes is None
                 else attribute_lines(attributes)):
        print(line)
    if user is not None:
        shown: list[str] = (user["_lines"] if "_lines" in user
                            else plan_user.lines(user, privacy))
        for line in shown:
            print(line)
    return 0
