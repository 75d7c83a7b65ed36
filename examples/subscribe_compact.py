"""Read stream-dp's compact output with plain aiokafka and numpy, written from docs/formats.md.

No stream-dp import: the shard manifests (``dp.manifest.v1``, JSON, on
``<compact_topic>.manifests``) name each shard's streams in order; each tick record
(``dp.counts.block.v1``) is a 12-byte prefix, a JSON header and two little-endian float64
arrays, read with ``numpy.frombuffer`` (no copy, no per-stream Python objects). A tick is
complete when every shard's record for it has arrived.

    STREAM_DP_BOOTSTRAP=127.0.0.1:9092 python examples/subscribe_compact.py \\
        --topic dp.counts.compact --prefix www/ --ticks 3

Prints, per stream starting with ``--prefix``, ``tick stream value ± stderr``; with ``--json``
one JSON line per complete tick instead: ``{"tick", "shards", "streams", "received_at",
"values": {stream: [value, stderr]}}`` (``received_at``: Unix seconds when its last record was
decoded). TLS / SASL: set them in ``client_kwargs`` below as for any aiokafka client.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import struct
import sys
import time

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition


def read_manifest(value: bytes) -> tuple[str, list[str], str]:
    """``(shard, streams, sha256)`` of a manifest, its hash checked (formats.md)."""
    doc = json.loads(value)
    streams = doc["streams"]
    digest = hashlib.sha256(json.dumps(streams, separators=(",", ":"), ensure_ascii=False)
                            .encode("utf-8")).hexdigest()
    if doc.get("schema") != "dp.manifest.v1" or digest != doc["sha256"]:
        raise ValueError("not a valid dp.manifest.v1")
    return doc["shard"], streams, digest


def read_record(value: bytes) -> tuple[dict, np.ndarray, np.ndarray]:
    """``(header, values, stderr)`` of a tick record (formats.md, "Tick record")."""
    magic, version, _reserved, hlen = struct.unpack_from("<4sHHI", value, 0)
    if magic != b"DPCB" or version != 1:
        raise ValueError("not a dp.counts.block.v1 record")
    header = json.loads(value[12:12 + hlen].decode("utf-8"))
    start = 12 + hlen
    start += -start % 8
    n = header["n"]
    if len(value) != start + 16 * n:
        raise ValueError("truncated or oversized record")
    values = np.frombuffer(value, dtype="<f8", count=n, offset=start)
    stderr = np.frombuffer(value, dtype="<f8", count=n, offset=start + 8 * n)
    return header, values, stderr


async def read_manifests(bootstrap: str, topic: str) -> dict[str, tuple[list[str], str]]:
    """shard → (streams, sha256): the whole compacted manifests topic, to its current end."""
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         isolation_level="read_committed", max_partition_fetch_bytes=64 << 20)
    await c.start()
    out: dict[str, tuple[list[str], str]] = {}
    try:
        await c.topics()
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        while any([await c.position(tp) < ends[tp] for tp in tps]):
            for msgs in (await c.getmany(timeout_ms=500)).values():
                for m in msgs:
                    if m.value is not None and not (m.key or b"").startswith(b"histogram"):
                        # (the histogram's node manifest, or its pieces "histogram/…")
                        shard, streams, digest = read_manifest(m.value)
                        out[shard] = (streams, digest)
    finally:
        await c.stop()
    return out


async def main(topic: str, prefix: str, ticks: int, from_beginning: bool, as_json: bool) -> None:
    bootstrap = os.environ.get("STREAM_DP_BOOTSTRAP", "127.0.0.1:9092")
    manifests = await read_manifests(bootstrap, f"{topic}.manifests")
    chosen: dict[str, np.ndarray] = {}  # manifest sha256 → positions of the chosen streams
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
        isolation_level="read_committed", max_partition_fetch_bytes=16 << 20,
        auto_offset_reset="earliest" if from_beginning else "latest",
    )
    await consumer.start()
    shards = len(consumer.partitions_for_topic(topic) or ()) or 1
    pending: dict[int, dict[str, tuple[dict, np.ndarray, np.ndarray]]] = {}
    newest: dict[str, int] = {}  # shard → the newest tick of its records so far
    done: set[int] = set()
    try:
        async for msg in consumer:
            header, values, stderr = read_record(msg.value)
            tick, shard = header["tick"], header["shard"]
            if tick in done:
                continue  # a re-published copy: bit-identical, the first one won
            for attempt in range(5):  # a new shard's manifest: committed with its first record,
                if manifests.get(shard, ([], ""))[1] == header["manifest"]:  # read it again
                    break
                if attempt:
                    await asyncio.sleep(0.5 * attempt)
                manifests = await read_manifests(bootstrap, f"{topic}.manifests")
            else:
                print(f"tick {tick}: no manifest for {shard}; skipped", file=sys.stderr)
                continue
            pending.setdefault(tick, {})[shard] = (header, values, stderr)
            newest[shard] = max(newest.get(shard, 0), tick)
            if len(pending[tick]) < shards:
                # Hold a tick until every shard's record is in: read from the beginning, one
                # shard's partition may deliver all its ticks before the next one starts. Give up
                # a tick only when every shard has moved past it, or past 100 000 held ticks (a
                # shard that stopped for good).
                gone = min(newest.values()) if len(newest) == shards else 0
                for old in [t for t in pending if t < gone or len(pending) > 100_000]:
                    del pending[old]
                continue
            got = pending.pop(tick)
            done.add(tick)
            out: dict[str, list[float]] = {}
            for shard_name, (_header, vals, errs) in sorted(got.items()):
                streams, digest = manifests[shard_name]
                if digest not in chosen:
                    chosen[digest] = np.array([i for i, s in enumerate(streams)
                                               if s.startswith(prefix)], dtype=np.int64)
                pos = chosen[digest]
                for i, v, e in zip(pos.tolist(), vals[pos].tolist(), errs[pos].tolist(),
                                   strict=True):
                    out[streams[i]] = [v, e]
            if as_json:
                print(json.dumps({"tick": tick, "shards": len(got), "streams": len(out),
                                  "received_at": time.time(), "values": out}), flush=True)
            else:
                for name, (v, e) in out.items():
                    print(f"tick {tick:>6}  {name:<30} {v:12.2f} ± {e:.2f}", flush=True)
            if ticks and len(done) >= ticks:
                break
    finally:
        await consumer.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topic", default=os.environ.get("STREAM_DP_COMPACT_TOPIC", ""),
                    help="the deployment's compact_topic (default: $STREAM_DP_COMPACT_TOPIC)")
    ap.add_argument("--prefix", default="", help="only streams whose name starts with this")
    ap.add_argument("--ticks", type=int, default=0, help="stop after this many ticks (0: never)")
    ap.add_argument("--from-beginning", action="store_true", help="read the retained topic")
    ap.add_argument("--json", action="store_true", help="one JSON line per complete tick")
    a = ap.parse_args()
    if not a.topic:
        ap.error("--topic (or $STREAM_DP_COMPACT_TOPIC) is required")
    try:
        asyncio.run(main(a.topic, a.prefix, a.ticks, a.from_beginning, a.json))
    except KeyboardInterrupt:  # Ctrl-C: stop quietly
        raise SystemExit(130) from None
