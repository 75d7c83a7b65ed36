"""Subscribe to stream-dp's releases from your own code: a plain aiokafka consumer.

Prints every stream's newest release (value ± standard error) as ticks come in, de-duplicated
by (stream, tick) — every copy of a (stream, tick) is bit-identical, so the first one wins.

    STREAM_DP_BOOTSTRAP=127.0.0.1:9092 python examples/subscribe.py --prefix www/ --ticks 3

TLS / SASL: the same STREAM_DP_SECURITY_PROTOCOL, STREAM_DP_SSL_* and STREAM_DP_SASL_*
variables as the service (agents.security).
"""

from __future__ import annotations

import argparse
import asyncio
import os

from aiokafka import AIOKafkaConsumer

from agents.security import client_kwargs
from stream_dp.releases import LatestReleases, decode_count


async def main(prefix: str, ticks: int, from_beginning: bool) -> None:
    consumer = AIOKafkaConsumer(
        os.environ.get("STREAM_DP_COUNTS_TOPIC", "dp.counts.v1"),
        bootstrap_servers=os.environ.get("STREAM_DP_BOOTSTRAP", "127.0.0.1:9092"),
        group_id=None, enable_auto_commit=False, isolation_level="read_committed",
        auto_offset_reset="earliest" if from_beginning else "latest", **client_kwargs(),
    )
    await consumer.start()
    latest = LatestReleases()
    shown: set[int] = set()
    try:
        async for msg in consumer:
            r = decode_count(msg.value)
            if not r.stream.startswith(prefix) or not latest.add(r):
                continue
            print(f"tick {r.tick:>6}  {r.stream:<30} {r.value:12.2f} ± {r.stderr:.2f}", flush=True)
            shown.add(r.tick)
            if ticks and len(shown) > ticks:
                break
    finally:
        await consumer.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default="", help="only streams whose name starts with this")
    ap.add_argument("--ticks", type=int, default=0, help="stop after this many ticks (0: never)")
    ap.add_argument("--from-beginning", action="store_true", help="read the retained topic")
    a = ap.parse_args()
    asyncio.run(main(a.prefix, a.ticks, a.from_beginning))
