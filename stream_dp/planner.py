"""The ``auto`` strategy: pick the registered strategy with the lowest exact expected error.

The criterion is the mean per-release MSE over ticks ``1..horizon`` (``Mechanism.mse_curve``,
analytic, no simulation, plus the squared bound on the grid-rounding bias, which matters only at
a budget so large that the noise shrinks towards the grid), among the strategies registered for the privacy model whose error stays
bounded (or polylogarithmic at p = 1) on an unbounded stream past the horizon — the service runs
streams forever; only if none qualifies are the others considered. Ties go to the
earlier-registered strategy (simpler first).

>>> from stream_dp.budget import PureDP
>>> pick(0.3, 1023, PureDP(1.0))
'naive'
"""

from __future__ import annotations

from stream_dp.analysis import StrategyFigures
from stream_dp.budget import Privacy

__all__ = ["Candidate", "compare", "pick"]

#: One strategy's exact figures for ``(p, horizon, privacy, cap)``.
Candidate = StrategyFigures


def compare(
    p: float, horizon: int, privacy: Privacy, cap: float = 1.0, *, integer_counts: bool = False
) -> list[Candidate]:
    """Every strategy registered for ``privacy.model``, with exact sensitivity and mean MSE.

    Integer-grid strategies take part only with ``integer_counts=True`` (whole-number counts).
    """
    from stream_dp.analysis import figures
    from stream_dp.strategies import available, get

    # a fractional cap makes the integer strategies inapplicable (the library's documented
    # behaviour); `stream-dp plan --integer-counts --cap 1.5` refuses the contradiction instead
    names = available(
        privacy.model, integer_counts=integer_counts and float(cap).is_integer()
    )
    out: list[Candidate] = []
    refusal: ValueError | None = None
    for name in names:
        try:
            out += figures((name,), p, horizon, privacy, cap)
        except ValueError as exc:
            # an integer-grid strategy may refuse a budget the others follow (e.g. a huge ε):
            # it is then not a candidate; any other refusal is the caller's error
            if not get(name).integer_only:
                raise
            refusal = refusal or exc
    if not out and refusal is not None:
        raise refusal
    return out


def pick(
    p: float, horizon: int, privacy: Privacy, cap: float = 1.0, *, integer_counts: bool = False
) -> str:
    """Name of the strategy with the lowest mean per-release MSE over ``horizon`` ticks.

    Strategies whose error grows linearly past the horizon are only picked if no other one
    qualifies (see the module docstring).
    """
    candidates = compare(p, horizon, privacy, cap, integer_counts=integer_counts)
    if not candidates:
        raise ValueError(f"no strategy registered for privacy model {privacy.model!r}")
    safe = [c for c in candidates if c.unbounded_ok] or candidates
    return min(safe, key=lambda c: c.error_mse).strategy
