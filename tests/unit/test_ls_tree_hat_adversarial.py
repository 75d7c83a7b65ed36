"""Adversarial review of ``tree-ls`` hat plans (issue #36), each check against its own oracle.

* **Claimed error = released error, from the released values themselves.** Every release is
  linear in the noise draws. A noise source that puts a unit impulse on node ``k`` in stream
  ``k`` (one stream per node the mechanism ever draws) makes the releases of stream ``k`` the
  decoder's column for node ``k``; the variance of what is released at tick ``t`` is then
  ``Σ_k R[t, k]²·Var(node k)``, with the variance of the discrete Laplace / Gaussian at the scale
  the mechanism *really* asked for (closed form / direct sum here, not the library's). That is
  compared with ``variance(t)`` and ``mse_curve`` (the planner's figure), at ``p = 0.99`` and
  ``0.995``, and at ``p = 1`` over epoch 0 with its per-block schedule and two later epochs with
  super levels; and with zero noise the releases are the exact decayed sums (unbiased).
* **The planner's real hat plans**: their coefficient rows against the hat definition written
  out here, and the exact loss (Fractions at the scales really drawn) of one event at every
  column, for pure and zCDP, at ``p`` from just above the switch to 1, at several ε, ρ and caps.
* **Checkpoints**: a hat plan's state restored mid-triangle continues bit-identically; a
  checkpoint of a hat plan is refused by a mechanism that differs only in its shapes.
* **Per person**: the factor reported for hat plans (``n`` pure, ``n²`` zCDP) against the exact
  spend of ``n`` events placed everywhere in two top blocks.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from stream_dp.budget import ZCDP, PureDP
from stream_dp.strategies.ls_tree.mechanism import LsTreeMechanism
from stream_dp.strategies.ls_tree.plan import LsPlan

ONE = 4096  # 2**COEFF_BITS, from the definition of the fixed-point coefficients


class _Recorder:
    """Zero noise; records each node's (kind, scale) and that it is always the same."""

    def __init__(self, n: int = 1) -> None:
        self.n = n
        self.nodes: dict[int, tuple[str, float]] = {}

    def _draw(self, kind: str, node: int, scale: float) -> np.ndarray:
        assert self.nodes.setdefault(node, (kind, scale)) == (kind, scale), node
        return self._value(node)

    def _value(self, node: int) -> np.ndarray:
        return np.zeros(self.n, dtype=np.int64)

    def discrete_laplace(self, node: int, scale: float) -> np.ndarray:
        return self._draw("laplace", node, scale)

    def discrete_gaussian(self, node: int, sigma: float) -> np.ndarray:
        return self._draw("gaussian", node, sigma)


class _Impulse(_Recorder):
    """Node ``ids[k]`` draws 1 in stream ``k`` and 0 elsewhere; every other node draws 0."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__(len(ids))
        self.index = {node: k for k, node in enumerate(ids)}

    def _value(self, node: int) -> np.ndarray:
        z = np.zeros(self.n, dtype=np.int64)
        k = self.index.get(node)
        if k is not None:
            z[k] = 1
        return z


def _noise_variance(kind: str, scale: float) -> float:
    """Variance of the integer noise: discrete Laplace ``P(z) ∝ exp(−|z|/b)`` has
    ``2t/(1−t)²`` with ``t = e^(−1/b)``; the discrete Gaussian by direct summation (σ² beyond
    σ = 50, where the difference is below 1e-900 relative)."""
    if kind == "laplace":
        t = math.exp(-1.0 / scale)
        return 2.0 * t / math.expm1(-1.0 / scale) ** 2
    if scale > 50.0:
        return scale * scale
    k = np.arange(-int(60 * scale) - 10, int(60 * scale) + 11, dtype=np.float64)
    w = np.exp(-k * k / (2.0 * scale * scale))
    return math.fsum(w * k * k) / math.fsum(w)


def _released_variance(mech: LsTreeMechanism, ticks: int) -> np.ndarray:
    """Variance of each release ``1..ticks`` from the releases' own linear map (see module)."""
    rec = _Recorder()
    state = mech.new_state(1)
    for _ in range(ticks):
        mech.step(state, np.zeros(1), rec)  # type: ignore[arg-type]
    ids = sorted(rec.nodes)
    imp = _Impulse(ids)
    state = mech.new_state(len(ids))
    var = np.array([_noise_variance(*rec.nodes[node]) for node in ids])
    out = np.empty(ticks)
    for t in range(ticks):
        col = mech.step(state, np.zeros(len(ids)), imp)  # type: ignore[arg-type]
        out[t] = math.fsum(col * col * var)
    assert imp.nodes == rec.nodes  # same draws, same scales
    return out


#: hand-made hat plans (overlaps of two hat levels with the top block's edges) and, at
#: ``None``, the planner's plan at that (p, horizon)
PROBE_CASES = [
    (0.99, 255, LsPlan((4, 16), (0.4, 0.3, 0.3), (), ("hat", "flat"))),
    (0.99, 255, LsPlan((2, 6, 24), (0.3, 0.2, 0.2, 0.3), (), ("hat", "hat", "flat"))),
    (0.995, 100, LsPlan((3, 12), (0.5, 0.45, 0.05), (), ("hat", "decayed"))),
    (0.99, 255, None),
    (0.999, 300, None),
    (1.0, 40, LsPlan((4, 16), (0.4, 0.3, 0.3), (), ("hat", "flat"))),
    (1.0, 100, None),
]


@pytest.mark.parametrize(("p", "horizon", "plan"), PROBE_CASES,
                         ids=[f"p{p}-T{h}-{'planned' if pl is None else '-'.join(pl.shapes)}"
                              for p, h, pl in PROBE_CASES])
@pytest.mark.parametrize("privacy", [PureDP(1.0), ZCDP(0.5)], ids=["pure", "zcdp"])
def test_claimed_variance_is_the_variance_of_what_is_released(
        p: float, horizon: int, plan: LsPlan | None, privacy: object) -> None:
    mech = LsTreeMechanism(p, horizon, privacy, 1.0, plan=plan)  # type: ignore[arg-type]
    if plan is None and p >= 0.99:
        assert "hat" in mech.plan.level_shapes, mech.plan
    b = mech.block
    # p < 1: three top blocks and a bit; p = 1: epochs 0, 1 and 2 (and into epoch 3)
    ticks = 3 * b + 5 if not mech.super else b * mech.first_blocks * 7 + b + 3
    got = _released_variance(mech, ticks)
    claimed = np.array([mech.variance(t) for t in range(1, ticks + 1)])
    assert np.allclose(got, claimed, rtol=1e-9, atol=0.0), np.max(np.abs(got / claimed - 1))
    curve = np.asarray(mech.mse_curve(ticks))
    assert np.allclose(got, curve, rtol=1e-9, atol=0.0), np.max(np.abs(got / curve - 1))


@pytest.mark.parametrize(("p", "horizon", "plan"), PROBE_CASES[:2] + PROBE_CASES[5:6],
                         ids=["hat-flat", "hat-hat-flat", "p1-hat-flat"])
def test_releases_are_unbiased_the_exact_decayed_sums_without_noise(
        p: float, horizon: int, plan: LsPlan) -> None:
    """Zero noise, random data (values off the grid): every release is the decayed sum of the
    rounded counts, computed here in Fractions (the decoder adds the residuals only)."""
    mech = LsTreeMechanism(p, horizon, PureDP(1.0), 1.0, plan=plan)
    g = mech.grid
    ticks = 3 * mech.block + 5 if not mech.super else mech.block * mech.first_blocks * 7
    rng = np.random.default_rng(36)
    data = rng.uniform(0.0, 50.0, size=(ticks, 3))
    state = mech.new_state(3)
    rec = _Recorder(3)
    pf = Fraction(p)
    exact = [Fraction(0)] * 3
    for t in range(ticks):
        out = mech.step(state, data[t], rec)  # type: ignore[arg-type]
        for s in range(3):
            exact[s] = pf * exact[s] + Fraction(int(np.rint(data[t, s] / g))) * Fraction(g)
            assert abs(float(out[s]) - float(exact[s])) <= 1e-9 * max(1.0, float(exact[s])), t


def _definition_rows(p: float, shape: str, length: int, top: int) -> list[list[int]]:
    """A level's integer rows inside one top block, from the definitions: hats (issue #36)
    peak at ``r·L − 1`` with ``2**12 − round(2**12·d/L)`` (halves up) for ``d < L``; flat nodes
    all ``2**12``; decayed nodes ``round(2**12·p^(L−1−i))``."""
    rows = []
    if shape == "hat":
        for r in range(top // length + 1):
            row = []
            for i in range(top):
                d = abs(i - (r * length - 1))
                row.append(ONE - math.floor(Fraction(ONE * d, length) + Fraction(1, 2))
                           if d < length else 0)
            rows.append(row)
        return rows
    k = [ONE if shape == "flat" else round(math.ldexp(p ** (length - 1 - i), 12))
         for i in range(length)]
    for start in range(0, top, length):
        rows.append([0] * start + k + [0] * (top - start - length))
    return rows


def _largest_change(cap: float, grid: float) -> int:
    """The largest ``rint((D + w)/g) − rint(D/g)`` over ``D`` and ``0 ≤ w ≤ cap`` (half to
    even): ``c + 1`` for an odd integer ``c = cap/g``, ``c`` for an even one, else ``⌈c⌉``."""
    c = Fraction(cap) / Fraction(grid)
    if c.denominator == 1:
        return int(c) + 1 if int(c) % 2 else int(c)
    return math.ceil(c)


def _footprint(mech: LsTreeMechanism, t: int, dq: int) -> dict[int, int]:
    """Node id → shift of its measurement for a rounded change ``dq`` at tick ``t``: the leaf,
    the nodes of each level over ``t`` (two triangles per hat level), at p = 1 from epoch 1 on
    one super node per level whose span lies inside the epoch."""
    from stream_dp.strategies._epochs import SUPER_BASE, epoch_of_block, super_levels

    b = mech.block
    top, offset = divmod(t - 1, b)
    out = {t: dq}
    shapes = mech.plan.shapes or ("decayed",) * len(mech.plan.levels)
    for ell, (length, shape) in enumerate(zip(mech.plan.levels, shapes, strict=True), start=1):
        if shape == "hat":
            for r in range(b // length + 1):
                d = abs(offset - (r * length - 1))
                if d < length:
                    k = ONE - math.floor(Fraction(ONE * d, length) + Fraction(1, 2))
                    out[(ell << 40) | (top * (b // length + 1) + r)] = k * dq
            continue
        k = ONE if shape == "flat" else round(math.ldexp(mech.p ** (length - 1 - (t - 1) % length),
                                                         12))
        out[(ell << 40) | ((t - 1) // length)] = k * dq
    if mech.super:
        e, k, n_e = epoch_of_block(top, mech.first_blocks)
        if e:
            for level in range(1, super_levels(n_e) + 1):
                low = (k >> level) << level
                if low + (1 << level) <= n_e:
                    out[SUPER_BASE | (level << 40) | (top - k + low)] = dq
    return out


def _exact_worst_spend(mech: LsTreeMechanism, ticks: int) -> tuple[Fraction, int]:
    """The largest exact spend of one event over ticks ``1..ticks`` (and a tick reaching it),
    at the scales really drawn by running the mechanism that far (and one block more)."""
    from stream_dp.strategies._epochs import SUPER_BASE

    rec = _Recorder()
    state = mech.new_state(1)
    for _ in range(ticks + mech.block):
        mech.step(state, np.zeros(1), rec)  # type: ignore[arg-type]
    dq = _largest_change(mech.cap, mech.grid)
    pure = mech.model == "pure"
    frac = {node: Fraction(scale) for node, (_, scale) in rec.nodes.items()}
    cache: dict[tuple[tuple[int, Fraction], ...], Fraction] = {}
    worst, where = Fraction(0), 0
    for t in range(1, ticks + 1):
        terms = []
        for node, shift in _footprint(mech, t, dq).items():
            if node not in frac:
                assert node & SUPER_BASE, (t, node)  # only super nodes past the run are undrawn
                continue
            assert rec.nodes[node][0] == ("laplace" if pure else "gaussian")
            terms.append((shift, frac[node]))
        key = tuple(sorted(terms))
        spend = cache.get(key)
        if spend is None:
            spend = sum((Fraction(s) / b if pure else Fraction(s) ** 2 / (2 * b * b)
                         for s, b in terms), Fraction(0))
            cache[key] = spend
        if spend > worst:
            worst, where = spend, t
    return worst, where


#: (p, horizon, privacy, cap): the planner's hat plans at the issue's decays and the default
#: horizon, budgets from tiny to huge (float rounding of the scales), caps off the grid
PLANNED = [
    (0.99, 65_535, PureDP(1.0), 1.0),
    (0.99, 65_535, PureDP(0.01), 1.0),
    (0.99, 65_535, PureDP(1.0 / 3.0), 0.3),
    (0.99, 65_535, PureDP(7.0), 5.5),
    (0.99, 65_535, PureDP(100.0), 1.0),
    (0.995, 32_767, PureDP(1.0), 1.0 + 2.0**-21),
    (0.999, 65_535, PureDP(1.0), 1.0),
    (0.9999, 32_767, PureDP(0.7), 2.0),
    (0.99, 65_535, ZCDP(0.5), 1.0),
    (0.99, 65_535, ZCDP(0.005), 0.3),
    (0.999, 32_767, ZCDP(50.0), 1.0 + 2.0**-21),
    (1.0, 8191, PureDP(1.0), 1.0 + 2.0**-21),
    (1.0, 1000, ZCDP(0.5), 3.0),
    # horizons at the search's edges: the shortest with hats, three hat levels from 2048 ticks,
    # a horizon one past a top block (p = 1: an epoch 0 of two blocks, the second nearly empty)
    (0.99, 40, PureDP(1.0), 1.0 + 2.0**-21),
    (1.0, 33, ZCDP(0.5), 1.0 + 2.0**-21),
    (0.999, 2048, PureDP(1.0), 1.0 + 2.0**-21),
    (1.0, 1000, PureDP(1.0 / 3.0), 0.3),
    (1.0, 4097, PureDP(1.0), 1.0 + 2.0**-21),
]


@pytest.mark.parametrize(("p", "horizon", "privacy", "cap"), [
    pytest.param(*case, id=f"p{case[0]}-T{case[1]}-{case[2]!r}-cap{case[3]}",
                 # p = 1 with tops of 2560 and 4096 ticks: epochs 0 and 1 are 15–25 k ticks
                 marks=[pytest.mark.slow] if case[0] == 1.0 and case[1] > 4000 else [])
    for case in PLANNED])
def test_planned_hat_plans_spend_at_most_the_budget_exactly_at_every_tick(
        p: float, horizon: int, privacy: object, cap: float) -> None:
    """The planner's plan: its rows are the definitions', and one event at *any* tick of two top
    blocks (p < 1) or of epochs 0 and 1 (p = 1: every per-block schedule, then the later
    epoch's super levels) spends at most the budget, exactly, at the scales really drawn."""
    mech = LsTreeMechanism(p, horizon, privacy, cap)  # type: ignore[arg-type]
    shapes = mech.plan.level_shapes
    assert "hat" in shapes, mech.plan
    rows = [row for length, shape in zip(mech.plan.levels, shapes, strict=True)
            for row in _definition_rows(p, shape, length, mech.block)]
    assert np.array_equal(mech.coeffs, np.asarray(rows, dtype=np.int64))
    ticks = mech.block * (3 * mech.first_blocks if mech.super else 2)
    worst, where = _exact_worst_spend(mech, ticks)
    budget = Fraction(privacy.epsilon if isinstance(privacy, PureDP)  # type: ignore[attr-defined]
                      else privacy.rho)  # type: ignore[attr-defined]
    assert worst <= budget, (where, float(worst / budget - 1))
    # the budget is used, not wasted: all of it but the rounding slack the event cannot reach
    used = Fraction(_largest_change(cap, mech.grid)) / Fraction(mech.slack_units)
    if isinstance(privacy, ZCDP):
        used *= used
    assert worst >= budget * used * (1 - Fraction(1, 10**6)), float(worst / budget)


@pytest.mark.parametrize("p", [math.nextafter(0.99, 0.0), 0.99, math.nextafter(0.99, 1.0)])
def test_the_hat_switch_at_p_0_99(p: float) -> None:
    """Below 0.99 no hat plan (every plan as before issue #36); at and above it the planner's hat
    plan, and either way one event spends at most ε exactly at every tick of two blocks."""
    mech = LsTreeMechanism(p, 65_535, PureDP(1.0), 1.0 + 2.0**-21)
    assert ("hat" in mech.plan.level_shapes) == (p >= 0.99), mech.plan
    worst, where = _exact_worst_spend(mech, 2 * mech.block)
    assert worst <= 1, (where, float(worst - 1))


#: small hat plans for the per-person and checkpoint checks (a hat level whose triangles meet
#: the top block's edges, two hat levels, a hat level under a decayed top)
SMALL_HATS = [LsPlan((4, 16), (0.4, 0.3, 0.3), (), ("hat", "flat")),
              LsPlan((2, 6, 24), (0.3, 0.2, 0.2, 0.3), (), ("hat", "hat", "flat")),
              LsPlan((3, 12), (0.5, 0.45, 0.05), (), ("hat", "decayed"))]


@pytest.mark.parametrize("plan", SMALL_HATS, ids=["hat-flat", "hat-hat-flat", "hat-decayed"])
@pytest.mark.parametrize("privacy", [PureDP(1.0), ZCDP(0.5)], ids=["pure", "zcdp"])
def test_per_person_factor_of_hat_plans_bounds_the_exact_spend_of_n_events(
        plan: LsPlan, privacy: object) -> None:
    """One person's ``n`` events (``n`` = 2 with ``b`` = 0, 1, 3 ticks apart, 3 with ``b`` = 0, 5;
    all in one tick when ``b`` = 0) placed *everywhere* in two top blocks: the exact spend — the measurements'
    summed shifts (overlapping triangles add up), ``Σ|shift|/b`` or ``Σ shift²/(2σ²)`` at the
    scales really drawn — is at most ``stream_factor`` × the per-event budget."""
    from stream_dp.user_level.accounting import stream_factor

    mech = LsTreeMechanism(0.99, 255, privacy, 1.0 + 2.0**-21, plan=plan)  # type: ignore[arg-type]
    ticks = 2 * mech.block
    rec = _Recorder()
    state = mech.new_state(1)
    for _ in range(ticks + mech.block):
        mech.step(state, np.zeros(1), rec)  # type: ignore[arg-type]
    pure = isinstance(privacy, PureDP)
    budget = Fraction(privacy.epsilon if pure else privacy.rho)  # type: ignore[attr-defined]
    c = Fraction(mech.cap) / Fraction(mech.grid)  # an odd integer: each event moves q by c + 1
    scale = {node: Fraction(s) for node, (_, s) in rec.nodes.items()}
    for n, sep in ((2, 0), (2, 1), (2, 3), (3, 0), (3, 5)):
        factor = stream_factor(mech, n, sep)
        worst = Fraction(0)
        starts = range(1, ticks + 1)
        patterns = ([(s,) * n for s in starts] if sep == 0 else
                    [combo for combo in itertools.combinations(starts, n)
                     if all(b - a >= sep for a, b in itertools.pairwise(combo))])
        for combo in patterns:
            # n events in one tick move its rounded count by at most n·c + 1, else c + 1 each
            shifts: dict[int, int] = {}
            for s in set(combo):
                dq = int(combo.count(s) * c) + 1
                for node, amount in _footprint(mech, s, dq).items():
                    shifts[node] = shifts.get(node, 0) + amount
            spend = sum((abs(Fraction(a)) / scale[k] if pure
                         else Fraction(a) ** 2 / (2 * scale[k] ** 2)
                         for k, a in shifts.items()), Fraction(0))
            worst = max(worst, spend)
        assert worst <= budget * Fraction(factor.value), (n, sep, float(worst / budget), factor)


@pytest.mark.parametrize(("p", "horizon", "plan"), [
    (0.99, 255, None), (1.0, 100, None), (0.99, 255, SMALL_HATS[1]), (1.0, 40, SMALL_HATS[0]),
], ids=["planned-p0.99", "planned-p1", "hat-hat-flat", "p1-hat-flat"])
def test_a_hat_checkpoint_restored_mid_triangle_continues_bit_identically(
        p: float, horizon: int, plan: LsPlan | None) -> None:
    """Checkpoints at the nasty offsets (first block, inside a triangle, where two hat levels'
    peaks meet the top block's end, a block's first tick, past the horizon at p = 1) restored —
    by the planner from the stored settings and with the mechanism given — continue with
    exactly the releases of the bank that never stopped."""
    from stream_dp.counters import CounterBank

    key = b"ls-tree-hat-checkpoint-review-key-01"
    mech = LsTreeMechanism(p, horizon, PureDP(1.0), 1.0, plan=plan)
    b = mech.block
    assert "hat" in mech.plan.level_shapes
    total = b * mech.first_blocks * 3 + 7 if mech.super else 3 * b + 7
    rng = np.random.default_rng(37)
    data = rng.integers(0, 3, size=(total, 2)).astype(np.float64)
    whole = CounterBank(mech, ["a", "b"], key)
    expected = np.array([whole.step(row) for row in data])
    stops = sorted({1, 2, mech.plan.levels[0] - 1, mech.plan.levels[0] + 1, b - 1, b, b + 1,
                    2 * b - 1, 2 * b + 3, mech.horizon, mech.horizon + 1})
    stops = [s for s in stops if 1 <= s < total]
    for stop in stops:
        bank = CounterBank(mech, ["a", "b"], key)
        for row in data[:stop]:
            bank.step(row)
        blob = bank.to_bytes()
        for restored in (CounterBank.from_bytes(blob, key) if plan is None else None,
                         CounterBank.from_bytes(blob, key, mechanism=LsTreeMechanism(
                             p, horizon, PureDP(1.0), 1.0, plan=plan))):
            if restored is None:
                continue
            again = np.array([restored.step(row) for row in data[stop:stop + 2 * b]])
            assert np.array_equal(again, expected[stop:stop + 2 * b]), stop


def test_a_hat_checkpoint_is_refused_by_a_mechanism_with_other_shapes() -> None:
    """Same levels and shares, other node shapes (the residuals in the state were drawn for the
    checkpoint's rows): refused, as is every restore into an all-decayed plan."""
    from stream_dp.counters import CounterBank
    from stream_dp.integrity import IntegrityError

    key = b"ls-tree-hat-checkpoint-review-key-02"
    plan = SMALL_HATS[0]
    bank = CounterBank(LsTreeMechanism(0.99, 255, PureDP(1.0), 1.0, plan=plan), ["a"], key)
    for _ in range(21):
        bank.step(np.array([1.0]))
    blob = bank.to_bytes()
    for shapes in [(), ("decayed", "flat"), ("hat", "decayed"), ("flat", "flat")]:
        other = LsPlan(plan.levels, plan.shares, (), shapes)
        with pytest.raises(IntegrityError):
            CounterBank.from_bytes(blob, key, mechanism=LsTreeMechanism(
                0.99, 255, PureDP(1.0), 1.0, plan=other))


@pytest.mark.parametrize("plan", [SMALL_HATS[0], LsPlan((4, 16), (0.4, 0.3, 0.3))],
                         ids=["hat-flat", "decayed"])
def test_the_last_releasable_tick_draws_no_noise_id_of_an_earlier_measurement(
        plan: LsPlan) -> None:
    """Node ids are ``(level << 40) | index`` and a leaf's id is its tick: the leaf of tick
    ``2**40`` would be drawn under the id of level 1's first node, whose noise block 0 already
    released (through the residuals), at another scale — two measurements on one keyed noise.
    The mechanism must refuse that tick (``ValueError``, state unchanged) rather than draw it."""
    from stream_dp.strategies.ls_tree.mechanism import MAX_TICKS

    mech = LsTreeMechanism(0.99, 255, PureDP(1.0), 1.0, plan=plan)
    rec = _Recorder()
    state = mech.new_state(1)
    mech.step(state, np.zeros(1), rec)  # block 0: every node of it drawn
    assert (1 << 40) in rec.nodes  # level 1, node 0
    state["tick"] = np.array(MAX_TICKS - 2, dtype=np.int64)
    released = []
    for _ in range(2):
        try:
            mech.step(state, np.zeros(1), rec)  # the recorder asserts one scale per id
        except ValueError:
            break
        released.append(int(state["tick"]))
    assert released and max(released) < 1 << 40, released


def test_nothing_published_about_a_hat_mechanism_moves_with_the_data() -> None:
    """``describe()`` (which keys the noise and is printed by the tools), the fingerprint and
    the size of a checkpoint are the same after two runs on very different data (all zeros vs
    counts up to 10^6 × cap), on the planner's hat plan."""
    from stream_dp.counters import CounterBank

    key = b"ls-tree-hat-published-bytes-key-001"
    mech = LsTreeMechanism(0.99, 255, PureDP(1.0), 1.0)
    assert "hat" in mech.plan.level_shapes
    before = (mech.canonical_bytes(), mech.fingerprint())
    sizes = []
    for high in (0.0, 1e6):
        bank = CounterBank(mech, ["a", "b"], key)
        rng = np.random.default_rng(38)
        for _ in range(mech.block + 7):
            bank.step(rng.uniform(0.0, high, size=2) if high else np.zeros(2))
        sizes.append(len(bank.to_bytes()))
        assert (mech.canonical_bytes(), mech.fingerprint()) == before
    assert sizes[0] == sizes[1]
