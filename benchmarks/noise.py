"""Throughput of the secure noise: AES-256 PRF blocks vs the exact discrete samplers.

Prints one markdown table row per case, for one call drawing one sample per stream (what a
``CounterBank`` tick needs per measured node). Times are the minimum over ``--reps`` calls, as
wall-clock and as process CPU time (the CPU time is robust to other load on a shared machine).
``ratio`` = CPU time / CPU time of one PRF block per stream, measured in the same run. The last
row is NumPy's floating-point Laplace sampler (insecure, never used in the release path), for
scale only.

Usage::

    python benchmarks/noise.py [--streams 1000000] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable

import numpy as np

from stream_dp.noise.gaussian import gaussian_core
from stream_dp.noise.keyed import KeyedNoise
from stream_dp.noise.laplace import discrete_laplace_params, laplace_core


def _time(fn: Callable[[int], object], reps: int) -> tuple[float, float]:
    fn(10_000)  # warm-up (allocations, per-scale tables)
    walls, cpus = [], []
    for r in range(reps):
        w0, c0 = time.perf_counter(), time.process_time()
        fn(r)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return min(walls), min(cpus)


def _blocks_per_sample(noise: KeyedNoise, kind: str, param: float, n: int) -> float:
    source = noise._source(kind, param, 99_999)
    ids = noise.stream_ids[:n]
    start = np.zeros(n, dtype=np.uint64)
    if kind == "laplace":
        _, after = laplace_core(source, ids, start, *discrete_laplace_params(param))
    else:
        _, after = gaussian_core(source, ids, start, param)
    return float(after.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    n = args.streams
    noise = KeyedNoise(os.urandom(32), "benchmark", np.arange(n, dtype=np.uint64))
    ids = noise.stream_ids
    zeros = np.zeros(n, dtype=np.uint64)

    print(f"# secure noise throughput, {n:,} streams, min of {args.reps} calls")
    print(f"# machine: nproc={os.cpu_count()}, {platform.processor() or platform.machine()}")
    print()
    print("| case | blocks/sample | wall ms | CPU ms | samples/s (CPU) | ratio to AES |")
    print("|---|---:|---:|---:|---:|---:|")
    aes_wall, aes_cpu = _time(lambda r: noise.prf.blocks(ids, r, zeros), args.reps)
    print(
        f"| AES-256 PRF, 1 block/stream | 1 | {aes_wall * 1e3:.1f} | {aes_cpu * 1e3:.1f} "
        f"| {n / aes_cpu:,.0f} | 1.0 |"
    )
    cases: list[tuple[str, str, float]] = [
        ("discrete Laplace, scale 1", "laplace", 1.0),
        ("discrete Laplace, scale 1000", "laplace", 1000.0),
        ("discrete Laplace, scale 2^40", "laplace", 2.0**40),
        ("discrete Gaussian, σ 3", "gaussian", 3.0),
        ("discrete Gaussian, σ 1000", "gaussian", 1000.0),
        ("discrete Gaussian, σ 2^40", "gaussian", 2.0**40),
    ]
    for label, kind, param in cases:
        if kind == "laplace":
            fn: Callable[[int], object] = lambda r, p=param: noise.discrete_laplace(r, p)  # noqa: E731
        else:
            fn = lambda r, p=param: noise.discrete_gaussian(r, p)  # noqa: E731
        wall, cpu = _time(fn, args.reps)
        bps = _blocks_per_sample(noise, kind, param, min(n, 200_000))
        print(
            f"| {label} | {bps:.2f} | {wall * 1e3:.1f} | {cpu * 1e3:.1f} "
            f"| {n / cpu:,.0f} | {cpu / aes_cpu:.1f} |"
        )
    rng = np.random.default_rng()
    wall, cpu = _time(lambda r: rng.laplace(0.0, 1000.0, size=n), args.reps)
    print(
        f"| (insecure reference) numpy float Laplace | – | {wall * 1e3:.1f} | {cpu * 1e3:.1f} "
        f"| {n / cpu:,.0f} | {cpu / aes_cpu:.1f} |"
    )


if __name__ == "__main__":
    main()
