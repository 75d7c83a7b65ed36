"""``tree-ls`` under pure ε-DP: the exact privacy loss of one event at the scales the mechanism
really computes (adversarial review). Exact (rational arithmetic), no simulation.

For each ``p, horizon, cap`` the planner's mechanism is built; the largest change one event of
weight ``≤ cap`` makes to a rounded count is ``Δq = cap/g + 1`` for an odd integer ``cap/g``,
``cap/g`` for an even one and ``⌈cap/g⌉`` otherwise (rounding half to even). The event touches
its leaf (``Δq``), one node per level (at most ``2**12·Δq``: the last tick of a node), and at
``p = 1`` from epoch 1 on one super node per level (``Δq``). Printed: the worst ``Σ Δ/b − ε`` over
the share vectors of epoch 0 (the schedule's blocks), and over epochs 1..7 (nested levels at
their budget plus the epoch's super levels), as an exact rational shown as a float.

Usage::

    python benchmarks/ls_tree_exact_privacy.py 0.9,65535,1.0 1.0,65535,0x1.000008p+0

(``cap`` as a decimal or a C99 hex float; ``0x1.000008p+0`` = ``1 + 2**-21``, an odd multiple
of the ε = 1 grid ``2**-21``.)
"""

from __future__ import annotations

import math
import sys
import time
from fractions import Fraction

from stream_dp.budget import PureDP
from stream_dp.strategies.ls_tree.mechanism import LsTreeMechanism
from stream_dp.strategies.ls_tree.plan import COEFF_BITS


def largest_change(cap: float, grid: float) -> Fraction:
    """``max rint((D + w)/g) − rint(D/g)`` over ``D`` and ``0 ≤ w ≤ cap`` (grid units)."""
    c = Fraction(cap) / Fraction(grid)
    if c.denominator == 1:
        return c + 1 if c.numerator % 2 == 1 else c
    return Fraction(math.ceil(c))


def tree_loss(dq: Fraction, scales: tuple[float, ...]) -> Fraction:
    """``Σ Δ_ℓ/b_ℓ``: the leaf moves by ``dq``, one node per level by at most ``2**F·dq``."""
    return sum((dq * (1 if ell == 0 else 1 << COEFF_BITS) / Fraction(s)
                for ell, s in enumerate(scales)), Fraction(0))


def main(argv: list[str]) -> None:
    for arg in argv or ["0.9,65535,1.0"]:
        p_s, t_s, cap_s = arg.split(",")
        p, horizon = float(p_s), int(t_s)
        cap = float.fromhex(cap_s) if cap_s.startswith("0x") else float(cap_s)
        start = time.perf_counter()
        mech = LsTreeMechanism(p, horizon, PureDP(1.0), cap)
        eps = Fraction(mech.budget)
        dq = largest_change(cap, mech.grid)
        vectors = {mech.plan.shares, *mech.plan.schedule}
        epoch0 = max(tree_loss(dq, mech._profiles[v][0]) for v in vectors)
        later = Fraction(0)
        if mech.super:
            nested = tree_loss(dq, mech.scales1)
            for e in range(1, 8):
                en = mech.epoch_noise(mech.first_blocks << e)
                later = max(later, nested + sum((dq / Fraction(s) for s in en.scales),
                                                Fraction(0)))
        print(f"p={p} T={horizon} cap={cap!r} grid={mech.grid!r} "
              f"cap/g={Fraction(cap) / Fraction(mech.grid)} dq={dq} "
              f"slack={mech.slack_units!r} levels={mech.plan.levels} "
              f"schedule={len(mech.plan.schedule)} epoch0 loss-eps={float(epoch0 - eps):.3e}"
              + (f" epochs1-7 loss-eps={float(later - eps):.3e}" if mech.super else "")
              + f" over={max(epoch0, later) > eps} ({time.perf_counter() - start:.1f} s)",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
