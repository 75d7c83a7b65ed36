"""Dense-matrix oracle of the naive family (library-private; tests and checks only).

``dense(mech, n) = (L, B, v)``: the release at ticks ``1..n`` is ``B @ (L @ x + z)`` with
independent noise coordinates ``z_j`` of variance ``v_j`` (squared value units), so the
per-release noise variance is ``(B**2) @ v``; ``B @ L`` is the decayed-sum workload.
Input perturbation: ``L = I``, ``B = W_p``, one measurement per tick.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["dense", "release"]


def dense(mech: object, n: int) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """``(L, B, v)`` for ticks ``1..n`` of a ``naive``/``naive-int`` mechanism."""
    p = float(mech.p)  # type: ignore[attr-defined]
    idx = np.arange(n)
    lag = idx[:, None] - idx[None, :]
    big_b = np.where(lag >= 0, p ** np.clip(lag, 0, None).astype(float), 0.0)
    var = np.full(n, float(mech.measurement_variance))  # type: ignore[attr-defined]
    return np.eye(n), big_b, var


def release(
    mech: object, counts: NDArray[np.float64], z: NDArray[np.int64], rounded: bool
) -> NDArray[np.float64]:
    """Releases for ``counts`` (ticks × streams) and known grid-unit noise ``z`` (same shape):
    ``W_p @ (g·(round(D/g) + z))`` (``D/g`` unrounded if not ``rounded``), ``g`` the grid."""
    g = float(mech.grid)  # type: ignore[attr-defined]
    scaled = counts / g
    meas = g * ((np.rint(scaled) if rounded else scaled) + z)
    _, big_b, _ = dense(mech, counts.shape[0])
    out: NDArray[np.float64] = big_b @ meas
    return out
