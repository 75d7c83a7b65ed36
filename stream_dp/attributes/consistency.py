"""Make overlapping noisy marginal tables consistent (GLS, seed 000's approximation method).

The true tables agree on what they share: every table has the same total, and two tables that
contain attribute ``a`` have the same one-way marginal of ``a``. (For the structures of
:mod:`stream_dp.attributes.structure` tables overlap in at most one attribute, so these are all
the equalities; for general overlaps a table pair also shares larger marginals, see
``shared_subsets``.) Given noisy tables with known per-cell noise variances, the optimal consistent
release is the weighted least-squares projection onto these equalities (seed 000, Theorem 1). We
split the constraints into groups — one per shared attribute set, one for the totals — and cycle
through their exact projections with :func:`stream_dp.consistency.approximate` (alternating
projections in the noise metric converge to the GLS optimum for any split).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from stream_dp.attributes.tables import cell_index
from stream_dp.consistency.approx import GroupBlock, approximate

__all__ = ["constraint_blocks", "make_consistent", "make_consistent_result"]

Float64Array = NDArray[np.float64]


def _cells_with(attrs: Sequence[int], sub: Sequence[int]) -> NDArray[np.int64]:
    """For every cell of the table over ``attrs``: its cell in the marginal over ``sub``."""
    k = len(attrs)
    grid = ((np.arange(1 << k)[:, None] >> np.arange(k - 1, -1, -1)) & 1).astype(np.uint8)
    pos = [list(attrs).index(a) for a in sub]
    return cell_index(grid, pos)


def constraint_blocks(
    tables: Sequence[Sequence[int]], max_shared: int = 3
) -> tuple[list[GroupBlock], NDArray[np.int64]]:
    """Constraint groups over the concatenated cells of ``tables`` and each table's offset.

    One block per attribute set ``S`` shared by two or more tables (sets up to ``max_shared``
    attributes, maximal shared sets only): the marginal over ``S`` of the first table equals that of
    each other table. One more block: all totals equal.
    """
    sizes = [1 << len(t) for t in tables]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    shared: dict[tuple[int, ...], list[int]] = {}
    for x, y in itertools.combinations(range(len(tables)), 2):
        common = tuple(sorted(set(tables[x]) & set(tables[y])))
        if 1 <= len(common) <= max_shared:
            lst = shared.setdefault(common, [])
            for t in (x, y):
                if t not in lst:
                    lst.append(t)
    blocks: list[GroupBlock] = []
    for common, members in sorted(shared.items()):
        members.sort()
        nodes = np.concatenate([np.arange(offsets[t], offsets[t + 1]) for t in members])
        cols = {t: i for i, t in enumerate(members)}
        local = np.concatenate([[0], np.cumsum([sizes[t] for t in members])])
        n_cells = 1 << len(common)
        rows = []
        first = members[0]
        for t in members[1:]:
            for v in range(n_cells):
                row = np.zeros(int(local[-1]))
                row[local[cols[first]] : local[cols[first] + 1]] = (
                    _cells_with(tables[first], common) == v
                )
                row[local[cols[t]] : local[cols[t] + 1]] -= _cells_with(tables[t], common) == v
                rows.append(row)
        blocks.append(GroupBlock(np.array(rows), nodes.reshape(1, -1)))
    if len(tables) > 1:
        rows = []
        for t in range(1, len(tables)):
            row = np.zeros(int(offsets[-1]))
            row[offsets[0] : offsets[1]] = 1.0
            row[offsets[t] : offsets[t + 1]] = -1.0
            rows.append(row)
        blocks.append(GroupBlock(np.array(rows), np.arange(offsets[-1]).reshape(1, -1)))
    return blocks, offsets


def make_consistent(
    tables: Sequence[Sequence[int]],
    values: Sequence[Float64Array],
    variances: Sequence[float] | None = None,
    *,
    tol: float = 1e-9,
    max_iter: int = 2000,
) -> list[Float64Array]:
    """GLS-consistent versions of the noisy flat ``values`` of ``tables`` (same units, counts).

    ``variances``: per-table noise variance of each cell (default equal). Relative ``tol`` on the
    mean absolute change per cycle (scaled by the mean table total).
    """
    return make_consistent_result(tables, values, variances, tol=tol, max_iter=max_iter)[0]


def make_consistent_result(
    tables: Sequence[Sequence[int]],
    values: Sequence[Float64Array],
    variances: Sequence[float] | None = None,
    *,
    tol: float = 1e-9,
    max_iter: int = 2000,
) -> tuple[list[Float64Array], int, float]:
    """:func:`make_consistent` and the solver's diagnostics: ``(tables, iterations, residual)``
    (residual: ``‖M x − b‖₂`` of the constraints after the last cycle, counts)."""
    if len(values) != len(tables):
        raise ValueError("one value array per table is required")
    for t, v in zip(tables, values, strict=True):
        if np.asarray(v).shape != (1 << len(t),):
            raise ValueError(f"table over {list(t)} needs {1 << len(t)} cells")
    if not tables:
        return [], 0, 0.0
    blocks, offsets = constraint_blocks(tables)
    x = np.concatenate([np.asarray(v, dtype=np.float64) for v in values])
    var = (
        None
        if variances is None
        else np.concatenate(
            [np.full(1 << len(t), float(s)) for t, s in zip(tables, variances, strict=True)]
        )
    )
    if not blocks:
        return [x[offsets[i] : offsets[i + 1]].copy() for i in range(len(tables))], 0, 0.0
    scale = max(1.0, float(np.abs(x).sum()) / len(tables) / max(1, x.size))
    res = approximate(x, var, blocks, tol=tol * scale, max_iter=max_iter)
    y = res.values
    return ([y[offsets[i] : offsets[i + 1]].copy() for i in range(len(tables))],
            int(res.iterations), float(res.residual))
