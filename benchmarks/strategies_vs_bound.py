"""Every strategy's exact per-release MSE next to the factorisation lower bound (analytic).

Prints, for each privacy model and decay p, the mean per-release MSE over ticks 1..T of every
registered strategy for that model (``blt-horizon``, which ``auto`` does not pick, included),
``auto``'s pick, the lower bound of
:mod:`stream_dp.lower_bound` at the same horizon, and each strategy's ratio to the bound.
Everything is exact (no simulation); a tree/sqrt plan is computed once and cached on disk.

Usage::

    python benchmarks/strategies_vs_bound.py                   # T = 32767, ε = 1, ρ = 0.5
    python benchmarks/strategies_vs_bound.py --horizon 4095 --model zcdp
    python benchmarks/strategies_vs_bound.py --model zcdp --p 1   # one row
"""

from __future__ import annotations

import argparse
import time

from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.lower_bound import mean_mse_bound
from stream_dp.planner import compare, pick

PS = (0.1, 0.3, 0.5, 0.7, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9999, 1.0)


def table(privacy: Privacy, horizon: int, ps: tuple[float, ...]) -> None:
    names: list[str] | None = None
    for p in ps:
        t0 = time.perf_counter()
        cands = compare(p, horizon, privacy, by_name=True)  # blt-horizon too
        bound = mean_mse_bound(horizon, p, privacy)
        if names is None:
            names = [c.strategy for c in cands]
            head = "".join(f"{n:>13}" for n in names)
            print(f"\n{privacy}, horizon T = {horizon}: mean per-release MSE (ratio to bound)")
            print(f"{'p':>6}{head}{'auto':>13}{'pick':>13}{'bound':>11}{'auto/bound':>11}{'s':>6}")
        by = {c.strategy: c.mean_mse for c in cands}
        # auto's real pick: the planner's rule (error bounded past the horizon first)
        chosen = pick(p, horizon, privacy)
        best = next(c for c in cands if c.strategy == chosen)
        cells = "".join(f"{by[n]:>13.3f}" for n in names)
        print(
            f"{p:>6g}{cells}{best.mean_mse:>13.3f}{best.strategy:>13}{bound:>11.3f}"
            f"{best.mean_mse / bound:>11.6f}{time.perf_counter() - t0:>6.1f}"
        )
        # the near-optimal ones to 6 decimals (blt, blt-horizon: issue #36's anchors)
        ratios = "  ".join(f"{n} {by[n] / bound:.6f}" if by[n] < 1.1 * bound
                           else f"{n} {by[n] / bound:.2f}" for n in names)
        print(f"{'':>6}  ratio to bound: {ratios}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--horizon", type=int, default=32767)
    ap.add_argument("--model", choices=("pure", "zcdp", "both"), default="both")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--rho", type=float, default=0.5)
    ap.add_argument("--p", type=float, nargs="*", default=list(PS), help="decays (default: all)")
    args = ap.parse_args()
    ps = tuple(args.p)
    if args.model in ("pure", "both"):
        table(PureDP(args.epsilon), args.horizon, ps)
    if args.model in ("zcdp", "both"):
        table(ZCDP(args.rho), args.horizon, ps)


if __name__ == "__main__":
    main()
