"""Exact analytics of the release strategies: per-release MSE, its mean, sensitivities.

Everything is analytic (no simulation) and O(T log T) without dense matrices: the mechanisms'
``mse_curve`` sums ``p^(2(t−k))/a_k²`` over Fenwick query paths level by level, and their
sensitivities come from the exact column sums of ``ΛL`` (:func:`stream_dp.strategies.fenwick.plan.column_sums`).

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

from stream_dp.budget import Privacy, PureDP
from stream_dp.figures import (
    NEGLIGIBLE_ROUNDING,
    StrategyFigures,
    error_curve,
    figures,
    rounding_bias,
    with_rounding,
)
from stream_dp.mechanism import Float64Array, Mechanism

__all__ = [
    "NEGLIGIBLE_ROUNDING",
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
    from stream_dp.planner import make_mechanism

    return make_mechanism(strategy, p, horizon, privacy, cap)


def _budget(budget: float | Privacy) -> Privacy:
    """A float is ε for pure DP (the historical signature); ``PureDP``/``ZCDP`` pass through."""
    if isinstance(budget, bool):
        raise ValueError(f"budget must be ε (a float), PureDP or ZCDP, got {budget!r}")
    if isinstance(budget, (int, float)):
        return PureDP(float(budget))
    if getattr(budget, "model", None) in ("pure", "zcdp"):
        return budget
    raise ValueError(f"budget must be ε (a float), PureDP or ZCDP, got {budget!r}")


def mse_curve(
    strategy: str, p: float, horizon: int, budget: float | Privacy, cap: float = 1.0
) -> Float64Array:
    """Per-release MSE at ticks ``t = 1..horizon``, rounding included (squared value units).

    ``budget`` per event and stream: a float ε (pure DP), or a ``PureDP``/``ZCDP`` budget;
    ``strategy`` may be ``"auto"`` (resolved by the planner for that budget).

    >>> from stream_dp.budget import ZCDP
    >>> bool(mse_curve("sqrt", 0.9, 15, ZCDP(0.5))[-1] > 0)
    True
    """
    mech = _mechanism(strategy, p, horizon, _budget(budget), cap)
    return error_curve(mech, horizon)


def expected_mse(
    strategy: str, p: float, horizon: int, budget: float | Privacy, cap: float = 1.0
) -> float:
    """Mean over ``t = 1..horizon`` of the per-release MSE (squared value units), cap 1 by
    default; ``budget`` a float ε (pure DP, Laplace) or a ``PureDP``/``ZCDP`` budget.

    >>> from stream_dp.budget import PureDP
    >>> expected_mse("dm", 0.3, 7, 1.0) == expected_mse("dm", 0.3, 7, PureDP(1.0))
    True
    """
    return float(mse_curve(strategy, p, horizon, budget, cap).mean())


def sensitivity(strategy: str, p: float, horizon: int, cap: float = 1.0) -> float:
    """Exact L1 sensitivity of the strategy's measurements (grid slack included), cap units.

    Independent of ε (the measurement weights do not depend on it).
    """
    return float(_mechanism(strategy, p, horizon, PureDP(1.0), cap).sensitivity())


def lower_bound(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> float:
    """Factorisation lower bound on the mean per-release MSE over ``1..horizon``.

    ``κ·cap²·‖W_p‖_*²/horizon²`` with ``κ = 2/ε²`` (pure DP) or ``1/(2ρ)`` (zCDP); see
    :mod:`stream_dp.lower_bound` for the proof and the O(n) singular values.
    """
    from stream_dp.lower_bound import mean_mse_bound

    return mean_mse_bound(horizon, p, privacy, cap)
