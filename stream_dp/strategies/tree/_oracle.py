"""Dense-matrix oracle of the tree family (library-private; tests and checks only).

``dense(mech, n) = (L, B, v)`` for ticks ``1..n`` (``n`` ≤ the horizon): ``L`` has one row per
block completed by tick ``n`` (ordered by completion tick, then level), built here from the
definition — the weighted decayed sum of the block's ticks; ``B`` is the mechanism's causal
reconstruction (:meth:`TreeMechanism.dense_matrices`). The release is ``B @ (L @ x + z)`` with
independent ``z_j`` of variance ``v_j`` (squared value units); ``B @ L = W_p``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["dense", "measurement_matrix"]


def measurement_matrix(mech: object, n: int) -> NDArray[np.float64]:
    """``L`` from the definition: row ``(level i, block end e)`` holds ``w_i·p^(e−j)`` for the
    block's ticks ``j``."""
    p = float(mech.p)  # type: ignore[attr-defined]
    levels = list(mech.levels)  # type: ignore[attr-defined]
    weights = list(mech.weights)  # type: ignore[attr-defined]
    rows = [(i, t) for t in range(1, n + 1) for i, lv in enumerate(levels) if t % (1 << lv) == 0]
    out = np.zeros((len(rows), n))
    for k, (i, e) in enumerate(rows):
        j = np.arange(e - (1 << levels[i]) + 1, e + 1)
        out[k, j - 1] = weights[i] * p ** (e - j)
    return out


def dense(mech: object, n: int) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """``(L, B, v)`` for ticks ``1..n`` of a ``tree``/``binary-tree`` mechanism."""
    _, big_b = mech.dense_matrices(n)  # type: ignore[attr-defined]
    big_l = measurement_matrix(mech, n)
    var = np.full(big_l.shape[0], float(mech.unit_variance))  # type: ignore[attr-defined]
    return big_l, np.asarray(big_b, dtype=float), var
