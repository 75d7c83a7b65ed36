"""Dense-matrix oracle of the BLT family (library-private; tests and checks only).

``dense(mech, n) = (L, B, v)`` for ticks ``1..n``, from the definition: ``L = C`` the Toeplitz
matrix of ``c_0 = 1, c_k = Σ_i w_i θ_i^(k−1)`` (the measurement ``C·y = C·x + Z`` the noise
correlation is equivalent to), ``B = W_p·C⁻¹`` by a dense triangular solve (not the mechanism's
recurrences), ``v`` the unit noise variance ``h²·Var(Z)``. The release is ``B @ (L @ x + z)``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import solve_triangular

from stream_dp.strategies.blt.plan import coefficients

__all__ = ["dense"]


def dense(mech: object, n: int) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """``(L, B, v)`` for ticks ``1..n`` of a ``blt`` mechanism."""
    p = float(mech.p)  # type: ignore[attr-defined]
    c = coefficients(mech.theta, mech.w, n)  # type: ignore[attr-defined]
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    big_l = np.where(lag >= 0, c[np.clip(lag, 0, None)], 0.0)
    big_w = np.where(lag >= 0, p ** np.clip(lag, 0, None).astype(np.float64), 0.0)
    # B = W C^-1  <=>  C^T B^T = W^T
    big_b = solve_triangular(big_l.T, big_w.T, lower=False).T
    return big_l, np.asarray(big_b, dtype=np.float64), np.full(n, float(mech.unit_variance))  # type: ignore[attr-defined]
