"""CPU of the compact encoders at 10^6 streams (issue #25): ``encode_block`` for 4 shards of
250 000 streams (one tick's compact records) and ``encode_histogram`` for 1 001 011 nodes (one
tick's histogram chunks). No broker. Prints the median process CPU of 15 calls, in ms.

    python benchmarks/compact_encode.py

Run it with ``PYTHONPATH`` pointing at another tree to compare two versions side by side.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

import stream_dp
from stream_dp.compact import encode_block
from stream_dp.compact_histograms import encode_histogram


def _median_ms(fn: Callable[[], object], reps: int = 15) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return 1e3 * sorted(times)[reps // 2]


def main() -> None:
    rng = np.random.default_rng(1)
    v, e = rng.normal(size=250_000), np.full(250_000, 3.0)
    hv, hn, he = (rng.normal(size=1_001_011) for _ in range(3))

    def blocks() -> None:
        for k in range(4):
            encode_block(shard=f"shard-{k}", tick=5, tick_start=0.0, tick_end=10.0, epoch=0,
                         strategy="tree", p=1.0, privacy={"model": "zcdp", "rho": 0.5}, cap=1.0,
                         horizon=100, manifest="ab" * 32, values=v, stderr=e)

    def hist() -> None:
        encode_histogram(domain="d", tick=5, tick_end=10.0, values=hv, noisy=hn, stderr=he,
                         manifest="cd" * 32)

    where = stream_dp.__file__.rsplit("/", 2)[0]
    print(f"{where}: 4 compact records {_median_ms(blocks):.1f} ms, "
          f"histogram chunks {_median_ms(hist):.1f} ms CPU (median of 15)")


if __name__ == "__main__":
    main()
