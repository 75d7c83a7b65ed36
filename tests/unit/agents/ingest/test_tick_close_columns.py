"""Issue #25: the tick close's int64 columns (``Router.tick_columns`` → ``Partial.encode`` →
``Partial.decode`` → ``ReleaseState.gather``) against the per-node loops they replace.

Oracles: the leaf-by-leaf loop of ``test_ingest_tick_sums``, the stdlib JSON encoder, the
decoder before issue #25 (copied below) and a Python-int loop for the gathering. Cases: unbalanced
trees, keys that are internal nodes, sums between 2^53 and 2^62 (the int64 branch), sums
beyond int64 (the exact fall-back), hostile partials.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from agents.config.settings import Settings
from agents.ingest import routing as ir
from agents.ingest.records import _fast_loads
from agents.ingest.routing import Partial, Router
from agents.release.state import ReleaseState
from stream_dp.domain import Domain
from tests.unit.agents.ingest.test_tick_sums import _loop, _unbalanced_paths


def _as_tuples(cols: list[tuple[Any, Any]]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    out = []
    for idx, sums in cols:
        if isinstance(idx, np.ndarray):
            assert idx.dtype == np.int64 and sums.dtype == np.int64
            assert idx.flags.c_contiguous and sums.flags.c_contiguous
        out.append((tuple(int(i) for i in idx), tuple(int(x) for x in sums)))
    return out


@pytest.fixture(params=["compiled", "numpy"])
def columns_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of reading the bucket: ``_fastingest.dict_columns`` and ``np.fromiter``."""
    if request.param == "numpy":
        monkeypatch.setattr(ir, "_dict_columns", None)
    elif ir._dict_columns is None:
        pytest.skip("compiled extension not built")
    return str(request.param)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shards", [1, 3])
def test_tick_columns_equal_the_loop(columns_path: str, seed: int, shards: int) -> None:
    rng = np.random.default_rng(100 + seed)
    dom = Domain.from_paths(_unbalanced_paths(rng, 80))
    router = Router(dom, shards)
    leaves = sorted(router.declared.values())
    chosen = rng.choice(leaves, size=min(len(leaves), 50), replace=False)
    bucket = {int(k): int(2.0 ** rng.uniform(0, 50)) for k in chosen}
    bucket[int(chosen[0])] = 0  # a zero-valued leaf still releases its nodes
    internal = [n for n in range(len(dom.names)) if n not in set(leaves)]
    with_internal = dict(bucket)  # keys that are internal nodes: added like ancestors
    for n in rng.choice(internal, size=min(3, len(internal)), replace=False):
        with_internal[int(n)] = int(rng.integers(0, 1 << 40))
    for b in (bucket, with_internal):
        for clip in (1 << 52, int(np.median(list(b.values()))), 1):
            assert _as_tuples(router.tick_columns(b, clip)) == _loop(router, b, clip)


def test_the_int64_branch_between_2_53_and_2_62(columns_path: str) -> None:
    """Sums a float64 would round (beyond 2^53) but int64 holds: exact."""
    router = Router(Domain.from_paths([f"r{i % 3}/m{i % 7}/l{i}" for i in range(200)]), 2)
    bucket = {k: (1 << 52) + 2 * k + 1 for k in router.declared.values()}  # odd: float drops it
    clip = 1 << 61
    got = router.tick_columns(bucket, clip)
    assert all(isinstance(i, np.ndarray) for i, _ in got)
    assert _as_tuples(got) == _loop(router, bucket, clip)


@pytest.mark.parametrize("value", [(1 << 62) - 1, (1 << 63) + 7, 1 << 70])
def test_sums_beyond_int64_fall_back_to_exact_integers(columns_path: str, value: int) -> None:
    router = Router(Domain.from_paths([f"r/m{i % 2}/l{i}" for i in range(8)]), 2)
    bucket = {k: value + k for k in router.declared.values()}
    for clip in ((1 << 64) + 5, 1 << 80):
        got = router.tick_columns(bucket, clip)
        assert _as_tuples(got) == _loop(router, bucket, clip)
        assert router.tick_sums(bucket, clip) == _loop(router, bucket, clip)


def test_flat_domain(columns_path: str) -> None:
    router = Router(Domain.flat([f"s{i}" for i in range(300)]), 4)
    rng = np.random.default_rng(5)
    bucket = {int(k): int(rng.integers(0, 1 << 40)) for k in rng.choice(300, 120, replace=False)}
    assert _as_tuples(router.tick_columns(bucket, 1 << 39)) == _loop(router, bucket, 1 << 39)


# ------------------------------------------------------------------ wire format
def test_partials_bytes_are_the_old_encoders() -> None:
    """Array partials encode to the very bytes of the tuple partials (the old code path) and
    of the stdlib encoder (an independent oracle)."""
    rng = np.random.default_rng(7)
    router = Router(Domain.from_paths(_unbalanced_paths(rng, 120)), 3)
    leaves = sorted(router.declared.values())
    bucket = {int(k): int(rng.integers(0, 1 << 45)) for k in rng.choice(leaves, 60, replace=False)}
    for shard, (idx, counts) in enumerate(router.tick_columns(bucket, 1 << 44)):
        new = Partial(9, 1, shard, idx, counts, 1234.25)
        old = Partial(9, 1, shard, tuple(idx.tolist()), tuple(counts.tolist()), 1234.25)
        stdlib = json.dumps({"v": 2, "tick": 9, "src": 1, "shard": shard, "idx": idx.tolist(),
                             "counts": counts.tolist(), "closed_at": 1234.25},
                            separators=(",", ":")).encode()
        assert new.encode() == old.encode() == stdlib
        assert new == old and Partial.decode(stdlib) == old
    empty = Partial(1, 0, 0, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 1.5)
    assert empty.encode() == Partial(1, 0, 0, (), (), 1.5).encode()


# ------------------------------------------------------------------ hostile partials
def _old_decode(raw: bytes) -> Partial:
    """``Partial.decode`` before issue #25 (e1d22fe), verbatim."""
    d = _fast_loads(raw)
    if d.get("v") != 2:
        raise ValueError("a partial of an older version")
    counts = d["counts"]
    if not all(type(c) is int and c >= 0 for c in counts):
        raise ValueError("a partial whose counts are not integer units >= 0")
    return Partial(int(d["tick"]), int(d["src"]), int(d["shard"]),
                   tuple(int(i) for i in d["idx"]), tuple(counts), float(d["closed_at"]))


def _raw(idx: str, counts: str) -> bytes:
    return (f'{{"v":2,"tick":3,"src":1,"shard":0,"idx":{idx},"counts":{counts},'
            f'"closed_at":5.5}}').encode()


#: counts the old decoder refused: the new one refuses them too
REFUSED_BY_BOTH = [
    ("[0,1,2]", "[1,-1,3]"), ("[0,1]", "[true,4]"), ("[0,1]", "[4,false]"), ("[0,1]", "[1.0,2]"),
    ("[0,1]", "[1,2.5]"), ("[0,1]", '["1",2]'), ("[0,1]", "[null,2]"), ("[0,1]", "[[1],[2]]"),
    ("[0,1]", "[1,[2]]"), ("[0,1]", "[1,{}]"), ("[0,1]", "[-9223372036854775809,1]"),
    ("[0,1]", "[1e3,1]"), ("[0]", "[true]"), ("[0,1]", "[0,true]"),
]
#: the old decoder accepted these (int() of the indices, no length check, wrapped-around
#: negative indices, duplicates): none is written by an honest ingest, each would add a count
#: to another stream than its index says (or broadcast one count to several)
REFUSED_NOW = [
    ("[0,-1]", "[1,2]"), ("[0,true]", "[1,2]"), ("[0,1.5]", "[1,2]"), ('["0",1]', "[1,2]"),
    ("[0,1,2]", "[5]"), ("[0]", "[1,2]"), ("[3,3]", "[1,2]"), ("[4,2]", "[1,2]"),
]
ACCEPTED = [
    ("[]", "[]"), ("[0]", "[0]"), ("[0,1]", "[1,0]"), ("[0,5,9]", "[0,1,9007199254740991]"),
    ("[2,7]", "[9223372036854775807,1]"), ("[1,2]", "[9223372036854775808,3]"),
    ("[1,18446744073709551615]", "[2,3]"),  # attribute patterns beyond int64: exact
]


@pytest.mark.parametrize("idx,counts", REFUSED_BY_BOTH)
def test_hostile_counts_are_refused_as_before(idx: str, counts: str) -> None:
    raw = _raw(idx, counts)
    with pytest.raises((ValueError, TypeError)):
        _old_decode(raw)
    with pytest.raises(ValueError):
        Partial.decode(raw)


@pytest.mark.parametrize("idx,counts", REFUSED_NOW)
def test_malformed_indices_are_refused(idx: str, counts: str) -> None:
    with pytest.raises(ValueError):
        Partial.decode(_raw(idx, counts))


@pytest.mark.parametrize("idx,counts", ACCEPTED)
def test_honest_partials_decode_to_the_old_values(idx: str, counts: str) -> None:
    raw = _raw(idx, counts)
    new, old = Partial.decode(raw), _old_decode(raw)
    assert new == old and new.encode() == old.encode() == raw


def test_decode_refuses_what_is_not_an_object() -> None:
    for raw in (b"[1,2]", b"3", b'"x"'):
        with pytest.raises((ValueError, TypeError)):
            Partial.decode(raw)
    with pytest.raises(ValueError, match="older version"):
        Partial.decode(b'{"v":1,"tick":1,"src":0,"shard":0,"idx":[],"counts":[],'
                       b'"closed_at":0}')


def test_random_partials_round_trip_as_arrays() -> None:
    rng = np.random.default_rng(11)
    for _ in range(50):
        n = int(rng.integers(0, 300))
        idx = np.sort(rng.choice(10_000, n, replace=False)).astype(np.int64)
        counts = rng.integers(0, 1 << 62, n, dtype=np.int64)
        raw = Partial(4, 0, 1, idx, counts, 2.0).encode()
        back = Partial.decode(raw)
        assert isinstance(back.idx, np.ndarray) and isinstance(back.counts, np.ndarray)
        assert back == _old_decode(raw)


# ------------------------------------------------------------------ gathering
def _gather_loop(n: int, clip: int, parts: list[Partial]) -> list[int]:
    """Per stream: add each source's count in source order, clip after each (Python ints)."""
    units = [0] * n
    for p in parts:
        for i, c in zip(p.idx, p.counts, strict=True):
            units[int(i)] = min(units[int(i)] + int(c), clip)
    return units


def test_gather_equals_the_exact_loop_also_for_hostile_magnitudes() -> None:
    """Counts up to 2^63 - 1 (an int64 partial) and beyond (Python ints): clipped exactly; the
    code before issue #25 wrapped int64 around on the first and raised on the second."""
    s = Settings(origin=1000.0, events_partitions=3)
    router = Router(Domain.flat([f"s{i}" for i in range(40)]), 1)
    st = ReleaseState(s, router, 0, None)
    rng = np.random.default_rng(2)
    for trial in range(30):
        parts = []
        for src in range(3):
            idx = np.sort(rng.choice(40, int(rng.integers(0, 40)), replace=False))
            big = [0, 1, st.clip - 1, st.clip, (1 << 63) - 1][trial % 5]
            counts = rng.integers(0, st.clip, len(idx), dtype=np.int64)
            if len(idx):
                counts[0] = big
            raw = Partial(1, src, 0, idx.astype(np.int64), counts, 0.0).encode()
            parts.append(Partial.decode(raw))
        if trial % 3 == 0:  # a count beyond int64: the exact path
            p = parts[1]
            parts[1] = Partial(1, 1, 0, tuple(int(i) for i in p.idx),
                               tuple([1 << 70, *[int(c) for c in p.counts][1:]])
                               if len(p.idx) else (), 0.0)
        got = st.gather(dict(enumerate(parts)))
        assert got.dtype == np.int64
        assert got.tolist() == _gather_loop(40, st.clip, parts)
