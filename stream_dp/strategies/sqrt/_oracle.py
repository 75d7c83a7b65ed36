"""Dense-matrix oracle of the square-root family (library-private; tests and checks only).

``dense(mech, n) = (L, B, v)`` for ticks ``1..n``: ``L`` the banded Toeplitz matrix of the
first ``K`` square-root coefficients, ``B`` its exact inverse applied to ``W_p``
(:func:`stream_dp.strategies.sqrt.toeplitz.dense_sqrt`). The release is ``B @ (L @ x + z)``
with independent ``z_j`` of variance ``v_j`` (squared value units); ``B @ L = W_p``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from stream_dp.strategies.sqrt.toeplitz import dense_sqrt

__all__ = ["dense"]


def dense(mech: object, n: int) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """``(L, B, v)`` for ticks ``1..n`` of a ``sqrt`` mechanism."""
    big_l, big_b = dense_sqrt(n, float(mech.p), int(mech.taps))  # type: ignore[attr-defined]
    return big_l, big_b, np.full(n, float(mech.unit_variance))  # type: ignore[attr-defined]
