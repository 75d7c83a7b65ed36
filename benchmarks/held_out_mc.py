"""Held-out Monte-Carlo check of ``auto``'s (or a named strategy's) claimed error, from the
public API only.

Builds ``make_mechanism(strategy, p, horizon, PureDP(ε))`` (``--strategy``, default ``auto``), runs a :class:`CounterBank` of ``S``
streams (keyed noise, independent across stream ids) on uniform random counts for the first ``K``
ticks, and compares the empirical mean squared error of the releases against the true decayed
sums (computed here, independently of the mechanism) with the mechanism's claimed
``mse_curve`` over the same ticks (issue #36: the figures must match what the code releases).

Usage::

    python benchmarks/held_out_mc.py --p 0.99 --streams 4000 --ticks 1600
    python benchmarks/held_out_mc.py --p 1 --rho 0.5 --streams 2000 --ticks 32767
    python benchmarks/held_out_mc.py --strategy blt-horizon --p 0.999 --rho 0.5 --ticks 65534

Past the horizon it also prints each horizon's own means (``blt-horizon`` trades the next
horizon's error for the first one's).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from stream_dp.budget import ZCDP, PureDP
from stream_dp.counters import CounterBank
from stream_dp.planner import make_mechanism


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--p", type=float, default=0.99)
    ap.add_argument("--horizon", type=int, default=32767)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--rho", type=float, default=None,
                    help="ρ-zCDP at this ρ instead of pure ε-DP")
    ap.add_argument("--streams", type=int, default=4000)
    ap.add_argument("--ticks", type=int, default=1600)
    ap.add_argument("--strategy", default="auto", help="a strategy name (default: auto)")
    args = ap.parse_args()
    p, n, k = args.p, args.streams, args.ticks
    budget = PureDP(args.epsilon) if args.rho is None else ZCDP(args.rho)
    mech = make_mechanism(args.strategy, p, args.horizon, budget)
    bank = CounterBank(mech, [f"s{i}" for i in range(n)], b"held-out-check-key-0123456789abc")
    rng = np.random.default_rng(1)
    truth = np.zeros(n)
    sq = np.zeros(k)
    t0 = time.perf_counter()
    for t in range(k):
        x = rng.uniform(0.0, 1.0, n)
        truth = p * truth + x
        sq[t] = float(np.mean((bank.step(x) - truth) ** 2))
    claim = mech.mse_curve(k)
    print(f"p = {p:g}, {budget}, {args.strategy} = {mech.name}, {n} streams, ticks 1..{k}: "
          f"empirical MSE {sq.mean():.3f}, claimed {claim.mean():.3f}, ratio "
          f"{sq.mean() / claim.mean():.4f} ({time.perf_counter() - t0:.0f} s)")
    for lo in range(0, k, args.horizon) if k > args.horizon else ():
        hi = min(k, lo + args.horizon)
        print(f"  ticks {lo + 1}..{hi}: empirical {sq[lo:hi].mean():.3f}, claimed "
              f"{claim[lo:hi].mean():.3f}, ratio {sq[lo:hi].mean() / claim[lo:hi].mean():.4f}")


if __name__ == "__main__":
    main()
