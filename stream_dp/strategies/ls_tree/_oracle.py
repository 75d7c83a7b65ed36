"""Dense-matrix oracle of the least-squares tree family (library-private; tests and checks only).

``dense(mech, n) = (L, B, v)`` for ticks ``1..n``, built from the definition and *not* from the
mechanism's recurrences: ``L`` stacks the leaf rows (``e_s``) and the node rows (the block's
fixed-point coefficients ``K_i·2**-F``) of every block that has started by tick ``n``, future
leaves of the last block included (their columns beyond ``n`` are cut, their noise is not);
``v`` their noise variances (squared value units); ``B = W (Lᵀ V⁻¹ L)⁻¹ Lᵀ V⁻¹``, the generalised
least-squares decoder, computed densely on the full blocks. The release is ``B @ (L x + z)``;
``B @ L = W_p`` on ticks ``1..n``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from stream_dp.strategies.ls_tree.plan import COEFF_BITS, coefficients

__all__ = ["dense"]


def dense(mech: object, n: int) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """``(L, B, v)`` for ticks ``1..n`` of a ``tree-ls`` mechanism."""
    p = float(mech.p)  # type: ignore[attr-defined]
    b = int(mech.block)  # type: ignore[attr-defined]
    g2 = float(mech.grid) ** 2  # type: ignore[attr-defined]
    v1, v2 = float(mech.v1) * g2, float(mech.v2) * g2  # type: ignore[attr-defined]
    full = -(-n // b) * b
    k = np.asarray(coefficients(p, b), dtype=np.float64) / float(1 << COEFF_BITS)
    rows = [np.eye(full)[s] for s in range(full)]
    var = [v1] * full
    for start in range(0, full, b):
        row = np.zeros(full)
        row[start:start + b] = k
        rows.append(row)
        var.append(v2)
    big_l = np.vstack(rows)
    vinv = 1.0 / np.asarray(var)
    lag = np.subtract.outer(np.arange(full), np.arange(full))
    work = np.where(lag >= 0, p ** np.clip(lag, 0, None).astype(float), 0.0)
    gram = big_l.T @ (vinv[:, None] * big_l)
    big_b = work @ np.linalg.solve(gram, big_l.T * vinv[None, :])
    return big_l[:, :n], big_b[:n], np.asarray(var)
