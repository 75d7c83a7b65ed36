"""CounterBank tick time vs a memory-bandwidth floor over the same state arrays.

For S streams and horizon T = 2**20 − 1 (20 Fenwick levels), times ``CounterBank.step`` (noise
included: exact discrete Laplace from the keyed AES generator) averaged over K consecutive ticks of a fresh
bank (best of 3 blocks) (the lowbit levels of K consecutive ticks have the same distribution as anywhere in the
epoch), and next to it, in the same run:

* ``floor_state``: one NumPy pass that reads and writes every state array of the bank
  (``np.multiply(a, 1.0, out=a)`` over S, R, carry and release) — the target's reference;
* ``floor_row``: one pass reading the counts and writing one state row (the least any tick
  can touch), for a stricter comparison;
* ``noise``: the keyed noise draw alone (one discrete Laplace sample per stream);
* ``tick cpu`` / ``floor cpu``: the same, as process CPU time (robust to other load).

Usage: python benchmarks/counter_bank.py [--streams 1000 100000 1000000] [--ticks 64]
       [--strategy dmfda] [--p 0.999]   (``--strategy all``: every registered strategy; zCDP-only
       strategies such as ``sqrt`` run under ρ = 0.5 with discrete Gaussian noise)
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.counters import CounterBank
from stream_dp.mechanism import Mechanism
from stream_dp.planner import make_mechanism
from stream_dp.strategies.registry import available, get

HORIZON = 2**20 - 1


def _best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    return _best2(fn, repeat)[0]


def _best2(fn, repeat: int, inner: int = 1) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Best wall-clock and best CPU (process) time of ``inner`` calls, over ``repeat`` runs."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(inner):
            fn()
        wall = min(wall, (time.perf_counter() - w0) / inner)
        cpu = min(cpu, (time.process_time() - c0) / inner)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--streams", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    ap.add_argument("--ticks", type=int, default=64)
    ap.add_argument("--strategy", nargs="+", default=["dmfda", "naive"])
    ap.add_argument("--p", type=float, default=0.999, help="decay per tick (default 0.999)")
    args = ap.parse_args()
    print(
        f"# CounterBank tick, T = 2**20 - 1, p = {args.p}, {args.ticks} ticks, "
        f"nproc={os.cpu_count()}, "
        f"{platform.processor() or platform.machine()}, numpy {np.__version__}"
    )
    print(
        f"{'strategy':<12}{'S':>10}{'tick ms':>10}{'noise ms':>10}{'floor_state ms':>16}"
        f"{'tick/floor':>12}{'floor_row ms':>14}{'tick/row':>10}{'state MB':>10}"
        f"{'B/stream':>10}{'tick cpu':>12}{'floor cpu':>12}{'cpu ratio':>10}"
    )
    strategies = list(available()) if args.strategy == ["all"] else args.strategy
    for strategy in strategies:
        privacy: Privacy = PureDP(1.0) if "pure" in get(strategy).models else ZCDP(0.5)
        mech = make_mechanism(strategy, args.p, HORIZON, privacy)
        for S in args.streams:
            print(_measure(strategy, mech, S, args.ticks), flush=True)


def _measure(strategy: str, mech: Mechanism, S: int, ticks: int) -> str:
    bank = CounterBank(mech, [f"stream-{i}" for i in range(S)], bytes(range(32)))
    counts = np.random.default_rng(0).poisson(2.0, S).astype(np.float64)
    bank.step(counts)  # warm-up (plans, caches)
    # best of 3 blocks of K ticks (shared, noisy machine); CPU time is robust to other load
    tick, tick_cpu = _best2(lambda: bank.step(counts), 3, ticks)
    arrays = [a for a in bank._state.values() if a.ndim >= 1]
    mb = sum(a.nbytes for a in arrays) / 2**20
    row = np.zeros(S)
    noise = bank._noise
    scale = (
        getattr(mech, "scale_units", None)
        or getattr(mech, "sigma_units", None)
        or getattr(mech, "leaf_scale", None)
        or mech.plan(mech.horizon).scale_units  # type: ignore[attr-defined]
    )
    gaussian = getattr(mech, "privacy", None) is not None and mech.privacy.model == "zcdp"  # type: ignore[attr-defined]
    node = [10**9]

    def floor_state() -> None:
        for a in arrays:
            np.multiply(a, 1, out=a)

    def floor_row() -> None:
        np.add(counts, row, out=row)

    def draw() -> None:
        node[0] += 1
        if gaussian:
            noise.discrete_gaussian(node[0], scale)
        else:
            noise.discrete_laplace(node[0], scale)

    rep = 5 if S <= 100_000 else 3
    (fs, fs_cpu), fr, nz = _best2(floor_state, rep), _best(floor_row, rep), _best(draw, rep)
    return (
        f"{strategy:<12}{S:>10}{tick * 1e3:>10.3f}{nz * 1e3:>10.3f}{fs * 1e3:>16.3f}"
        f"{tick / fs:>12.2f}{fr * 1e3:>14.3f}{tick / fr:>10.1f}{mb:>10.1f}"
        f"{mb * 2**20 / S:>10.0f}{tick_cpu * 1e3:>12.3f}{fs_cpu * 1e3:>12.3f}{tick_cpu / fs_cpu:>10.2f}"
    )


if __name__ == "__main__":
    main()
