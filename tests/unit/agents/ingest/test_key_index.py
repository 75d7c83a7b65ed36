"""``agents.ingest._fastingest.KeyIndex``: the compiled scanner's table of the declared keys by their
UTF-8 bytes (issue #25). It must answer exactly as the dict it was built from answers for the
str a record's key bytes decode to (strictly), and it must never be read once that dict changed:
the scanner then looks keys up in the dict, and the worker rebuilds the index.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.ingest import records as ingest_records
from agents.ingest.processing import _key_index
from agents.ingest.records import _NO_STOP, FAST_PATH_STATUS, Record
from agents.ingest.routing import Router
from agents.ingest.state import IngestState
from stream_dp.domain import Domain
from tests.unit.agents.ingest import test_fastingest as tf

fast = pytest.importorskip("agents.ingest._fastingest", reason="the compiled fast path did not build")
pytestmark = pytest.mark.skipif(ingest_records._fastingest is None or not hasattr(fast, "KeyIndex"),
                                reason=FAST_PATH_STATUS)


def _strict(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")  # strict: no surrogates, no overlong forms
    except UnicodeDecodeError:
        return None


def _as_dict_answers(d: dict[Any, Any], raw: bytes) -> Any:
    """What the scanner's dict lookup gives for a record key of these bytes."""
    text = _strict(raw)
    return None if text is None else d.get(text)


_TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from("\ud800\udfffé🙂/"), max_size=40)


@hsettings(max_examples=150, deadline=None)
@given(keys=st.lists(_TEXT, max_size=60), probes=st.lists(st.binary(max_size=40), max_size=30),
       prefix=st.sampled_from(["", "r0/m0/", "a-long-common-prefix-of-24b/"]))
def test_the_index_answers_as_the_dict(keys: list[str], probes: list[bytes],
                                       prefix: str) -> None:
    """Declared keys of any text (non-ASCII, lone surrogates that have no UTF-8 bytes, long
    keys sharing their first 12/16/24 bytes, the empty key) and non-str keys; probes of any
    bytes (invalid UTF-8 included) and every key's own bytes and their prefixes/extensions."""
    d: dict[Any, Any] = {prefix + k: object() for k in keys}
    d[7] = object()  # not a str: no record's key finds it
    ix = fast.KeyIndex(d)
    assert ix.fresh(d)
    for k, v in d.items():
        if type(k) is not str:
            continue
        try:
            raw = k.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: the dict never finds it for bytes
            continue
        assert ix.get(raw) is v
        for other in (raw[:-1], raw + b"x", raw + b"\x00", b"\x00" + raw):
            assert ix.get(other) is _as_dict_answers(d, other)
    for raw in probes + [p.encode("utf-8", "surrogatepass") for p in d if type(p) is str]:
        assert ix.get(raw) is _as_dict_answers(d, raw)
    assert len(ix) == sum(1 for k in d if type(k) is str and _strict(
        k.encode("utf-8", "surrogatepass")) is not None)


@hsettings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=80))
def test_the_key_hash_is_pythons_hash_of_the_bytes(data: bytes) -> None:
    """The index hashes a record's key bytes with CPython's keyed hash, ``hash(bytes)``, to all
    64 bits (issue 38: on Python 3.13 the hash function had no prototype in the C file, so
    the compiler took its result for an ``int`` and the hash came back cut to 32 bits)."""
    assert fast.key_hash(data) == hash(data)


def test_the_slot_tags_are_spread() -> None:
    """The slot tag is the hash's upper 32 bits: it filters a probe only if those bits vary from
    key to key. The hash cut to 32 bits and sign-extended gave two tags, 0 and 0xffffffff."""
    assert sys.hash_info.width == 64
    tags = {(fast.key_hash(f"r{i}/m{i % 7}".encode()) >> 32) & 0xFFFFFFFF for i in range(256)}
    assert len(tags) > 250  # 256 keys in 2^32 tags: a collision or two at most, by chance


def test_many_keys_long_probe_sequences_and_misses() -> None:
    """5·10^4 keys (load just under 1/2: linear probing forms clusters, tags and heads collide
    across keys that differ only past the inline bytes) and as many absent keys."""
    n = 50_000
    long = "x" * 30
    d = {f"{long}/{i}": i for i in range(n)}
    d.update({f"r{i % 10}/m{i % 100}/l{i}": -i for i in range(n)})
    ix = fast.KeyIndex(d)
    assert len(ix) == len(d)
    for k, v in d.items():
        assert ix.get(k.encode()) == v
    for i in range(n, 2 * n):
        assert ix.get(f"{long}/{i}".encode()) is None
        assert ix.get(f"r{i % 10}/m{i % 100}/l{i}".encode()) is None


def _scan(router: Router, d: dict[str, Any], ix: Any, recs: list[Record],
          tmp: Path) -> tuple[int, dict[int, dict[Any, int]]]:
    s = tf._settings(tmp, schedule="markers")
    state = IngestState(s, router, 0, offset=0)
    scanner = state._fast_scanner()
    buckets: dict[int, dict[Any, int]] = {}
    end, _added, _accepted, _clamped, _bounded = scanner.scan(recs, 0, 1, _NO_STOP, math.inf,
                                                    False, buckets, d, ix)
    return end, buckets


def _recs(keys: list[str]) -> list[Record]:
    return [Record(i, None, json.dumps({"key": k, "ts": tf.ORIGIN + 1.0}).encode(), -1, 0, ())
            for i, k in enumerate(keys)]


@pytest.mark.parametrize("change", ["reassign", "delete", "add", "delete_and_add", "clear"])
def test_the_scanner_never_reads_an_index_of_a_changed_dict(tmp_path: Path, change: str) -> None:
    """After any change of the declared dict (same size or not), the scanner answers from the
    dict: an index built before would put the event in the old leaf's bucket, or accept a key
    that is no longer declared."""
    router = Router(Domain.from_paths(["a/x", "a/y", "b/z"]), 2)
    d = dict(router.declared)
    ix = fast.KeyIndex(d)
    if change == "reassign":
        d["a/x"] = d["a/y"]
    elif change == "delete":
        del d["a/x"]
    elif change == "add":
        d["q/q"] = d["a/y"]
    elif change == "delete_and_add":  # the same size
        del d["a/x"]
        d["a/x"] = d["b/z"]
    else:
        d.clear()
    assert not ix.fresh(d)
    recs = _recs(["b/z", "a/x", "a/y"])
    want = _scan(router, d, None, recs, tmp_path)
    assert _scan(router, d, ix, recs, tmp_path) == want
    assert not fast.KeyIndex(dict(d)).fresh(d)  # equal contents, another dict: not fresh


def test_a_fresh_index_is_used(tmp_path: Path) -> None:
    """The index really is read while fresh (else the tests above would compare the dict with
    itself): a key that is a str subclass is left out of the index (the dict finds it), so with
    the index the scanner hands that record to the pure path, without it accepts it."""

    class Key(str):
        pass

    router = Router(Domain.from_paths(["a/x", "a/y", "b/z"]), 2)
    d = {Key(k) if k == "a/x" else k: v for k, v in router.declared.items()}
    ix = fast.KeyIndex(d)
    assert ix.fresh(d) and ix.get(b"a/x") is None and ix.get(b"b/z") == d["b/z"]
    recs = _recs(["b/z", "a/x", "a/y"])
    assert _scan(router, d, None, recs, tmp_path)[0] == 3
    end, buckets = _scan(router, d, ix, recs, tmp_path)
    assert end == 1 and buckets == {1: {d["b/z"]: 8388608}}
    assert _key_index(router) is _key_index(router)  # built once per router
    assert _key_index(router).fresh(router.declared)


def test_the_worker_rebuilds_the_index_when_declared_changes(tmp_path: Path) -> None:
    """IngestState: a change of ``router.declared`` between batches is seen by the next batch
    exactly as the pure path sees it."""
    out = []
    for use_fast in (False, True):
        router = Router(Domain.from_paths(["a/x", "a/y", "b/z"]), 2)
        leaf = dict(router.declared)
        s = tf._settings(tmp_path, schedule="markers")
        state = IngestState(s, router, 0, offset=0)
        state.use_fast_path = use_fast
        state.clock = lambda: tf.ORIGIN + 1e6
        state.process_batch(_recs(["a/x", "a/y"]))
        first = _key_index(router)
        router.declared["a/x"] = leaf["b/z"]
        state.process_batch([r._replace(offset=r.offset + 2) for r in _recs(["a/x", "a/y"])])
        if use_fast:
            assert first is not None and not first.fresh(router.declared)
            assert _key_index(router) is not first
        out.append((state.buckets, state.digest, state.out.accepted))
    u = 8388608  # one event of value 1.0 in integer units (cap 1.0)
    assert out[1] == out[0]
    assert out[0][0] == {1: {leaf["a/x"]: u, leaf["a/y"]: 2 * u, leaf["b/z"]: u}}
