"""Subscribe to stream-dp's releases from your own code: a plain aiokafka consumer.

Prints every stream's newest release (value ± standard error) as ticks come in, de-duplicated
by (stream, tick) — every copy of a (stream, tick) is bit-identical, so the first one wins.
``--ticks N`` prints the first N ticks it sees, every stream of each, then stops; with
``--from-beginning`` those are ticks 1..N. Run it from the repository root (it imports
``agents`` and ``stream_dp``), or anywhere once the package is installed.

    STREAM_DP_BOOTSTRAP=127.0.0.1:9092 python examples/subscribe.py --prefix www/ --ticks 3

TLS / SASL: the same STREAM_DP_SECURITY_PROTOCOL, STREAM_DP_SSL_* and STREAM_DP_SASL_*
variables as the service (agents.config.security).
"""

from __future__ import annotations

import argparse
import asyncio
import os

from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.config.security import client_kwargs
from stream_dp.releases import LatestReleases, decode_count


async def main(prefix: str, ticks: int, from_beginning: bool) -> None:
    topic = os.environ.get("STREAM_DP_COUNTS_TOPIC", "dp.counts.v1")
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=os.environ.get("STREAM_DP_BOOTSTRAP", "127.0.0.1:9092"),
        group_id=None, enable_auto_commit=False, isolation_level="read_committed",
        auto_offset_reset="earliest" if from_beginning else "latest", **client_kwargs(),
    )
    await consumer.start()
    latest = LatestReleases()
    loop = asyncio.get_running_loop()
    # --ticks N: the first N ticks seen (every stream of them), then stop once every partition
    # has moved past them (or sits at its end, or nothing of them came for 3 s): partitions
    # deliver independently, so one partition's streams may be ticks ahead of another's
    first: int | None = None
    passed: set[int] = set()
    last_in_window = loop.time()
    ends: dict[TopicPartition, int] = {}
    try:
        if from_beginning and ticks:
            await consumer.topics()
            tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
            ends = await consumer.end_offsets(tps)
        while True:
            batch = await consumer.getmany(timeout_ms=500)
            for tp, msgs in batch.items():
                for msg in msgs:
                    try:
                        r = decode_count(msg.value)
                    except ValueError as exc:  # e.g. the tables of a binary-attribute domain
                        raise SystemExit(f"{os.path.basename(__file__)}: {exc}") from None
                    first = r.tick if first is None else first
                    if ticks and r.tick >= first + ticks:
                        passed.add(tp.partition)
                        continue
                    last_in_window = loop.time()
                    if not r.stream.startswith(prefix) or not latest.add(r):
                        continue
                    print(f"tick {r.tick:>6}  {r.stream:<30} {r.value:12.2f} ± {r.stderr:.2f}",
                          flush=True)
            if not ticks or first is None:
                continue
            assigned = consumer.assignment()
            at_end = {tp.partition for tp in assigned
                      if tp in ends and await consumer.position(tp) >= ends[tp]}
            if {tp.partition for tp in assigned} <= passed | at_end:
                break
            if passed and loop.time() - last_in_window > 3.0:
                break
    finally:
        await consumer.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default="", help="only streams whose name starts with this")
    ap.add_argument("--ticks", type=int, default=0,
                    help="print this many ticks (every stream of each), then stop (0: never)")
    ap.add_argument("--from-beginning", action="store_true", help="read the retained topic")
    a = ap.parse_args()
    try:
        asyncio.run(main(a.prefix, a.ticks, a.from_beginning))
    except KeyboardInterrupt:  # Ctrl-C: stop quietly
        raise SystemExit(130) from None
