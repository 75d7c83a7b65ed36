"""Exact error figures of concrete strategies: the per-release MSE bound (noise variance plus
grid rounding), and one row of ``stream-dp plan``.

The layer between the registry and the planner: it builds mechanisms by concrete name
(:func:`stream_dp.strategies.registry.make`) and imports neither the planner nor
:mod:`stream_dp.analysis` (which re-exports these names and adds ``"auto"``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from stream_dp.budget import Privacy
from stream_dp.mechanism import Float64Array, Mechanism
from stream_dp.strategies.registry import make

__all__ = [
    "NEGLIGIBLE_ROUNDING",
    "StrategyFigures",
    "error_curve",
    "figures",
    "rounding_bias",
    "with_rounding",
]


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
    strategies: tuple[str, ...], p: float, horizon: int, privacy: Privacy, cap: float = 1.0, *,
    user_level: bool = False,
) -> list[StrategyFigures]:
    """Exact figures of each strategy (sensitivity, mean and last-tick MSE over the horizon);
    ``user_level``: of the mechanism a user-level deployment runs (the registry's
    ``user_level``)."""
    out = []
    for name in strategies:
        mech = make(name, p, horizon, privacy, cap, user_level=user_level)
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
