"""Node routing of ingested events and what ingest hands to the release stage: :func:`shard_of`,
:class:`Router` (event key → nodes → shard and index) and :class:`Partial` (one tick's raw
per-node sums of one events partition for one shard).
"""

from __future__ import annotations

import array
import itertools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agents.ingest.records import _fast_dumps, _fast_loads, _fastingest

_INT64_MAX = (1 << 63) - 1
#: ``agents.ingest._fastingest.dict_columns`` (one C pass over a dict + radix sort), or None without
#: the compiled extension / with ``STREAM_DP_PURE_INGEST=1`` (then ``np.fromiter``: the same)
_dict_columns: Any = getattr(_fastingest, "dict_columns", None)


def _leaf_columns(bucket: dict[int, int]) -> tuple[Any, Any] | None:
    """A leaf-mode bucket's keys (leaf indices, increasing) and their sums (integer units) as
    writable int64 arrays, or None when a key or a sum is not an int in int64."""
    import numpy as np

    if _dict_columns is not None:
        cols = _dict_columns(bucket)  # sorted by key already
        if cols is None:
            return None
        return (np.frombuffer(bytearray(cols[0]), dtype=np.int64),
                np.frombuffer(bytearray(cols[1]), dtype=np.int64))
    n = len(bucket)
    try:
        keys = np.fromiter(bucket.keys(), dtype=np.int64, count=n)
        vals = np.fromiter(bucket.values(), dtype=np.int64, count=n)
    except (OverflowError, TypeError, ValueError):
        return None
    order = np.argsort(keys)  # distinct keys: any sort gives the one order
    return keys[order], vals[order]


def _merge_sorted(a: Any, a_vals: Any, b: Any, b_vals: Any) -> tuple[Any, Any]:
    """Two increasing, disjoint int64 index arrays (with a value each) merged into one
    increasing array and its values, in O(len(a) + len(b) · log len(a))."""
    import numpy as np

    n = len(a) + len(b)
    at_b = np.searchsorted(a, b) + np.arange(len(b))  # b[j]'s place: j earlier b's before it
    from_a = np.ones(n, dtype=bool)
    from_a[at_b] = False
    nodes = np.empty(n, dtype=np.int64)
    vals = np.empty(n, dtype=np.int64)
    nodes[from_a], vals[from_a] = a, a_vals
    nodes[at_b], vals[at_b] = b, b_vals
    return nodes, vals


def _int_list(col: Any) -> list[int]:
    """A column (int64 array or sequence of ints) as a list of Python ints."""
    tolist = getattr(col, "tolist", None)
    return list(tolist()) if tolist is not None else [int(x) for x in col]


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
        #: attribute i) to shard 0, which releases every table (agents.release.state)
        self.patterns = getattr(domain, "kind", "") == "binary"
        names: Sequence[str] = () if self.patterns else domain.names
        crc32 = zlib.crc32  # shard_of, inlined: 10^7 names at start-up
        self.node_shard = [crc32(n.encode("utf-8")) % shards for n in names]
        # nodes grouped by shard in domain order (a stable sort), each one's place in its shard
        of = np.asarray(self.node_shard, dtype=np.int64)
        order = np.argsort(of, kind="stable")
        counts = np.bincount(of, minlength=shards)
        starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        local = np.empty(len(names), dtype=np.int64)
        local[order] = np.arange(len(names), dtype=np.int64) - np.repeat(starts, counts)
        self.shard_nodes: list[list[int]] = [
            order[a : a + c].tolist() for a, c in zip(starts.tolist(), counts.tolist(),
                                                      strict=True)]
        self.local_index: list[int] = local.tolist()
        self._cache: dict[str, tuple[int, ...] | None] = {}
        #: the deployment's nonce (agents.kafka.nonce), set by the worker before any state is built
        self.deployment_nonce = ""
        #: flat and hierarchy domains: open buckets are keyed by the event's leaf (an int; its
        #: nodes are the leaf and its ancestors, :meth:`expand`), and every valid event key is
        #: known up front, so memory does not grow with the keys seen. Grids and binary
        #: attributes: keyed by the tuple of nodes, cached per key seen.
        self.leaf_mode = not self.patterns and getattr(domain, "kind", "") in ("flat", "hierarchy")
        #: the ingest fast path's lookup: event key -> bucket key (leaf index, or nodes tuple)
        self.declared: dict[str, Any] = self._declared(domain) if self.leaf_mode else {}
        parent = getattr(domain, "parent", None)
        self._parent = array.array("q", parent.tolist() if parent is not None and self.leaf_mode
                                   else [])

    @staticmethod
    def _declared(domain: Any) -> dict[str, Any]:
        """Every leaf key up to decode_event's 1 024 characters → its node (a new dict)."""
        keys: dict[str, Any] = domain.leaf_keys()
        if keys and max(map(len, keys)) > 1024:
            keys = {k: v for k, v in keys.items() if len(k) <= 1024}
        return keys

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
        """:meth:`tick_columns` as tuples of Python ints (per shard: local indices, sums in
        integer units)."""
        return [(tuple(_int_list(idx)), tuple(_int_list(sums)))
                for idx, sums in self.tick_columns(bucket, clip)]

    def tick_columns(self, bucket: dict[int, int], clip: int) -> list[tuple[Any, Any]]:
        """Leaf mode: one closed tick's per-leaf sums (integer units) → per shard, the (local
        indices, sums) of every node they feed, nodes in global order, each sum clipped to
        ``clip`` units (:func:`stream_dp.contributions.clip_limit_units`).

        Both columns are C-contiguous int64 arrays (what :meth:`Partial.encode` writes without
        a Python int per node: ~10^5 nodes per tick at 10^6 streams, issue #25); when a sum
        can leave int64 (only with a clip beyond 2^62 / the leaves' count), tuples of exact
        Python ints instead, from the per-node loop.

        Integer sums are exact in any order; each leaf's sum is clipped before it is added to
        its ancestors and each node's sum after (both 1-Lipschitz: one event still moves every
        node by at most its own contribution). Unit tests check it against the leaf-by-leaf
        loop."""
        import numpy as np

        n_leaves = len(bucket)
        empty = np.zeros(0, dtype=np.int64)
        if not n_leaves:
            return [(empty, empty) for _ in range(self.shards)]
        cols = _leaf_columns(bucket)
        if cols is None:  # a sum (or a key) beyond int64: exact Python integers
            return self._tick_columns_loop(bucket, clip)
        keys, vals = cols  # keys distinct and increasing
        if clip <= _INT64_MAX:
            np.minimum(vals, clip, out=vals)
        # every node's sum is at most the tick's total
        total_max = int(vals.max()) * n_leaves
        if total_max >= (1 << 62):  # pathological bursts: exact Python integers
            return self._tick_columns_loop(bucket, clip)
        parent, _, local = self._arrays()
        is_internal, internal_pos, internal_nodes = self._internal()
        # A bucket key that is a leaf gets no other contribution (keys are distinct, and
        # ancestors are internal nodes): its sum is its own value, with no work per node of
        # the domain. Only the internal nodes (~10^3 at 10^6 leaves) are accumulated, in a
        # compact index of their own.
        inner = is_internal[keys]
        if inner.any():  # a key that is an internal node is added like an ancestor
            anc, anc_w = [keys[inner]], [vals[inner]]
            leaf_keys, leaf_sums = keys[~inner], vals[~inner]
        else:
            anc, anc_w = [], []
            leaf_keys, leaf_sums = keys, vals
        n_int = len(internal_nodes)
        exact_float = total_max < (1 << 53)  # float64 adds integers < 2^53 exactly

        def add_up(pos: Any, weights: Any) -> tuple[Any, Any]:
            """Per internal node (compact position): the sum of ``weights`` and whether any
            entry landed on it."""
            hits = np.bincount(pos, minlength=n_int) > 0
            if exact_float:
                return np.bincount(pos, weights=weights, minlength=n_int).astype(np.int64), hits
            acc = np.zeros(n_int, dtype=np.int64)  # total < 2^62: no int64 overflow
            np.add.at(acc, pos, weights)
            return acc, hits

        if parent.size:
            # One step up from every key, reduced at once to one entry per distinct parent
            # (~10^3 for 5·10^4 leaves); from there every further step is small. Each key's
            # value still travels its whole path once (exact in any grouping), also in an
            # unbalanced tree where one node is reached after different numbers of steps.
            up = parent[keys]
            going = up >= 0
            if not going.all():
                up, w = up[going], vals[going]
            else:
                w = vals
            if up.size:
                first, hit = add_up(internal_pos[up], w)
                got = np.flatnonzero(hit)
                cur, w = internal_nodes[got], first[got]
                anc.append(cur)
                anc_w.append(w)
                while True:
                    up = parent[cur]
                    going = up >= 0  # a root ends its path; the others go one level up
                    if not going.any():
                        break
                    cur, w = up[going], w[going]
                    anc.append(cur)
                    anc_w.append(w)
        if anc:
            acc, hit = add_up(internal_pos[np.concatenate(anc)], np.concatenate(anc_w))
            got = np.flatnonzero(hit)
            nodes, sums = _merge_sorted(leaf_keys, leaf_sums, internal_nodes[got], acc[got])
        else:
            nodes, sums = leaf_keys, leaf_sums
        if clip <= _INT64_MAX:
            np.minimum(sums, clip, out=sums)
        # per shard, in node order: a stable counting sort by shard (radix for small ints)
        shard_of_node = self._shard_code()[nodes]
        order = np.argsort(shard_of_node, kind="stable")
        bounds = np.cumsum(np.bincount(shard_of_node, minlength=self.shards))
        idx_all, sums_all = local[nodes[order]], sums[order]
        out = []
        lo = 0
        for hi in bounds.tolist():
            out.append((idx_all[lo:hi], sums_all[lo:hi]))  # contiguous slices
            lo = hi
        return out

    def _shard_code(self) -> Any:
        """``node_shard`` as the smallest unsigned dtype that holds it (built once): NumPy's
        stable sort of 8/16-bit ints is a radix sort."""
        found = self.__dict__.get("_np_shard_code")
        if found is None:
            import numpy as np

            dtype = np.uint8 if self.shards <= 1 << 8 else (
                np.uint16 if self.shards <= 1 << 16 else np.int64)
            found = self.__dict__["_np_shard_code"] = self._arrays()[1].astype(dtype)
        return found

    def _internal(self) -> tuple[Any, Any, Any]:
        """``(is_internal, internal_pos, internal_nodes)`` (built once): per node whether it
        has a child, its position among the internal nodes (-1 for a leaf), and the internal
        nodes in increasing order."""
        found = self.__dict__.get("_np_internal")
        if found is None:
            import numpy as np

            parent, node_shard, _ = self._arrays()
            n = len(node_shard)
            is_internal = np.zeros(n, dtype=bool)
            if parent.size:
                is_internal[parent[parent >= 0]] = True
            internal_nodes = np.flatnonzero(is_internal)
            internal_pos = np.full(n, -1, dtype=np.int64)
            internal_pos[internal_nodes] = np.arange(len(internal_nodes), dtype=np.int64)
            found = self.__dict__["_np_internal"] = (is_internal, internal_pos, internal_nodes)
        return found

    def _tick_columns_loop(self, bucket: dict[int, int], clip: int
                           ) -> list[tuple[Any, Any]]:
        """:meth:`tick_columns` by the per-node loop over exact Python ints (the fall-back for
        sums beyond int64): tuples."""
        sums: dict[int, int] = {}
        for leaf, v in bucket.items():  # exact integers: any order gives the same sums
            v = v if v < clip else clip
            for n in self.expand(leaf):
                sums[n] = sums.get(n, 0) + v
        per: list[list[tuple[int, int]]] = [[] for _ in range(self.shards)]
        for n in sorted(sums):
            x = sums[n]
            per[self.node_shard[n]].append((self.local_index[n], x if x < clip else clip))
        return [(tuple(i for i, _ in items), tuple(x for _, x in items)) for items in per]

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


@dataclass(frozen=True, eq=False)
class Partial:
    """Raw per-node counts of one tick from one events partition for one release shard.

    INTERNAL ONLY (raw counts): ``idx`` are indices within the shard (strictly increasing),
    ``counts`` their sums in integer units (:mod:`stream_dp.contributions`; event counts for
    binary-attribute domains), already clipped to the per-tick limit.

    Both columns are either C-contiguous int64 NumPy arrays (leaf-mode ingest and
    :meth:`decode`: no Python int per node) or sequences of Python ints (other domains, and
    values beyond int64: exact). Equality compares values, whichever the representation.
    """

    tick: int
    source: int
    shard: int
    idx: Any
    counts: Any
    closed_at: float
    #: this record is piece ``piece`` of ``pieces`` of one (tick, source, shard) partial: a
    #: binary-attribute partial holds one entry per distinct pattern of the tick, a number no
    #: setting bounds, so it is cut into records of at most :data:`PIECE_ENTRIES` entries that
    #: fit the partials topic's record limit whatever the events (the release stage joins them)
    piece: int = 0
    pieces: int = 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Partial):
            return NotImplemented
        return ((self.tick, self.source, self.shard, self.closed_at, self.piece, self.pieces)
                == (other.tick, other.source, other.shard, other.closed_at, other.piece,
                    other.pieces)
                and _int_list(self.idx) == _int_list(other.idx)
                and _int_list(self.counts) == _int_list(other.counts))

    __hash__ = None  # type: ignore[assignment]  # mutable columns: like a list

    def encode(self) -> bytes:
        """The v2 JSON record (the same bytes for arrays and for tuples of the same ints; the
        piece fields only in a partial cut into several records)."""
        doc = {"v": 2, "tick": self.tick, "src": self.source, "shard": self.shard,
               "idx": self.idx, "counts": self.counts, "closed_at": self.closed_at}
        if self.pieces != 1:
            doc |= {"piece": self.piece, "pieces": self.pieces}
        return _fast_dumps(doc, numpy=True)  # ~10^5 nodes per tick at 10^6 streams

    def split(self, max_entries: int | None = None) -> list[Partial]:
        """This partial as records of at most ``max_entries`` (default :data:`PIECE_ENTRIES`)
        entries each: itself when it fits, else its pieces in order (at least one)."""
        limit = PIECE_ENTRIES if max_entries is None else max_entries
        n = len(self.idx)
        if n <= limit:
            return [self]
        count = -(-n // limit)
        return [Partial(self.tick, self.source, self.shard, self.idx[i * limit:(i + 1) * limit],
                        self.counts[i * limit:(i + 1) * limit], self.closed_at, i, count)
                for i in range(count)]

    @classmethod
    def join(cls, pieces: list[Partial]) -> Partial:
        """The partial whose :meth:`split` gave ``pieces`` (all of them, in any order);
        ``ValueError`` unless they are exactly pieces ``0..n-1`` of one partial whose indices
        increase across them."""
        first = pieces[0]
        n = first.pieces
        key = (first.tick, first.source, first.shard, first.closed_at, n)
        if len(pieces) != n or any((p.tick, p.source, p.shard, p.closed_at, p.pieces) != key
                                   for p in pieces):
            raise ValueError("pieces of different partials, or not all of them")
        ordered = sorted(pieces, key=lambda p: p.piece)
        if [p.piece for p in ordered] != list(range(n)):
            raise ValueError("pieces of a partial with a piece missing or twice")
        idx = [i for p in ordered for i in _int_list(p.idx)]
        if not _strictly_increasing(idx):
            raise ValueError("pieces whose indices do not increase across them")
        return cls(first.tick, first.source, first.shard, tuple(idx),
                   tuple(c for p in ordered for c in _int_list(p.counts)), first.closed_at)

    @classmethod
    def decode(cls, raw: bytes) -> Partial:
        """Parse and validate a v2 record; ``ValueError`` (or ``KeyError``/``TypeError`` for a
        missing field or a record that is not an object) for anything an honest ingest does
        not write: counts that are not integers >= 0 (bools, floats, strings, nested lists
        refused), indices that are not strictly increasing integers >= 0, columns of
        different lengths."""
        d = _fast_loads(raw)
        if not isinstance(d, dict):
            raise TypeError("a partial is a JSON object")
        if d.get("v") != 2:
            raise ValueError("a partial of an older version (float sums): this release needs "
                             "a new deployment (stream-dp deployment new; docs/operations.md, "
                             "'Changing the configuration')")
        idx, counts = _checked_column(d["idx"]), _checked_column(d["counts"])
        if len(idx) != len(counts):
            raise ValueError("a partial whose idx and counts differ in length")
        if not _strictly_increasing(idx):
            raise ValueError("a partial whose indices are not strictly increasing")
        piece, pieces = d.get("piece", 0), d.get("pieces", 1)
        if type(piece) is not int or type(pieces) is not int or not 0 <= piece < pieces:
            raise ValueError("a partial whose piece fields are not 0 <= piece < pieces")
        return cls(int(d["tick"]), int(d["src"]), int(d["shard"]), idx, counts,
                   float(d["closed_at"]), piece, pieces)


#: most entries in one partials record: a binary-attribute entry (a 64-bit pattern, a count)
#: takes at most ~40 bytes of JSON, so a piece stays below 11 MiB, inside the partials topic's
#: 16 MiB records; a stream-domain partial holds at most its shard's nodes (checked at start-up)
PIECE_ENTRIES = 1 << 18

_NOT_UNITS = "a partial whose idx or counts are not integer units >= 0"


def _checked_loop(values: Any) -> tuple[int, ...]:
    """A decoded JSON list of integers >= 0 as a tuple of exact Python ints (the per-element
    check: any magnitude; ``ValueError`` for anything else, bools included)."""
    if type(values) is not list or not all(type(c) is int and c >= 0 for c in values):
        raise ValueError(_NOT_UNITS)
    return tuple(values)


def _checked_column(values: Any) -> Any:
    """:func:`_checked_loop` vectorised: an int64 array when every element is an int in
    int64, else the per-element path (exact beyond int64, or ``ValueError``)."""
    import numpy as np

    if type(values) is not list:
        raise ValueError(_NOT_UNITS)
    if not values:
        return np.zeros(0, dtype=np.int64)
    try:
        col = np.array(values)
    except (ValueError, TypeError, OverflowError):  # ragged nesting and the like
        raise ValueError(_NOT_UNITS) from None
    # NumPy makes int64 only from Python ints that all fit (floats, strings, None, nesting:
    # another dtype or shape; ints beyond int64: float64, uint64 or object -> the exact loop),
    # and from bools mixed with such ints (True -> 1, False -> 0)
    if col.dtype != np.int64 or col.ndim != 1:
        return _checked_loop(values)
    if int(col.min()) < 0:
        raise ValueError(_NOT_UNITS)
    # a bool became 0 or 1: those few elements (at most two indices; counts of 0 or 1 unit)
    # are checked one by one, so a JSON true/false is refused as before
    if any(type(values[i]) is not int for i in np.flatnonzero(col <= 1).tolist()):
        raise ValueError(_NOT_UNITS)
    return col


def _strictly_increasing(idx: Any) -> bool:
    import numpy as np

    if isinstance(idx, np.ndarray):
        return bool(idx.size < 2 or (np.diff(idx) > 0).all())
    return all(a < b for a, b in itertools.pairwise(idx))
