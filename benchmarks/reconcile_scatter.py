"""CPU of the reconcile agent's scatter of one tick's compact records into domain order
(``BlockAssembler.pop_complete``) at 10^6 streams: 4 shards of 250 000 streams, every stream a
node of the domain. No broker. Prints the median process CPU of 15 ticks, in ms.

    python benchmarks/reconcile_scatter.py

Run it with ``PYTHONPATH`` pointing at another tree to compare two versions side by side.
"""

from __future__ import annotations

import time

import numpy as np

import agents
from agents.reconcile.tables import BlockAssembler
from stream_dp.compact import Manifest, decode_block, encode_block, manifest_hash


def main() -> None:
    names = [f"n{i}" for i in range(1_000_000)]
    split = [names[k::4] for k in range(4)]
    manifests = {manifest_hash(s): Manifest(f"shard-{k}", tuple(s), manifest_hash(s))
                 for k, s in enumerate(split)}
    rng = np.random.default_rng(1)
    times = []
    asm = BlockAssembler(names, shards=4)
    asm.set_manifests(manifests)
    for tick in range(1, 16):
        for k, s in enumerate(split):
            rec = encode_block(shard=f"shard-{k}", tick=tick, tick_start=tick - 1.0,
                               tick_end=float(tick), epoch=0, strategy="tree", p=1.0,
                               privacy={"model": "zcdp", "rho": 1.0}, cap=1.0, horizon=64,
                               manifest=manifest_hash(s), values=rng.normal(size=len(s)),
                               stderr=np.ones(len(s)))
            asm.add_block(k, tick, decode_block(rec))
        t0 = time.process_time()
        done = asm.pop_complete()
        times.append(time.process_time() - t0)
        assert len(done) == 1
    where = agents.__file__.rsplit("/", 2)[0]
    print(f"{where}: scatter of one tick {1e3 * sorted(times)[7]:.1f} ms CPU (median of 15)")


if __name__ == "__main__":
    main()
