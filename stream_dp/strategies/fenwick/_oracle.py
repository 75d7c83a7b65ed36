"""Dense-matrix oracle of the Fenwick family (library-private; tests and checks only).

``dense(mech, n) = (L, B, v)`` for ticks ``1..n`` of the first epoch (``n`` ≤ its length): the
release is ``B @ (L @ x + z)`` with independent noise ``z_j`` of variance ``v_j`` (squared value
units), so the per-release noise variance is ``(B**2) @ v``. ``L = Λ·S`` (weights times the
Fenwick strategy matrix), ``B = R·Λ⁻¹`` (reconstruction), ``B @ L = W_p``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from stream_dp.strategies.fenwick.plan import reconstruction_matrix, strategy_matrix

__all__ = ["dense"]


def dense(mech: object, n: int) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """``(L, B, v)`` for ticks ``1..n`` of a ``dm``/``dmfda``/``fenwick-opt`` mechanism."""
    _, _, length = mech.epoch_of(1)  # type: ignore[attr-defined]
    if n > length:
        raise ValueError(f"n must be at most the first epoch's length {length}, got {n}")
    p = float(mech.p)  # type: ignore[attr-defined]
    w: NDArray[np.float64] = np.asarray(mech.weights(length), dtype=np.float64)[:n]  # type: ignore[attr-defined]
    big_l = w[:, None] * strategy_matrix(n, p)
    big_b = reconstruction_matrix(n, p) / w[None, :]
    var = np.full(n, float(mech.plan(length).measurement_variance))  # type: ignore[attr-defined]
    return big_l, big_b, var
