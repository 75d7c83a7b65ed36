"""The node manifest in pieces (:mod:`stream_dp.node_manifest`): every record within its
limit, the pieces joined back to exactly the names and hash chunk records carry, and the
one-record form byte for byte what was always published."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.kafka.codec import validate
from stream_dp.compact import decode_manifest, encode_manifest, manifest_hash
from stream_dp.node_manifest import (
    NODE_MANIFEST_MAX_BYTES,
    encode_node_manifest,
    is_node_manifest_key,
    join_node_manifests,
)

NAMES = st.lists(st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")),
                         min_size=1, max_size=12),
                 min_size=1, max_size=60, unique=True)


def _decoded(records):
    return [decode_manifest(value) for _, value in records]


@settings(max_examples=200, deadline=None)
@given(names=NAMES, limit=st.integers(min_value=100, max_value=2000))
def test_pieces_fit_their_limit_and_join_to_exactly_the_names(names, limit):
    whole = encode_manifest("histogram", names)
    try:
        records = encode_node_manifest(names, max_bytes=limit)
    except ValueError:  # a single name too long for this limit: every piece of one name fails
        assert any(len(encode_manifest(f"histogram/{len(names)}/{i}", [n])) > limit
                   for i, n in enumerate(names))
        return
    assert all(len(value) <= limit for _, value in records)
    if len(whole) <= limit:
        assert records == [("histogram", whole)]  # byte for byte the one-record form
    else:
        assert len(records) >= 2
        offsets = [int(key.rsplit("/", 1)[1]) for key, _ in records]
        assert offsets == sorted(offsets) and offsets[0] == 0
    for key, value in records:
        assert is_node_manifest_key(key) and is_node_manifest_key(key.encode())
        man = decode_manifest(value)  # each piece verifies its own hash
        assert man.shard == key
    joined = join_node_manifests(_decoded(records))
    assert joined is not None
    assert joined.shard == "histogram"
    assert joined.streams == tuple(names)
    assert joined.sha256 == manifest_hash(names)


def test_the_default_limit_keeps_a_million_short_names_in_one_record():
    names = [f"r{i % 10}/m{i % 1000}/l{i}" for i in range(1_000_000)]
    assert NODE_MANIFEST_MAX_BYTES == 32 * 1024 * 1024
    assert [key for key, _ in encode_node_manifest(names)] == ["histogram"]


def test_every_piece_is_a_dp_manifest_v1_record():
    names = [f"node-{i}" for i in range(50)]
    records = encode_node_manifest(names, max_bytes=300)
    assert len(records) > 2
    for _, value in records:
        validate("dp.manifest.v1", json.loads(value))


def _pieces(names, limit):
    return _decoded(encode_node_manifest(names, max_bytes=limit))


def test_the_newest_of_a_whole_record_and_a_complete_set_of_pieces_wins():
    old = [f"a{i}" for i in range(40)]
    new = [f"b{i}" for i in range(40)]
    whole_old = decode_manifest(encode_manifest("histogram", old))
    whole_new = decode_manifest(encode_manifest("histogram", new))
    assert join_node_manifests([whole_old, *_pieces(new, 200)]).streams == tuple(new)
    assert join_node_manifests([*_pieces(new, 200), whole_old]).streams == tuple(old)
    assert join_node_manifests([*_pieces(old, 200), *_pieces(new, 200)]).streams == tuple(new)
    assert join_node_manifests([whole_old, whole_new]).streams == tuple(new)
    assert join_node_manifests([]) is None


def test_an_incomplete_set_of_pieces_is_never_joined():
    names = [f"n{i}" for i in range(60)]
    pieces = _pieces(names, 200)
    assert len(pieces) >= 3
    for drop in range(len(pieces)):
        partial = pieces[:drop] + pieces[drop + 1:]
        assert join_node_manifests(partial) is None
        # an older complete manifest stays what a reader holds
        older = decode_manifest(encode_manifest("histogram", ["x", "y"]))
        assert join_node_manifests([older, *partial]).streams == ("x", "y")


def test_pieces_of_another_total_never_mix():
    first = [f"p{i}" for i in range(30)]
    second = [f"q{i}" for i in range(31)]
    a, b = _pieces(first, 200), _pieces(second, 200)
    rng = random.Random(3)
    # the second deployment's last piece not written yet: the first's manifest still holds
    assert join_node_manifests(a + b[:-1]).streams == tuple(first)
    shuffled = b[:]
    rng.shuffle(shuffled)
    assert join_node_manifests(shuffled).streams == tuple(second)


def test_shard_manifests_are_not_node_manifest_records():
    assert not is_node_manifest_key(b"shard-0")
    assert not is_node_manifest_key("histograms")
    assert not is_node_manifest_key(None)
    assert is_node_manifest_key(b"histogram")


def test_a_name_too_long_for_any_piece_is_refused():
    with pytest.raises(ValueError, match="does not fit"):
        encode_node_manifest(["x" * 500, "y"], max_bytes=300)
