"""``blt`` at p = 1 under an adversarial review (ρ-zCDP, event level): the whole footprint of one
event through the real ``step``, the worst-case rounding by block position, the binding
of the column-scale table into the checkpoint, the claimed variance past the horizon, and budgets
whose later super levels the sampler cannot draw.

Method (no trust in the plan's claims): the mechanism is stepped on neighbouring inputs with
noise that *records* the scale of every draw; the privacy loss of a discrete Gaussian draw of
scale ``σ`` whose integer mean moves by ``Δ`` is ``Δ²/(2σ²)`` (Canonne–Kamath–Steinke), and
adaptive composition adds the draws (Bun–Steinke). The means are read from the real state: a
tick's mean from the open block's noisy sum with the tick's draw forced to 0, a super node's
mean (its exact total ``X``) from the value the fold forms ``M = X + Z`` of, with ``Z`` forced to 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from stream_dp.budget import ZCDP
from stream_dp.counters import CounterBank
from stream_dp.integrity import IntegrityError
from stream_dp.noise.gaussian import MAX_SIGMA
from stream_dp.planner import make_mechanism
from stream_dp.strategies import _epochs
from stream_dp.strategies._common import BudgetOutOfRange
from stream_dp.strategies.blt import plan as blt_plan
from stream_dp.strategies.blt.mechanism import MAX_TICKS, BltMechanism

KEY = b"blt-adversarial-review-key-0123!"


class _Recorder:
    """``BoundNoise`` for one stream: a tick's draw (node below ``SUPER_BASE``) returns the armed
    value, a super node's draw returns 0; every draw's ``(node, sigma)`` is recorded."""

    def __init__(self) -> None:
        self.value = 0
        self.draws: list[tuple[int, float]] = []

    def discrete_gaussian(self, node: int, sigma: float) -> np.ndarray:
        self.draws.append((int(node), float(sigma)))
        if node >= _epochs.SUPER_BASE:
            return np.zeros(1, dtype=np.int64)
        return np.full(1, self.value, dtype=np.int64)


@contextmanager
def _super_means() -> Iterator[list[int]]:
    """Record the exact integer ``M = X + Z`` (units) of every super node the fold forms, in
    order (``fold_block`` turns it into a float with ``limbs_value``, once per node)."""
    seen: list[int] = []
    real = _epochs.limbs_value

    def spy(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        seen.append((int(hi[0]) << _epochs.LIMB) + int(lo[0]))
        return real(hi, lo)

    _epochs.limbs_value = spy  # type: ignore[assignment]
    try:
        yield seen
    finally:
        _epochs.limbs_value = real  # type: ignore[assignment]


def _replay(mech: BltMechanism, counts: np.ndarray, outputs: np.ndarray | None,
            rng: np.random.Generator) -> dict[str, Any]:
    """Step ``counts`` (one stream) through the real ``step``. Per tick: a trial step on a copy
    of the state with the tick's draw forced to 0 gives the mean of ``y_t`` given the past
    (read from the open block's noisy sum); the real step then draws the value that makes
    ``y_t`` equal ``outputs[t]`` (the neighbour replays the first run's outputs) or a fresh one.
    Returns the tick means, outputs and scales, and the super nodes' ids, scales and means."""
    state = mech.new_state(1)
    noise = _Recorder()
    means, ys, sigmas, nodes = [], [], [], []
    with _super_means() as supers:
        for t, x in enumerate(counts):
            trial = {k: np.array(v, copy=True) for k, v in state.items()}
            noise.value = 0
            before = len(supers)
            mech.step(trial, np.array([x]), noise)  # type: ignore[arg-type]
            del supers[before:]  # the trial's folds are not releases
            trial_draws = noise.draws[:]
            noise.draws.clear()
            j = t % mech.horizon
            prior = float(state["block_sum"][0]) if j else 0.0
            mean = round(float(trial["block_sum"][0]) - prior)
            sigma = trial_draws[0][1]
            assert trial_draws[0][0] < _epochs.SUPER_BASE
            z = (int(outputs[t]) - mean if outputs is not None
                 else int(np.rint(rng.normal() * sigma)))
            noise.value = z
            mech.step(state, np.array([x]), noise)  # type: ignore[arg-type]
            assert noise.draws == trial_draws  # the scales are public: the same in both calls
            y = round(float(state["block_sum"][0]) - prior)
            assert y == mean + z
            means.append(mean)
            ys.append(y)
            sigmas.append(sigma)
            nodes.extend(noise.draws[1:])
            noise.draws.clear()
    assert len(nodes) == len(supers)
    return {"means": np.array(means), "ys": np.array(ys), "sigmas": np.array(sigmas),
            "nodes": nodes, "supers": supers}


HORIZON = 8  # blocks of 8 ticks; epochs of 1, 2, 4, 8 blocks (0, 1, 2, 3 super levels)
TICKS = 15 * HORIZON


def _neighbour_runs(replay: Callable[..., dict[str, Any]], mech: BltMechanism, ticks: int,
                    event: int, cap: float, seed: int
                    ) -> tuple[dict[str, Any], dict[str, Any], np.ndarray]:
    """A run of ``replay`` (this module's or a p < 1 one) on random counts and its neighbour
    — one more event of size ``cap`` at tick index ``event`` — replaying the run's outputs:
    ``(run, neighbour, ticks whose integer mean moved)``; the outputs and the drawn scales
    must be the same in both (the scales are public)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 4, size=ticks).astype(np.float64) * 0.3
    other = counts.copy()
    other[event] += cap
    run = replay(mech, counts, None, rng)
    nb = replay(mech, other, run["ys"], rng)
    assert np.array_equal(run["ys"], nb["ys"]) and np.array_equal(run["sigmas"], nb["sigmas"])
    return run, nb, np.flatnonzero(run["means"] != nb["means"])


@pytest.mark.parametrize("event", [0, 7, 8, 15, 16, 23, 24, 31, 55, 56, 63, 95, 112, TICKS - 1])
def test_whole_footprint_of_one_event_stays_within_rho(event: int) -> None:
    """One event of size ``cap`` (non-integer: 1.7) at a block's first or last tick, the first
    and last block of every epoch, and the last tick of the run. Its loss is summed over
    *everything* it moves — its block's ticks (at the scales the mechanism really drew,
    ``σ/d_j`` or ``σ₁/d_j``) and every super node whose exact total contains it — and must stay
    within ρ. Nothing before the event, in another block, or in a super node without the
    event may move. An event at a block's first tick uses nearly all of the block's share (the
    column scaling equalises the columns), and each super level its own share: so an
    accounting that left out one of the parts, or gave a part more than its share, fails here."""
    rho, cap = 0.5, 1.7
    mech = BltMechanism(1.0, HORIZON, ZCDP(rho), cap)
    run, nb, moved = _neighbour_runs(_replay, mech, TICKS, event, cap, 1000 + event)
    assert [n for n, _ in run["nodes"]] == [n for n, _ in nb["nodes"]]
    block = event // HORIZON
    start, end = block * HORIZON, (block + 1) * HORIZON
    assert moved.size and moved.min() == event and moved.max() < end  # its block only
    ticks = math.fsum((((nb["means"] - run["means"]) / run["sigmas"]) ** 2 / 2.0).tolist())
    supers = 0.0
    levels = set()
    for (node, sigma), m1, m2 in zip(run["nodes"], run["supers"], nb["supers"], strict=True):
        level, first = (node - _epochs.SUPER_BASE) >> 40, node & ((1 << 40) - 1)
        inside = first <= block < first + (1 << level)
        assert (m1 != m2) == inside, (node, m1, m2)  # only the nodes holding the event move
        if inside:
            assert abs(m2 - m1) <= mech.d_units
            assert level not in levels  # one node per level
            levels.add(level)
            supers += (m2 - m1) ** 2 / (2.0 * sigma**2)
    spent = ticks + supers
    assert spent <= rho, (ticks, supers)
    e, k, n_e = _epochs.epoch_of_block(block, 1)
    share = rho if e == 0 else _epochs.nested_budget(rho)
    assert ticks <= share
    if event in (start, end - 1):  # the columns are equalised: first and last at the full norm
        assert ticks >= 0.999 * share
    assert (block - k + n_e) * HORIZON <= TICKS  # every epoch here completes: all levels fold
    assert levels == set(range(1, e + 1))
    if e:
        assert supers >= 0.999 * rho * _epochs.SUPER_SHARE * (cap / mech.unit / mech.d_units) ** 2


def _worst_case_loss(mech: BltMechanism, positions: np.ndarray) -> tuple[float, int]:
    """``max_s`` of the worst-case loss of an event at block position ``s`` (units of ρ):
    ``D²/(2σ_s²) + Σ_(t>s) (⌊|c_(t−s)|·d_s·D/d_t + 2E/d_t⌋ + 1)²/(2σ_t²)`` with ``σ_t`` the
    scale ``step`` passes to the sampler (``σ/d_t`` in float64) — the receiving tick's own
    scale (not the plan's ``d_max``), the integer mean shift after the worst rounding, ``c_k`` summed from powers (not the closed forms the plan certifies
    with), ``D = cap/h + 1``."""
    horizon = mech.horizon
    th, w = mech.theta, mech.w
    k = np.arange(horizon - 1, dtype=np.float64)
    c = np.concatenate(([1.0], (w[None, :] * np.exp(k[:, None] * np.log(th)[None, :])).sum(axis=1)))
    assert mech.scales is not None
    d, dd, e2 = mech.scales, mech.d_units, 2.0 * mech.float_error
    drawn = np.array([mech.sigma_units / float(dj) for dj in d])  # the float step passes
    worst, where = 0.0, -1
    for s in positions.tolist():
        dt = d[s + 1:]
        shift = np.floor(np.abs(c[1:horizon - s]) * d[s] * dd / dt + e2 / dt) + 1.0
        loss = 0.5 * ((dd / drawn[s]) ** 2 + math.fsum(((shift / drawn[s + 1:]) ** 2).tolist()))
        if loss > worst:
            worst, where = loss, int(s)
    return worst, where


@pytest.mark.parametrize(("horizon", "cap"), [(1023, 1.0), (65_535, 1.9)])
def test_worst_case_rounding_at_every_block_position(monkeypatch: pytest.MonkeyPatch,
                                                    horizon: int, cap: float) -> None:
    """The column-scaled filter (what runs without a row fit, and at a small ρ with one; the
    row-scaled one: test_blt_rows.py) at a cap just below a power of two (the finest grid), and
    a short horizon checked at every position: the worst-case loss (every rounding the wrong
    way) of an event at every position (T = 1023), or at the first and last 64 and about 256 of
    the positions where the column scale steps (T = 65535), stays within ρ, and the first
    position uses nearly all of it."""
    rho = 0.5
    monkeypatch.setattr(blt_plan, "row_fit", lambda horizon: None)
    mech = BltMechanism(1.0, horizon, ZCDP(rho), cap)
    assert mech.rows is None
    assert mech.scales is not None
    steps = np.flatnonzero(np.diff(mech.scales)) + 1
    if horizon <= 1023:
        positions = np.arange(horizon)
    else:
        positions = np.unique(np.concatenate((np.arange(64), np.arange(horizon - 64, horizon),
                                              steps[:: max(1, steps.size // 256)])))
    worst, where = _worst_case_loss(mech, positions)
    assert worst <= rho, (worst, where)
    first, _ = _worst_case_loss(mech, np.array([0]))
    assert first >= 0.9999 * rho


def test_restore_with_another_column_scale_table_is_refused(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """An operator restores a worker on a host that computes the column scales one step of
    2⁻²⁰ apart at one block position (libm differences): the checkpoint must be refused, not
    resumed with noise of another scale at the same ticks. The same for another fit."""
    mech = BltMechanism(1.0, 63, ZCDP(0.5))
    bank = CounterBank(mech, ["a", "b"], KEY)
    for _ in range(70):
        bank.step(np.array([1.0, 2.0]))
    blob = bank.to_bytes()
    assert CounterBank.from_bytes(blob, KEY, mechanism=BltMechanism(1.0, 63, ZCDP(0.5))).tick == 70
    real = blt_plan.column_scales

    def other_table(theta: np.ndarray, w: np.ndarray, block: int,
                    sums: np.ndarray | None = None) -> np.ndarray:
        d = real(theta, w, block, sums)
        d[40] -= 2.0**-20  # still ≤ √(S_T/S_(T−j)) and non-decreasing: a valid table
        return d

    monkeypatch.setattr(blt_plan, "column_scales", other_table)
    moved = BltMechanism(1.0, 63, ZCDP(0.5))
    assert moved.scales is not None and mech.scales is not None
    assert not np.array_equal(moved.scales, mech.scales)
    with pytest.raises(IntegrityError):
        CounterBank.from_bytes(blob, KEY, mechanism=moved)
    monkeypatch.setattr(blt_plan, "column_scales", real)
    th, w = blt_plan.fit(1.0, 63)

    def other_fit(p: float, horizon: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        return th, (w[0] * (1 - 2.0**-12), *w[1:])

    monkeypatch.setattr(blt_plan, "fit", other_fit)
    with pytest.raises(IntegrityError):
        CounterBank.from_bytes(blob, KEY, mechanism=BltMechanism(1.0, 63, ZCDP(0.5)))


@pytest.mark.slow
def test_released_mse_past_the_horizon_matches_the_claim() -> None:
    """Claimed vs empirical MSE with the column scaling *and* the super levels: T = 63
    (d_max ≈ 1.46), seven blocks (epochs 0, 1 and 2), 20 000 keyed streams, random counts.
    Fixed bound of tests/unit/test_accuracy_all.py: the mean of S squared errors has sd
    ≤ σ²·√(5/S), Z = 4.9 (two-sided p ≈ 1e-6 per comparison), plus the rounding bias."""
    from stream_dp.figures import rounding_bias
    from tests.unit._montecarlo import empirical_mse_curve, mse_slack

    horizon, n_streams, z = 63, 20_000, 4.9
    ticks = 7 * horizon
    mech = BltMechanism(1.0, horizon, ZCDP(0.5))
    rng = np.random.default_rng(63)
    sq, _ = empirical_mse_curve(mech, KEY, n_streams, ticks,
                                lambda t: rng.uniform(0.0, 3.0, size=n_streams))
    exact = mech.mse_curve(ticks)
    b = rounding_bias(mech, ticks)
    slack = mse_slack(exact, n_streams, b, z)
    checked = (1, 31, 62, 63, 64, 100, 126, 127, 189, 190, 300, ticks)
    for t in checked:
        assert abs(sq[t - 1] - exact[t - 1]) <= slack[t - 1], (t, sq[t - 1], exact[t - 1])
    for lo, hi in ((0, 63), (63, 189), (189, ticks)):  # each epoch's mean
        assert abs(sq[lo:hi].mean() - exact[lo:hi].mean()) <= slack[lo:hi].mean(), (lo, hi)


@pytest.mark.parametrize(("rho", "horizon"), [(1e-8, 63), (1e-8, 32767)])
def test_a_budget_whose_super_levels_cannot_be_drawn_is_refused(rho: float, horizon: int
                                                                 ) -> None:
    """At ρ = 10⁻⁸ the block noise is drawable, but the level-1 super noise of epoch 17
    (``D/√(2·0.4ρ/153)``) exceeds the sampler's 2⁴⁶: the mechanism used to be built and then
    raised at the end of the first block of that epoch (95 days of 1 s ticks at T = 63), every
    time it was restored — releases stopped for good. It must be refused when built instead."""
    with pytest.raises(BudgetOutOfRange, match="super levels"):
        BltMechanism(1.0, horizon, ZCDP(rho))


@pytest.mark.parametrize(("p", "rho"), [(1.0, 1e-8), (1.0, 1e-12), (0.9, 1e-12)])
def test_auto_passes_over_blt_when_it_refuses_the_budget(p: float, rho: float) -> None:
    """ρ = 10⁻⁸ and 10⁻¹² are valid settings (``limits.RHO_RANGE``): with ``blt`` refusing
    them (at p = 1 its later epochs; at 10⁻¹² its very first draw: σ > 2⁴⁶ units), ``auto``
    must still build a strategy that follows the budget for its whole life, not fail."""
    with pytest.raises(BudgetOutOfRange):
        BltMechanism(p, 63, ZCDP(rho))
    mech = make_mechanism("auto", p, 63, ZCDP(rho))
    assert mech.name != "blt"
    assert math.isfinite(mech.variance(1))


def test_every_epoch_of_an_accepted_budget_can_be_drawn() -> None:
    """The converse: for budgets that are accepted, every epoch up to ``MAX_TICKS`` has
    drawable super-level noise (so the refusal above is not over-eager)."""
    for rho in (1e-7, 0.5, 1e6):
        for horizon in (8, 63):
            mech = BltMechanism(1.0, horizon, ZCDP(rho))
            e = 1
            while ((1 << e) - 1) * horizon < MAX_TICKS:
                assert max(mech.epoch_noise(1 << e).scales) <= MAX_SIGMA
                e += 1
