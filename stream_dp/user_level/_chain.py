"""The chain of top blocks both trees' programs end with (:mod:`stream_dp.user_level.trees`
at ``p = 1``, :mod:`stream_dp.user_level.trees_decayed` below it): one function, one module,
so neither program imports the other."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

Float64Array = NDArray[np.float64]
_NEG = -math.inf


def chain_top_blocks(n: int, sep: int, top: int, lo: int, hi: int,
                     table: Callable[[int], Float64Array]) -> Float64Array:
    """Chain the top blocks of ticks ``[lo, hi)``: ``table(first)`` is the best value of the
    top block starting at tick ``first`` by (events, first offset, last offset), offsets
    clipped at ``sep − 1``; the result is the best value over patterns of at most ``c`` events,
    ``c = 0 … n``, two events at least ``sep`` apart across blocks too. Shared by the exact
    program at ``p = 1`` and the decayed one (:mod:`stream_dp.user_level.trees_decayed`)."""
    clip = sep - 1
    # chain of top blocks: state (c, z); the window's left edge leaves a free
    chain = np.full((n + 1, sep), _NEG)
    chain[0, clip] = 0.0  # nothing yet: no constraint on the first event
    for first in range((lo // top) * top, hi, top):
        t = table(first)
        new = np.full_like(chain, _NEG)
        for z in range(sep):  # the block empty: the last event moves a whole block away
            tz = min(z + top, clip)
            np.maximum(new[:, tz], chain[:, z], out=new[:, tz])
        rs = np.maximum.accumulate(t[:, ::-1, :], axis=1)[:, ::-1, :]  # a at least …
        for c1 in range(n):
            for z in range(sep):
                if chain[c1, z] == _NEG:
                    continue
                cand = chain[c1, z] + rs[1:n - c1 + 1, max(clip - z, 0), :]
                np.maximum(new[c1 + 1:], cand, out=new[c1 + 1:])
        chain = new
    return np.maximum.accumulate(np.maximum(chain.max(axis=1), 0.0))

