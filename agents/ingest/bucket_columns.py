"""An open tick's bucket as the ingest checkpoint writes it: keys sorted, sums clipped.

:meth:`agents.ingest.state.IngestState.to_bytes` writes each open tick's bucket (event key → sum in
integer units) as ``[sorted keys, min(sum, clip) in that order]``. At 10^6 streams a bucket
holds up to ~5·10^4 leaf keys per events partition between commits, encoded at every commit:
sorting the keys and looking each one up again in Python was most of the checkpoint's cost.
:func:`bucket_columns` does it with NumPy for integer keys (flat and hierarchy domains: the
leaf index) and falls back to the Python loop for anything else (grid / attribute keys, sums
beyond int64): the same two lists either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_INT64_MAX = (1 << 63) - 1


def _compiled() -> Any:
    """``agents.ingest._fastingest.dict_columns`` (one C pass and a radix sort), or None without the
    extension or with ``STREAM_DP_PURE_INGEST=1`` (then NumPy: the same columns)."""
    from agents.ingest.records import _fastingest

    return getattr(_fastingest, "dict_columns", None) if _fastingest is not None else None


_dict_columns = _compiled()


def bucket_columns_loop(bucket: dict[Any, int], clip: int) -> tuple[list[Any], list[int]]:
    """The reference: keys in sorted order and each sum clipped to ``clip`` (integer units)."""
    keys = sorted(bucket)
    return keys, [bucket[k] if bucket[k] < clip else clip for k in keys]


def bucket_columns(bucket: dict[Any, int], clip: int, int_keys: bool, *, arrays: bool = False
                   ) -> tuple[Any, Any]:
    """:func:`bucket_columns_loop`'s lists; vectorised when ``int_keys`` (every key an int).

    ``arrays``: the vectorised columns stay C-contiguous int64 arrays (no Python int per
    element; ``_fast_dumps(..., numpy=True)`` writes them as the same JSON as the lists); the
    fall-backs still give lists."""
    n = len(bucket)
    if not int_keys or n < 64:  # small buckets: the loop is as fast
        return bucket_columns_loop(bucket, clip)
    cols = _dict_columns(bucket) if _dict_columns is not None else None
    if cols is not None:
        # the compiled pass: both columns in key order already (bytearray: writable arrays)
        keys = np.frombuffer(bytearray(cols[0]), dtype=np.int64)
        sums = np.frombuffer(bytearray(cols[1]), dtype=np.int64)
    else:
        try:
            keys = np.fromiter(bucket.keys(), dtype=np.int64, count=n)
            sums = np.fromiter(bucket.values(), dtype=np.int64, count=n)
        except (OverflowError, TypeError, ValueError):  # a sum beyond int64, a key not an int
            return bucket_columns_loop(bucket, clip)
        # keys are distinct (a dict's), so every sort gives the one order: the default
        # introsort, not "stable" (a timsort for int64: 5x the CPU at 50 000 keys)
        order = np.argsort(keys)
        keys, sums = keys[order], sums[order]  # fresh contiguous arrays
    if clip <= _INT64_MAX:
        np.minimum(sums, clip, out=sums)
    if arrays:
        return keys, sums
    return keys.tolist(), sums.tolist()
