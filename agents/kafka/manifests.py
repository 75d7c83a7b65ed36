"""Reading the shard manifests of the compact output (``<compact_topic>.manifests``).

Shared by every reader of the compact records (``stream-dp tail compact``, the reconcile side
agent, the dashboard): the newest ``dp.manifest.v1`` of each shard, read from the beginning of
the (compacted) topic to its end as it was when reading started.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["histogram_manifests_topic", "read_manifests"]


def histogram_manifests_topic(blocks_topic: str) -> str:
    """The manifests topic beside a histogram chunk topic: ``X.histograms`` → ``X.manifests``
    (``<compact_topic>.manifests`` for the default ``<compact_topic>.histograms``)."""
    return f"{blocks_topic.removesuffix('.histograms')}.manifests"


async def read_manifests(bootstrap: str, kafka_kwargs: dict[str, Any], topic: str,
                         consumer_class: Any = None, *, histogram: bool = False
                         ) -> dict[str, Any]:
    """Shard name → :class:`stream_dp.compact.Manifest`, newest first-wins-last per shard.

    The topic also holds the node manifest of the compact histograms (key ``histogram``, 10^6
    names at 10^6 nodes, or its pieces ``histogram/<total>/<offset>`` beyond 32 MiB): left out,
    or with ``histogram=True`` the only one read (``{"histogram": manifest}``, pieces joined:
    :func:`stream_dp.node_manifest.join_node_manifests`).
    Raises ``ValueError`` for a malformed manifest (its hash does not match its streams).
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from stream_dp.compact import decode_manifest
    from stream_dp.node_manifest import is_node_manifest_key, join_node_manifests

    c = (consumer_class or AIOKafkaConsumer)(bootstrap_servers=bootstrap, **kafka_kwargs, group_id=None,
                       enable_auto_commit=False, isolation_level="read_committed",
                       max_partition_fetch_bytes=64 << 20, fetch_max_bytes=64 << 20)
    try:
        # a start cancelled half way leaves a connection stop() cannot close: let it finish
        from agents.kafka.reading import finish_before_cancel

        await finish_before_cancel(c.start(), 3.0)
    except BaseException:
        with contextlib.suppress(Exception):
            await c.stop()
        raise
    out: dict[str, Any] = {}
    nodes: list[Any] = []
    try:
        await c.topics()
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
        if not tps:
            return out
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        while any([await c.position(tp) < ends[tp] for tp in tps]):
            batch = await c.getmany(timeout_ms=500)
            for msgs in batch.values():
                for m in msgs:
                    if m.value is not None and is_node_manifest_key(m.key) == histogram:
                        man = decode_manifest(m.value)
                        if histogram:
                            nodes.append(man)
                        else:
                            out[man.shard] = man
    finally:
        await c.stop()
    if histogram:
        joined = join_node_manifests(nodes)
        return {} if joined is None else {joined.shard: joined}
    return out
