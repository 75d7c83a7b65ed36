"""The router's shard layout, built with arrays at start-up, against the element-by-element
definition (``crc32(name) mod shards``; each shard's nodes in domain order, a node's place in
its shard) and the declared keys against the domain's leaves."""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.ingest.routing import Router, shard_of
from stream_dp.domain import Domain

SEGMENT = st.text("abcé☃/", min_size=1, max_size=4).filter(
    lambda s: not s.startswith("/") and not s.endswith("/") and "//" not in s)


@settings(max_examples=150, deadline=None)
@given(paths=st.lists(SEGMENT, min_size=1, max_size=40, unique=True),
       shards=st.integers(min_value=1, max_value=9), flat=st.booleans())
def test_the_layout_is_the_definition(paths: list[str], shards: int, flat: bool) -> None:
    try:
        domain = Domain.flat(paths) if flat else Domain.from_paths(paths, root="root")
    except ValueError:  # a path collides with an internal node or the root: not a domain
        return
    router = Router(domain, shards)
    names = domain.names
    assert router.node_shard == [zlib.crc32(n.encode()) % shards for n in names]
    assert router.node_shard == [shard_of(n, shards) for n in names]
    want: list[list[int]] = [[] for _ in range(shards)]
    local = [0] * len(names)
    for i, s in enumerate(router.node_shard):
        local[i] = len(want[s])
        want[s].append(i)
    assert router.shard_nodes == want
    assert router.local_index == local
    assert all(type(x) is int for x in router.local_index)
    assert all(type(x) is int for nodes in router.shard_nodes for x in nodes)
    leaves = {n: i for i, n in enumerate(names)
              if flat or (not any(m.startswith(n + "/") for m in names) and n != "root")}
    assert router.declared == leaves
    assert list(router.declared) == list(leaves)  # node order


def test_keys_longer_than_the_decoder_takes_are_not_declared() -> None:
    long = "x" * 1025
    router = Router(Domain.flat(["a", long, "b"]), 2)
    assert router.declared == {"a": 0, "b": 2}
