"""``blt-horizon`` against ``blt``: each horizon's mean error (issue #36; analytic, exact).

For each ``(p, T)`` prints the ratio of both strategies' mean per-release MSE over ticks
``1..T`` and over each of the next ``--horizons − 1`` horizons, the worst tick of ``1..2T``
against ``blt``'s worst, the run length (in horizons) past which ``blt-horizon``'s mean over the
whole run is no longer lower (its break-even), and the first horizon's ratio to the lower bound
of :mod:`stream_dp.lower_bound` (slack included, as ``stream-dp plan`` reports it).

Usage::

    python benchmarks/blt_horizon.py                       # ρ = 0.5, the docs' table
    python benchmarks/blt_horizon.py --rho 0.01 --cases 0.999:4095
"""

from __future__ import annotations

import argparse
import time

import numpy as np

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
    ap.add_argument("--horizons", type=int, default=6, help="horizons to follow (default 6)")
    args = ap.parse_args()
    privacy = ZCDP(args.rho)
    k_max = max(2, args.horizons)
    print(f"{privacy}: mean MSE per horizon, blt-horizon / blt")
    print(f"{'p':>8}{'T':>7}{'table':>6}" + "".join(f"{'h' + str(k + 1):>9}" for k in range(k_max))
          + f"{'worst≤2T':>9}{'even':>8}{'blt/bound':>11}{'b-h/bound':>11}{'s':>6}")
    for case in args.cases:
        p_text, t_text = case.split(":")
        p, horizon = float(p_text), int(t_text)
        t0 = time.perf_counter()
        plain, planned = (make(name, p, horizon, privacy) for name in ("blt", "blt-horizon"))
        n = k_max * horizon
        a, b = plain.mse_curve(n), planned.mse_curve(n)
        ratios = [float(b[k * horizon:(k + 1) * horizon].mean() / a[k * horizon:(k + 1) * horizon].mean())
                  for k in range(k_max)]
        worst = float(b[:2 * horizon].max() / a[:2 * horizon].max())
        # the run length where the running means cross: Σ_(t≤n) b ≥ Σ_(t≤n) a from then on
        diff = np.cumsum(b - a)
        later = np.flatnonzero(diff[horizon:] >= 0.0)
        even = (f"{(horizon + int(later[0]) + 1) / horizon:.3f}" if later.size else f">{k_max}")
        bound = mean_mse_bound(horizon, p, privacy)
        print(f"{p:>8g}{horizon:>7}{'yes' if getattr(planned, 'first', False) else 'no':>6}"
              + "".join(f"{r:>9.5f}" for r in ratios)
              + f"{worst:>9.4f}{even:>8}"
              f"{float(a[:horizon].mean()) / bound:>11.6f}{float(b[:horizon].mean()) / bound:>11.6f}"
              f"{time.perf_counter() - t0:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
