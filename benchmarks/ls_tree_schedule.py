"""``tree-ls`` at ``p = 1``: what each top block inside the horizon costs, with the plan's uniform
shares and with the per-block schedule (issue #26). Exact (closed form, no simulation).

Prints, per top block ``k`` inside the horizon: its ticks inside the horizon, the ticks after it
that carry its end-of-block estimate, its top-level share, its own mean variance and its
end-of-block variance, and its contribution to the mean over ticks ``1..T``; then the value of
the top share for the last block (which no tick of the horizon carries) and the variance past
the horizon (``Mechanism.variance``).

Usage::

    python benchmarks/ls_tree_schedule.py                     # ε = 1, T = 32767
    python benchmarks/ls_tree_schedule.py --horizon 65535
"""

from __future__ import annotations

import argparse

import numpy as np

from stream_dp.budget import PureDP
from stream_dp.strategies.ls_tree.mechanism import LsTreeMechanism
from stream_dp.strategies.ls_tree.plan import LsPlan, block_part


def table(mech: LsTreeMechanism, label: str) -> None:
    horizon, b, g2 = mech.horizon, mech.block, mech.grid**2
    plan = mech.plan
    print(f"\n{label}: levels {plan.levels}, shapes {plan.level_shapes}")
    print(f"{'k':>3}{'inside':>8}{'later':>8}{'top share':>10}{'own mean':>10}{'end var':>9}"
          f"{'share of mean':>14}")
    total = 0.0
    for k in range(mech.first_blocks):
        shares = plan.shares_of(k)
        part = g2 * block_part(1.0, plan.levels, mech.model, mech.budget, shares,
                               mech.slack_units, plan.shapes)
        inside = min(b, horizon - k * b)
        later = max(0, horizon - (k + 1) * b)
        contrib = (float(part[:inside].sum()) + later * float(part[-1])) / horizon
        total += contrib
        print(f"{k:>3}{inside:>8}{later:>8}{shares[-1]:>10.3f}{part[:inside].mean():>10.2f}"
              f"{part[-1]:>9.2f}{contrib:>14.2f}")
    curve = mech.mse_curve(horizon)
    print(f"mean over 1..T: {total:.3f} (mse_curve: {curve.mean():.3f})")
    for mult in (1, 16, 256):
        print(f"  variance at t = {mult}T: {mech.variance(mult * horizon):.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--horizon", type=int, default=32767)
    ap.add_argument("--epsilon", type=float, default=1.0)
    args = ap.parse_args()
    privacy = PureDP(args.epsilon)
    planned = LsTreeMechanism(1.0, args.horizon, privacy)
    uniform = LsTreeMechanism(1.0, args.horizon, privacy,
                              plan=LsPlan(planned.plan.levels, planned.plan.shares, (),
                                          planned.plan.shapes))
    table(uniform, "uniform shares (before)")
    table(planned, "planned (schedule)" if planned.plan.schedule else "planned (no schedule)")
    # the last block: its top node completes after the horizon (if T + 1 is a multiple of B)
    # but its residual still informs the non-causal decoder: its in-horizon cost by top share
    k = planned.first_blocks - 1
    inside = min(planned.block, args.horizon - k * planned.block)
    top = planned.plan.shares[-1]
    print(f"\nlast block (k = {k}, {inside} ticks inside): own mean variance by top share a "
          "(lower levels keep their ratios)")
    for a in (0.01, 0.04, 0.08, 0.12, 0.16, 0.2, planned.plan.shares[-1]):
        vec = (*(x * (1.0 - a) / (1.0 - top) for x in planned.plan.shares[:-1]), a)
        part = planned.grid**2 * block_part(1.0, planned.plan.levels, planned.model,
                                            planned.budget, vec, planned.slack_units,
                                            planned.plan.shapes)
        print(f"  a = {a:.2f}: {float(np.mean(part[:inside])):.2f}")


if __name__ == "__main__":
    main()
