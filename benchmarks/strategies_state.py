"""State bytes per stream and CounterBank tick time for every strategy, at many streams.

For each (strategy, privacy model) the script builds a real :class:`CounterBank` (KeyedNoise,
exact discrete samplers) with S streams, runs a few warm-up ticks and times ``step`` over the
next ticks (median), next to one NumPy pass (``buf += 1.0``) over a buffer of the same size as the per-stream state:
the memory-bandwidth floor of a tick.

Usage::

    python benchmarks/strategies_state.py                    # S = 10^6, p = 0.99, T = 32767
    python benchmarks/strategies_state.py --streams 100000 --ticks 8
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.counters import CounterBank
from stream_dp.planner import make_mechanism
from stream_dp.strategies.registry import available


def bench(
    name: str, privacy: Privacy, p: float, horizon: int, names: list[str], ticks: int
) -> None:
    mech = make_mechanism(name, p, horizon, privacy)
    bank = CounterBank(mech, names, b"benchmark-key-not-secret-" * 2)
    s = len(names)
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 4, size=s).astype(np.float64)
    for _ in range(3):
        bank.step(counts)
    times = []
    for _ in range(ticks):
        t0 = time.perf_counter()
        bank.step(counts)
        times.append(time.perf_counter() - t0)
    state = bank._state  # benchmark only: measure the arrays the bank holds
    per_stream = [a for a in state.values() if a.ndim >= 1 and a.shape[-1] == s]
    nbytes = sum(a.nbytes for a in per_stream)
    buf = np.zeros(nbytes // 8, dtype=np.float64)  # same bytes as the per-stream state
    buf += 1.0  # touch every page once
    floor = []
    for _ in range(5):
        t0 = time.perf_counter()
        buf += 1.0  # one read + write pass over that memory
        floor.append(time.perf_counter() - t0)
    del buf
    extra = getattr(mech, "taps", None) or getattr(mech, "levels", None)
    med = statistics.median(times)
    fl = statistics.median(floor)
    print(
        f"{name:<12}{privacy.model:<6}{nbytes / s:>10.0f}{med * 1e3:>12.1f}{fl * 1e3:>12.1f}"
        f"{med / fl:>9.1f}   {extra!s}"
    )
    del bank, state, per_stream
    gc.collect()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--streams", type=int, default=1_000_000)
    ap.add_argument("--ticks", type=int, default=8)
    ap.add_argument("--p", type=float, default=0.99)
    ap.add_argument("--horizon", type=int, default=32767)
    ap.add_argument("--only", nargs="*", default=None, help="strategy names (default: all)")
    args = ap.parse_args()
    names = [f"s{i}" for i in range(args.streams)]
    print(
        f"S = {args.streams} streams, p = {args.p}, horizon = {args.horizon}, median of {args.ticks} ticks"
    )
    print(
        f"{'strategy':<12}{'model':<6}{'B/stream':>10}{'tick ms':>12}{'floor ms':>12}{'ratio':>9}   structure"
    )
    for model, privacy in (("pure", PureDP(1.0)), ("zcdp", ZCDP(0.5))):
        for name in available(model):
            if args.only and name not in args.only:
                continue
            bench(name, privacy, args.p, args.horizon, names, args.ticks)


if __name__ == "__main__":
    main()
