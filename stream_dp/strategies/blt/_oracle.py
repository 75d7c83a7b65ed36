"""Dense-matrix oracle of the BLT family (library-private; tests and checks only).

``dense(mech, n) = (L, B, v)`` for ticks ``1..n`` (at ``p = 1``: ``n ≤ horizon``, one block), from
the definition: ``C`` the Toeplitz matrix of ``c_0 = 1, c_k = Σ_i w_i θ_i^(k−1)``; at ``p = 1``
the column scales ``D = diag(d_j)`` of :func:`.plan.column_scales` (with row scales ``R``:
:func:`.plan.row_column_scales`; at ``p < 1`` with start rows: :func:`.plan.start_scales`,
``D = R = I`` past the table; ``blt-horizon``'s planned first horizon: :func:`.plan.first_scales`,
``C`` cut after it, where the filter restarts; else ``D = I``). The measurement the noise correlation is
equivalent to is ``L·y = L·x + Z`` with ``L = D⁻¹·C·D`` and ``Z_j`` of variance ``v_j =
h²·Var(discrete Gaussian(σ/(d_j·r_j)))`` (the privacy-normalised measurement ``R·D·L = R·C·D``
has equal column norms); ``B = W_p·L⁻¹`` by a dense triangular solve
(not the mechanism's recurrences). The release is ``B @ (L @ x + z)``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import solve_triangular

from stream_dp.noise.gaussian import discrete_gaussian_variance
from stream_dp.strategies.blt.plan import coefficients

__all__ = ["dense"]


def dense(mech: object, n: int) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """``(L, B, v)`` for ticks ``1..n`` of a ``blt`` mechanism."""
    p = float(mech.p)  # type: ignore[attr-defined]
    c = coefficients(mech.theta, mech.w, n)  # type: ignore[attr-defined]
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    big_c = np.where(lag >= 0, c[np.clip(lag, 0, None)], 0.0)
    scales = getattr(mech, "scales", None)
    rows = getattr(mech, "rows", None)
    if scales is None:
        d = np.ones(n)
        var = np.full(n, float(mech.unit_variance))  # type: ignore[attr-defined]
    else:
        if p == 1.0 and n > len(scales):
            raise ValueError("the dense oracle covers one block at p = 1")
        d = np.ones(n)
        r = np.ones(n)
        k = min(n, len(scales))
        d[:k] = np.asarray(scales[:k], dtype=np.float64)
        if rows is not None:
            r[:k] = np.asarray(rows[:k], dtype=np.float64)
        sigma = float(mech.sigma_units)  # type: ignore[attr-defined]
        var = float(mech.unit) ** 2 * np.array(  # type: ignore[attr-defined]
            [discrete_gaussian_variance(sigma / float(dj * rj)) for dj, rj in zip(d, r, strict=True)])
    if getattr(mech, "first", False) and scales is not None and n > len(scales):
        # blt-horizon at p < 1: the filter restarts after the planned first horizon
        big_c[len(scales):, : len(scales)] = 0.0
    big_l = (big_c * d[None, :]) / d[:, None]
    big_w = np.where(lag >= 0, p ** np.clip(lag, 0, None).astype(np.float64), 0.0)
    # B = W L^-1  <=>  L^T B^T = W^T
    big_b = solve_triangular(big_l.T, big_w.T, lower=False).T
    return big_l, np.asarray(big_b, dtype=np.float64), var
