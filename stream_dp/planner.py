"""The ``auto`` strategy: pick the registered strategy with the lowest exact expected error.

The criterion is the mean per-release MSE over ticks ``1..horizon`` (``Mechanism.mse_curve``,
analytic, no simulation), among the strategies registered for the privacy model. Ties go to the
earlier-registered strategy (simpler first).

>>> from stream_dp.budget import PureDP
>>> pick(0.3, 1023, PureDP(1.0))
'naive'
"""

from __future__ import annotations

from dataclasses import dataclass

from stream_dp.budget import Privacy

__all__ = ["Candidate", "compare", "pick"]


@dataclass(frozen=True)
class Candidate:
    """One strategy's exact figures for ``(p, horizon, privacy, cap)``."""

    strategy: str
    sensitivity: float
    mean_mse: float


def compare(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> list[Candidate]:
    """Every strategy registered for ``privacy.model``, with exact sensitivity and mean MSE."""
    from stream_dp.strategies import available, make_mechanism

    out = []
    for name in available(privacy.model):
        mech = make_mechanism(name, p, horizon, privacy, cap)
        out.append(Candidate(name, mech.sensitivity(), float(mech.mse_curve(horizon).mean())))
    return out


def pick(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> str:
    """Name of the strategy with the lowest mean per-release MSE over ``horizon`` ticks."""
    candidates = compare(p, horizon, privacy, cap)
    if not candidates:
        raise ValueError(f"no strategy registered for privacy model {privacy.model!r}")
    return min(candidates, key=lambda c: c.mean_mse).strategy
