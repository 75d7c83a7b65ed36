"""``auto`` at user level (issue #34): strategies ranked by their error at the noise that gives
one person the declared budget, against an independent recomputation through the analysis."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_dp.analysis import expected_mse
from stream_dp.budget import ZCDP, PureDP
from stream_dp.planner import make_mechanism, pick, user_compare
from stream_dp.strategies.registry import available
from stream_dp.user_level.accounting import stream_factor
from stream_dp.user_level.bounds import UserBounds


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))


def _oracle_pick(p: float, horizon: int, rho: float, bounds: UserBounds) -> tuple[str, dict[str, float]]:
    """The strategy whose MSE at ρ / factor is least (analysis.expected_mse, the factor of the
    mechanism at the declared ρ) among those whose error stays bounded past the horizon, first
    listed on ties."""
    errors, bounded = {}, []
    for name in available("zcdp"):
        mech = make_mechanism(name, p, horizon, ZCDP(rho))
        f = stream_factor(mech, bounds.per_leaf_events, bounds.min_separation_ticks,
                          bounds.period_ticks)
        errors[name] = expected_mse(name, p, horizon, ZCDP(rho / f.value))
        if mech.error_stays_bounded():
            bounded.append(name)
    return min(bounded or errors, key=lambda n: errors[n]), errors


@pytest.mark.parametrize(("p", "sep"), [(1.0, 4), (1.0, 1), (0.99, 4)])
def test_user_level_pick_is_the_least_error_at_the_person_calibration(p: float, sep: int) -> None:
    bounds = UserBounds(max_events=6, period_ticks=64, min_separation_ticks=sep)
    want, errors = _oracle_pick(p, 63, 0.5, bounds)
    got = pick(p, 63, ZCDP(0.5), user_bounds=bounds)
    assert got == want, errors
    rows = {c.strategy: c for c in user_compare(p, 63, ZCDP(0.5), bounds)}
    for name, mse in errors.items():
        assert rows[name].error_mse >= mse * (1 - 1e-9)  # the rounding bias² on top at most
        assert rows[name].error_mse == pytest.approx(mse, rel=1e-3)


def test_user_level_auto_differs_from_event_level() -> None:
    """Eight events on distinct ticks at p = 0.9: the tree's block program gives a per-person
    factor well below the Toeplitz strategies' (most pairs of distinct ticks share few blocks),
    so ranking by the person's budget picks the tree where ranking by the event's picks blt; and
    8 ticks apart, sqrt (its spaced sum) where the event level picks blt."""
    for sep, want in ((1, "tree"), (8, "sqrt")):
        bounds = UserBounds(max_events=8, period_ticks=64, min_separation_ticks=sep)
        event = pick(0.9, 63, ZCDP(0.5))
        user = pick(0.9, 63, ZCDP(0.5), user_bounds=bounds)
        assert (event, user) == ("blt", want)
        assert _oracle_pick(0.9, 63, 0.5, bounds)[0] == want
        mech = make_mechanism("auto", 0.9, 63, ZCDP(0.5), user_bounds=bounds)
        # the mechanism keeps the declared per-event budget (the service's meaning of ρ)
        assert mech.name == want and mech.privacy == ZCDP(0.5)


def test_all_events_in_one_tick_rank_like_event_level() -> None:
    """b = 0: every strategy's factor is n² (exact), the same calibration for all: the user-level
    pick is the event-level one."""
    bounds = UserBounds(max_events=6, period_ticks=64)
    assert pick(0.99, 63, ZCDP(0.5), user_bounds=bounds) == pick(0.99, 63, ZCDP(0.5))
    assert pick(0.9, 63, PureDP(1.0), user_bounds=bounds) == pick(0.9, 63, PureDP(1.0))


def test_user_bounds_must_be_bounds() -> None:
    with pytest.raises(ValueError, match="user_bounds must be a UserBounds"):
        pick(0.9, 63, ZCDP(0.5), user_bounds=6)  # type: ignore[arg-type]
