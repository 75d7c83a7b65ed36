"""``dm``: paper 004's DM — the Fenwick strategy with one uniform scale ``1/Δ₁(L)`` (Alg. 1–3).

Measuring ``L·D / ‖L‖₁`` with unit-sensitivity noise is the same mechanism as the paper's
``L·D + Lap(‖L‖₁/ε)``; the release is ``B·(noisy measurements)`` rescaled. See
:mod:`stream_dp.strategies.fenwick.base` for the grid, epochs and per-tick cost.
"""

from __future__ import annotations

import numpy as np

from stream_dp.budget import Privacy
from stream_dp.mechanism import Float64Array
from stream_dp.strategies.fenwick.base import FenwickMechanism

__all__ = ["DMMechanism", "l1_norm"]


def l1_norm(n: int, p: float) -> float:
    """``‖L‖₁`` of the Fenwick strategy on ``n`` ticks: column 1's sum ``Σ_{2^i ≤ n} p^(2^i − 1)``.

    Column 1's update path ``1, 2, 4, …`` is the longest and its offsets ``2^i − 1`` the
    smallest, so it has the largest column sum.

    >>> round(l1_norm(7, 0.3), 3)
    1.327
    """
    total = 0.0
    i = 1
    while i <= n:
        total += p ** (i - 1)
        i <<= 1
    return total


class DMMechanism(FenwickMechanism):
    """Fenwick strategy, uniform weights ``1/‖L‖₁``."""

    name = "dm"

    def _compute_weights(self, n: int) -> Float64Array:
        return np.full(n, 1.0 / l1_norm(n, self.p), dtype=np.float64)


def make(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> DMMechanism:
    """Factory registered as ``"dm"``."""
    return DMMechanism(p, horizon, privacy, cap)
