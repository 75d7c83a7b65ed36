"""Live event traffic for the scale benchmark (a subprocess: its CPU is not the worker's).

Every ``tick_seconds`` (aligned to ``origin``), one event (value 1) for each of a fresh random
``active`` fraction of the leaves, spread over the first half of the tick, record timestamp =
send time (the clock schedule reads event time from it).

    python benchmarks/_live_events.py BOOTSTRAP TOPIC LEAVES_FILE ORIGIN TICK_SECONDS ACTIVE
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import numpy as np
from aiokafka import AIOKafkaProducer


async def main(bootstrap: str, topic: str, leaves_file: str, origin: float, tick: float,
               active: float) -> None:
    with open(leaves_file, encoding="utf-8") as fh:
        leaves = [line for line in fh.read().splitlines() if line]
    keys = [leaf.encode() for leaf in leaves]
    rng = np.random.default_rng(1)
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20,
                            max_request_size=1 << 22)
    await prod.start()
    await prod.partitions_for(topic)  # metadata for _partition below
    part_of: dict[int, int] = {}  # leaf -> partition, as the default partitioner hashes its key
    try:
        while True:
            now = time.time()
            n = int((now - origin) // tick)
            start = origin + n * tick
            chosen = rng.choice(len(leaves), int(active * len(leaves)), replace=False)
            slices = 10
            for part in np.array_split(chosen, slices):
                ts = time.time()
                ms = int(ts * 1000)
                # whole record batches per partition (not one send per record): this process
                # must keep up with 10^5 events per tick on a loaded machine, or its events
                # arrive after their tick closed and the worker dead-letters them
                batches: dict[int, Any] = {}
                futs = []
                for i in part.tolist():
                    p = part_of.get(i)
                    if p is None:
                        p = part_of[i] = prod._partition(topic, None, None, None, keys[i], None)
                    batch = batches.get(p)
                    if batch is None:
                        batch = batches[p] = prod.create_batch()
                    value = json.dumps({"key": leaves[i], "ts": ts}).encode()
                    if batch.append(key=keys[i], value=value, timestamp=ms) is None:
                        futs.append(await prod.send_batch(batch, topic, partition=p))
                        batch = batches[p] = prod.create_batch()
                        batch.append(key=keys[i], value=value, timestamp=ms)
                for p, batch in batches.items():
                    futs.append(await prod.send_batch(batch, topic, partition=p))
                await asyncio.gather(*futs)
                await asyncio.sleep(max(0.0, start + tick / 2 / slices - time.time()))
                start += tick / 2 / slices
            await asyncio.sleep(max(0.0, origin + (n + 1) * tick + 0.01 - time.time()))
    finally:
        await prod.stop()


if __name__ == "__main__":
    b, t, f, o, s, a = sys.argv[1:7]
    asyncio.run(main(b, t, f, float(o), float(s), float(a)))
