"""Throughput of the users' tools, side by side in one run (prints a table).

* simulate: events generated and written as CSV (``nettrace`` model), events/s;
* log parsing: ``read_log`` over that CSV, records/s;
* replay vs a bare producer: ``send_events`` (idempotent producer, per-record replay header,
  acknowledged checkpoints every 2 000 records) next to a bare ``AIOKafkaProducer`` sending the
  same pre-encoded messages with the same idempotence settings, to two fresh topics of the same
  embedded broker (noida-db). The ratio is what replay's bookkeeping costs.

Run: ``python benchmarks/users_tools.py [--events 200000]``
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from agents.commands._replay_send import encode_event, send_events
from agents.kafka.embedded_broker import EmbeddedBroker
from simulators.base import TimeAxis
from simulators.logfile import read_log, write_log
from simulators.web_traffic import WebTraffic


async def _topics(bootstrap: str, names: list[str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, 4, 1) for n in names])
    finally:
        await admin.close()


async def _bare(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> float:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
                                linger_ms=5, max_batch_size=262_144)
    await producer.start()
    t0 = time.perf_counter()
    try:
        futures = []
        for key, value in messages:
            futures.append(await producer.send(topic, value, key=key))
            if len(futures) >= 2000:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    ticks = max(1, args.events // 40)
    sim = WebTraffic(TimeAxis(ticks, 1.0), seed=1, rate=40.0)

    with TemporaryDirectory() as tmp:
        log = Path(tmp) / "net.csv"
        t0 = time.perf_counter()
        with open(log, "w", encoding="utf-8", newline="") as fh:
            n = write_log(sim.events(), fh, "csv")
        t_sim = time.perf_counter() - t0

        t0 = time.perf_counter()
        records = list(read_log(log))
        t_parse = time.perf_counter() - t0
        assert len(records) == n
        messages = [(r.event.key.encode(), encode_event(r.event)) for r in records]

        with EmbeddedBroker() as broker:
            asyncio.run(_topics(broker.bootstrap, ["bench.bare", "bench.replay"]))
            t_bare = asyncio.run(_bare(broker.bootstrap, "bench.bare", messages))
            report = asyncio.run(send_events(records, bootstrap=broker.bootstrap,
                                             topic="bench.replay", run_id="bench",
                                             on_checkpoint=lambda r, o: None))
            assert report.sent == n

    print(f"events: {n:,} ({ticks:,} ticks of the nettrace model, 4 partitions, noida-db)")
    print(f"{'step':44} {'seconds':>8} {'per second':>12}")
    for name, secs in (
        ("simulate nettrace -> CSV", t_sim),
        ("read_log (CSV parse)", t_parse),
        ("bare AIOKafkaProducer (idempotent, acks=all)", t_bare),
        ("replay send_events (+headers, checkpoints)", report.seconds),
    ):
        print(f"{name:44} {secs:8.2f} {n / secs:12,.0f}")
    print(f"replay / bare producer throughput: {t_bare / report.seconds:.2f}")


if __name__ == "__main__":
    main()
