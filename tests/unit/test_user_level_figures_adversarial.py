"""Adversarial review of user-level privacy (issue #34): the per-person figures printed
(``stream-dp plan``, the worker's start-up log, every record's ``privacy.per_person``) are
said to be valid upper bounds, exact where they say exact. Oracle: exact rational arithmetic
on the very floats configured, with the closed forms of pure DP without spacing (a person's
``n`` events on one node cost ``n·ε``; a period ``h·K·ε``)."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from agents.commands._tail_format import privacy_text
from agents.config.domain import load_domain
from agents.config.settings import Settings
from agents.release.person import privacy_block
from agents.release.state import build_mechanism
from stream_dp.accounting import Accountant
from stream_dp.budget import PureDP
from stream_dp.planner import make_mechanism
from stream_dp.user_level import UserAccountant, UserBounds

#: per-event budgets whose products with small integers round *down* as floats (0.7·3) or
#: whose 6-digit display rounds down (0.1234567·3 = 0.3703701 → "0.37037")
EPSILONS = [0.7, 0.1234567, 0.3, 1.1, 0.1]


def _numbers(line: str) -> list[Fraction]:
    return [Fraction(x) for x in re.findall(r"ε = ([0-9.e+-]+)", line)]


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("k", [3, 7])
def test_plan_and_start_up_figures_are_never_below_the_exact_product(eps: float, k: int) -> None:
    """A flat deployment, naive strategy, pure DP: one person's K events on one stream cost
    exactly ``K·ε`` (said exact). Neither the JSON figures nor the printed lines may show less
    than the exact product of the configured float and K."""
    bounds = UserBounds(max_events=k, period_ticks=10)
    privacy = PureDP(eps)
    acc = UserAccountant(Accountant(privacy, nodes_touched=1, cap=1.0), bounds, (1,),
                         make_mechanism("naive", 0.9, 63, privacy, 1.0), 60.0)
    exact = Fraction(eps) * k
    figures = acc.figures()
    for key in ("stream", "period"):
        assert figures[key]["exact"] is True
        got: Any = figures[key]["privacy"]
        assert Fraction(got["epsilon"]) >= exact, (key, figures[key])
    lines = acc.summary()
    shown = [n for line in lines if "per period" in line for n in _numbers(line)]
    assert shown, lines
    # 6 digits, never below the exact figure by more than a float's own noise (ε = 0.1 is
    # shown as 0.1, its person figure 1.0000000000000002 as 1)
    assert all(n >= exact * (1 - Fraction(1, 10**12)) for n in shown), (lines, float(exact))


@pytest.mark.parametrize("eps", EPSILONS)
def test_every_records_per_person_figures_are_never_below_the_exact_product(
        tmp_path: Path, eps: float) -> None:
    """The ``privacy`` block of every release record: ``stream`` = K·ε, ``total`` = h·K·ε
    (hierarchy of h = 3 nodes per event, pure DP, naive, b = 0: both exact), never below the
    exact products of the configured floats."""
    domain_file = tmp_path / "domain.toml"
    paths = [f"r{i}/l{j}" for i in range(2) for j in range(3)]
    domain_file.write_text('name = "t"\nkind = "hierarchy"\nroot = "all"\npaths = ['
                           + ", ".join(json.dumps(p) for p in paths) + "]\n")
    s = Settings(origin=1000.0, domain_file=str(domain_file), strategy="naive", p=0.9,
                 horizon=63, epsilon=eps, privacy_unit="user", user_period_ticks=10,
                 user_max_events=3)
    domain = load_domain(s.domain_file)
    h = Accountant.for_domain(domain, s.privacy).nodes_touched
    assert h == 3
    block = privacy_block(s, domain, build_mechanism(s))
    per_node = Fraction(block["epsilon"])
    per = block["per_person"]
    assert per["exact"] is True
    assert Fraction(per["stream"]) >= 3 * per_node, (per, float(3 * per_node))
    assert Fraction(per["total"]) >= h * 3 * per_node, (per, float(h * 3 * per_node))
    # stream-dp tail's row: the per-person figure shown never below the exact one (6 digits)
    shown = re.search(r"· ε=([0-9.e+-]+) per person per period", privacy_text(block))
    assert shown is not None, privacy_text(block)
    assert Fraction(shown.group(1)) >= 3 * per_node * (1 - Fraction(1, 10**12)), shown.group(0)


@pytest.mark.parametrize(("name", "p"), [("sqrt", 0.9), ("blt", 0.9)])
@pytest.mark.parametrize(("count", "sep", "period"), [(4, 5, 8), (3, 4, 6), (5, 10, 20)])
def test_zcdp_toeplitz_factor_said_exact_is_reached_within_one_period(
        name: str, p: float, count: int, sep: int, period: int) -> None:
    """A Toeplitz strategy's zCDP factor with ``b ≥ 1`` is said exact. With a period of T
    ticks, at most ``⌊(T − 1)/b⌋ + 1`` events b apart fit in it, so the exact factor is the
    brute-force maximum over the patterns *within one period* (the first one: the columns'
    norms only shrink after it), not over ``count`` events spread past the period's end."""
    import numpy as np

    from stream_dp.budget import ZCDP
    from stream_dp.strategies.blt import _oracle as blt_oracle
    from stream_dp.strategies.sqrt import _oracle as sqrt_oracle
    from stream_dp.user_level import brute_force_norm_sq, stream_factor

    mech = make_mechanism(name, p, 15, ZCDP(0.5))
    f = stream_factor(mech, count, sep, period)
    oracle = sqrt_oracle if name == "sqrt" else blt_oracle
    big_l, _, var = oracle.dense(mech, 60)
    m = big_l / np.sqrt(var)[:, None]
    single = float((m[:, 0] ** 2).sum())
    within = max(brute_force_norm_sq(m[:, q * period:(q + 1) * period], count, sep)
                 for q in range(60 // period)) / single
    assert f.value >= within * (1 - 1e-9)  # a bound, always
    if f.exact:  # said exact: reached by a pattern the period holds
        assert f.value == pytest.approx(within, rel=1e-6), (f, within)


def _periods_any_year(tick_seconds: Fraction, period_ticks: int) -> int:
    """The most aligned periods one interval ``[x, x + 365 days)`` of event times touches, by
    brute force over its start ``x`` (event time ``t`` is in tick ``⌊t/S⌋ + 1``): starts on a
    fine grid over several periods, and just before every tick boundary."""
    year = Fraction(365 * 86_400)
    best = 0
    span = 3 * period_ticks * tick_seconds
    starts = {span * i / 997 for i in range(997)}
    starts |= {k * tick_seconds - Fraction(1, 10**6) for k in range(1, 3 * period_ticks + 1)}
    for x in starts:
        if x < 0:
            continue
        first = int(x // tick_seconds) + 1
        end = (x + year) / tick_seconds  # the last time is just before x + year
        last = int(end) if end.denominator == 1 else int(end) + 1
        best = max(best, (last - 1) // period_ticks - (first - 1) // period_ticks + 1)
    return best


@pytest.mark.parametrize(("ticks_per_year", "period"), [(10, 3), (10, 9), (10, 5), (12, 11),
                                                        (Fraction(21, 2), 3), (7, 2)])
def test_the_years_periods_cover_a_year_that_starts_inside_a_tick(
        ticks_per_year: Fraction | int, period: int) -> None:
    """"Any 365 days": a year that starts inside a tick meets one tick more than a year that
    starts on a tick boundary (10 ticks a year meet 11), so it may touch one period more; the
    yearly figure's count of periods must cover the brute force."""
    from stream_dp.user_level.accounting import year_periods

    s = Fraction(365 * 86_400) / Fraction(ticks_per_year)
    want = _periods_any_year(s, period)
    assert year_periods(period, float(s)) >= want, (year_periods(period, float(s)), want)
