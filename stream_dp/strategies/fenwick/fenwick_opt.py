"""``fenwick-opt``: the Fenwick strategy with Λ from solving problem (21) numerically.

Weights come from :func:`stream_dp.strategies.fenwick.opt_weights.optimal_weights` (dual ascent on the convex
problem, cached on disk per (p, epoch length); never worse than DM's or DMFDA's Λ by the
mechanism's exact error). For ``p = 1`` epochs longer than 2**20 ticks (reached after about 2**20
ticks of doubling epochs) the solve is skipped and DMFDA's Λ is used, which is within a
hair of the optimum at ``p = 1``. Everything else (grid, epochs, noise) is
:mod:`stream_dp.strategies.fenwick.base`.
"""

from __future__ import annotations

from stream_dp.budget import Privacy
from stream_dp.mechanism import Float64Array
from stream_dp.strategies.fenwick.base import FenwickMechanism
from stream_dp.strategies.fenwick.dmfda_weights import lambdas
from stream_dp.strategies.fenwick.opt_weights import optimal_weights

__all__ = ["SOLVE_LIMIT", "FenwickOptMechanism"]

#: Largest epoch length solved numerically.
SOLVE_LIMIT = 1 << 20


class FenwickOptMechanism(FenwickMechanism):
    """Fenwick strategy, optimised diagonal Λ."""

    name = "fenwick-opt"

    def _compute_weights(self, n: int) -> Float64Array:
        if n > SOLVE_LIMIT:
            return lambdas(n, self.p)
        # Epoch 0 must never be worse than dm/dmfda over the horizon; later p = 1 epochs
        # (longer than the first) are only judged with their carry.
        first = self.p < 1.0 or n <= self.epoch_of(1)[2]
        return optimal_weights(n, self.p, first_epoch=first)


def make(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> FenwickOptMechanism:
    """Factory registered as ``"fenwick-opt"``."""
    return FenwickOptMechanism(p, horizon, privacy, cap)
