"""Numeric range of every registered strategy: ``Mechanism.max_count()`` per stream and tick.

Prints a Markdown table (one row per strategy and privacy model, one column per decay p) of the
largest per-tick count per stream, at cap 1, ε = 1 (pure) or ρ = 0.5 (zCDP), for each horizon
given. Issue #26 asks for ≥ 10^6 × cap everywhere (``tests/unit/test_numeric_range.py`` asserts
it for caps 1 and 1.9). Exact (no simulation); plans and fits are cached on disk.

Usage::

    python benchmarks/numeric_range.py                       # horizons 65535 and 2**20 - 1
    python benchmarks/numeric_range.py --horizon 4095
"""

from __future__ import annotations

import argparse

from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.planner import make_mechanism
from stream_dp.strategies.registry import available

PS = (0.1, 0.9, 0.99, 0.999, 0.9999, 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--horizon", type=int, action="append")
    ap.add_argument("--cap", type=float, default=1.0)
    args = ap.parse_args()
    horizons = args.horizon or [65_535, (1 << 20) - 1]
    models: tuple[tuple[str, Privacy], ...] = (("pure", PureDP(1.0)), ("zcdp", ZCDP(0.5)))
    for horizon in horizons:
        print(f"\nhorizon {horizon}, cap {args.cap:g}: max_count() per stream and tick\n")
        print("| strategy | model | " + " | ".join(f"p = {p:g}" for p in PS) + " | min / cap |")
        print("|---|---|" + "---|" * (len(PS) + 1))
        for model, privacy in models:
            for name in available(model, integer_counts=True):
                vals = [
                    make_mechanism(name, p, horizon, privacy, args.cap).max_count() for p in PS
                ]
                cells = " | ".join(f"{v:.3g}" for v in vals)
                print(f"| {name} | {model} | {cells} | {min(vals) / args.cap:.3g} |", flush=True)


if __name__ == "__main__":
    main()
