"""The node manifest of the compact histograms, in one record or in pieces.

The node manifest (a ``dp.manifest.v1`` with ``shard = "histogram"``) names every node of a
histogram in chunk order; chunk records (:mod:`stream_dp.compact_histograms`) carry its SHA-256.
Up to :data:`NODE_MANIFEST_MAX_BYTES` it is one record keyed ``histogram`` — every domain up to
about 2·10^6 nodes of short names, byte for byte what was always published. A larger one (10^7
nodes of names like ``r1/m22/l333`` take ≈ 150 MB, over any Kafka record limit) is published as
**pieces**: ``dp.manifest.v1`` records of consecutive nodes keyed and named
``histogram/<total>/<offset>`` (``total`` nodes in the whole manifest, ``offset`` the position
of the piece's first node), each with the SHA-256 of its own names. A reader joins the pieces of
one ``total`` that tile ``0 … total − 1``; the joined list's SHA-256 is the one chunk records
name. No Kafka imports. Format: docs/formats.md.

>>> recs = encode_node_manifest(["all", "a", "b", "c"], max_bytes=150)
>>> [key for key, _ in recs]
['histogram/4/0', 'histogram/4/2']
>>> from stream_dp.compact import decode_manifest, manifest_hash
>>> whole = join_node_manifests([decode_manifest(v) for _, v in recs])
>>> whole.streams, whole.sha256 == manifest_hash(["all", "a", "b", "c"])
(('all', 'a', 'b', 'c'), True)
>>> [key for key, _ in encode_node_manifest(["all", "a", "b", "c"])]
['histogram']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from stream_dp.compact import Manifest, encode_manifest, manifest_hash
from stream_dp.compact_histograms import HISTOGRAM_MANIFEST_SHARD

__all__ = [
    "NODE_MANIFEST_MAX_BYTES",
    "encode_node_manifest",
    "is_node_manifest_key",
    "join_node_manifests",
]

#: the largest node manifest record, in bytes: half of the 64 MiB ``max.message.bytes`` that
#: ``stream-dp topics create`` gives the manifests topic (a broker's request limit, 100 MiB by
#: default, also bounds a record)
NODE_MANIFEST_MAX_BYTES = 32 * 1024 * 1024


def encode_node_manifest(
    streams: Sequence[str], *, max_bytes: int | None = None
) -> list[tuple[str, bytes]]:
    """``(key, dp.manifest.v1 value)`` records of a histogram's node manifest, in the order to
    publish them: one keyed ``histogram`` when it fits ``max_bytes`` (default
    :data:`NODE_MANIFEST_MAX_BYTES`), else pieces keyed ``histogram/<total>/<offset>`` of at
    most ``max_bytes`` each (``ValueError`` when a single name does not fit)."""
    if max_bytes is None:
        max_bytes = NODE_MANIFEST_MAX_BYTES
    whole = encode_manifest(HISTOGRAM_MANIFEST_SHARD, streams)
    if len(whole) <= max_bytes:
        return [(HISTOGRAM_MANIFEST_SHARD, whole)]
    names = list(streams)
    total = len(names)
    # equal counts of names, more pieces until every one fits (names of uneven lengths)
    pieces = -(-len(whole) // max_bytes)
    while True:
        size = -(-total // pieces)
        out = []
        for offset in range(0, total, size):
            shard = f"{HISTOGRAM_MANIFEST_SHARD}/{total}/{offset}"
            value = encode_manifest(shard, names[offset : offset + size])
            if len(value) > max_bytes:
                break
            out.append((shard, value))
        else:
            return out
        if size == 1:
            raise ValueError(f"a node name does not fit a manifest record of {max_bytes} bytes")
        pieces = min(total, pieces * 2)


def is_node_manifest_key(key: bytes | str | None) -> bool:
    """Whether a record of the manifests topic belongs to the node manifest (``histogram`` or
    a piece ``histogram/…``), not to a release shard."""
    if isinstance(key, bytes):
        key = key.decode("utf-8", "replace")
    return key is not None and (key == HISTOGRAM_MANIFEST_SHARD
                                or key.startswith(HISTOGRAM_MANIFEST_SHARD + "/"))


def join_node_manifests(manifests: Iterable[Manifest]) -> Manifest | None:
    """The node manifest among decoded records of the manifests topic, given in topic order:
    the newest whole one (``histogram``) or complete set of pieces (joined: ``shard``
    ``histogram``, the SHA-256 of every name in order), whichever was written last; ``None``
    when there is neither. Pieces of another ``total`` (an earlier deployment's) never mix."""
    whole: tuple[int, Manifest] | None = None
    groups: dict[int, tuple[int, dict[int, Manifest]]] = {}
    for at, man in enumerate(manifests):
        if man.shard == HISTOGRAM_MANIFEST_SHARD:
            whole = (at, man)
            continue
        parsed = _piece(man.shard)
        if parsed is None:
            continue
        total, offset = parsed
        group = groups.get(total, (at, {}))[1]
        group[offset] = man
        groups[total] = (at, group)
    # newest first: a whole record, or a group by its last piece (joined only when chosen)
    found: list[tuple[int, int, Manifest | None]] = [(at, total, None)
                                                      for total, (at, _) in groups.items()]
    if whole is not None:
        found.append((whole[0], -1, whole[1]))
    for _, total, candidate in sorted(found, key=lambda f: f[0], reverse=True):
        joined = candidate if candidate is not None else _join(total, groups[total][1])
        if joined is not None:
            return joined
    return None


def _piece(shard: str) -> tuple[int, int] | None:
    """``(total, offset)`` of a piece's shard name ``histogram/<total>/<offset>``."""
    head, _, rest = shard.partition("/")
    total, _, offset = rest.partition("/")
    if head != HISTOGRAM_MANIFEST_SHARD or not total.isdigit() or not offset.isdigit():
        return None
    return int(total), int(offset)


def _join(total: int, group: dict[int, Manifest]) -> Manifest | None:
    """The pieces of ``group`` joined when they tile ``0 … total − 1`` exactly."""
    names: list[str] = []
    while len(names) < total:
        piece = group.get(len(names))
        if piece is None or not piece.streams:
            return None
        names.extend(piece.streams)
    if len(names) != total:
        return None
    streams = tuple(names)
    return Manifest(HISTOGRAM_MANIFEST_SHARD, streams, manifest_hash(streams))
