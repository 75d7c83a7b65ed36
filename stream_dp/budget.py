"""Immutable, validated privacy budgets: pure ε-DP and ρ-zCDP.

Units: a budget is **per event, per released stream** unless a caller says otherwise (see
:mod:`stream_dp.accounting` for the total an event spends when it feeds several streams).

* :class:`PureDP` — ``epsilon`` of pure ε-differential privacy.
* :class:`ZCDP` — ``rho`` of ρ-zero-concentrated differential privacy (Bun–Steinke 2016).

Both are frozen dataclasses validated on construction: NaN, ±inf, values ≤ 0 and non-numbers
raise :class:`ValueError` naming the parameter and its allowed range. Budgets compose with ``+``
inside one model (basic sequential composition: ε adds, ρ adds); adding budgets of different
models raises :class:`TypeError` — convert explicitly with :meth:`PureDP.to_zcdp` first.

>>> PureDP(0.5) + PureDP(0.25)
PureDP(epsilon=0.75)
>>> ZCDP(0.1).scaled(3)
ZCDP(rho=0.30000000000000004)
>>> PureDP(1.0).to_zcdp()
ZCDP(rho=0.5)
>>> round(ZCDP(0.5).to_approx_dp(1e-6), 4)
5.2215
>>> PureDP(1.0) + ZCDP(0.5)
Traceback (most recent call last):
...
TypeError: cannot compose PureDP with ZCDP: convert explicitly (e.g. PureDP.to_zcdp()) first
>>> PureDP(0)
Traceback (most recent call last):
...
ValueError: epsilon must be a finite number > 0, got 0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import ClassVar, Literal

__all__ = ["ZCDP", "Privacy", "PureDP", "privacy_from_dict"]


def _positive_finite(name: str, value: object, allowed: str = "a finite number > 0") -> float:
    """Validate ``value`` as a finite real > 0 and return it as a float."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be {allowed}, got {value!r} of type {type(value).__name__}")
    as_float = float(value)
    if not math.isfinite(as_float) or as_float <= 0.0:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return as_float


@dataclass(frozen=True)
class PureDP:
    """Pure ε-differential privacy; ``epsilon`` per event (finite, > 0)."""

    epsilon: float
    model: ClassVar[Literal["pure"]] = "pure"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _positive_finite("epsilon", self.epsilon))

    def __add__(self, other: object) -> PureDP:
        if isinstance(other, PureDP):
            return PureDP(self.epsilon + other.epsilon)
        raise _mix_error(self, other)

    def __radd__(self, other: object) -> PureDP:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self  # so that sum([PureDP(..), ...]) works
        raise _mix_error(other, self)

    def scaled(self, k: float) -> PureDP:
        """The budget multiplied by ``k`` (> 0): ``k`` compositions, or a share when ``k < 1``.

        >>> PureDP(1.0).scaled(0.25)
        PureDP(epsilon=0.25)
        """
        return PureDP(self.epsilon * _positive_finite("k", k))

    def to_zcdp(self) -> ZCDP:
        """ε-DP implies (ε²/2)-zCDP (Bun–Steinke 2016, Prop. 1.4)."""
        return ZCDP(self.epsilon * self.epsilon / 2.0)

    @property
    def value(self) -> float:
        """The budget's single parameter (ε)."""
        return self.epsilon

    def as_dict(self) -> dict[str, str | float]:
        """The wire form used in ``dp.counts.v1``: ``{"model": "pure", "epsilon": ε}``."""
        return {"model": "pure", "epsilon": self.epsilon}

    def __str__(self) -> str:
        return f"ε = {self.epsilon:g} (pure DP)"


@dataclass(frozen=True)
class ZCDP:
    """ρ-zero-concentrated differential privacy; ``rho`` per event (finite, > 0)."""

    rho: float
    model: ClassVar[Literal["zcdp"]] = "zcdp"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", _positive_finite("rho", self.rho))

    def __add__(self, other: object) -> ZCDP:
        if isinstance(other, ZCDP):
            return ZCDP(self.rho + other.rho)
        raise _mix_error(self, other)

    def __radd__(self, other: object) -> ZCDP:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        raise _mix_error(other, self)

    def scaled(self, k: float) -> ZCDP:
        """The budget multiplied by ``k`` (> 0): ``k`` compositions, or a share when ``k < 1``.

        >>> ZCDP(0.5).scaled(0.5)
        ZCDP(rho=0.25)
        """
        return ZCDP(self.rho * _positive_finite("k", k))

    @property
    def value(self) -> float:
        """The budget's single parameter (ρ)."""
        return self.rho

    def as_dict(self) -> dict[str, str | float]:
        """The wire form used in ``dp.counts.v1``: ``{"model": "zcdp", "rho": ρ}``."""
        return {"model": "zcdp", "rho": self.rho}

    def to_approx_dp(self, delta: float) -> float:
        """The ε such that ρ-zCDP implies (ε, δ)-DP, for ``delta`` in (0, 1).

        Uses the conversion of Canonne, Kamath and Steinke (2020, "The Discrete Gaussian for
        Differential Privacy", Cor. 13): ρ-zCDP gives (ε, δ)-DP for every α > 1 with

            ε(α) = α·ρ + (log(1/δ) + (α − 1)·log(1 − 1/α) − log α) / (α − 1).

        Every α gives a *valid* ε, so minimising numerically can only err on the safe side
        (a slightly larger ε). The result is also never above the classic bound
        ``ρ + 2·sqrt(ρ·log(1/δ))`` (Bun–Steinke 2016, Prop. 1.3), which is returned if smaller.

        >>> round(ZCDP(0.1).to_approx_dp(1e-5), 4)
        1.9142
        >>> ZCDP(0.1).to_approx_dp(1e-5) <= 0.1 + 2 * math.sqrt(0.1 * math.log(1e5))
        True
        """
        if isinstance(delta, bool) or not isinstance(delta, Real):
            raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
        d = float(delta)
        if not (0.0 < d < 1.0):
            raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
        rho = self.rho
        log_inv_delta = -math.log(d)
        classic = rho + 2.0 * math.sqrt(rho * log_inv_delta)

        def eps_at(alpha: float) -> float:
            am1 = alpha - 1.0
            return (
                alpha * rho
                + (log_inv_delta + am1 * math.log1p(-1.0 / alpha) - math.log(alpha)) / am1
            )

        # ε(α) is convex-ish and unimodal on (1, ∞); golden-section search on log(α − 1).
        lo, hi = math.log(1e-9), math.log(1e9)
        ratio = (math.sqrt(5.0) - 1.0) / 2.0
        x1 = hi - ratio * (hi - lo)
        x2 = lo + ratio * (hi - lo)
        f1 = eps_at(1.0 + math.exp(x1))
        f2 = eps_at(1.0 + math.exp(x2))
        for _ in range(200):
            if f1 <= f2:
                hi, x2, f2 = x2, x1, f1
                x1 = hi - ratio * (hi - lo)
                f1 = eps_at(1.0 + math.exp(x1))
            else:
                lo, x1, f1 = x1, x2, f2
                x2 = lo + ratio * (hi - lo)
                f2 = eps_at(1.0 + math.exp(x2))
        best = min(f1, f2)
        return max(0.0, min(best, classic))

    def __str__(self) -> str:
        return f"ρ = {self.rho:g} (zCDP)"


#: Either privacy model. Use ``budget.model`` (``"pure"`` / ``"zcdp"``) to dispatch.
Privacy = PureDP | ZCDP


def privacy_from_dict(data: dict[str, object]) -> Privacy:
    """Inverse of ``as_dict``: ``{"model": "pure", "epsilon": ε}`` or ``{"model": "zcdp", "rho": ρ}``.

    >>> privacy_from_dict({"model": "zcdp", "rho": 0.5})
    ZCDP(rho=0.5)
    """
    model = data.get("model")
    if model == "pure":
        return PureDP(data.get("epsilon"))  # type: ignore[arg-type]
    if model == "zcdp":
        return ZCDP(data.get("rho"))  # type: ignore[arg-type]
    raise ValueError(f"model must be 'pure' or 'zcdp', got {model!r}")


def _mix_error(left: object, right: object) -> TypeError:
    return TypeError(
        f"cannot compose {type(left).__name__} with {type(right).__name__}: "
        "convert explicitly (e.g. PureDP.to_zcdp()) first"
    )
