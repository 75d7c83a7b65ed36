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
