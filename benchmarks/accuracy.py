"""Per-release MSE of every registered strategy: exact analytics plus Monte-Carlo spot checks.

Table 1: mean per-release MSE over ticks 1..T (T = 2**15 − 1, ε = 1 per event, cap 1, pure DP)
for p ∈ {0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999}, one column per strategy registered for pure DP
(iterating the registry, so new strategies appear automatically), the best marked with ``*``,
and ``2/(1 − p²)`` (input perturbation's limit) for reference, plus the factorisation lower bound
(:func:`stream_dp.analysis.lower_bound`) and every strategy's ratio to it. zCDP strategies, if
registered, get their own table at ρ = ε²/2 (the zCDP that ε-DP implies; not the same guarantee).

Table 2: Monte-Carlo spot checks — a CounterBank of S streams (independent keyed noise per
stream) with Poisson counts, run for the first K ticks; empirical MSE / analytic MSE over those
ticks (1.00 ± a few % expected).

Usage: python benchmarks/accuracy.py [--horizon 32767] [--mc-streams 2000] [--mc-ticks 2047]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from stream_dp.analysis import lower_bound
from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.counters import CounterBank
from stream_dp.planner import make_mechanism
from stream_dp.strategies.registry import available

PS = (0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999)


def table(model: str, privacy: Privacy, horizon: int) -> None:
    names = available(model)
    if not names:
        return
    print(f"\n## Mean per-release MSE, T = {horizon}, {privacy}, cap 1")
    ref = model == "pure"  # input perturbation's pure-DP limit, for reference
    print(
        f"{'p':>7}"
        + "".join(f"{n:>14}" for n in names)
        + (f"{'2/(1-p²)':>12}" if ref else "")
        + f"{'best':>14}"
        + f"{'bound':>10}{'best/bound':>11}"
    )
    for p in PS:
        mse = {
            n: float(make_mechanism(n, p, horizon, privacy).mse_curve(horizon).mean())
            for n in names
        }
        best = min(mse, key=lambda k: mse[k])
        cells = "".join(f"{mse[n]:>13.4g}{'*' if n == best else ' '}" for n in names)
        extra = f"{2 / (1 - p * p):>12.4g}" if ref else ""
        bound = lower_bound(
            p, horizon, privacy
        )  # factorisation lower bound (stream_dp.lower_bound)
        print(f"{p:>7}{cells}{extra}{best:>14}{bound:>10.4g}{mse[best] / bound:>11.3f}")
        print(f"{'':>7}  ratio to bound: " + "  ".join(f"{n} {mse[n] / bound:.2f}" for n in names))


def spot_checks(horizon: int, streams: int, ticks: int) -> None:
    print(
        f"\n## Monte-Carlo spot checks: {streams} streams x first {ticks} ticks, T = {horizon}, ε = 1"
    )
    print(f"{'p':>7}{'strategy':>14}{'analytic':>12}{'empirical':>12}{'ratio':>8}{'seconds':>9}")
    names = available("pure")
    for p in (0.3, 0.9, 0.999):
        for n in names:
            mech = make_mechanism(n, p, horizon, PureDP(1.0))
            bank = CounterBank(mech, [f"mc-{i}" for i in range(streams)], bytes(range(32)))
            rng = np.random.default_rng(1)
            true = np.zeros(streams)
            sq = 0.0
            t0 = time.perf_counter()
            for _ in range(ticks):
                d = rng.poisson(3.0, streams).astype(np.float64)
                true = p * true + d
                sq += float(np.mean((bank.step(d) - true) ** 2))
            secs = time.perf_counter() - t0
            analytic = float(mech.mse_curve(ticks).mean())
            emp = sq / ticks
            print(f"{p:>7}{n:>14}{analytic:>12.4g}{emp:>12.4g}{emp / analytic:>8.3f}{secs:>9.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--horizon", type=int, default=2**15 - 1)
    ap.add_argument("--mc-streams", type=int, default=2000)
    ap.add_argument("--mc-ticks", type=int, default=2047)
    args = ap.parse_args()
    table("pure", PureDP(1.0), args.horizon)
    table("zcdp", ZCDP(0.5), args.horizon)
    if args.mc_ticks > 0:
        spot_checks(args.horizon, args.mc_streams, args.mc_ticks)


if __name__ == "__main__":
    main()
