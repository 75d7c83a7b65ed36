"""Exact analytics of the release strategies: per-release MSE, its mean, sensitivities.

Everything is analytic (no simulation) and O(T log T) without dense matrices: the mechanisms'
``mse_curve`` sums ``p^(2(t−k))/a_k²`` over Fenwick query paths level by level, and their
sensitivities come from the exact column sums of ``ΛL`` (:func:`stream_dp.fenwick.column_sums`).

Conventions: pure ε-DP with (discrete) Laplace noise, contribution cap 1 unless given, MSE in
squared count units, per release. The values include the grid slack the implementation adds to
the sensitivity (≤ 2**-17 relative; :mod:`stream_dp.strategies._fenwick_base`), and for ticks
beyond the first epoch the variance of the carried value.

>>> round(7 * expected_mse("dm", 0.3, 7, 1.0), 3)  # paper 004's worked example: 25.635/ε²
25.635
"""

from __future__ import annotations

from dataclasses import dataclass

from stream_dp.budget import Privacy, PureDP
from stream_dp.mechanism import Float64Array, Mechanism

__all__ = [
    "StrategyFigures",
    "expected_mse",
    "figures",
    "lower_bound",
    "mse_curve",
    "sensitivity",
]


def _mechanism(strategy: str, p: float, horizon: int, privacy: Privacy, cap: float) -> Mechanism:
    from stream_dp.strategies import make_mechanism

    return make_mechanism(strategy, p, horizon, privacy, cap)


def mse_curve(
    strategy: str, p: float, horizon: int, epsilon: float, cap: float = 1.0
) -> Float64Array:
    """Per-release MSE at ticks ``t = 1..horizon`` (ε per event, pure DP)."""
    mech = _mechanism(strategy, p, horizon, PureDP(epsilon), cap)
    curve: Float64Array = mech.mse_curve(horizon)
    return curve


def expected_mse(strategy: str, p: float, horizon: int, epsilon: float, cap: float = 1.0) -> float:
    """Mean over ``t = 1..horizon`` of the per-release MSE (pure ε-DP, Laplace, cap 1 by default)."""
    return float(mse_curve(strategy, p, horizon, epsilon, cap).mean())


def sensitivity(strategy: str, p: float, horizon: int, cap: float = 1.0) -> float:
    """Exact L1 sensitivity of the strategy's measurements (grid slack included), cap units.

    Independent of ε (the measurement weights do not depend on it).
    """
    return float(_mechanism(strategy, p, horizon, PureDP(1.0), cap).sensitivity())


@dataclass(frozen=True)
class StrategyFigures:
    """One row of ``stream-dp plan``: exact figures of a strategy for (p, horizon, privacy, cap)."""

    strategy: str
    sensitivity: float
    mean_mse: float
    final_mse: float
    #: The error stays bounded / polylogarithmic past the horizon (``error_stays_bounded``).
    unbounded_ok: bool = True

    @property
    def rmse(self) -> float:
        """Root of the mean per-release MSE."""
        return float(self.mean_mse**0.5)


def figures(
    strategies: tuple[str, ...], p: float, horizon: int, privacy: Privacy, cap: float = 1.0
) -> list[StrategyFigures]:
    """Exact figures of each strategy (sensitivity, mean and last-tick MSE over the horizon)."""
    out = []
    for name in strategies:
        mech = _mechanism(name, p, horizon, privacy, cap)
        curve = mech.mse_curve(horizon)
        out.append(
            StrategyFigures(
                name,
                float(mech.sensitivity()),
                float(curve.mean()),
                float(curve[-1]),
                mech.error_stays_bounded(),
            )
        )
    return out


def lower_bound(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> float:
    """Factorisation lower bound on the mean per-release MSE over ``1..horizon``.

    ``κ·cap²·‖W_p‖_*²/horizon²`` with ``κ = 2/ε²`` (pure DP) or ``1/(2ρ)`` (zCDP); see
    :mod:`stream_dp.lower_bound` for the proof and the O(n) singular values.
    """
    from stream_dp.lower_bound import mean_mse_bound

    return mean_mse_bound(horizon, p, privacy, cap)
