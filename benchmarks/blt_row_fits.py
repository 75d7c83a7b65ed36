"""What the shipped row fits of ``blt`` at p = 1 give at each horizon (issue #36; analytic).

For every horizon given: the lower bound of :mod:`stream_dp.lower_bound`, the mean release
variance over ticks ``1..T`` of the column-scaled filter (the mechanism without its row fit) and
of the mechanism as built (row-scaled where a fit is shipped and it lowers the error), both as
ratios to the bound, ``auto``'s pick, and the ρ at which the mechanism keeps the rows. Then,
past the horizon, the as-built filter against the column-scaled one: the ratio of the mean and
of the largest variance over blocks 2, 3, 17 and 257 (every tick up to 2500 ticks a block, every
37th beyond), and of the variance at the block's last tick. Row fits are made by
``benchmarks/blt_row_scaling.py --write``.

Usage::

    python benchmarks/blt_row_fits.py 1023 4095 8191 32767 65535
    python benchmarks/blt_row_fits.py --rho 0.01 4095
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stream_dp.budget import ZCDP
from stream_dp.lower_bound import mean_mse_bound
from stream_dp.planner import make_mechanism
from stream_dp.strategies.blt import plan as blt_plan
from stream_dp.strategies.blt.mechanism import BltMechanism

RHOS = (1e2, 1.0, 0.1, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 1e-5, 3e-6, 1e-6)


def column_scaled(horizon: int, rho: float) -> BltMechanism:
    """The mechanism as it is without a shipped row fit."""
    real = blt_plan.row_fit
    blt_plan.row_fit = lambda h: None  # type: ignore[assignment]
    try:
        return BltMechanism(1.0, horizon, ZCDP(rho))
    finally:
        blt_plan.row_fit = real  # type: ignore[assignment]


def later_blocks(mech: BltMechanism, old: BltMechanism, horizon: int) -> str:
    cells = []
    for k in (1, 2, 16, 256):
        ts = np.arange(k * horizon + 1, (k + 1) * horizon + 1, 37 if horizon > 2500 else 1)
        new = np.array([mech.variance(int(t)) for t in ts])
        before = np.array([old.variance(int(t)) for t in ts])
        end = mech.variance((k + 1) * horizon) / old.variance((k + 1) * horizon)
        cells.append(f"{new.mean() / before.mean():.4f} / {new.max() / before.max():.4f} / "
                     f"{end:.4f}")
    return " | ".join(cells)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("horizons", type=int, nargs="+")
    ap.add_argument("--rho", type=float, default=0.5)
    a = ap.parse_args(argv)
    print(f"ρ = {a.rho:g} zCDP, p = 1, cap 1: mean variance over ticks 1..T / lower bound")
    print("| T | bound | column scales only | as built | row fit used | auto | rows kept at ρ = |")
    print("|---:|---:|---:|---:|---|---|---|")
    later = []
    for horizon in a.horizons:
        t0 = time.monotonic()
        bound = mean_mse_bound(horizon, 1.0, ZCDP(a.rho))
        mech = BltMechanism(1.0, horizon, ZCDP(a.rho))
        old = column_scaled(horizon, a.rho)
        built = float(mech.mse_curve(horizon).mean())
        before = float(old.mse_curve(horizon).mean())
        kept = [r for r in RHOS if BltMechanism(1.0, horizon, ZCDP(r)).rows is not None]
        auto = make_mechanism("auto", 1.0, horizon, ZCDP(a.rho)).name
        print(f"| {horizon} | {bound:.4f} | {before:.4f} = {before / bound:.4f}× | "
              f"{built:.4f} = **{built / bound:.4f}×** | {mech.rows is not None} | {auto} | "
              f"{', '.join(f'{r:g}' for r in kept) or '—'} |", flush=True)
        if mech.rows is not None:
            later.append((horizon, later_blocks(mech, old, horizon)))
        print(f"  ({time.monotonic() - t0:.1f} s)", file=sys.stderr)
    if later:
        print("\nPast the horizon, as built / column-scaled: mean / largest variance / last tick")
        print("| T | block 2 | block 3 | block 17 | block 257 |")
        print("|---:|---|---|---|---|")
        for horizon, row in later:
            print(f"| {horizon} | {row} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
