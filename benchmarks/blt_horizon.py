"""``blt-horizon`` against ``blt``: each horizon's mean error (issue #36; analytic, exact).

For each ``(p, T)`` prints the mean per-release MSE of both strategies over ticks ``1..T``, the
next horizon ``T+1..2T`` and the third, their ratio, and the first horizon's ratio to the lower
bound of :mod:`stream_dp.lower_bound` (slack included, as ``stream-dp plan`` reports it).

Usage::

    python benchmarks/blt_horizon.py                       # ρ = 0.5, the docs' table
    python benchmarks/blt_horizon.py --rho 0.01 --cases 0.999:4095
"""

from __future__ import annotations

import argparse
import time

from stream_dp.budget import ZCDP
from stream_dp.lower_bound import mean_mse_bound
from stream_dp.strategies.registry import make

CASES = ("0.99:4095", "0.995:32767", "0.999:4095", "0.999:32767", "0.9999:4095", "0.9999:32767",
         "0.99999:65535", "0.5:15", "1:4095")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rho", type=float, default=0.5)
    ap.add_argument("--cases", nargs="*", default=list(CASES), help="p:horizon pairs")
    args = ap.parse_args()
    privacy = ZCDP(args.rho)
    print(f"{privacy}: mean MSE per horizon, blt-horizon / blt")
    print(f"{'p':>8}{'T':>7}{'table':>7}{'1..T':>10}{'T+1..2T':>10}{'2T+1..3T':>10}"
          f"{'blt/bound':>11}{'b-h/bound':>11}{'s':>6}")
    for case in args.cases:
        p_text, t_text = case.split(":")
        p, horizon = float(p_text), int(t_text)
        t0 = time.perf_counter()
        plain, planned = (make(name, p, horizon, privacy) for name in ("blt", "blt-horizon"))
        a, b = plain.mse_curve(3 * horizon), planned.mse_curve(3 * horizon)
        ratios = [float(b[k * horizon:(k + 1) * horizon].mean() / a[k * horizon:(k + 1) * horizon].mean())
                  for k in range(3)]
        bound = mean_mse_bound(horizon, p, privacy)
        print(f"{p:>8g}{horizon:>7}{'yes' if getattr(planned, 'first', False) else 'no':>7}"
              + "".join(f"{r:>10.5f}" for r in ratios)
              + f"{float(a[:horizon].mean()) / bound:>11.6f}{float(b[:horizon].mean()) / bound:>11.6f}"
              f"{time.perf_counter() - t0:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
