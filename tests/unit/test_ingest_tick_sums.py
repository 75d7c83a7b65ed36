"""Leaf-mode tick sums (``Router.tick_sums``): bit for bit the per-node loop they replace.

The loop — every leaf in sorted order adds its value to each of its nodes — is the order in
which releases were always summed; a replayed log must give identical bits. Unbalanced trees
(leaves at several depths under one node) and values whose sums depend on the order are the
cases a level-by-level shortcut would get wrong.
"""

from __future__ import annotations

import numpy as np
import pytest

from agents.ingest import Router
from stream_dp.domain import Domain


def _loop(router: Router, bucket: dict[int, float]) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    sums: dict[int, float] = {}
    for leaf in sorted(bucket):
        for n in router.expand(leaf):
            sums[n] = sums.get(n, 0.0) + bucket[leaf]
    per: list[list[tuple[int, float]]] = [[] for _ in range(router.shards)]
    for n in sorted(sums):
        per[router.node_shard[n]].append((router.local_index[n], sums[n]))
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
    # magnitudes 1e-3 .. 1e6: float sums that change with the order of the additions
    bucket = {int(k): float(10.0 ** rng.uniform(-3, 6)) for k in chosen}
    bucket[int(chosen[0])] = 0.0  # a zero-valued leaf still releases its nodes
    got = router.tick_sums(bucket)
    want = _loop(router, bucket)
    assert [g[0] for g in got] == [w[0] for w in want]
    for (_, g), (_, w) in zip(got, want, strict=True):
        assert np.array_equal(np.array(g).view(np.int64), np.array(w).view(np.int64))


def test_flat_domain_and_empty_tick() -> None:
    router = Router(Domain.flat([f"s{i}" for i in range(10)]), 2)
    bucket = {7: 1.5, 2: 0.25}
    assert router.tick_sums(bucket) == _loop(router, bucket)
    assert router.tick_sums({}) == [((), ()), ((), ())]


def test_a_v3_checkpoint_restores_to_the_same_leaf_buckets() -> None:
    """Checkpoints written before leaf keys (v3: each key as its list of nodes) still restore."""
    import json

    from agents.config import Settings
    from agents.ingest import IngestState

    dom = Domain.from_paths(["a/x", "a/y", "b/z/w", "c"])
    router = Router(dom, 2)
    s = Settings(origin=1000.0)
    st = IngestState(s, router, 0)
    st.buckets = {3: {router.declared["a/y"]: 2.5, router.declared["b/z/w"]: 1.0}, 4: {}}
    v4 = st.to_bytes()
    doc = json.loads(v4)
    assert doc["v"] == 4
    doc["v"] = 3
    doc["buckets"] = {t: [[list(router.expand(k)) for k in b[0]], b[1]]
                      for t, b in doc["buckets"].items()}
    for raw in (v4, json.dumps(doc).encode()):
        back = IngestState(s, router, 0)
        back.restore(raw, 1)
        assert back.buckets == st.buckets


def test_record_digest_is_blake2b_of_the_documented_bytes() -> None:
    """The schedule's per-record digest (persisted with closing points: it must never change)
    against an independent incremental BLAKE2b over the documented fields."""
    import hashlib
    import random

    from agents.ingest import record_digest

    def oracle(offset: int, ts: int, tt: int, key: bytes | None, value: bytes | None) -> int:
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{offset}|{ts}|{tt}|".encode())
        h.update(b"-|" if key is None else f"{len(key)}|".encode() + key)
        if value is not None:
            h.update(value)
        return int.from_bytes(h.digest(), "little")

    rng = random.Random(3)
    for i in range(2000):
        key = None if i % 7 == 0 else rng.randbytes(rng.randint(0, 20))
        value = None if i % 11 == 0 else rng.randbytes(rng.randint(0, 80))
        args = (rng.randint(0, 10**12), rng.randint(-1, 10**13), rng.randint(0, 1))
        assert record_digest(*args, key, value) == oracle(*args, key, value)
