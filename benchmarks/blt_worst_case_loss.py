"""Worst-case privacy loss of one event in ``blt`` at p = 1 (ρ-zCDP), by block position, from
first principles (adversarial review; no broker, no noise drawn).

For an event at block position ``s`` the loss is ``d_s²D² + Σ_(t>s) d_t²·(⌊|c_(t−s)|·d_s·D/d_t +
2E/d_t⌋ + 1)²`` over ``2σ²``: tick ``t`` draws scale ``σ/d_t`` (the mechanism's table), its
integer mean moves by at most the floor plus one (every rounding the wrong way), ``c_k`` are
summed from powers (not the plan's closed forms), ``D = cap/h + 1`` units and ``E`` the
mechanism's float-error bound. Prints, per ``(horizon, ρ, cap)``, the worst loss over the first
and last 200 positions and a spread of ``--spread`` others (default 2 000; every position for
T ≤ 2 400) in units of ρ, where it is reached, and the table's and slack's figures.
``--budgets`` limits the ``(ρ, cap)`` pairs to the first N of
(0.5, 1), (0.5, 1.9), (1e-4, 1), (1e4, 3.3).

    python benchmarks/blt_worst_case_loss.py 1023 65535
    python benchmarks/blt_worst_case_loss.py --spread 200 --budgets 2 1048575
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from stream_dp.budget import ZCDP
from stream_dp.strategies.blt.mechanism import BltMechanism


def worst_case(horizon: int, rho: float, cap: float, spread: int = 2000) -> dict[str, float]:
    """The worst loss over the sampled positions (units of ρ) and the mechanism's figures."""
    t0 = time.process_time()
    mech = BltMechanism(1.0, horizon, ZCDP(rho), cap)
    assert mech.scales is not None
    th, w, d = mech.theta, mech.w, mech.scales
    k = np.arange(horizon - 1, dtype=np.float64)
    c = np.concatenate(([1.0], (w[None, :] * np.exp(k[:, None] * np.log(th)[None, :])).sum(axis=1)))
    dd, e2, sigma = mech.d_units, 2.0 * mech.float_error, mech.sigma_units
    positions = sorted(set(range(min(200, horizon))) | set(range(max(0, horizon - 200), horizon))
                       | set(np.linspace(0, horizon - 1, spread).astype(int).tolist()))
    worst, where = 0.0, -1
    for s in positions:
        dt = d[s + 1:]
        shift = np.floor(np.abs(c[1:horizon - s]) * d[s] * dd / dt + e2 / dt) + 1.0
        loss = ((d[s] * dd) ** 2 + math.fsum(((dt * shift) ** 2).tolist())) / (2.0 * sigma**2)
        if loss > worst:
            worst, where = loss, s
    return {"horizon": horizon, "rho": rho, "cap": cap, "buffers": len(th),
            "d_max": float(d[-1]), "float_error_units": mech.float_error,
            "slack_units": mech.slack_units, "worst_loss_over_rho": worst / rho,
            "at_position": where, "max_count_over_cap": mech.max_count() / cap,
            "cpu_s": round(time.process_time() - t0, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("horizons", type=int, nargs="*", default=[1023])
    parser.add_argument("--spread", type=int, default=2000)
    parser.add_argument("--budgets", type=int, default=4)
    args = parser.parse_args()
    budgets = ((0.5, 1.0), (0.5, 1.9), (1e-4, 1.0), (1e4, 3.3))[: args.budgets]
    for horizon in args.horizons:
        for rho, cap in budgets:
            print(worst_case(horizon, rho, cap, args.spread), flush=True)


if __name__ == "__main__":
    main()
