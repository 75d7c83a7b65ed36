"""``dmfda``: paper 004's DMFDA — Fenwick strategy with the diagonal Λ of Alg. 4 (recursion (30)).

The weights are :func:`stream_dp.strategies.fenwick.dmfda_weights.lambdas` (δ clamped to [1 − p, 1], seeds/README.md), whose
``ΛL`` column sums are ≤ 1; the noise is calibrated to the exact maximum column sum plus the
grid slack (:mod:`stream_dp.strategies.fenwick.base`).
"""

from __future__ import annotations

from stream_dp.budget import Privacy
from stream_dp.mechanism import Float64Array
from stream_dp.strategies.fenwick.base import FenwickMechanism
from stream_dp.strategies.fenwick.dmfda_weights import lambdas

__all__ = ["DMFDAMechanism"]


class DMFDAMechanism(FenwickMechanism):
    """Fenwick strategy, weights λ_k of Alg. 4."""

    name = "dmfda"

    def _compute_weights(self, n: int) -> Float64Array:
        return lambdas(n, self.p)


def make(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> DMFDAMechanism:
    """Factory registered as ``"dmfda"``."""
    return DMFDAMechanism(p, horizon, privacy, cap)
