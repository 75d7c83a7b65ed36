"""The ``auto`` strategy: pick the registered strategy with the lowest exact expected error.

Strategies registered with ``auto=False`` (``blt-horizon``, which plans the horizon as a run of
its own and makes the horizons after it pay) are built by name only: :func:`compare` and
:func:`user_compare` leave them out (``compare(..., by_name=True)`` lists them), so ``auto`` is
the minimum of what they list.

The criterion is the mean per-release MSE over ticks ``1..horizon`` (``Mechanism.mse_curve``,
analytic, no simulation, plus the squared bound on the grid-rounding bias, which matters only at
a budget so large that the noise shrinks towards the grid). Ties go to the earlier-listed
strategy (simpler first; :func:`stream_dp.strategies.registry.available`).

**Past the horizon** (the service runs streams forever). Only strategies whose
``Mechanism.error_stays_bounded()`` is True are candidates, unless none is; the claim means:

* p < 1: the per-release error is **bounded** in ``t`` (every strategy: epochs carry the last
  release times ``p^T``, so earlier epochs' noise decays geometrically);
* p = 1: the error past the horizon grows **at most polylogarithmically** in ``t`` (doubling
  epochs of a Fenwick tree: O(log² t)-ish), as opposed to linearly (a fixed-horizon tree or
  Toeplitz factorisation restarted every ``T`` ticks adds one epoch's error per epoch).

``tests/unit/test_accuracy_all.py`` checks every registered strategy's claim numerically from
its exact variance averaged over ``[16T, 32T)`` and ``[256T, 512T)`` (p = 1 and p = 0.999), so
a wrong claim fails.
This is why at p = 1 ``auto`` may pick a strategy with a larger error *within* the horizon:
the others' error keeps growing linearly afterwards (docs/accuracy.md, "p = 1").

Layers, bottom up (issue #26; ``tests/unit/test_layering.py``): :mod:`stream_dp.limits` (ranges)
< :mod:`stream_dp.strategies.registry` < :mod:`stream_dp.figures` < this module <
:mod:`stream_dp.analysis`. :func:`make_mechanism` here is the one implementation of "build a
mechanism, ``auto`` included", and :func:`check_buildable` the one "would it build"; import
them from here (no module below imports this one, not even lazily).

**User level** (issue #34; docs/design/user-level.md §4). With ``user_bounds`` (a
:class:`~stream_dp.user_level.bounds.UserBounds`), strategies are ranked by their error at the
**user-level calibration**: each strategy's per-event budget is the declared one divided by its
per-person factor on one leaf stream (:func:`stream_dp.user_level.accounting.stream_factor` for
``min(K, k)`` events, the bounds' separation and period), so that every strategy spends the same
per-person budget; a factor that is only an upper bound is used as it is (the guarantee that can
be claimed). :func:`user_compare` lists them; the mechanism :func:`make_mechanism` builds is still
the declared per-event budget's (the service's meaning of ε and ρ is unchanged).

>>> from stream_dp.budget import PureDP
>>> pick(0.3, 1023, PureDP(1.0))
'naive'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.figures import StrategyFigures, figures
from stream_dp.limits import check_parameters
from stream_dp.mechanism import Mechanism
from stream_dp.strategies._common import BudgetOutOfRange
from stream_dp.strategies.registry import available, check_arguments, get, make
from stream_dp.user_level.accounting import UserFactor, stream_factor
from stream_dp.user_level.bounds import UserBounds

__all__ = ["Candidate", "UserCandidate", "check_buildable", "check_range", "compare",
           "make_mechanism", "pick", "user_compare"]


def check_range(mechanism: Mechanism, max_tick_count: float, what: str | None = None) -> None:
    """Raise ``ValueError`` if per-tick counts up to ``max_tick_count`` (value units, per
    stream: ``cap ×`` the declared maximum events per tick) can leave the strategy's numeric
    range :meth:`~stream_dp.mechanism.Mechanism.max_count`.

    Such a configuration would release for a while and then stop at the first tick whose
    counts overflow, so the planner and the service refuse it up front.

    >>> from stream_dp.budget import PureDP
    >>> from stream_dp.planner import make_mechanism
    >>> check_range(make_mechanism("naive", 0.9, 63, PureDP(1.0)), 1e6)
    >>> check_range(make_mechanism("tree-ls", 0.999, 4095, PureDP(1.0)), 1e9)
    Traceback (most recent call last):
    ...
    ValueError: per-tick count 1e+09 can exceed the numeric range of tree-ls (p = 0.999, horizon = 4095, cap = 1): counts up to 5.37e+08 per tick and stream; declare fewer events per tick, or choose a strategy with a larger range (docs/accuracy.md, 'Numeric range')
    """
    limit = mechanism.max_count()
    if not (isinstance(max_tick_count, (int, float)) and max_tick_count >= 0):
        raise ValueError(f"max_tick_count must be a number ≥ 0, got {max_tick_count!r}")
    if max_tick_count > limit:
        shown = what if what is not None else f"per-tick count {max_tick_count:g}"
        raise ValueError(
            f"{shown} can exceed the numeric range of {mechanism.name} (p = {mechanism.p:g}, "
            f"horizon = {mechanism.horizon}, cap = {mechanism.cap:g}): counts up to "
            f"{limit:.3g} per tick and stream; declare fewer events per tick, or choose a "
            "strategy with a larger range (docs/accuracy.md, 'Numeric range')"
        )

#: One strategy's exact figures for ``(p, horizon, privacy, cap)``.
Candidate = StrategyFigures


def compare(
    p: float, horizon: int, privacy: Privacy, cap: float = 1.0, *, integer_counts: bool = False,
    by_name: bool = False,
) -> list[Candidate]:
    """Every strategy registered for ``privacy.model``, with exact sensitivity and mean MSE.

    Integer-grid strategies take part only with ``integer_counts=True`` (whole-number counts),
    the strategies ``auto`` does not pick (``blt-horizon``) only with ``by_name=True``.
    """
    # a fractional cap makes the integer strategies inapplicable (the library's documented
    # behaviour); `stream-dp plan --integer-counts --cap 1.5` refuses the contradiction instead
    names = available(
        privacy.model, integer_counts=integer_counts and float(cap).is_integer(), by_name=by_name
    )
    out: list[Candidate] = []
    refusal: ValueError | None = None
    for name in names:
        try:
            out += figures((name,), p, horizon, privacy, cap)
        except ValueError as exc:
            # an integer-grid strategy may refuse a budget the others follow (e.g. a huge ε),
            # and any strategy a budget its samplers cannot follow for its whole life
            # (BudgetOutOfRange, e.g. blt at p = 1 and ρ ≈ 1e-8): it is then not a candidate;
            # any other refusal is the caller's error
            if not (get(name).integer_only or isinstance(exc, BudgetOutOfRange)):
                raise
            refusal = refusal or exc
    if not out and refusal is not None:
        raise refusal
    return out


@dataclass(frozen=True)
class UserCandidate:
    """One strategy at the user-level calibration: its per-person ``factor`` on one leaf stream
    (per-person budget = factor × per-event budget) and its ``figures`` at the per-event budget
    ``declared / factor`` (so that one person spends the declared budget)."""

    factor: UserFactor
    figures: StrategyFigures

    @property
    def strategy(self) -> str:
        """The strategy's name."""
        return self.figures.strategy

    @property
    def error_mse(self) -> float:
        """Mean per-release MSE (squared counts) at the user-level calibration."""
        return self.figures.error_mse


def _scaled(privacy: Privacy, factor: float) -> Privacy:
    """``privacy`` divided by ``factor`` (the per-event budget giving ``privacy`` per person)."""
    if isinstance(privacy, PureDP):
        return PureDP(privacy.epsilon / factor)
    assert isinstance(privacy, ZCDP)
    return ZCDP(privacy.rho / factor)


def user_compare(
    p: float, horizon: int, privacy: Privacy, bounds: UserBounds, cap: float = 1.0, *,
    integer_counts: bool = False,
) -> list[UserCandidate]:
    """Every strategy registered for ``privacy.model`` at the user-level calibration:
    ``privacy`` is the per-person budget of one leaf stream per period; each strategy runs at
    ``privacy / factor``. A strategy whose calibrated budget leaves the documented range or its
    samplers' (a refusal, as in :func:`compare`) is not a candidate.

    >>> from stream_dp.budget import ZCDP
    >>> from stream_dp.user_level.bounds import UserBounds
    >>> b = UserBounds(max_events=4, period_ticks=64, min_separation_ticks=8)
    >>> [(c.strategy, c.factor.exact) for c in user_compare(1.0, 63, ZCDP(0.5), b)][:2]
    [('tree', True), ('binary-tree', True)]
    """
    if not isinstance(bounds, UserBounds):
        raise ValueError(f"user_bounds must be a UserBounds, got {bounds!r}")
    names = available(privacy.model, integer_counts=integer_counts and float(cap).is_integer())
    out: list[UserCandidate] = []
    refusal: ValueError | None = None
    for name in names:
        f = stream_factor(make(name, p, horizon, privacy, cap, user_level=True),
                          bounds.per_leaf_events,
                          bounds.min_separation_ticks, bounds.period_ticks)
        calibrated = _scaled(privacy, f.value)
        try:
            # a budget outside the documented range (ε < 1e-6 after a large factor) is no
            # candidate, like a sampler's refusal
            check_parameters(epsilon=getattr(calibrated, "epsilon", None),
                             rho=getattr(calibrated, "rho", None))
            out += [UserCandidate(f, fig) for fig in figures((name,), p, horizon, calibrated, cap,
                                                             user_level=True)]
        except ValueError as exc:
            if not (get(name).integer_only or isinstance(exc, BudgetOutOfRange)
                    or calibrated is not privacy):
                raise
            refusal = refusal or exc
    if not out and refusal is not None:
        raise refusal
    return out


def pick(
    p: float,
    horizon: int,
    privacy: Privacy,
    cap: float = 1.0,
    *,
    integer_counts: bool = False,
    max_tick_count: float | None = None,
    user_bounds: UserBounds | None = None,
) -> str:
    """Name of the strategy with the lowest mean per-release MSE over ``horizon`` ticks.

    Strategies whose error grows linearly past the horizon (``error_stays_bounded()`` False)
    are only picked if no other one qualifies (see the module docstring). With ``max_tick_count`` (``cap ×`` the declared
    maximum events per tick and stream) only strategies whose numeric range covers it are
    considered; ``ValueError`` if none does. With ``user_bounds``: the lowest MSE at the
    user-level calibration (:func:`user_compare`; the module docstring).
    """
    candidates: list[StrategyFigures] = (
        compare(p, horizon, privacy, cap, integer_counts=integer_counts) if user_bounds is None
        else [c.figures for c in user_compare(p, horizon, privacy, user_bounds, cap,
                                              integer_counts=integer_counts)])
    # compare/user_compare list no strategy registered with auto=False (blt-horizon): by name only
    if not candidates:
        raise ValueError(f"no strategy registered for privacy model {privacy.model!r}")
    if max_tick_count is not None:
        def in_range(name: str) -> bool:
            mech = make(name, p, horizon, privacy, cap)
            return not math.isnan(mech.max_count()) and mech.max_count() >= max_tick_count

        candidates = [c for c in candidates if in_range(c.strategy)]
        if not candidates:
            raise ValueError(
                f"no strategy's numeric range covers per-tick counts up to {max_tick_count:g} "
                f"at p = {p:g}, horizon = {horizon} (docs/accuracy.md, 'Numeric range')"
            )
    safe = [c for c in candidates if c.unbounded_ok] or candidates
    return min(safe, key=lambda c: c.error_mse).strategy


def make_mechanism(
    strategy: str,
    p: float,
    horizon: int,
    privacy: Privacy,
    cap: float = 1.0,
    *,
    integer_counts: bool = False,
    user_bounds: UserBounds | None = None,
) -> Mechanism:
    """A configured :class:`~stream_dp.mechanism.Mechanism`; ``"auto"`` resolves through
    :func:`pick` (by the user-level error with ``user_bounds``), any other name through the
    registry (:func:`stream_dp.strategies.registry.make`).

    ``p`` ∈ (0, 1] decay per tick; ``horizon`` ticks per epoch (≥ 1); ``privacy`` per event and
    stream; ``cap`` (> 0) bounds one event's contribution to a tick's count. ``integer_counts``
    declares that every count will be a whole number (whole-number event values and cap), which
    lets ``auto`` consider the integer-grid strategies. With ``user_bounds`` the mechanism is
    a user-level deployment's (the registry's ``user_level``: ``blt`` without start rows, whose
    per-person factor is then the exact Toeplitz one).
    """
    if strategy == "auto":
        p, horizon, cap, _ = check_arguments(p, horizon, privacy, cap)
        strategy = pick(p, horizon, privacy, cap=cap, integer_counts=integer_counts,
                        user_bounds=user_bounds)
    return make(strategy, p, horizon, privacy, cap, user_level=user_bounds is not None)


def check_buildable(
    strategy: str,
    p: float,
    horizon: int,
    privacy: Privacy,
    cap: float = 1.0,
    *,
    integer_counts: bool = False,
) -> str:
    """Build the mechanism once (``auto`` resolved); return the strategy name it resolves to.

    A strategy's own refusal (a budget its samplers cannot follow for this cap and grid, a
    strategy unknown or not offered for the privacy model) becomes a one-line ``ValueError``.
    """
    try:
        mech = make_mechanism(strategy, p, horizon, privacy, cap, integer_counts=integer_counts)
        mech.variance(1)
    except ValueError as exc:
        raise ValueError(" ".join(str(exc).split())) from None
    return mech.name
