"""The ingest checkpoint's bucket columns, vectorised, against the Python loop they replace
(the oracle: ``sorted`` keys, each sum clipped), including the fall-backs."""

from __future__ import annotations

import numpy as np
import pytest

from agents.bucket_columns import bucket_columns, bucket_columns_loop


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

    from agents import ingest_records
    from agents.ingest_records import _fast_dumps

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
    from agents import bucket_columns as bc
    from agents.config import Settings
    from agents.ingest import IngestState, Router
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
