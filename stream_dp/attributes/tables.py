"""Marginal tables over binary attributes: cell indexing, exact counting, marginalising.

A table over the attributes ``(a_1, …, a_k)`` (in that order) has ``2**k`` cells; the cell of an
event is the integer whose bits are its values of ``a_1 … a_k``, **``a_1`` most significant**
(the cell order of ``stream-dp marginals``' answers). As a NumPy array a table is the flat
vector of its cells, or equivalently an array of shape ``(2,)*k`` indexed ``[x_1, …, x_k]``.

>>> cell_index(np.array([[1, 0, 1]], dtype=np.uint8), (2, 0)).tolist()
[3]
>>> marginalize(np.arange(8.0), (0, 1, 2), (2,)).tolist()
[12.0, 16.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = ["cell_index", "count_table", "marginalize"]

Float64Array = NDArray[np.float64]


def cell_index(bits: NDArray[np.uint8], attrs: Sequence[int]) -> NDArray[np.int64]:
    """Cell of each row of the 0/1 matrix ``bits`` (shape ``(n, m)``) in the table over ``attrs``."""
    idx = np.zeros(bits.shape[0], dtype=np.int64)
    for a in attrs:
        idx <<= 1
        idx |= bits[:, a].astype(np.int64)
    return idx


def count_table(
    bits: NDArray[np.uint8], attrs: Sequence[int], weights: NDArray[np.float64] | None = None
) -> Float64Array:
    """Exact (optionally weighted, e.g. decayed) counts of the ``2**len(attrs)`` cells."""
    counts: Float64Array = np.bincount(
        cell_index(bits, attrs), weights=weights, minlength=1 << len(attrs)
    ).astype(np.float64)
    return counts


def marginalize(table: Float64Array, attrs: Sequence[int], keep: Sequence[int]) -> Float64Array:
    """The flat table over ``keep`` (a subset of ``attrs``, in ``keep``'s order) of ``table``."""
    attrs_t = tuple(attrs)
    missing = [a for a in keep if a not in attrs_t]
    if missing:
        raise ValueError(f"cannot marginalise onto {missing}: not in the table's {list(attrs_t)}")
    arr = np.asarray(table, dtype=np.float64).reshape((2,) * len(attrs_t))
    drop = tuple(i for i, a in enumerate(attrs_t) if a not in keep)
    summed = arr.sum(axis=drop) if drop else arr
    kept = [a for a in attrs_t if a in keep]
    order = [kept.index(a) for a in keep]
    out: Float64Array = np.transpose(summed, order).reshape(-1) if order else summed.reshape(-1)
    return out
