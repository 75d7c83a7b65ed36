"""``stream-dp plan``: compare the strategies' exact error for (p, horizon, privacy, cap)."""

from __future__ import annotations

import argparse
import json
import sys

from stream_dp.budget import Privacy, PureDP

HELP = "compare strategies' exact error for (p, horizon, privacy)"

DESCRIPTION = """\
Print, for every registered strategy, its exact L1 sensitivity (per event of size --cap, grid
slack included), the expected RMSE of one release (root of the mean per-release MSE over ticks
1..horizon, analytic, no simulation) and its MSE ratio to the best strategy; then the strategy
that `--strategy auto` would pick. ε is per event and per stream (pure differential privacy).

examples:
  stream-dp plan --p 0.9 --epsilon 1 --horizon 32767
  stream-dp plan --p 0.999 --epsilon 0.5 --horizon 1048575 --cap 2
  stream-dp plan --p 1 --epsilon 1 --horizon 65535 --format json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``stream-dp plan``."""
    parser.add_argument("--p", type=float, required=True, help="decay per tick, in (0, 1]")
    parser.add_argument(
        "--epsilon", type=float, required=True, help="ε per event and stream (pure DP), > 0"
    )
    parser.add_argument(
        "--horizon", type=int, required=True, help="ticks per epoch (and averaging window), ≥ 1"
    )
    parser.add_argument(
        "--cap", type=float, default=1.0, help="largest contribution of one event (default 1)"
    )
    parser.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format (default table)"
    )


def privacy_from_args(args: argparse.Namespace) -> Privacy:
    """The budget the options describe (extension point for --rho / zCDP)."""
    return PureDP(args.epsilon)


def rows(args: argparse.Namespace) -> tuple[list[dict[str, object]], str]:
    """Table rows (one per strategy, best first by MSE) and the planner's pick."""
    from stream_dp.analysis import figures
    from stream_dp.planner import pick
    from stream_dp.strategies import available

    privacy = privacy_from_args(args)
    figs = figures(available(privacy.model), args.p, args.horizon, privacy, args.cap)
    best = min(f.mean_mse for f in figs)
    out: list[dict[str, object]] = [
        {
            "strategy": f.strategy,
            "sensitivity": f.sensitivity,
            "rmse": f.rmse,
            "mse": f.mean_mse,
            "ratio": f.mean_mse / best,
        }
        for f in sorted(figs, key=lambda f: f.mean_mse)
    ]
    return out, pick(args.p, args.horizon, privacy, cap=args.cap)


def run(args: argparse.Namespace) -> int:
    """Print the comparison; exit code 2 on invalid parameters."""
    try:
        table, chosen = rows(args)
        privacy = privacy_from_args(args)
    except ValueError as exc:
        print(f"stream-dp plan: error: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        doc = {
            "p": args.p,
            "horizon": args.horizon,
            "cap": args.cap,
            "privacy": privacy.as_dict(),
            "strategies": table,
            "pick": chosen,
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"p = {args.p:g}, horizon = {args.horizon} ticks, {privacy} per event, cap = {args.cap:g}"
    )
    print(f"{'strategy':<14}{'sensitivity':>13}{'RMSE/release':>14}{'MSE/release':>14}{'ratio':>9}")
    for r in table:
        mark = "  <- pick" if r["strategy"] == chosen else ""
        print(
            f"{r['strategy']!s:<14}{r['sensitivity']:>13.6f}{r['rmse']:>14.4f}"
            f"{r['mse']:>14.4f}{r['ratio']:>9.3f}{mark}"
        )
    print(f"pick: {chosen}")
    return 0
