"""Node routing of ingested events and what ingest hands to the release stage: :func:`shard_of`,
:class:`Router` (event key → nodes → shard and index) and :class:`Partial` (one tick's raw
per-node sums of one events partition for one shard).

Moved out of :mod:`agents.ingest` (which re-exports these names).
"""

from __future__ import annotations

import array
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agents.ingest_records import _fast_dumps, _fast_loads


def shard_of(stream: str, shards: int) -> int:
    """The release shard of ``stream``: ``crc32(UTF-8 name) mod shards``."""
    return zlib.crc32(stream.encode("utf-8")) % shards


class Router:
    """Maps event keys to nodes and nodes to (shard, index within the shard).

    ``domain`` is a :class:`stream_dp.domain.Domain`; shard ``s`` releases the nodes
    ``shard_nodes[s]`` (global indices, in domain order).
    """

    def __init__(self, domain: Any, shards: int) -> None:
        self.domain = domain
        self.shards = shards
        #: a binary-attribute domain: events are routed as attribute patterns (bit i =
        #: attribute i) to shard 0, which releases every table (agents.release)
        self.patterns = getattr(domain, "kind", "") == "binary"
        names: Sequence[str] = () if self.patterns else domain.names
        self.node_shard = [shard_of(n, shards) for n in names]
        self.shard_nodes: list[list[int]] = [[] for _ in range(shards)]
        self.local_index = [0] * len(names)
        for i, s in enumerate(self.node_shard):
            self.local_index[i] = len(self.shard_nodes[s])
            self.shard_nodes[s].append(i)
        self._cache: dict[str, tuple[int, ...] | None] = {}
        #: the deployment's nonce (agents.nonce), set by the worker before any state is built
        self.deployment_nonce = ""
        #: flat and hierarchy domains: open buckets are keyed by the event's leaf (an int; its
        #: nodes are the leaf and its ancestors, :meth:`expand`), and every valid event key is
        #: known up front, so memory does not grow with the keys seen. Grids and binary
        #: attributes: keyed by the tuple of nodes, cached per key seen.
        self.leaf_mode = not self.patterns and getattr(domain, "kind", "") in ("flat", "hierarchy")
        #: the ingest fast path's lookup: event key -> bucket key (leaf index, or nodes tuple)
        self.declared: dict[str, Any] = (
            {k: v for k, v in domain.leaf_keys().items() if len(k) <= 1024}  # decode_event's limit
            if self.leaf_mode else {})
        parent = getattr(domain, "parent", None)
        self._parent = array.array("q", parent.tolist() if parent is not None and self.leaf_mode
                                   else [])

    @property
    def domain_id(self) -> str:
        """The domain's digest, computed once (0.7 s at 10^6 streams; every shard state of
        the worker needs it)."""
        found = self.__dict__.get("_domain_id")
        if found is None:
            found = self.__dict__["_domain_id"] = str(self.domain.digest())
        return str(found)

    def shard_names(self, shard: int) -> list[str]:
        if self.patterns:
            return []
        names: Sequence[str] = self.domain.names
        return [names[i] for i in self.shard_nodes[shard]]

    def expand(self, bucket_key: Any) -> tuple[int, ...]:
        """The nodes (global indices) of a bucket key: a leaf and its ancestors, leaf first."""
        if type(bucket_key) is tuple:
            return bucket_key
        path = [bucket_key]
        parent = self._parent
        if parent:
            while (up := parent[path[-1]]) >= 0:
                path.append(up)
        return tuple(path)

    def tick_sums(self, bucket: dict[int, int], clip: int
                  ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Leaf mode: one closed tick's per-leaf sums (integer units) → per shard, the (local
        indices, sums) of every node they feed, nodes in global order, each sum clipped to
        ``clip`` units (:func:`stream_dp.contributions.clip_limit_units`).

        Integer sums are exact in any order; each leaf's sum is clipped before it is added to
        its ancestors and each node's sum after (both 1-Lipschitz: one event still moves every
        node by at most its own contribution). A unit test checks it against the leaf-by-leaf
        loop."""
        import numpy as np

        n_leaves = len(bucket)
        if not n_leaves:
            return [((), ()) for _ in range(self.shards)]
        arrays = self._arrays()
        parent, node_shard, local = arrays
        keys = np.fromiter(bucket.keys(), dtype=np.int64, count=n_leaves)
        vals = np.fromiter((v if v < clip else clip for v in bucket.values()), dtype=np.int64,
                           count=n_leaves)
        cur = keys
        levels = [cur]
        if parent.size:
            while True:
                up = np.where(cur >= 0, parent[np.maximum(cur, 0)], -1)
                if not (up >= 0).any():
                    break
                levels.append(up)
                cur = up
        paths = np.stack(levels, axis=1).ravel()
        weights = np.repeat(vals, len(levels))
        keep = paths >= 0
        idx, w = paths[keep], weights[keep]
        if int(vals.max()) * n_leaves < (1 << 62):  # no int64 overflow possible
            sums = np.zeros(len(node_shard), dtype=np.int64)
            np.add.at(sums, idx, w)
        else:  # pathological bursts: exact Python integers (object array)
            sums = np.zeros(len(node_shard), dtype=object)
            for i, x in zip(idx.tolist(), w.tolist(), strict=True):
                sums[i] += x
        seen = np.zeros(len(node_shard), dtype=bool)
        seen[idx] = True
        touched = np.flatnonzero(seen)  # == np.unique(idx), without sorting 4 entries per leaf
        shard_of_node = node_shard[touched]
        out = []
        for shard in range(self.shards):
            mine = touched[shard_of_node == shard]
            got = [v if v < clip else clip for v in sums[mine].tolist()]
            out.append((tuple(local[mine].tolist()), tuple(int(v) for v in got)))
        return out

    def _arrays(self) -> tuple[Any, Any, Any]:
        """``(parent, node_shard, local_index)`` as numpy arrays (built once)."""
        found = self.__dict__.get("_np_arrays")
        if found is None:
            import numpy as np

            found = self.__dict__["_np_arrays"] = (
                np.asarray(self._parent, dtype=np.int64),
                np.asarray(self.node_shard, dtype=np.int64),
                np.asarray(self.local_index, dtype=np.int64))
        return found

    def bucket_key(self, nodes: Sequence[int]) -> Any:
        """The open-bucket key of an event feeding ``nodes`` (leaf first)."""
        return int(nodes[0]) if self.leaf_mode else tuple(int(n) for n in nodes)

    def nodes(self, key: str) -> tuple[int, ...] | None:
        """Global node indices an event with ``key`` feeds, or ``None`` if undeclared."""
        if self.leaf_mode:
            try:
                leaf = self.declared.get(key)
            except TypeError:
                return None
            return None if leaf is None else self.expand(leaf)
        try:
            return self._cache[key]
        except KeyError:
            pass
        try:
            found: tuple[int, ...] | None = tuple(int(i) for i in self.domain.nodes_for_event(key))
        except KeyError:
            found = None
        if found is not None and len(self._cache) < 1_000_000:  # never cache a miss: a
            self._cache[key] = found  # writer's random keys must not fill the memory
            if len(key) <= 1024:
                self.declared[key] = found
        return found


@dataclass(frozen=True)
class Partial:
    """Raw per-node counts of one tick from one events partition for one release shard.

    INTERNAL ONLY (raw counts): ``idx`` are indices within the shard, ``counts`` their sums in
    integer units (:mod:`stream_dp.contributions`; event counts for binary-attribute domains),
    already clipped to the per-tick limit.
    """

    tick: int
    source: int
    shard: int
    idx: tuple[int, ...]
    counts: tuple[int, ...]
    closed_at: float

    def encode(self) -> bytes:
        doc = {"v": 2, "tick": self.tick, "src": self.source, "shard": self.shard,
               "idx": self.idx, "counts": self.counts, "closed_at": self.closed_at}
        return _fast_dumps(doc)  # 10^5 counts per tick at 10^6 streams

    @classmethod
    def decode(cls, raw: bytes) -> Partial:
        d = _fast_loads(raw)
        if d.get("v") != 2:
            raise ValueError("a partial of an older version (float sums): this release needs "
                             "a new epoch (docs/operations.md, 'Changing the configuration')")
        counts = d["counts"]
        if not all(type(c) is int and c >= 0 for c in counts):
            raise ValueError("a partial whose counts are not integer units >= 0")
        return cls(
            int(d["tick"]), int(d["src"]), int(d["shard"]), tuple(int(i) for i in d["idx"]),
            tuple(counts), float(d["closed_at"]),
        )
