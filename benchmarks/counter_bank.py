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
* ``tick cpu`` / ``floor cpu``: the same, as process CPU time (robust to other load);
* ``AES blk/tick``: the 16-byte AES blocks one tick really encrypts (counted at
  :meth:`stream_dp.noise.prf.BlockPRF.blocks` over the timed ticks: every sample's bytes,
  refinements included), and ``floor2 cpu``: issue #35's floor of the same work, the keyed
  noise itself (those blocks × the CPU time of one AES-256 block, measured here on one big
  buffer) plus one pass over the state (``floor cpu``); ``tick/floor2`` is the target's ratio
  (≤ 2).

Usage: python benchmarks/counter_bank.py [--streams 1000 100000 1000000] [--ticks 64]
       [--strategy dmfda] [--p 0.999] [--horizon 1048575]   (``--strategy all``: every registered strategy; zCDP-only
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
    ap.add_argument("--horizon", type=int, default=HORIZON,
                    help=f"ticks per epoch the strategies are planned for (default {HORIZON})")
    args = ap.parse_args()
    aes = _aes_block_cpu()
    print(
        f"# CounterBank tick, T = {args.horizon}, p = {args.p}, {args.ticks} ticks, "
        f"AES-256 {aes * 1e9:.2f} ns CPU per 16-byte block, "
        f"nproc={os.cpu_count()}, "
        f"{platform.processor() or platform.machine()}, numpy {np.__version__}"
    )
    print(
        f"{'strategy':<12}{'S':>10}{'tick ms':>10}{'noise ms':>10}{'floor_state ms':>16}"
        f"{'tick/floor':>12}{'floor_row ms':>14}{'tick/row':>10}{'state MB':>10}"
        f"{'B/stream':>10}{'tick cpu':>12}{'floor cpu':>12}{'cpu ratio':>10}"
        f"{'AES blk/tick':>14}{'floor2 cpu':>12}{'tick/floor2':>12}"
    )
    strategies = list(available()) if args.strategy == ["all"] else args.strategy
    for strategy in strategies:
        privacy: Privacy = PureDP(1.0) if "pure" in get(strategy).models else ZCDP(0.5)
        mech = make_mechanism(strategy, args.p, args.horizon, privacy)
        for S in args.streams:
            print(_measure(strategy, mech, S, args.ticks, aes), flush=True)


def _aes_block_cpu(blocks: int = 1 << 20) -> float:
    """CPU seconds per 16-byte AES-256 block, encrypted in one buffer the way
    :class:`stream_dp.noise.prf.BlockPRF` does (ECB ``update_into``): best of 5."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    enc = Cipher(algorithms.AES(bytes(range(32))), modes.ECB()).encryptor()
    src, dst = bytearray(16 * blocks), bytearray(16 * blocks + 16)

    def run() -> None:
        enc.update_into(src, dst)

    return _best2(run, 5)[1] / blocks


class _BlockCount:
    """Counts the blocks :meth:`BlockPRF.blocks` encrypts while installed."""

    def __init__(self) -> None:
        from stream_dp.noise.prf import BlockPRF

        self.n = 0
        self._cls, self._orig = BlockPRF, BlockPRF.blocks

        def counting(prf, ids, node, counters, out=None):  # type: ignore[no-untyped-def]
            self.n += int(np.asarray(ids).shape[0])
            return self._orig(prf, ids, node, counters, out)

        self._counting = counting

    def __enter__(self) -> _BlockCount:
        self._cls.blocks = self._counting  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self._cls.blocks = self._orig  # type: ignore[method-assign]


def _measure(strategy: str, mech: Mechanism, S: int, ticks: int, aes: float) -> str:
    bank = CounterBank(mech, [f"stream-{i}" for i in range(S)], bytes(range(32)))
    counts = np.random.default_rng(0).poisson(2.0, S).astype(np.float64)
    bank.step(counts)  # warm-up (plans, caches)
    # best of 3 blocks of K ticks (shared, noisy machine); CPU time is robust to other load
    tick, tick_cpu = _best2(lambda: bank.step(counts), 3, ticks)
    # the blocks of the same number of further ticks (a counting wrapper: not in the timing)
    with _BlockCount() as counted:
        for _ in range(ticks):
            bank.step(counts)
    blocks = counted.n / ticks
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
    floor2 = blocks * aes + fs_cpu
    return (
        f"{strategy:<12}{S:>10}{tick * 1e3:>10.3f}{nz * 1e3:>10.3f}{fs * 1e3:>16.3f}"
        f"{tick / fs:>12.2f}{fr * 1e3:>14.3f}{tick / fr:>10.1f}{mb:>10.1f}"
        f"{mb * 2**20 / S:>10.0f}{tick_cpu * 1e3:>12.3f}{fs_cpu * 1e3:>12.3f}{tick_cpu / fs_cpu:>10.2f}"
        f"{blocks:>14.0f}{floor2 * 1e3:>12.3f}{tick_cpu / floor2:>12.2f}"
    )


if __name__ == "__main__":
    main()
