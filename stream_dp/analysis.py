"""Exact analytics of the release strategies: per-release MSE, its mean, sensitivities.

Everything is analytic (no simulation) and O(T log T) without dense matrices: the mechanisms'
``mse_curve`` sums ``p^(2(t−k))/a_k²`` over Fenwick query paths level by level, and their
sensitivities come from the exact column sums of ``ΛL`` (:func:`stream_dp.fenwick.column_sums`).

Conventions: pure ε-DP with (discrete) Laplace noise, contribution cap 1 unless given, MSE in
squared count units, per release. The values include the grid slack the implementation adds to
the sensitivity (≤ 2**-17 relative; :mod:`stream_dp.strategies._fenwick_base`), for ticks
beyond the first epoch the variance of the carried value, and the **grid rounding**: the squared
bound on the rounding bias (``Mechanism.rounding_bound``) is added to the noise variance, so every
reported MSE bounds ``E[(release − true value)²]`` for any data. Below :data:`NEGLIGIBLE_ROUNDING`
of the noise variance (the usual case: 2**-34 to 2**-25 relative) it is left out, as it changes no
reported digit; it matters when the budget is so large that the noise shrinks towards the grid,
where it is the error that remains. This is why no reported error falls below the factorisation
lower bound (:mod:`stream_dp.lower_bound`), which assumes noise on real-valued measurements.

>>> round(7 * expected_mse("dm", 0.3, 7, 1.0), 3)  # paper 004's worked example: 25.635/ε²
25.635
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from stream_dp.budget import Privacy, PureDP
from stream_dp.mechanism import Float64Array, Mechanism

__all__ = [
    "StrategyFigures",
    "error_curve",
    "expected_mse",
    "figures",
    "lower_bound",
    "mse_curve",
    "rounding_bias",
    "sensitivity",
    "with_rounding",
]


def _mechanism(strategy: str, p: float, horizon: int, privacy: Privacy, cap: float) -> Mechanism:
    from stream_dp.strategies import make_mechanism

    return make_mechanism(strategy, p, horizon, privacy, cap)


#: A squared rounding bias below this fraction of the noise variance is left out of the reported
#: errors (it is far below their precision, and leaving it out keeps them equal to the exact noise
#: variance, e.g. the standard error of a release to ``sqrt(Mechanism.variance(t))``).
NEGLIGIBLE_ROUNDING = 2.0**-20


def with_rounding(variance: float, bias: float) -> float:
    """``variance + bias²`` (an MSE bound), or ``variance`` if ``bias²`` is negligible."""
    b2 = bias * bias
    return variance + b2 if b2 > NEGLIGIBLE_ROUNDING * variance else variance


def rounding_bias(mech: Mechanism, ticks: int | None = None) -> float:
    """The mechanism's bound on the grid-rounding bias of any release over the first ``ticks``
    ticks (default: its horizon; the bound is the same for every tick when ``p < 1``)."""
    bound = mech.rounding_bound
    if ticks is not None and "ticks" in inspect.signature(bound).parameters:
        return float(bound(ticks=ticks))  # type: ignore[call-arg]
    return float(bound())


def error_curve(mech: Mechanism, horizon: int) -> Float64Array:
    """Per-release MSE bound at ticks ``1..horizon``: noise variance + rounding bias² (left
    out when negligible, see :data:`NEGLIGIBLE_ROUNDING`)."""
    curve: Float64Array = mech.mse_curve(horizon)
    extra = with_rounding(float(curve.mean()), rounding_bias(mech, horizon)) - float(curve.mean())
    if extra > 0.0:
        curve = curve + rounding_bias(mech, horizon) ** 2
    return curve


def mse_curve(
    strategy: str, p: float, horizon: int, epsilon: float, cap: float = 1.0
) -> Float64Array:
    """Per-release MSE at ticks ``t = 1..horizon`` (ε per event, pure DP), rounding included."""
    mech = _mechanism(strategy, p, horizon, PureDP(epsilon), cap)
    return error_curve(mech, horizon)


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
    #: Mean over ticks 1..horizon of the noise variance of a release (``Mechanism.mse_curve``).
    mean_mse: float
    final_mse: float
    #: The error stays bounded / polylogarithmic past the horizon (``error_stays_bounded``).
    unbounded_ok: bool = True
    #: Squared bound on the grid-rounding bias of a release (:func:`rounding_bias`).
    rounding_mse: float = 0.0

    @property
    def error_mse(self) -> float:
        """Mean per-release MSE bound: noise variance + rounding bias² (what ``plan`` reports
        and ``auto`` minimises)."""
        return self.mean_mse + self.rounding_mse

    @property
    def rmse(self) -> float:
        """Root of the mean per-release MSE bound (rounding included)."""
        return float(self.error_mse**0.5)


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
                with_rounding(float(curve.mean()), rounding_bias(mech, horizon))
                - float(curve.mean()),
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
