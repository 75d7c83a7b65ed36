"""Leaf-mode tick sums (``Router.tick_sums``): exactly the per-node loop over integer units.

The loop — every leaf adds its (clipped) units to each of its nodes, each node's sum clipped —
is the definition; integer sums do not depend on the order, so any order must agree. Unbalanced
trees (leaves at several depths under one node), huge sums and the clip are the cases a
level-by-level shortcut would get wrong.
"""

from __future__ import annotations

import numpy as np
import pytest

from agents.ingest.routing import Router
from stream_dp.domain import Domain


def _loop(router: Router, bucket: dict[int, int], clip: int
          ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    sums: dict[int, int] = {}
    for leaf in sorted(bucket):
        for n in router.expand(leaf):
            sums[n] = sums.get(n, 0) + min(bucket[leaf], clip)
    per: list[list[tuple[int, int]]] = [[] for _ in range(router.shards)]
    for n in sorted(sums):
        per[router.node_shard[n]].append((router.local_index[n], min(sums[n], clip)))
    return [(tuple(i for i, _ in items), tuple(x for _, x in items)) for items in per]


def _unbalanced_paths(rng: np.random.Generator, n: int) -> list[str]:
    paths = set()
    while len(paths) < n:
        depth = int(rng.integers(1, 5))
        paths.add("/".join(f"n{int(rng.integers(0, 4))}" for _ in range(depth)))
    # a path that is a prefix of another would make an internal node a leaf: drop those
    return sorted(p for p in paths if not any(q.startswith(p + "/") for q in paths))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("shards", [1, 3])
def test_tick_sums_equal_the_leaf_by_leaf_loop_bit_for_bit(seed: int, shards: int) -> None:
    rng = np.random.default_rng(seed)
    dom = Domain.from_paths(_unbalanced_paths(rng, 60))
    router = Router(dom, shards)
    assert router.leaf_mode
    leaves = sorted(router.declared.values())
    chosen = rng.choice(leaves, size=min(len(leaves), 40), replace=False)
    # magnitudes 1 .. 2^50 units, and a clip that some leaves and many ancestors reach
    bucket = {int(k): int(2.0 ** rng.uniform(0, 50)) for k in chosen}
    bucket[int(chosen[0])] = 0  # a zero-valued leaf still releases its nodes
    for clip in (1 << 52, int(np.median(list(bucket.values()))), 1):
        got = router.tick_sums(bucket, clip)
        want = _loop(router, bucket, clip)
        assert got == want
        assert all(type(x) is int for _, g in got for x in g)


def test_sums_beyond_int64_are_exact_and_clipped() -> None:
    """Sums that would overflow int64 fall back to exact integers (then the clip)."""
    router = Router(Domain.from_paths([f"r/l{i}" for i in range(8)]), 1)
    bucket = {k: (1 << 62) - 1 for k in router.declared.values()}
    clip = (1 << 63) + 5
    assert router.tick_sums(bucket, clip) == _loop(router, bucket, clip)


def test_flat_domain_and_empty_tick() -> None:
    router = Router(Domain.flat([f"s{i}" for i in range(10)]), 2)
    bucket = {7: 3, 2: 1 << 40}
    assert router.tick_sums(bucket, 1 << 52) == _loop(router, bucket, 1 << 52)
    assert router.tick_sums({}, 5) == [((), ()), ((), ())]


def test_checkpoints_round_trip_integer_buckets_and_refuse_older_versions() -> None:
    """v5 checkpoints hold integer units; older (float) checkpoints are refused."""
    import json

    from agents.config.settings import Settings
    from agents.ingest.state import IngestState

    dom = Domain.from_paths(["a/x", "a/y", "b/z/w", "c"])
    router = Router(dom, 2)
    s = Settings(origin=1000.0)
    st = IngestState(s, router, 0)
    st.buckets = {3: {router.declared["a/y"]: 5, router.declared["b/z/w"]: 1 << 36}, 4: {}}
    v5 = st.to_bytes()
    back = IngestState(s, router, 0)
    back.restore(v5, 1)
    assert back.buckets == st.buckets
    doc = json.loads(v5)
    doc["v"] = 4
    with pytest.raises(ValueError, match="version"):
        IngestState(s, router, 0).restore(json.dumps(doc).encode(), 1)
    doc["v"] = 5
    doc["buckets"]["3"][1][0] = 2.5  # a float sum is not a count of units
    with pytest.raises(ValueError, match="integer"):
        IngestState(s, router, 0).restore(json.dumps(doc).encode(), 1)


def test_record_digest_is_keyed_blake2b_of_the_documented_bytes() -> None:
    """The schedule's per-record digest (persisted with closing points: it must never change)
    against an independent incremental keyed BLAKE2b over the documented fields, headers
    included; another key, another header or a moved byte gives another digest."""
    import hashlib
    import random

    from agents.ingest.digest import digest_key, record_digest

    def lp(b: bytes | None) -> bytes:
        return b"-|" if b is None else f"{len(b)}|".encode() + b

    def oracle(dkey: bytes, offset: int, ts: int, tt: int, key: bytes | None,
               value: bytes | None, headers: list[tuple[str, bytes | None]]) -> int:
        h = hashlib.blake2b(digest_size=16, key=dkey)
        h.update(f"{offset}|{ts}|{tt}|".encode())
        h.update(lp(key))
        h.update(lp(value))
        h.update(f"{len(headers)}|".encode())
        for k, v in headers:
            h.update(lp(k.encode()))
            h.update(lp(v))
        return int.from_bytes(h.digest(), "little")

    rng = random.Random(3)
    dkey = digest_key(bytes(range(32)))
    assert dkey != digest_key(bytes(range(1, 33))) and len(dkey) == 32
    for i in range(2000):
        key = None if i % 7 == 0 else rng.randbytes(rng.randint(0, 20))
        value = None if i % 11 == 0 else rng.randbytes(rng.randint(0, 80))
        headers = [(f"h{j}", None if j % 3 == 2 else rng.randbytes(rng.randint(0, 9)))
                   for j in range(i % 4)]
        args = (rng.randint(0, 10**12), rng.randint(-1, 10**13), rng.randint(0, 1))
        got = record_digest(dkey, *args, key, value, headers)
        assert got == oracle(dkey, *args, key, value, headers)
        assert got != record_digest(digest_key(None), *args, key, value, headers)
        assert got != record_digest(dkey, *args, key, value,
                                    [*headers, ("stream-dp-close", b"1")])
