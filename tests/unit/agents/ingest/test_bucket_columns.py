"""The ingest checkpoint's bucket columns, vectorised, against the Python loop they replace
(the oracle: ``sorted`` keys, each sum clipped), including the fall-backs."""

from __future__ import annotations

import numpy as np
import pytest

from agents.ingest.bucket_columns import bucket_columns, bucket_columns_loop


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_columns_equal_the_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(64, 5000))
    keys = rng.choice(10**7, size=n, replace=False).tolist()
    sums = rng.integers(1, 2**40, size=n).tolist()
    bucket = dict(zip(keys, sums, strict=True))
    for clip in (1, 2**20, 2**39, 2**62, 2**70):
        got = bucket_columns(bucket, clip, True)
        want = bucket_columns_loop(bucket, clip)
        assert got == want
        assert all(type(k) is int for k in got[0]) and all(type(v) is int for v in got[1])


def test_fallbacks_give_the_same_columns() -> None:
    big = {i: (2**64 if i == 7 else i + 1) for i in range(100)}  # a sum beyond int64
    assert bucket_columns(big, 2**65, True) == bucket_columns_loop(big, 2**65)
    grid = {(i, i + 1): i for i in range(100)}  # grid keys: tuples of nodes
    assert bucket_columns(grid, 50, False) == bucket_columns_loop(grid, 50)
    small = {3: 5, 1: 9}
    assert bucket_columns(small, 6, True) == ([1, 3], [6, 5])


def test_array_columns_write_the_same_json_as_the_lists() -> None:
    """``arrays=True`` columns through ``_fast_dumps(..., numpy=True)`` (orjson, and the stdlib
    fall-back) are the bytes of the lists through ``_fast_dumps``."""
    import json

    from agents.ingest import records as ingest_records
    from agents.ingest.records import _fast_dumps

    rng = np.random.default_rng(25)
    keys = rng.choice(2**40, size=3000, replace=False).tolist()
    bucket = dict(zip(keys, rng.integers(0, 2**50, size=3000).tolist(), strict=True))
    bucket[keys[0]] = 2**62  # near the top of int64
    for clip in (1, 2**30, 2**63 - 1, 2**70):
        arrays = bucket_columns(bucket, clip, True, arrays=True)
        assert all(isinstance(c, np.ndarray) and c.dtype == np.int64 for c in arrays)
        lists = bucket_columns_loop(bucket, clip)
        doc = {"v": 5, "buckets": {"3": list(arrays), "4": [[], []]}, "offset": 7}
        want = _fast_dumps({"v": 5, "buckets": {"3": list(lists), "4": [[], []]}, "offset": 7})
        assert _fast_dumps(doc, numpy=True) == want
        std = json.dumps(doc, separators=(",", ":"), allow_nan=False,
                         default=ingest_records._tolist).encode()
        assert std == want
    # the fall-backs still give lists, written as before
    big = {i: (2**64 if i == 7 else i + 1) for i in range(100)}
    assert bucket_columns(big, 2**65, True, arrays=True) == bucket_columns_loop(big, 2**65)


def test_ingest_checkpoint_bytes_equal_the_list_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole ingest checkpoint (sealed) is byte for byte what the list columns gave."""
    from agents.config.settings import Settings
    from agents.ingest import bucket_columns as bc
    from agents.ingest.routing import Router
    from agents.ingest.state import IngestState
    from stream_dp.domain import Domain

    dom = Domain.from_paths([f"r{i}/l{j}" for i in range(30) for j in range(40)])
    router = Router(dom, 2)
    s = Settings(origin=1000.0)
    st = IngestState(s, router, 0, key=b"k" * 32)
    rng = np.random.default_rng(3)
    leaves = sorted(router.declared.values())
    st.buckets = {t: {int(k): int(v) for k, v in zip(
        rng.choice(leaves, size=500, replace=False), rng.integers(1, 2**45, size=500),
        strict=True)} for t in (5, 6)}
    got = st.to_bytes()

    def lists_only(bucket: dict[int, int], clip: int, int_keys: bool, *, arrays: bool = False
                   ) -> tuple[list[int], list[int]]:
        return bc.bucket_columns_loop(bucket, clip)

    monkeypatch.setattr(bc, "bucket_columns", lists_only)
    assert st.to_bytes() == got


@pytest.mark.parametrize("seed", range(6))
def test_compiled_columns_equal_the_loop_and_numpy(seed: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``_fastingest.dict_columns`` (one C pass, radix sort over the bytes the keys span): the
    loop's columns for keys from 0..10^3 up to the whole int64 range (negative keys, a span
    of 2^64 - 1: every byte pass), and the NumPy path's too."""
    from agents.ingest import bucket_columns as bc

    if bc._dict_columns is None:
        pytest.skip("compiled extension not built (STREAM_DP_PURE_INGEST or no compiler)")
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(64, 20_000))
    lo, hi = [(0, 10**3 * 30), (0, 2**20), (-(2**40), 2**40), (0, 2**56),
              (-(2**63), 2**63 - 1), (2**62, 2**63 - 1)][seed]
    keys = list({int(k) for k in rng.integers(lo, hi, size=n, endpoint=True)})
    if seed == 4:
        keys += [-(2**63), 2**63 - 1]  # both ends of int64
    keys = list(dict.fromkeys(keys))
    rng.shuffle(keys)
    sums = rng.integers(0, 2**62, size=len(keys)).tolist()
    bucket = dict(zip(keys, sums, strict=True))
    raw = bc._dict_columns(bucket)
    assert raw is not None
    assert np.frombuffer(raw[0], dtype=np.int64).tolist() == sorted(keys)
    for clip in (1, 2**40, 2**63, 2**70):
        want = bucket_columns_loop(bucket, clip)
        assert bucket_columns(bucket, clip, True) == want
        arrays = bucket_columns(bucket, clip, True, arrays=True)
        assert [a.tolist() for a in arrays] == list(want)
        assert all(a.flags.writeable and a.flags.c_contiguous for a in arrays)
        monkeypatch.setattr(bc, "_dict_columns", None)  # the NumPy path: the same columns
        assert bucket_columns(bucket, clip, True) == want
        monkeypatch.undo()


def test_compiled_columns_refuse_what_is_not_int64() -> None:
    """A sum or key beyond int64, a float, a bool or a tuple: None (the caller falls back to
    the exact Python loop), never a truncated value; an empty dict gives empty columns."""
    from agents.ingest import bucket_columns as bc

    if bc._dict_columns is None:
        pytest.skip("compiled extension not built")
    base = {i: i + 1 for i in range(100)}
    for bad in ({**base, 7: 2**63}, {**base, 2**63: 1}, {**base, -(2**63) - 1: 1},
                {**base, 3: 1.0}, {**{k: v for k, v in base.items() if k != 1}, True: 1},
                {**base, 5: -(2**64)}):
        assert bc._dict_columns(bad) is None
        assert bucket_columns(bad, 2**70, True) == bucket_columns_loop(bad, 2**70)
    assert bc._dict_columns({**base, (1, 2): 3}) is None  # a grid key
    assert bc._dict_columns({}) == (b"", b"")
    with pytest.raises(TypeError):
        bc._dict_columns([1, 2])
