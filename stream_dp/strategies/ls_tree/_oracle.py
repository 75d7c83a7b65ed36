"""Dense-matrix oracle of the least-squares tree family (library-private; tests and checks only).

``dense(mech, n) = (L, B, v)`` for ticks ``1..n``, built from the definition and *not* from the
mechanism's recurrences: ``L`` stacks the leaf rows (``e_s``) and the node rows (the node's
fixed-point coefficients ``K_i·2**-F``, every level) of every top block that has started by tick ``n``, future
leaves of the last block included (their columns beyond ``n`` are cut, their noise is not);
(hat levels, issue #36: the triangles of :func:`.plan.hat_rows`, written out here from their
definition; flat levels: all ones) ``v`` their noise variances (squared value units, each top block's from its own shares:
``LsPlan.shares_of``; epoch 0 only at ``p = 1``); ``B = W (Lᵀ V⁻¹ L)⁻¹ Lᵀ V⁻¹``, the generalised
least-squares decoder, computed densely on the full blocks. The release is ``B @ (L x + z)``;
``B @ L = W_p`` on ticks ``1..n``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from stream_dp.noise.gaussian import discrete_gaussian_variance
from stream_dp.noise.laplace import discrete_laplace_variance
from stream_dp.strategies.ls_tree.plan import COEFF_BITS, coefficients

__all__ = ["dense"]


def dense(mech: object, n: int) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """``(L, B, v)`` for ticks ``1..n`` of a ``tree-ls`` mechanism."""
    p = float(mech.p)  # type: ignore[attr-defined]
    levels = tuple(mech.plan.levels)  # type: ignore[attr-defined]
    b = levels[-1]
    g2 = float(mech.grid) ** 2  # type: ignore[attr-defined]
    full = -(-n // b) * b
    # each top block's variances from its own shares (a p = 1 schedule, issue #26), from the
    # noise definition (discrete Laplace / Gaussian at scale Δ/(ε·a) or Δ/√(2ρa)), epoch 0 only
    slack = float(mech.slack_units)  # type: ignore[attr-defined]
    budget = float(mech.budget)  # type: ignore[attr-defined]
    pure = mech.model == "pure"  # type: ignore[attr-defined]

    def var_of(top: int, ell: int) -> float:
        share = mech.plan.shares_of(top)[ell]  # type: ignore[attr-defined]
        change = slack * (1.0 if ell == 0 else float(1 << COEFF_BITS))
        v = (discrete_laplace_variance(change / (budget * share)) if pure
             else discrete_gaussian_variance(change / np.sqrt(2.0 * budget * share)))
        return v * g2 / (1.0 if ell == 0 else float(1 << (2 * COEFF_BITS)))

    rows = [np.eye(full)[s] for s in range(full)]
    var = [var_of(s // b, 0) for s in range(full)]
    one = 1 << COEFF_BITS
    shapes = tuple(mech.plan.shapes) or ("decayed",) * len(levels)  # type: ignore[attr-defined]
    for ell, (length, shape) in enumerate(zip(levels, shapes, strict=True), start=1):
        if shape == "hat":
            # issue #36: triangles of half-width `length` peaking at the last tick of each
            # `length`-tick node (and one just before the top block), cut at the top block's
            # edges; K = 2**F − round(2**F·distance/length), halves rounded up
            for top_start in range(0, full, b):
                for peak in range(top_start - 1, top_start + b, length):
                    row = np.zeros(full)
                    for i in range(top_start, top_start + b):
                        d = abs(i - peak)
                        if d < length:
                            row[i] = (one - math.floor(one * d / length + 0.5)) / one
                    rows.append(row)
                    var.append(var_of(top_start // b, ell))
            continue
        k = (np.asarray(coefficients(p, length), dtype=np.float64) / float(one)
             if shape == "decayed" else np.ones(length))
        for start in range(0, full, length):
            row = np.zeros(full)
            row[start:start + length] = k
            rows.append(row)
            var.append(var_of(start // b, ell))
    big_l = np.vstack(rows)
    vinv = 1.0 / np.asarray(var)
    lag = np.subtract.outer(np.arange(full), np.arange(full))
    work = np.where(lag >= 0, p ** np.clip(lag, 0, None).astype(float), 0.0)
    gram = big_l.T @ (vinv[:, None] * big_l)
    big_b = work @ np.linalg.solve(gram, big_l.T * vinv[None, :])
    return big_l[:, :n], big_b[:n], np.asarray(var)
