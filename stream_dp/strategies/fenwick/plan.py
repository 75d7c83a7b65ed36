"""Fenwick (lowbit) strategy of paper 004: index helpers, dense builders and structured helpers.

Node ``i`` (1-based tick) of the Fenwick tree covers the ticks ``(i − lowbit(i), i]`` and holds the
decayed partial sum ``S_i = Σ_{j in range} p^(i−j) D_j`` (eq. 12). The release at tick ``t`` is
``s_t = Σ_{k on the query path of t} p^(t−k) S_k`` with query path ``k = t, t − lowbit(t), …``
(eq. 13). In matrix form ``W_p = B·L`` with ``L`` (Alg. 1, *BuildL*, with the ``i ≤ N`` fix noted
in seeds/README.md) and ``B`` (Alg. 2, *BuildB*).

The dense builders are O(n²) memory and exist for tests and checks only; the release path uses
the structured O(log n) helpers (:func:`update_path`, :func:`query_path`, :func:`column_sums`,
:func:`query_sums`), which never build a matrix.

>>> lowbit(12), level(12)
(4, 2)
>>> update_path(3, 8)
[3, 4, 8]
>>> query_path(7)
[7, 6, 4]
>>> import numpy as np
>>> n, p = 7, 0.3
>>> bool(np.allclose(reconstruction_matrix(n, p) @ strategy_matrix(n, p), decay_workload(n, p)))
True
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "column_sums",
    "decay_workload",
    "level",
    "levels_for",
    "lowbit",
    "query_path",
    "query_sums",
    "reconstruction_matrix",
    "strategy_matrix",
    "update_path",
]

Float64Array = NDArray[np.float64]
Int64Array = NDArray[np.int64]


def _check_n_p(n: int, p: float) -> tuple[int, float]:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or int(n) < 1:
        raise ValueError(f"n must be an integer ≥ 1, got {n!r}")
    pf = float(p)
    if not (math.isfinite(pf) and 0.0 < pf <= 1.0):
        raise ValueError(f"p must be a number in (0, 1], got {p!r}")
    return int(n), pf


def lowbit(i: int) -> int:
    """The lowest set bit of ``i`` (``i ≥ 1``): ``i & -i``."""
    if i < 1:
        raise ValueError(f"i must be an integer ≥ 1, got {i!r}")
    return i & -i


def level(i: int) -> int:
    """``log2(lowbit(i))``: the Fenwick level of node ``i`` (number of trailing zero bits)."""
    return lowbit(i).bit_length() - 1


def levels_for(n: int) -> int:
    """Number of Fenwick levels used by nodes ``1..n``: ``floor(log2 n) + 1``."""
    if n < 1:
        raise ValueError(f"n must be an integer ≥ 1, got {n!r}")
    return int(n).bit_length()


def update_path(j: int, n: int) -> list[int]:
    """Nodes whose range contains tick ``j`` (column ``j`` of ``L``): ``j, j + lowbit(j), … ≤ n``."""
    if not 1 <= j <= n:
        raise ValueError(f"j must be an integer in [1, n={n}], got {j!r}")
    path = []
    i = j
    while i <= n:
        path.append(i)
        i += i & -i
    return path


def query_path(t: int) -> list[int]:
    """Nodes summed for the release at tick ``t`` (row ``t`` of ``B``): ``t, t − lowbit(t), … > 0``."""
    if t < 1:
        raise ValueError(f"t must be an integer ≥ 1, got {t!r}")
    path = []
    k = t
    while k > 0:
        path.append(k)
        k -= k & -k
    return path


def strategy_matrix(n: int, p: float) -> Float64Array:
    """Dense ``L`` (n×n), Alg. 1 *BuildL* with ``i ≤ n``: ``L[i, j] = p^(i−j)`` on update paths."""
    n, p = _check_n_p(n, p)
    out = np.zeros((n, n), dtype=np.float64)
    for j in range(1, n + 1):
        for i in update_path(j, n):
            out[i - 1, j - 1] = p ** (i - j)
    return out


def reconstruction_matrix(n: int, p: float) -> Float64Array:
    """Dense ``B`` (n×n), Alg. 2 *BuildB*: ``B[t, k] = p^(t−k)`` for ``k`` on the query path of t."""
    n, p = _check_n_p(n, p)
    out = np.zeros((n, n), dtype=np.float64)
    for t in range(1, n + 1):
        for k in query_path(t):
            out[t - 1, k - 1] = p ** (t - k)
    return out


def decay_workload(n: int, p: float) -> Float64Array:
    """Dense workload ``W_p`` (n×n): ``W[t, j] = p^(t−j)`` for ``j ≤ t``, else 0."""
    n, p = _check_n_p(n, p)
    idx = np.arange(n)
    diff = idx[:, None] - idx[None, :]
    out = np.zeros((n, n), dtype=np.float64)
    mask = diff >= 0
    out[mask] = np.power(p, diff[mask].astype(np.float64))
    return out


def column_sums(weights: Float64Array, p: float) -> tuple[Float64Array, Int64Array]:
    """Column sums of ``diag(weights)·L`` and column path lengths, O(n log n), no matrix.

    ``weights[k−1]`` is the weight of node ``k`` (``n = len(weights)``). Returns
    ``(sums, lengths)`` with ``sums[j−1] = Σ_{i on update path of j} weights[i−1]·p^(i−j)`` and
    ``lengths[j−1]`` the number of nodes on that path (the coordinates one event at tick j touches).
    """
    w = np.asarray(weights, dtype=np.float64)
    n = w.shape[0]
    sums = w.copy()
    lengths = np.ones(n, dtype=np.int64)
    # Column j's path is j followed by the path of its parent j + lowbit(j) (a higher level), so
    # sweeping levels from the top down needs one strided vector operation per level: O(n).
    for lv in range(levels_for(n) - 1, -1, -1) if n else ():
        off = 1 << lv
        start = off - 1  # 0-based index of the first node of level lv
        step = off << 1
        parent_sums = sums[start + off :: step]
        k = parent_sums.shape[0]
        sums[start::step][:k] += (p**off) * parent_sums
        lengths[start::step][:k] += lengths[start + off :: step]
    return sums, lengths


def query_sums(weights: Float64Array, p: float, power: float = 2.0) -> Float64Array:
    """``Σ_{k on the query path of t} (p^(t−k) / weights[k−1])^power`` for ``t = 1..n``, O(n log n).

    With ``power=2`` this is the squared norm of row ``t`` of ``B·diag(weights)⁻¹`` (the release
    variance per unit measurement variance); with ``power=1`` the rounding amplification of row t.
    """
    w = np.asarray(weights, dtype=np.float64)
    n = w.shape[0]
    t = np.arange(1, n + 1, dtype=np.int64)
    acc = np.zeros(n, dtype=np.float64)
    for bit in range(levels_for(n)):
        has = ((t >> bit) & 1).astype(bool)
        if not has.any():
            continue
        k = (t[has] >> bit) << bit
        term = np.power(p, (t[has] - k).astype(np.float64)) / w[k - 1]
        acc[has] += term if power == 1.0 else np.power(term, power)
    return acc
