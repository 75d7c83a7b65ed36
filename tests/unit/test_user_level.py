"""User-level bounding and sensitivity (issue #34, library step): against independent oracles.

* the bounding rule against a re-implementation that rescans every earlier decision, and the
  neighbouring-person property: removing every event of one person changes no other decision;
* the spaced-sum dynamic program and the closed forms against brute force over every pattern,
  on random matrices and on the measurement matrices of the shipped strategies.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_dp.budget import ZCDP, PureDP
from stream_dp.planner import make_mechanism
from stream_dp.strategies.blt import _oracle as blt_oracle
from stream_dp.strategies.fenwick import _oracle as fenwick_oracle
from stream_dp.strategies.sqrt import _oracle as sqrt_oracle
from stream_dp.strategies.tree import _oracle as tree_oracle
from stream_dp.user_level.bounding import Bounder, keep_mask
from stream_dp.user_level.bounds import UserBounds
from stream_dp.user_level.sensitivity import (
    brute_force_norm_sq,
    gram_upper_bound_sq,
    max_spaced_sum,
    pure_factor,
    toeplitz_spaced_norm_sq,
    zcdp_factor,
)

# --- the bounding rule ------------------------------------------------------------------------


def _oracle_mask(events: list[tuple[str, int, int]], b: UserBounds) -> list[bool]:
    """The rule as written in the docs, by rescanning the person's earlier counted events."""
    counted: list[tuple[str, int, int]] = []
    out = []
    for person, tick, leaf in events:
        mine = [(t, s) for u, t, s in counted if u == person]
        period = 0 if b.period_ticks == 0 else (tick - 1) // b.period_ticks
        same = [(t, s) for t, s in mine
                if (0 if b.period_ticks == 0 else (t - 1) // b.period_ticks) == period]
        leaves = {s for _, s in same}
        k = b.max_events_per_stream or b.max_events
        ok = (len(same) < b.max_events
              and (b.max_streams == 0 or leaf in leaves or len(leaves) < b.max_streams)
              and sum(1 for _, s in same if s == leaf) < k
              and (b.min_separation_ticks == 0 or not mine
                   or tick >= max(t for t, _ in mine) + b.min_separation_ticks))
        if ok:
            counted.append((person, tick, leaf))
        out.append(ok)
    return out


_bounds = st.builds(
    UserBounds,
    max_events=st.integers(1, 4),
    period_ticks=st.integers(0, 5),
    max_streams=st.integers(0, 3),
    max_events_per_stream=st.integers(0, 3),
    min_separation_ticks=st.integers(0, 3),
)
_events = st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 12), st.integers(0, 3)),
                   max_size=40)


@given(_bounds, _events)
def test_bounder_follows_the_rule(bounds: UserBounds, events: list[tuple[str, int, int]]) -> None:
    assert keep_mask(events, bounds) == _oracle_mask(events, bounds)


@given(_bounds, _events, st.sampled_from("abc"))
def test_removing_one_person_changes_no_other_decision(
        bounds: UserBounds, events: list[tuple[str, int, int]], gone: str) -> None:
    full = keep_mask(events, bounds)
    rest = [e for e in events if e[0] != gone]
    assert keep_mask(rest, bounds) == [k for e, k in zip(events, full, strict=True)
                                       if e[0] != gone]


@given(_bounds, _events)
def test_counted_events_respect_every_bound(
        bounds: UserBounds, events: list[tuple[str, int, int]]) -> None:
    kept = [e for e, k in zip(events, keep_mask(events, bounds), strict=True) if k]
    for person in "abc":
        mine = [(t, s) for u, t, s in kept if u == person]
        ticks = [t for t, _ in mine]
        if bounds.min_separation_ticks:
            assert all(b - a >= bounds.min_separation_ticks for a, b in itertools.pairwise(ticks))
        by_period: dict[int, list[int]] = {}
        for t, s in mine:
            by_period.setdefault(bounds.period_of(t), []).append(s)
        for leaves in by_period.values():
            assert len(leaves) <= bounds.max_events
            assert all(leaves.count(s) <= bounds.per_leaf_events for s in leaves)
            if bounds.max_streams:
                assert len(set(leaves)) <= bounds.max_streams
            for below in (1, 2, 4):
                # any node above `below` of the leaves gets at most per_node_events(below)
                for group in itertools.combinations(sorted(set(leaves)), min(below,
                                                                             len(set(leaves)))):
                    got = sum(1 for s in leaves if s in group)
                    assert got <= bounds.per_node_events(below)


def test_a_flooding_person_costs_only_their_own_budget() -> None:
    b = Bounder(UserBounds(max_events=3, period_ticks=10))
    assert [b.admit("flood", 1, 0) for _ in range(10_000)].count(True) == 3
    assert b.admit("other", 1, 0)
    assert len(b) == 2


def test_forgetting_closed_periods_keeps_open_ones() -> None:
    b = Bounder(UserBounds(max_events=1, period_ticks=10))
    assert b.admit("a", 5, 0) and b.admit("a", 15, 0)
    b.forget_before(1)
    assert not b.admit("a", 16, 0)  # period 1 still remembered
    assert len(b) == 1
    b.forget_before(2)
    assert len(b) == 0


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", 1 << 32])
def test_bounds_reject_bad_values(bad: object) -> None:
    with pytest.raises(ValueError, match="max_events must be an integer"):
        UserBounds(max_events=bad, period_ticks=1)  # type: ignore[arg-type]


# --- sensitivity ------------------------------------------------------------------------------


def _brute_spaced_sum(v: np.ndarray, count: int, sep: int) -> float:
    n, best = v.size, 0.0
    for k in range(1, count + 1):
        picks = (itertools.combinations_with_replacement(range(n), k) if sep == 0
                 else itertools.combinations(range(n), k))
        for pick in picks:
            if sep and any(b - a < sep for a, b in itertools.pairwise(pick)):
                continue
            best = max(best, float(sum(v[i] for i in pick)))
    return best


@given(st.lists(st.floats(-5, 5), min_size=1, max_size=9), st.integers(1, 4), st.integers(0, 4))
def test_spaced_sum_matches_brute_force(values: list[float], count: int, sep: int) -> None:
    v = np.array(values)
    assert max_spaced_sum(v, count, sep) == pytest.approx(_brute_spaced_sum(v, count, sep),
                                                          rel=1e-12, abs=1e-12)


def _strategy_matrices() -> list[tuple[str, np.ndarray]]:
    n = 12
    out = []
    for name, oracle, privacy in (
            ("fenwick-opt", fenwick_oracle, PureDP(1.0)),
            ("tree", tree_oracle, PureDP(1.0)),
            ("sqrt", sqrt_oracle, ZCDP(0.5)),
            ("blt", blt_oracle, ZCDP(0.5)),
    ):
        for p in (0.9, 1.0):
            mech = make_mechanism(name, p, 15, privacy)
            big_l, _, var = oracle.dense(mech, n)
            out.append((f"{name}-p{p}", big_l / np.sqrt(var)[:, None]))
    return out


_MATRICES = _strategy_matrices()


@pytest.mark.parametrize(("label", "m"), _MATRICES, ids=[label for label, _ in _MATRICES])
@pytest.mark.parametrize(("count", "sep"), [(1, 1), (2, 0), (2, 1), (3, 2), (3, 4)])
def test_factors_against_brute_force_on_shipped_strategies(
        label: str, m: np.ndarray, count: int, sep: int) -> None:
    assert (m >= -1e-15).all(), label  # every shipped strategy measures with M >= 0
    exact_sq = brute_force_norm_sq(m, count, sep)
    single = float((m * m).sum(axis=0).max())
    # zCDP: the bound never underestimates, and is exact when all events may share one tick
    bound = gram_upper_bound_sq(m, count, sep)
    assert bound >= exact_sq * (1 - 1e-12)
    if sep == 0:
        assert bound == pytest.approx(exact_sq, rel=1e-12)
    assert zcdp_factor(m, count, sep) == pytest.approx(bound / single, rel=1e-12)
    # pure DP: the column-norm program is exact for M >= 0
    norms = m.sum(axis=0)
    brute_l1 = max(
        float(m[:, list(pick)].sum(axis=1).sum())
        for k in range(1, count + 1)
        for pick in (itertools.combinations_with_replacement(range(m.shape[1]), k) if sep == 0
                     else itertools.combinations(range(m.shape[1]), k))
        if not sep or all(b - a >= sep for a, b in itertools.pairwise(pick)))
    assert pure_factor(m, count, sep) == pytest.approx(brute_l1 / float(norms.max()), rel=1e-12)


@pytest.mark.parametrize("p", [0.5, 0.9, 0.99, 1.0])
@pytest.mark.parametrize(("count", "sep"), [(1, 1), (2, 0), (2, 1), (3, 2), (4, 3)])
def test_toeplitz_closed_form_is_the_worst_pattern(p: float, count: int, sep: int) -> None:
    """Square-root coefficients of the decayed prefix sum (non-negative, non-increasing): the
    closed form equals the brute-force maximum over every spaced pattern."""
    n = 11
    c = np.array([float(np.prod([(2 * i - 1) / (2 * i) for i in range(1, k + 1)])) * p ** k
                  for k in range(n)])
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    big_c = np.where(lag >= 0, c[np.clip(lag, 0, None)], 0.0)
    assert toeplitz_spaced_norm_sq(c, count, sep) == pytest.approx(
        brute_force_norm_sq(big_c, count, sep), rel=1e-12)


def test_toeplitz_closed_form_refuses_increasing_coefficients() -> None:
    with pytest.raises(ValueError, match="non-increasing"):
        toeplitz_spaced_norm_sq(np.array([1.0, 2.0]), 2, 1)


# --- per-stream factors and the accountant ------------------------------------------------------

from stream_dp.accounting import Accountant  # noqa: E402
from stream_dp.domain import Domain  # noqa: E402
from stream_dp.strategies.naive import _oracle as naive_oracle  # noqa: E402
from stream_dp.user_level.accounting import (  # noqa: E402
    UserAccountant,
    layer_leaves,
    stream_factor,
    year_periods,
)


def _normalised(oracle: object, mech: object, n: int) -> np.ndarray:
    big_l, _, var = oracle.dense(mech, n)  # type: ignore[attr-defined]
    return big_l / np.sqrt(var)[:, None]


def _brute_l1(m: np.ndarray, count: int, sep: int) -> float:
    best = 0.0
    for pick in (itertools.combinations_with_replacement(range(m.shape[1]), count) if sep == 0
                 else itertools.combinations(range(m.shape[1]), count)):
        if sep and any(b - a < sep for a, b in itertools.pairwise(pick)):
            continue
        best = max(best, float(np.abs(m[:, list(pick)].sum(axis=1)).sum()))
    return best


@pytest.mark.parametrize(("name", "oracle", "p"), [
    ("naive", naive_oracle, 0.95), ("tree", tree_oracle, 1.0), ("tree", tree_oracle, 0.95),
    ("fenwick-opt", fenwick_oracle, 0.95), ("dm", fenwick_oracle, 0.9),
    ("tree-ls", None, 0.95)])
@pytest.mark.parametrize(("count", "sep"), [(2, 0), (3, 1), (3, 3)])
def test_pure_stream_factor_against_brute_force(name: str, oracle: object, p: float,
                                                count: int, sep: int) -> None:
    """One epoch of 15 ticks as the period (``P·15`` is where an epoch starts, and a tree's top
    block of at most 8 ticks is seen at every alignment over 8 periods): exact against the
    brute force over every pattern of the columns' L1 changes (the dense matrix's column sums
    times cap, plus the grid slack of the coordinates each column touches) over Δ₁; tree-ls has
    no cycle of column norms here: n, a bound (exact when every event may share a tick)."""
    mech = make_mechanism(name, p, 15, PureDP(1.0))
    f = stream_factor(mech, count, sep, period_ticks=15)
    if oracle is None:
        assert f.value == count and f.exact is (sep == 0)
        return
    delta = float(mech.sensitivity())
    if name == "tree":  # every alignment of the top block: as many periods as it takes
        top = 1 << int(mech.levels[-1])  # type: ignore[attr-defined]
        cycle = top // math.gcd(15, top)
        rows = tree_rows(mech, -(-15 * cycle // top) * top)
        # one event moves each of its m coordinates by cap·w·p^…, plus the grid slack the
        # mechanism's Δ₁ = cap·max(1, Σw) + slack holds for all of them
        slack = delta - mech.cap * max(1.0, float(np.sum(mech.weights)))  # type: ignore[attr-defined]
        per = mech.cap * rows.sum(axis=0) + slack  # type: ignore[attr-defined]
    elif name == "naive":  # one coordinate per tick, every tick alike: Δ₁ each
        cycle, per = 1, np.full(15, delta)
    else:  # Fenwick: the period is the epoch, every epoch alike; 2 grid units per coordinate
        cycle = 1
        big_l, _, _ = oracle.dense(mech, 15)  # type: ignore[attr-defined]
        grid = float(mech.plan(15).grid)  # type: ignore[attr-defined]
        per = (mech.cap * (1 + 2.0**-40) * big_l.sum(axis=0)  # type: ignore[attr-defined]
               + 2.0 * grid * (big_l > 0).sum(axis=0))
    assert float(per.max()) <= delta * (1 + 1e-15)  # Δ₁ covers every column
    brute = max(_brute_spaced_sum(per[q * 15:(q + 1) * 15], count, sep) for q in range(cycle))
    ratio = brute / delta
    assert f.exact
    assert f.value >= ratio * (1 - 1e-12)
    assert f.value == pytest.approx(ratio, rel=1e-12)


@pytest.mark.parametrize(("name", "p"), [("sqrt", 0.5), ("sqrt", 0.9), ("blt", 0.5),
                                         ("blt", 0.9)])
@pytest.mark.parametrize(("count", "sep"), [(2, 0), (2, 1), (3, 2), (4, 5)])
def test_zcdp_toeplitz_factor_against_brute_force(name: str, p: float, count: int,
                                                  sep: int) -> None:
    """The closed form is the infinite stream's; the brute force over every pattern in a long
    enough window reaches it up to the coefficients' tail beyond the window."""
    mech = make_mechanism(name, p, 15, ZCDP(0.5))
    f = stream_factor(mech, count, sep)
    assert f.exact
    n = 40
    oracle = sqrt_oracle if name == "sqrt" else blt_oracle
    m = _normalised(oracle, mech, n)
    # the window's first column, full length: the largest column norm of the infinite stream
    brute = brute_force_norm_sq(m, count, sep) / float((m[:, 0] ** 2).sum())
    assert f.value >= brute * (1 - 1e-12)
    assert f.value == pytest.approx(brute, rel=1e-6)


@pytest.mark.parametrize(("name", "oracle", "p"), [("blt", blt_oracle, 1.0)])
@pytest.mark.parametrize(("count", "sep"), [(2, 1), (3, 2)])
def test_zcdp_bound_where_no_closed_form(name: str, oracle: object, p: float, count: int,
                                         sep: int) -> None:
    mech = make_mechanism(name, p, 15, ZCDP(0.5))
    f = stream_factor(mech, count, sep)
    assert not f.exact and f.value == count ** 2
    m = _normalised(oracle, mech, 15)
    assert f.value >= brute_force_norm_sq(m, count, sep) / float((m * m).sum(axis=0).max())


def test_layer_leaves_of_each_domain_kind() -> None:
    d = Domain.from_paths(["eu/fr/paris", "eu/fr/lyon", "eu/de/berlin", "us/ny"])
    assert layer_leaves(d) == (4, 3, 2, 1) and len(layer_leaves(d)) == d.touches
    g = Domain.grid({"a": ["x", "y"], "b": ["1", "2", "3"]})
    assert layer_leaves(g) == (6, 3, 2, 1) and len(layer_leaves(g)) == g.touches
    assert layer_leaves(Domain.flat(["a", "b"])) == (1,)


def _brute_total(domain: Domain, bounds: UserBounds, phi: object) -> float:
    """max over every multiset of a person's counted leaves (respecting K, L, k) of
    Σ_nodes φ(events on the node)."""
    leaves = [name for name in domain.names
              if name not in {domain.names[int(q)] for q in domain.parent if q >= 0}]
    best = 0.0
    for total in range(1, bounds.max_events + 1):
        for pick in itertools.combinations_with_replacement(leaves, total):
            if bounds.max_streams and len(set(pick)) > bounds.max_streams:
                continue
            if any(pick.count(s) > bounds.per_leaf_events for s in set(pick)):
                continue
            per_node: dict[int, int] = {}
            for s in pick:
                for v in domain.nodes_for_event(s):
                    per_node[int(v)] = per_node.get(int(v), 0) + 1
            best = max(best, sum(phi(c) for c in per_node.values()))  # type: ignore[operator]
    return best


@pytest.mark.parametrize("bounds", [
    UserBounds(max_events=4, period_ticks=10),
    UserBounds(max_events=4, period_ticks=10, max_events_per_stream=1),
    UserBounds(max_events=5, period_ticks=10, max_streams=2, max_events_per_stream=2),
    UserBounds(max_events=3, period_ticks=10, min_separation_ticks=2),
])
@pytest.mark.parametrize(("privacy", "name"), [(PureDP(1.0), "tree"), (ZCDP(0.5), "sqrt"),
                                               (ZCDP(0.5), "tree")])
def test_period_total_against_brute_force_over_allocations(bounds: UserBounds,
                                                           privacy: object, name: str) -> None:
    domain = Domain.from_paths(["a/x", "a/y", "a/z", "b/u", "b/v"])
    # pure: a tree at p = 1 (n × is exact there); zCDP: sqrt (Toeplitz) and the tree program
    mech = make_mechanism(name if isinstance(privacy, ZCDP) else "tree",
                          0.9 if name == "sqrt" else 1.0, 15, privacy)  # type: ignore[arg-type]
    acc = UserAccountant(Accountant.for_domain(domain, privacy), bounds,  # type: ignore[arg-type]
                         layer_leaves(domain), mech, tick_seconds=60.0)
    total, exact = acc.period_factor()
    brute = _brute_total(domain, bounds,
                         lambda c: stream_factor(mech, c, bounds.min_separation_ticks,
                                                 bounds.period_ticks).value)
    assert total >= brute * (1 - 1e-12)
    assert exact
    assert total == pytest.approx(brute, rel=1e-12)


def test_year_figures() -> None:
    # any 365 days touch 366 daily periods (a year starting inside one)
    assert year_periods(1440, 60.0) == 366 and year_periods(0, 60.0) == 1
    domain = Domain.flat(["a", "b"])
    b = UserBounds(max_events=10, period_ticks=1440)
    pure = UserAccountant(Accountant.for_domain(domain, PureDP(0.1)), b, (1,),
                          make_mechanism("tree", 0.99, 1023, PureDP(0.1)), 60.0)
    assert pure.year_factor() == (366 * 10.0, False)
    lines = pure.summary()
    assert any("ε = 1 per person per period" in line and "exact" in line for line in lines), lines
    assert any("ε = 366 (366 periods; an upper bound)" in line for line in lines), lines


def test_zcdp_year_bound_covers_every_multi_period_pattern() -> None:
    """Three periods of 4 ticks, two events each, one tick apart: the year's bound is at least
    the brute-force maximum over every such pattern (dense Toeplitz of the sqrt coefficients)."""
    mech = make_mechanism("sqrt", 0.9, 15, ZCDP(0.5))
    b = UserBounds(max_events=2, period_ticks=4, min_separation_ticks=1)
    acc = UserAccountant(Accountant.for_domain(Domain.flat(["a"]), ZCDP(0.5)), b, (1,), mech,
                         tick_seconds=YEAR_SECONDS_FOR_THREE_PERIODS)
    assert year_periods(4, acc.tick_seconds) == 3
    c = np.asarray(mech.coefficients)  # type: ignore[attr-defined]
    n = 12 + c.size
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    big_c = np.where(lag >= 0, np.concatenate([c, np.zeros(n)])[np.clip(lag, 0, None)], 0.0)
    best = 0.0
    per_period = [list(itertools.combinations(range(4 * q, 4 * q + 4), 2)) for q in range(3)]
    for a, bb, cc in itertools.product(*per_period):
        x = np.zeros(n)
        x[list(a + bb + cc)] = 1.0
        y = big_c @ x
        best = max(best, float(y @ y))
    year, exact = acc.year_factor()
    assert not exact
    assert year >= best / float(c @ c) * (1 - 1e-12)


# a year of 8 ticks meets at most 9 (one more when it starts inside a tick), which touch at
# most 3 periods of 4 ticks (⌈8 / 4⌉ + 1)
YEAR_SECONDS_FOR_THREE_PERIODS = 365 * 86_400 / 8


# --- the trees' zCDP program (trees.py) ----------------------------------------------------------

import math  # noqa: E402
import types  # noqa: E402

from stream_dp.strategies.tree._oracle import measurement_matrix as tree_rows  # noqa: E402
from stream_dp.user_level.trees import tree_norm_sq, tree_period_norm_sq  # noqa: E402


def _tree_window_brute(levels: tuple[int, ...], weights: tuple[float, ...], p: float,
                       count: int, sep: int, start: int, length: int) -> float:
    """Brute force over every pattern in the window, on the dense rows of *every* block the
    window's ticks feed (blocks that complete after the window included: the dense matrix runs
    to the end of the window's last top block)."""
    top = 1 << levels[-1]
    ticks = -(-(start + length) // top) * top
    rows = tree_rows(types.SimpleNamespace(p=p, levels=levels, weights=weights), ticks)
    return brute_force_norm_sq(rows[:, start:start + length], count, sep)


_TREE_SHAPES = [((0, 1, 2, 3), (0.6, 0.5, 0.45, 0.4)), ((0, 2, 3), (0.7, 0.5, 0.5)),
                ((0, 1, 3, 4), (0.3, 0.5, 0.6, 0.55)), ((0, 3), (1.0, 0.5))]


@pytest.mark.parametrize(("levels", "weights"), _TREE_SHAPES)
@pytest.mark.parametrize("count", [1, 2, 3, 4])
@pytest.mark.parametrize("sep", [1, 2, 3, 5, 7])
def test_tree_program_is_exact_at_p1(levels: tuple[int, ...], weights: tuple[float, ...],
                                     count: int, sep: int) -> None:
    """p = 1: the program equals the brute force over every pattern, for windows at every kind
    of alignment (inside one top block, across two, cut mid-block on both sides)."""
    top = 1 << levels[-1]
    for start, length in ((0, top), (0, 13), (3, 11), (top - 5, 9), (1, 2 * top - 3)):
        if length > 24 or (count > 3 and length > 16):
            continue
        want = _tree_window_brute(levels, weights, 1.0, count, sep, start, length)
        got = tree_norm_sq(levels, weights, 1.0, count, sep, start, length)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12), (start, length)


@given(st.sampled_from(_TREE_SHAPES), st.integers(1, 4), st.integers(1, 6), st.integers(0, 20),
       st.integers(1, 14), st.sampled_from([0.5, 0.8, 0.97]))
def test_tree_program_bounds_decayed_trees(shape: tuple[tuple[int, ...], tuple[float, ...]],
                                           count: int, sep: int, start: int, length: int,
                                           p: float) -> None:
    """p < 1: never below the brute force (the program is reported as a bound there)."""
    levels, weights = shape
    want = _tree_window_brute(levels, weights, p, count, sep, start, length)
    assert tree_norm_sq(levels, weights, p, count, sep, start, length) >= want * (1 - 1e-12)


def test_tree_program_spacing_is_not_off_by_one() -> None:
    """Four events in a window cut mid-block on both sides (ticks 5 … 20 of 16-tick top
    blocks): the brute-force maxima for b = 1 … 7 all differ, and the program gives exactly the
    one at b: a program that confused "b apart" with "b − 1" or "b + 1 apart" (inside a block
    or across a block boundary) fails."""
    levels, weights = (0, 1, 2, 3), (0.6, 0.5, 0.45, 0.4)
    brute = {b: _tree_window_brute(levels, weights, 1.0, 4, b, 5, 16) for b in range(1, 8)}
    assert len(set(brute.values())) == 7, brute
    for b in range(1, 8):
        assert tree_norm_sq(levels, weights, 1.0, 4, b, 5, 16) == pytest.approx(
            brute[b], rel=1e-12)


@pytest.mark.parametrize(("count", "sep"), [(2, 1), (3, 2), (3, 9), (4, 3)])
def test_tree_unending_stream(count: int, sep: int) -> None:
    """``length = 0`` (a period as long as the epoch): equal to the brute force over a long
    window, which no longer window exceeds (p = 1, exact)."""
    levels, weights = (0, 1, 2), (0.6, 0.6, 0.5)
    got = tree_norm_sq(levels, weights, 1.0, count, sep)
    long = _tree_window_brute(levels, weights, 1.0, count, sep, 0, 20)
    assert got == pytest.approx(long, rel=1e-12)
    assert got == pytest.approx(_tree_window_brute(levels, weights, 1.0, count, sep, 3, 21),
                                rel=1e-12) or got > _tree_window_brute(
        levels, weights, 1.0, count, sep, 3, 21)


def _period_brute(levels: tuple[int, ...], weights: tuple[float, ...], p: float, count: int,
                  sep: int, period: int) -> float:
    """The largest brute force over the periods ``[P·T, (P+1)·T)`` of one whole cycle of
    alignments (P < top block / gcd(T, top block))."""
    top = 1 << levels[-1]
    cycle = top // math.gcd(period, top)
    return max(_tree_window_brute(levels, weights, p, count, sep, q * period, period)
               for q in range(cycle))


@pytest.mark.parametrize("name", ["tree", "binary-tree"])
@pytest.mark.parametrize(("count", "sep", "period"), [
    (2, 1, 5), (2, 2, 8), (3, 2, 6), (3, 3, 12), (2, 5, 7), (3, 1, 16), (2, 4, 3)])
def test_tree_stream_factor_against_brute_force(name: str, count: int, sep: int,
                                                period: int) -> None:
    """The shipped trees (top blocks of at most 16 ticks): the zCDP factor is exact over every
    period alignment and equals the brute force, at p = 1 (counts) and at p = 0.9 (the Pareto
    program of the decayed sums)."""
    for p in (1.0, 0.9):
        mech = make_mechanism(name, p, 15, ZCDP(0.5))
        levels = tuple(int(v) for v in mech.levels)  # type: ignore[attr-defined]
        weights = tuple(float(w) for w in mech.weights)  # type: ignore[attr-defined]
        assert 1 << levels[-1] <= 16  # the brute force stays small
        f = stream_factor(mech, count, sep, period_ticks=period)
        brute = _period_brute(levels, weights, p, count, sep, period) / sum(
            w * w for w in weights)
        assert f.exact
        assert f.value >= brute * (1 - 1e-12)
        assert f.value == pytest.approx(_tree_slack(mech, brute, count, sep, period), rel=1e-12)
        assert f.value < count ** 2  # tighter than the old n² bound


def _tree_slack(mech: object, value: float, count: int, sep: int, period: int) -> float:
    """The matrix figure with the grid slack: Δ₂ = cap·max(1, ‖w‖) + 2√m·g, and a person's
    events (at most as many as fit in a period) each touch m coordinates whose slack does not
    grow with the events in them: √factor ≤ (cap·max(1, ‖w‖)·√value + 2√m·g·√n)/Δ₂."""
    n = min(count, (period - 1) // sep + 1)
    m = len(mech.levels)  # type: ignore[attr-defined]
    w = np.asarray(mech.weights)  # type: ignore[attr-defined]
    data = mech.cap * max(1.0, float(np.sqrt(w @ w)))  # type: ignore[attr-defined]
    slack = 2.0 * math.sqrt(m) * mech.grid  # type: ignore[attr-defined]
    assert data + slack == pytest.approx(mech.sensitivity(), rel=1e-15)  # type: ignore[attr-defined]
    return max(value, ((data * math.sqrt(value) + slack * math.sqrt(n)) / (data + slack)) ** 2)


def test_tree_many_alignments_fall_back_to_a_bound() -> None:
    """More alignments than computed one by one: the unending stream bounds every period and
    the figure says it is not exact."""
    levels, weights = (0, 1, 2, 3), (0.6, 0.5, 0.45, 0.4)
    exact, every = tree_period_norm_sq(levels, weights, 1.0, 3, 2, period_ticks=5)
    assert every
    bound, every = tree_period_norm_sq(levels, weights, 1.0, 3, 2, period_ticks=5, max_offsets=2)
    assert not every and (bound >= exact * (1 - 1e-12)).all()
    for c in (1, 2, 3):  # one value per count: at most c events
        assert exact[c] == pytest.approx(_period_brute(levels, weights, 1.0, c, 2, 5), rel=1e-12)


# --- the trees' year -------------------------------------------------------------------------------


def _year_brute(mech: object, per_period: int, sep: int, period: int, years: int) -> float:
    """max ‖L x‖² / largest column over every pattern of a year of ``years`` periods: at most
    ``per_period`` events in each, any two ``sep`` apart (across period boundaries too)."""
    levels = tuple(int(v) for v in mech.levels)  # type: ignore[attr-defined]
    weights = tuple(float(w) for w in mech.weights)  # type: ignore[attr-defined]
    top = 1 << levels[-1]
    ticks = years * period
    rows = tree_rows(types.SimpleNamespace(p=mech.p, levels=levels, weights=weights),  # type: ignore[attr-defined]
                     -(-ticks // top) * top)[:, :ticks]
    best = 0.0
    for k in range(1, years * per_period + 1):
        for pick in itertools.combinations(range(ticks), k):
            if any(b - a < sep for a, b in itertools.pairwise(pick)):
                continue
            if any(sum(1 for t in pick if t // period == q) > per_period for q in range(years)):
                continue
            y = rows[:, list(pick)].sum(axis=1)
            best = max(best, float(y @ y))
    return best / sum(w * w for w in weights)


@pytest.mark.parametrize(("period", "sep", "exact"), [
    (4, 1, False),   # top blocks of 4 ticks inside each period, distinct ticks: Y × the period
    #                  (a bound: a year starting inside a period holds parts of two)
    (4, 2, False),   # the same, two ticks apart: Y × the period bounds it
    (3, 1, False),   # top blocks straddle periods: top blocks × one block's worst case
    (3, 2, False),
])
def test_tree_year_against_brute_force(period: int, sep: int, exact: bool) -> None:
    mech = make_mechanism("tree", 1.0, 7, ZCDP(0.5))
    assert 1 << mech.levels[-1] == 4  # type: ignore[attr-defined]
    b = UserBounds(max_events=2, period_ticks=period, min_separation_ticks=sep)
    acc = UserAccountant(Accountant.for_domain(Domain.flat(["a"]), ZCDP(0.5)), b, (1,), mech,
                         tick_seconds=365 * 86_400 / (2 * period))
    assert year_periods(period, acc.tick_seconds) == 3
    year, is_exact = acc.year_factor()
    brute = _year_brute(mech, 2, sep, period, 3)
    assert is_exact is exact
    assert year >= brute * (1 - 1e-12)
    assert year < (3 * 2) ** 2  # below the old (Y·N)² bound
    if exact:
        assert year == pytest.approx(brute, rel=1e-12)


# --- the trees at p < 1, exactly (trees_decayed.py) ---------------------------------------------

from stream_dp.user_level.trees_decayed import DecayedProgram, TooLong  # noqa: E402


@given(st.sampled_from(_TREE_SHAPES), st.integers(1, 4), st.integers(1, 6), st.integers(0, 20),
       st.integers(1, 14), st.sampled_from([0.3, 0.5, 0.8, 0.97]))
def test_decayed_program_is_exact(shape: tuple[tuple[int, ...], tuple[float, ...]], count: int,
                                  sep: int, start: int, length: int, p: float) -> None:
    """p < 1: the Pareto program equals the brute force over every pattern (dense rows of every
    block the window feeds), and the count program with packed sums never falls below it."""
    levels, weights = shape
    want = _tree_window_brute(levels, weights, p, count, sep, start, length)
    got = DecayedProgram(levels, weights, p, count, sep).window(start, start + length)
    assert got[-1] == pytest.approx(want, rel=1e-12, abs=1e-12)
    for c in range(1, count):  # one value per count: at most c events
        assert got[c] == pytest.approx(
            _tree_window_brute(levels, weights, p, c, sep, start, length), rel=1e-12, abs=1e-12)
    assert tree_norm_sq(levels, weights, p, count, sep, start, length) >= want * (1 - 1e-12)


def test_decayed_spacing_is_not_off_by_one() -> None:
    """As at p = 1: the brute-force maxima for b = 1 … 7 differ, the program gives the one at b."""
    levels, weights = (0, 1, 2, 3), (0.6, 0.5, 0.45, 0.4)
    brute = {b: _tree_window_brute(levels, weights, 0.8, 4, b, 5, 16) for b in range(1, 8)}
    assert len(set(brute.values())) == 7, brute
    for b in range(1, 8):
        got = DecayedProgram(levels, weights, 0.8, 4, b).window(5, 21)[-1]
        assert got == pytest.approx(brute[b], rel=1e-12)


def test_decayed_program_gives_up_past_its_work_limit() -> None:
    """Pareto sets past the limit: TooLong, and the period figure falls back to the bound,
    reported as not exact and never below the exact one."""
    levels, weights = (0, 1, 2, 3), (0.6, 0.5, 0.45, 0.4)
    with pytest.raises(TooLong):
        DecayedProgram(levels, weights, 0.8, 4, 2, max_pairs=10).window(0, 32)
    exact, ok = tree_period_norm_sq(levels, weights, 0.8, 4, 2, period_ticks=16)
    bound, bounded = tree_period_norm_sq(levels, weights, 0.8, 4, 2, period_ticks=16,
                                         max_pairs=10)
    assert ok and not bounded
    assert (bound >= exact * (1 - 1e-12)).all()


# --- pure DP over a cycle of column norms ---------------------------------------------------------

from stream_dp.user_level.accounting import periodic_spaced_sum  # noqa: E402


@given(st.lists(st.floats(0, 5), min_size=1, max_size=6), st.integers(1, 3), st.integers(1, 4),
       st.integers(0, 7))
def test_periodic_spaced_sum_against_brute_force(cycle: list[float], count: int, sep: int,
                                                 period: int) -> None:
    """Every period ``[P·T, (P+1)·T)`` of the repeated cycle for one whole round of alignments
    (``period = 0``: a long window stands for the unending stream)."""
    c = np.array(cycle)
    if period == 0:
        want = _brute_spaced_sum(np.resize(c, 3 * (c.size + sep) * count), count, sep)
    else:
        rounds = c.size // math.gcd(period, c.size)
        seq = np.resize(c, period * rounds)
        want = max(_brute_spaced_sum(seq[q * period:(q + 1) * period], count, sep)
                   for q in range(rounds))
    got = periodic_spaced_sum(c, count, sep, period)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_periodic_spaced_sum_gives_up_past_its_alignments() -> None:
    assert periodic_spaced_sum(np.ones(8), 2, 1, 3, max_offsets=4) is None
    assert periodic_spaced_sum(np.ones(8), 2, 1, 3, max_offsets=8) == 2.0


def test_naive_factor_counts_only_the_events_that_fit_in_a_period() -> None:
    """Ten events 200 ticks apart never fit in a 1440-tick period: eight do, exactly."""
    f = stream_factor(make_mechanism("naive", 0.9, 1023, PureDP(1.0)), 10, 200, 1440)
    assert (f.value, f.exact) == (8.0, True)


@pytest.mark.parametrize(("sep", "exact"), [(1, False), (2, False)])
def test_pure_year_against_brute_force(sep: int, exact: bool) -> None:
    """Three periods of 4 ticks, two events each, a tree at p = 0.9 (pure): Y × the period,
    never exact over a year (one that starts inside a period holds parts of two)."""
    mech = make_mechanism("tree", 0.9, 7, PureDP(1.0))
    b = UserBounds(max_events=2, period_ticks=4, min_separation_ticks=sep)
    acc = UserAccountant(Accountant.for_domain(Domain.flat(["a"]), PureDP(1.0)), b, (1,), mech,
                         tick_seconds=365 * 86_400 / 9)
    rows = tree_rows(mech, 16)[:, :12]
    norms = rows.sum(axis=0)
    best = 0.0
    for k in range(1, 7):
        for pick in itertools.combinations(range(12), k):
            if any(y - x < sep for x, y in itertools.pairwise(pick)):
                continue
            if any(sum(1 for t in pick if t // 4 == q) > 2 for q in range(3)):
                continue
            best = max(best, float(norms[list(pick)].sum()))
    year, is_exact = acc.year_factor()
    assert is_exact is exact
    want = best / float(tree_rows(mech, 16).sum(axis=0).max())
    assert year >= want * (1 - 1e-12)
    if exact:
        assert year == pytest.approx(want, rel=1e-12)


# --- tree-ls at p < 1: a bound through the block program ----------------------------------------

from stream_dp.strategies.ls_tree._oracle import dense as ls_dense  # noqa: E402


@pytest.mark.parametrize(("p", "horizon"), [(0.9, 15), (0.99, 15), (0.999, 63)])
@pytest.mark.parametrize(("count", "sep", "period"), [(2, 1, 7), (3, 2, 12), (2, 3, 5), (3, 1, 6)])
def test_ls_tree_factor_bounds_the_brute_force(p: float, horizon: int, count: int, sep: int,
                                               period: int) -> None:
    """The dense oracle's rows (leaves and every level's blocks, each row over its own noise
    standard deviation), every period alignment within a top block: the factor never falls
    below the brute force over every pattern, and is below the old n² bound. (Horizons small
    enough for the dense oracle: at p = 0.999, T = 1023 the planner's hat plan took 20 GB.)"""
    mech = make_mechanism("tree-ls", p, horizon, ZCDP(0.5))
    _check_ls_tree_factor(mech, count, sep, period)


@pytest.mark.parametrize(("count", "sep", "period"), [(2, 1, 7), (3, 2, 12), (3, 1, 6)])
def test_ls_tree_factor_of_a_two_level_decayed_plan_bounds_the_brute_force(
        count: int, sep: int, period: int) -> None:
    """The nested-block program on two decayed levels under the top block (the planner's own
    plans at p >= 0.99 have hat levels now, and at horizons whose dense oracle fits in memory
    one level below p = 0.99): never below the brute force."""
    from stream_dp.strategies.ls_tree.mechanism import LsTreeMechanism
    from stream_dp.strategies.ls_tree.plan import LsPlan

    mech = LsTreeMechanism(0.999, 63, ZCDP(0.5), 1.0, plan=LsPlan((4, 16), (0.45, 0.5, 0.05)))
    _check_ls_tree_factor(mech, count, sep, period)


@pytest.mark.parametrize("shapes", [("hat", "flat"), ("hat", "decayed"), ("decayed", "flat")])
@pytest.mark.parametrize(("count", "sep", "period"), [(2, 1, 7), (3, 2, 12), (3, 1, 6)])
def test_ls_tree_factor_with_hat_or_flat_levels_falls_back_to_n_squared(
        shapes: tuple[str, str], count: int, sep: int, period: int) -> None:
    """Issue #36: a tree-ls plan with hat levels (two overlapping nodes per level per tick) or
    flat ones (coefficients 2**12, not decayed) is not what the nested-block program describes:
    the factor is the triangle inequality's n², which the brute force over the dense oracle's
    rows never exceeds. (With the decayed coefficients the program fell below the brute force for
    such plans.)"""
    from stream_dp.strategies.ls_tree.mechanism import LsTreeMechanism
    from stream_dp.strategies.ls_tree.plan import LsPlan

    mech = LsTreeMechanism(0.99, 63, ZCDP(0.5), 1.0,
                           plan=LsPlan((4, 16), (0.45, 0.5, 0.05), (), shapes))
    _check_ls_tree_factor(mech, count, sep, period)


def _check_ls_tree_factor(mech: object, count: int, sep: int, period: int) -> None:
    top = int(mech.plan.levels[-1])  # type: ignore[attr-defined]
    rounds = top // math.gcd(period, top)
    big_l, _, var = ls_dense(mech, -(-(period * rounds) // top) * top)
    m = big_l / np.sqrt(var)[:, None]
    single = float((m * m).sum(axis=0).max())
    brute = max(brute_force_norm_sq(m[:, q * period:(q + 1) * period], count, sep)
                for q in range(rounds)) / single
    f = stream_factor(mech, count, sep, period_ticks=period)
    assert not f.exact
    assert f.value >= brute * (1 - 1e-12)
    if mech.plan.shapes:  # type: ignore[attr-defined]
        assert f.value == count ** 2  # hat or flat levels: the triangle inequality (issue #36)
    else:
        assert f.value < count ** 2


def test_split_over_streams_with_spacing_is_not_claimed_exact() -> None:
    """Pure DP, dm at p = 0.9: three events 3 ticks apart cannot all sit on a largest column of
    one stream (φ(3) < 3), but spread over three streams each node's own worst case is one event
    on its largest column. Spacing holds across streams too, so that total is only a bound:
    the brute force over every pattern of the person (column norms depend on the tick, not the
    stream) is φ(3)."""
    mech = make_mechanism("dm", 0.9, 15, PureDP(1.0))
    b = UserBounds(max_events=3, period_ticks=15, min_separation_ticks=3)
    acc = UserAccountant(Accountant.for_domain(Domain.flat(["a", "b", "c"]), PureDP(1.0)), b,
                         (1,), mech, tick_seconds=60.0)
    big_l, _, _ = fenwick_oracle.dense(mech, 15)
    per = (mech.cap * (1 + 2.0**-40) * big_l.sum(axis=0)  # type: ignore[attr-defined]
           + 2.0 * float(mech.plan(15).grid) * (big_l > 0).sum(axis=0))  # type: ignore[attr-defined]
    truth = _brute_spaced_sum(per, 3, 3) / float(mech.sensitivity())
    assert acc.per_stream.exact and acc.per_stream.value == pytest.approx(truth, rel=1e-12)
    assert truth < 3
    total, exact = acc.period_factor()
    assert total == pytest.approx(3.0) and not exact


@pytest.mark.parametrize(("period", "tick_seconds"), [(525_600, 60.0), (1440, 60.0)])
def test_the_yearly_figure_covers_a_year_that_straddles_a_period_boundary(
        period: int, tick_seconds: float) -> None:
    """Pure DP, naive (every counted event spends ε on its own tick's measurement, columns
    disjoint, so k counted events spend exactly k·ε): a 365-day window starting at the last
    tick of period 0; one person's events on that tick and on the first tick of every later
    period the window reaches all count (K = 1 per period): 2 events within a year of a
    one-year period, 366 with daily periods, against a yearly figure of 1 and 365."""
    year_ticks = round(365 * 86_400 / tick_seconds)
    b = UserBounds(max_events=1, period_ticks=period)
    start = period  # the last tick of period 0 (ticks are numbered from 1)
    # then the first tick of every later period the window reaches
    ticks = [start, *range(start + 1, start + year_ticks, period)]
    assert ticks[-1] - ticks[0] < year_ticks  # within one 365-day window
    kept = keep_mask([("ann", t, 0) for t in ticks], b)
    assert all(kept)
    acc = UserAccountant(Accountant(PureDP(1.0), 1), b, (1,),
                         make_mechanism("naive", 0.9, 63, PureDP(1.0)), tick_seconds)
    year, _ = acc.year_factor()
    assert year >= len(ticks), (year, len(ticks))
