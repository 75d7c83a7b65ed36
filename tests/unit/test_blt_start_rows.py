"""``blt`` at p < 1 with start rows (issue #36): the same filter, the tick-``t`` draw at scale
``σ/(d_t·r_t)`` for the first ``t₁`` ticks of the stream — the factorisation ``C' = R·C·D`` with
``r_t < 1`` early, ``D`` equalising the *infinite* columns of ``R·C``, and ``R = D = I`` from
``t₁`` on. Shipped start fits only (``fits/blt-start-v1-p<hex>.json``): p = 0.995 and 0.9999
(at 0.99 and 0.999 the gain was 10⁻⁵ and 10⁻⁴ of the error: not shipped).

Checked without trusting the plan: the column norms of ``R·C·D`` from brute-force sums, the
release variance against dense matrices, one event's loss through the real ``step`` at the
scales it really drew, the worst-case rounding at every start position, the claimed MSE
against a Monte-Carlo run, the binding of the tables into the checkpoint, and the issue's
target at p ≤ 0.995.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from stream_dp.budget import ZCDP
from stream_dp.counters import CounterBank
from stream_dp.integrity import IntegrityError
from stream_dp.lower_bound import mean_mse_bound
from stream_dp.noise.gaussian import discrete_gaussian_variance
from stream_dp.planner import compare
from stream_dp.strategies.blt import plan as blt_plan
from stream_dp.strategies.blt.mechanism import MAX_TICKS, BltMechanism
from tests.unit.test_blt_adversarial import _neighbour_runs, _Recorder

KEY = b"blt-start-rows-test-key-0123456!"
P = 0.995  # t1 = 214 start rows: small enough for dense matrices and every position


def _plain(monkeypatch: pytest.MonkeyPatch, p: float, horizon: int, rho: float = 0.5
           ) -> BltMechanism:
    """The filter without start rows (as shipped before them)."""
    with monkeypatch.context() as m:
        m.setattr(blt_plan, "start_fit", lambda p: None)
        return BltMechanism(p, horizon, ZCDP(rho))


def _coefficients(th: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
    """``c_k`` summed from powers (``c_0 = 1``, ``c_k = Σ_i w_i θ_i^(k−1)``), not closed forms."""
    k = np.arange(1, n, dtype=np.float64)
    powers = th[None, :] ** (k[:, None] - 1.0)
    return np.concatenate(([1.0], (w[None, :] * powers).sum(axis=1)))


def _long(mech: BltMechanism) -> int:
    """Ticks after which ``c_k²`` is below 10⁻⁴⁰ of ``c_1²`` (the columns' tails)."""
    return math.ceil(92.0 / -math.log(float(np.max(mech.theta)))) + 1


def _padded(table: np.ndarray | None, n: int) -> np.ndarray:
    out = np.ones(n)
    if table is not None:
        out[: len(table)] = table
    return out


@pytest.mark.parametrize("p", [0.995, 0.9999])
def test_shipped_start_fits_are_used_and_bound_into_the_description(p: float) -> None:
    """At T = 32767 the shipped rows lower the mean error, so they are kept: r < 1 only early
    (r = 1 exactly past the table), d ≥ 1, and both tables' SHA-256 in the description."""
    mech = BltMechanism(p, 32767, ZCDP(0.5))
    assert mech.rows is not None and mech.scales is not None
    assert len(mech.rows) == len(mech.scales) <= blt_plan.START_TICKS
    assert float(mech.rows.max()) < 1.0 and float(mech.rows.min()) > 0.0
    assert np.all(np.diff(mech.rows) >= 0.0) and np.all(mech.scales >= 1.0)
    desc = mech.describe()
    assert desc["start_rows"] == "fit-v1" and len(desc["start_rows_sha256"]) == 64
    assert len(desc["start_column_scales_sha256"]) == 64
    assert "row_scales" not in desc and "block_ticks" not in desc
    for q in (0.9, 0.99, 0.999):  # no shipped start fit: as before
        plain = BltMechanism(q, 32767, ZCDP(0.5))
        assert plain.rows is None and plain.scales is None and "start_rows" not in plain.describe()


def test_columns_against_brute_force() -> None:
    """Every infinite column of ``R·C·D`` (``c_k`` from powers, norms by ``math.fsum`` up to
    where ``c_k² < 10⁻⁴⁰``) has at most the norm of the columns past the table, ``‖c‖₂``,
    which σ is computed from; the start columns are equalised up to the ``2⁻²⁰`` rounding."""
    mech = BltMechanism(P, 32767, ZCDP(0.5))
    assert mech.rows is not None and mech.scales is not None
    t1 = len(mech.rows)
    n = _long(mech) + t1
    c = _coefficients(mech.theta, mech.w, n)
    rows, scales = _padded(mech.rows, n), _padded(mech.scales, n)
    s_inf = math.fsum((c * c).tolist())
    cols = np.array([math.fsum(((rows[j:] * c[: n - j] * scales[j]) ** 2).tolist())
                     for j in range(t1 + 1)])
    assert cols.max() <= s_inf * (1.0 + 1e-12)  # brute force vs the closed form: ulp level
    assert cols.min() >= s_inf * (1.0 - 2.0**-17)
    assert cols[t1] == pytest.approx(s_inf, rel=1e-14)  # the first plain column
    assert mech.sigma_units**2 * 2 * 0.5 >= mech.d_units**2 * s_inf * (1.0 - 1e-12)
    assert mech.sigma_units**2 * 2 * 0.5 <= mech.d_units**2 * s_inf * (1 + 1e-3)


def test_release_variance_against_dense_matrices() -> None:
    """The release error is ``W_p·(R·C·D)⁻¹·ζ`` with ``ζ`` i.i.d. of the variance of a discrete
    Gaussian of scale σ: its per-tick variance from dense matrices over the table and 300
    ticks past it must be the mechanism's :meth:`mse_curve`."""
    mech = BltMechanism(P, 32767, ZCDP(0.5))
    assert mech.rows is not None and mech.scales is not None
    n = len(mech.rows) + 300
    c = _coefficients(mech.theta, mech.w, n)
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    big_c = np.where(lag >= 0, c[np.clip(lag, 0, None)], 0.0)
    measure = _padded(mech.rows, n)[:, None] * big_c * _padded(mech.scales, n)[None, :]
    decay = np.where(lag >= 0, P ** np.clip(lag, 0, None).astype(np.float64), 0.0)
    b = decay @ np.linalg.inv(measure)
    dense = (b**2).sum(axis=1) * discrete_gaussian_variance(mech.sigma_units) * mech.unit**2
    np.testing.assert_allclose(mech.mse_curve(n), dense, rtol=1e-9)


@pytest.mark.parametrize("p", [0.995, 0.9999])
def test_long_curve_against_the_whole_recurrence(p: float) -> None:
    """Past its prefix :func:`start_variance_curve` returns the plain curve; against the exact
    recurrence over all ``2**19`` ticks (no cut) it agrees to 10⁻¹³, and the variance
    converges (the release error stays bounded)."""
    mech = BltMechanism(p, 32767, ZCDP(0.5))
    assert mech.rows is not None and mech.scales is not None
    n = 1 << 19
    whole = blt_plan.scaled_variance_curve(
        mech.theta, mech.w, _padded(mech.scales, n), 1.0 / _padded(mech.rows, n) ** 2, p)
    got = blt_plan.start_variance_curve(p, mech.theta, mech.w, mech.scales, mech.rows, n)
    np.testing.assert_allclose(got, whole, rtol=1e-13)
    assert mech.variance(10**9) == mech.variance(1 << 22) >= float(mech.mse_curve(n)[-1])


def _replay(mech: BltMechanism, counts: np.ndarray, outputs: np.ndarray | None,
            rng: np.random.Generator) -> dict[str, Any]:
    """Step ``counts`` (one stream, p < 1) through the real ``step``: a trial step on a copy of
    the state with the tick's draw forced to 0 gives the integer mean of ``y_t`` given the past
    (``(release − p·previous)/h``); the real step then draws the value that makes ``y_t``
    equal ``outputs[t]`` (the neighbour replays the first run's outputs) or a fresh one."""
    state = mech.new_state(1)
    noise = _Recorder()
    means, ys, sigmas = [], [], []
    for x in counts:
        trial = {k: np.array(v, copy=True) for k, v in state.items()}
        prev = float(state["release"][0])
        noise.value = 0
        mech.step(trial, np.array([x]), noise)  # type: ignore[arg-type]
        (node, sigma), = noise.draws
        noise.draws.clear()
        mean = round((float(trial["release"][0]) - mech.p * prev) / mech.unit)
        z = (int(outputs[len(ys)]) - mean if outputs is not None
             else int(np.rint(rng.normal() * sigma)))
        noise.value = z
        mech.step(state, np.array([x]), noise)  # type: ignore[arg-type]
        assert noise.draws == [(node, sigma)]  # the scales are public: the same in both calls
        noise.draws.clear()
        y = round((float(state["release"][0]) - mech.p * prev) / mech.unit)
        assert y == mean + z
        means.append(mean)
        ys.append(y)
        sigmas.append(sigma)
    return {"means": np.array(means), "ys": np.array(ys), "sigmas": np.array(sigmas)}


@pytest.mark.parametrize("event", [0, 1, 7, 60, 213, 214, 400])
def test_one_event_through_the_real_step_stays_within_rho(event: int) -> None:
    """One event of size cap (1.7) at a start position (0 … t₁ − 1 = 213), the first plain
    tick (214) or later: its loss over 2 500 ticks at the scales the mechanism really drew
    (``σ/(d_t·r_t)``, public) plus the rest of its column (bounded by the closed form)
    stays within ρ; nothing before it moves; the draws are the table's."""
    rho, cap = 0.5, 1.7
    mech = BltMechanism(P, 32767, ZCDP(rho), cap)
    assert mech.rows is not None and mech.scales is not None
    ticks = 2500
    run, nb, moved = _neighbour_runs(_replay, mech, ticks, event, cap, 3700 + event)
    assert moved.size and moved.min() == event
    np.testing.assert_array_equal(
        run["sigmas"], mech.sigma_units / (_padded(mech.scales, ticks) * _padded(mech.rows, ticks)))
    spent = math.fsum((((nb["means"] - run["means"]) / run["sigmas"]) ** 2 / 2.0).tolist())
    # the ticks past the window: the mean moves by ≤ |c_k|·d_s·D + S units at scale σ (r = d
    # = 1 there), Σ_(k ≥ K) c_k² by the closed form minus the brute-force head
    k0 = ticks - event
    c = _coefficients(mech.theta, mech.w, k0)
    tail_sq = max(1.0 + blt_plan.square_sum(mech.theta, mech.w) - math.fsum((c * c).tolist()),
                  0.0)
    shift = (cap / mech.unit + 1.0) * float(_padded(mech.scales, ticks)[event])
    tail = (shift * math.sqrt(tail_sq) + mech.slack_units * math.sqrt(MAX_TICKS)) ** 2
    assert spent + tail / (2.0 * mech.sigma_units**2) <= rho
    assert spent >= 0.9 * rho * (cap / mech.unit / mech.d_units) ** 2


def _worst_case_loss(mech: BltMechanism, s: int, n: int, c: np.ndarray) -> float:
    """An event's worst-case loss at tick ``s`` (every rounding the wrong way) over ``n``
    ticks: ``D²/(2σ_s²) + Σ_(t>s) (⌊|c_(t−s)|·d_s·D/d_t + 2E/d_t⌋ + 1)²/(2σ_t²)`` with ``σ_t =
    σ/(d_t·r_t)`` as ``step`` computes it, plus the remaining ticks up to ``MAX_TICKS`` at the
    slack ``S``."""
    d = _padded(mech.scales, n)
    r = _padded(mech.rows, n)
    dd, e2 = mech.d_units, 2.0 * mech.float_error
    drawn = mech.sigma_units / (d * r)
    dt = d[s + 1:]
    shift = np.floor(np.abs(c[1:n - s]) * d[s] * dd / dt + e2 / dt) + 1.0
    head = math.fsum(((shift / drawn[s + 1:]) ** 2).tolist())
    rest = float(MAX_TICKS - n) * (mech.slack_units / mech.sigma_units) ** 2
    return 0.5 * ((dd / drawn[s]) ** 2 + head + rest)


def test_worst_case_rounding_at_every_start_position() -> None:
    """Every tick of the table and the first plain ones: within ρ, and the largest column
    (``d_s²·S'_s``, nearly equal everywhere) uses nearly all of it."""
    rho = 0.5
    mech = BltMechanism(P, 32767, ZCDP(rho), 1.0)
    assert mech.rows is not None and mech.scales is not None
    t1 = len(mech.rows)
    n = _long(mech) + t1 + 8
    c = _coefficients(mech.theta, mech.w, n)
    worst = max(_worst_case_loss(mech, s, n, c) for s in range(t1 + 8))
    assert rho * 0.999 <= worst <= rho


def test_another_start_table_refuses_the_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose libm rounds one start row a quantum lower (still private) draws other noise
    at that tick: it must refuse the first host's checkpoint, not resume it; the filter
    without start rows refuses it too."""
    mech = BltMechanism(P, 32767, ZCDP(0.5))
    bank = CounterBank(mech, ["a", "b"], KEY)
    for _ in range(40):
        bank.step(np.array([1.0, 2.0]))
    blob = bank.to_bytes()
    assert CounterBank.from_bytes(blob, KEY, mechanism=BltMechanism(P, 32767, ZCDP(0.5))).tick == 40
    real = blt_plan.start_rows

    def other(params: tuple[float, ...]) -> np.ndarray:
        r = np.array(real(params), copy=True)
        r[10] -= 2.0**-20
        return r

    with monkeypatch.context() as m:
        m.setattr(blt_plan, "start_rows", other)
        changed = BltMechanism(P, 32767, ZCDP(0.5))
    assert changed.rows is not None
    with pytest.raises(IntegrityError):
        CounterBank.from_bytes(blob, KEY, mechanism=changed)
    with pytest.raises(IntegrityError):
        CounterBank.from_bytes(blob, KEY, mechanism=_plain(monkeypatch, P, 32767))


def test_issue_36_target_for_p_up_to_0995() -> None:
    """zCDP ρ = 0.5, T = 32767: ``blt`` (the planner's figure, slack included) ≤ 1.0005× the
    lower bound at every p ≤ 0.995 of the benchmark's table."""
    for p in (0.1, 0.5, 0.9, 0.95, 0.99, 0.995):
        fig = {c.strategy: c.mean_mse for c in compare(p, 32767, ZCDP(0.5))}["blt"]
        assert fig <= 1.0005 * mean_mse_bound(32767, p, ZCDP(0.5)), p


@pytest.mark.parametrize(("p", "horizon"), [(0.995, 32767), (0.995, 63), (0.9999, 4095),
                                            (0.9999, 15), (0.995, 3)])
def test_rows_only_where_they_lower_the_error(monkeypatch: pytest.MonkeyPatch, p: float,
                                              horizon: int) -> None:
    """The planner's criterion, the mean error over ticks ``1..horizon``, never rises."""
    mech = BltMechanism(p, horizon, ZCDP(0.5))
    old = _plain(monkeypatch, p, horizon)
    assert mech.mse_curve(horizon).mean() <= old.mse_curve(horizon).mean()
    if mech.rows is None:
        assert mech.describe() == old.describe()


def test_released_mse_matches_the_claim_with_start_rows() -> None:
    """Claimed vs empirical MSE over the table and past it, 20 000 keyed streams. The fixed
    bound of tests/unit/test_accuracy_all.py (Z = 4.9, two-sided p ≈ 1e-6 per comparison)
    plus the rounding bias."""
    from tests.unit._montecarlo import check_claim

    ticks = 320
    mech = BltMechanism(P, 32767, ZCDP(0.5))
    assert mech.rows is not None
    exact = check_claim(mech, KEY, ticks, (1, 2, 10, 50, 100, 213, 214, 215, 300, ticks),
                        ((0, 20), (20, 214), (214, ticks)), seed=995)
    # the rows really change the first ticks: tick 1's variance is σ²/(d_0·r_0)², not σ²
    assert exact[0] == pytest.approx(
        mech.unit_variance / float(mech.scales[0] * mech.rows[0]) ** 2, rel=1e-9)  # type: ignore[index]


def test_user_level_deployments_run_without_start_rows() -> None:
    """The start rows stretch the correlation of a stream's first events with later ones (by
    ``d_s`` up to 1.23 at p = 0.995), so the per-person factor would no longer be the exact
    Toeplitz one: a user-level deployment (``make_mechanism(..., user_bounds=...)``, ``auto``'s
    user-level ranking, ``user_compare``) runs the plain filter and keeps its exact factor; the
    event-level mechanism has the rows, and its factor is an upper bound (not exact)."""
    from stream_dp.planner import make_mechanism, user_compare
    from stream_dp.user_level.accounting import stream_factor
    from stream_dp.user_level.bounds import UserBounds

    bounds = UserBounds(max_events=6, period_ticks=4096, min_separation_ticks=10)
    person = make_mechanism("blt", P, 4095, ZCDP(0.5), user_bounds=bounds)
    event = make_mechanism("blt", P, 4095, ZCDP(0.5))
    assert isinstance(person, BltMechanism) and isinstance(event, BltMechanism)
    assert person.rows is None and event.rows is not None
    exact = stream_factor(person, 6, 10, 4096)
    assert exact.exact and exact.value < 36.0
    assert not stream_factor(event, 6, 10, 4096).exact
    cand = {c.strategy: c for c in user_compare(P, 4095, ZCDP(0.5), bounds)}["blt"]
    assert cand.factor.value == exact.value and cand.factor.exact
    auto = make_mechanism("auto", P, 4095, ZCDP(0.5), user_bounds=bounds)
    assert getattr(auto, "rows", None) is None
    # a strategy without a user-level factory is the same mechanism at both levels
    from stream_dp.strategies.registry import make

    one, other = make("sqrt", P, 63, ZCDP(0.5), user_level=True), make("sqrt", P, 63, ZCDP(0.5))
    assert type(one) is type(other) and one.mse_curve(63).tolist() == other.mse_curve(63).tolist()


@pytest.mark.parametrize(("events", "sep"), [(2, 1), (2, 5), (2, 40), (3, 2), (3, 30)])
def test_person_factor_of_the_start_rows_bounds_brute_force(events: int, sep: int) -> None:
    """The event-level filter's per-person factor (not exact: cross terms × (max d)²) is at
    least the worst of every placement of ``events`` events ≥ ``sep`` apart over the table and
    100 plain ticks past it — ``‖Σ columns of R·C·D‖² / S_∞`` from dense columns — at least
    the plain filter's exact factor, and below the n² of the triangle inequality."""
    from stream_dp.user_level.accounting import stream_factor

    mech = BltMechanism(P, 32767, ZCDP(0.5))
    assert mech.rows is not None and mech.scales is not None
    span = len(mech.rows) + 100
    n = _long(mech) + span
    c = _coefficients(mech.theta, mech.w, n)
    rows, scales = _padded(mech.rows, n), _padded(mech.scales, n)
    cols = np.zeros((n, span))
    for j in range(span):
        cols[j:, j] = rows[j:] * c[: n - j] * scales[j]
    gram = cols.T @ cols / math.fsum((c * c).tolist())
    diag = np.diag(gram)
    if events == 2:
        pair = diag[:, None] + diag[None, :] + 2.0 * gram
        lag = np.subtract.outer(np.arange(span), np.arange(span))
        worst = float(pair[lag >= sep].max())
    else:
        worst = 0.0
        for a in range(span):
            for b in range(a + sep, span - sep):
                right = np.arange(b + sep, span)
                tot = (diag[a] + diag[b] + diag[right] + 2.0 * (gram[a, b] + gram[a, right]
                                                               + gram[b, right]))
                worst = max(worst, float(tot.max()))
    factor = stream_factor(mech, events, sep)
    plain = stream_factor(make_plain_blt(P), events, sep)
    assert plain.exact and not factor.exact
    assert factor.value >= worst * (1.0 - 1e-12)
    assert factor.value >= plain.value
    assert factor.value <= events**2 - (0.05 if sep >= 5 else 0.0)
    # a period that holds fewer events than the bound: at most that many, n² of them
    fit = (7 - 1) // sep + 1
    assert stream_factor(mech, 10, sep, 7).value <= min(fit, 10) ** 2


def test_person_factor_of_the_start_rows_never_above_the_periods_n_squared() -> None:
    """At p = 0.9999 (max d = 1.52) the scaled cross terms of 4 events 1 tick apart exceed
    4²: a period of 4 ticks holds no more than 4 events, so the factor is at most 16 (the
    adversarial review found 25.69, the n² of all 10 events)."""
    from stream_dp.user_level.accounting import stream_factor

    mech = BltMechanism(0.9999, 32767, ZCDP(0.5))
    assert mech.rows is not None
    assert stream_factor(mech, 10, 1, 4).value == 16.0


def make_plain_blt(p: float) -> BltMechanism:
    """The user-level (plain) filter of the same deployment."""
    from stream_dp.strategies.registry import make

    mech = make("blt", p, 32767, ZCDP(0.5), user_level=True)
    assert isinstance(mech, BltMechanism) and mech.rows is None
    return mech


def test_no_start_rows_where_they_would_cost_the_future(monkeypatch: pytest.MonkeyPatch) -> None:
    """At ρ = 10⁻⁶ the start rows' larger clip (∝ 1/min r) raises the float-error slack and
    with it σ: the converged error would be 10⁻³ above the plain filter's forever, for a gain
    over the first ticks only — the mechanism keeps the plain filter. At ρ = 0.5 the rows cost
    less than 10⁻⁶ of the converged error and are kept."""
    for rho, kept in ((1e-6, False), (0.5, True)):
        mech = BltMechanism(0.9999, 32767, ZCDP(rho))
        plain = _plain(monkeypatch, 0.9999, 32767, rho)
        assert (mech.rows is not None) == kept
        assert mech.variance(1 << 22) <= plain.variance(1 << 22) * (1 + 1e-6)
    with monkeypatch.context() as m:  # what the rule turned down
        m.setattr(BltMechanism, "_rows_win", lambda self, rows, plain: rows[0] < plain[0])
        forced = BltMechanism(0.9999, 32767, ZCDP(1e-6))
    assert forced.rows is not None
    assert forced.variance(1 << 22) > _plain(monkeypatch, 0.9999, 32767, 1e-6).variance(
        1 << 22) * (1 + 1e-4)


def test_huge_and_tiny_horizons() -> None:
    """A horizon of 2⁴⁰ ticks is built without a curve of 2⁴⁰ floats (the choice takes the
    converged error past 2²² ticks; before: MemoryError), and at horizons 1 and 2 the fit runs
    over 3 ticks (before: "no stable BLT filter", and the whole zCDP planner failed)."""
    big = BltMechanism(P, 1 << 40, ZCDP(0.5))
    assert big.variance(1 << 30) == big.variance(1 << 22)
    for horizon in (1, 2):
        cands = {c.strategy for c in compare(P, horizon, ZCDP(0.5))}
        assert "blt" in cands


def test_rounding_bound_covers_the_whole_tail() -> None:
    """``Σ|b_k|`` (p = 0.9999, the start rows' Abel row sums) is taken until ``b`` has
    decayed: the bound at least the one from the row sums over 2²² ticks."""
    mech = BltMechanism(0.9999, 32767, ZCDP(0.5))
    assert mech.scales is not None
    n = 1 << 22
    rows = blt_plan.scaled_abs_rows(0.9999, mech.theta, mech.w, _padded(mech.scales, n))
    full = mech.unit * (0.5 / (1 - 0.9999) + (0.5 + mech.float_error) * rows)
    assert mech.rounding_bound() >= full * (1 - 1e-12)
