"""``blt``: BLT-correlated discrete Gaussian noise (issue #12, zCDP at high p and p = 1).

Accuracy against the exact error (Monte Carlo) and the dense oracle run for every strategy in
tests/unit/test_accuracy_all.py; the empirical audit in tests/unit/test_privacy_audit.py. Here:
neighbouring inputs, the privacy accounting from first principles (closed forms against brute
force, the float-error bound against exact rational arithmetic), the issue's targets against
the lower bound, memory independent of the horizon, and refusals.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from stream_dp.analysis import expected_mse
from stream_dp.budget import ZCDP, PureDP
from stream_dp.counters import CounterBank
from stream_dp.lower_bound import mean_mse_bound
from stream_dp.planner import make_mechanism
from stream_dp.strategies._common import BudgetOutOfRange
from stream_dp.strategies.blt import plan as blt_plan
from stream_dp.strategies.blt.mechanism import MAX_TICKS, BltMechanism
from tests.unit._neighbours import check_one_event

KEY = b"blt-tests-key-0123456789abcdef!!"
STREAMS = [f"s{i}" for i in range(6)]


def _run(mech: BltMechanism, data: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    bank = CounterBank(mech, STREAMS, KEY)
    out, buffers = [], []
    for row in data:
        out.append(bank.step(row))
        buffers.append(np.array(bank._state["buffers"], copy=True))
    return np.array(out), buffers


@pytest.mark.parametrize("p", [0.9, 0.995, 0.999, 1.0])
def test_neighbouring_inputs_differ_only_where_the_event_counts(p: float) -> None:
    mech = BltMechanism(p, 63, ZCDP(0.5), 1.0)
    assert (mech.rows is not None) == (p == 0.995)  # 0.995: the start rows (issue #36)
    ticks = 40
    rng = np.random.default_rng(11)
    base = rng.integers(0, 5, size=(ticks, len(STREAMS))).astype(np.float64)
    base[:, 5] = mech.max_count() / 2  # a stream near the top of the numeric range
    # the buffers hold noise only: identical on both inputs, bit for bit
    for s, stream in ((0, 3), (17, 0), (ticks - 1, 3), (5, 5)):
        check_one_event(lambda d: _run(mech, d), base, [s], stream, p)


@pytest.mark.parametrize("p", [0.5, 0.99, 0.999, 1.0])
def test_closed_forms_match_brute_force_sums(p: float) -> None:
    # the Toeplitz fit (at p = 1 and T = 1023 the mechanism runs a row fit of its own, whose
    # slowest decay needs far more than 400 000 terms; its block sums: test_blt_rows.py)
    th, w = (np.asarray(v) for v in blt_plan.fit(p, 1023))
    n = 400_000
    c = blt_plan.coefficients(th, w, n)
    assert blt_plan.square_sum(th, w) == pytest.approx(float(np.sum(c[1:] ** 2)), rel=1e-6)
    assert blt_plan.abs_sum(th, w) >= float(np.sum(np.abs(c[1:]))) * (1 - 1e-12)
    # B = W C^-1: the convolution of b with c is the decay p^k
    b = blt_plan.reconstruction(p, th, w, 300)
    np.testing.assert_allclose(np.convolve(b, c[:300])[:300], p ** np.arange(300), atol=1e-9)


@pytest.mark.parametrize("p", [0.9, 0.995, 0.999, 1.0])
def test_accounting_from_first_principles(p: float) -> None:
    """ρ = Σ_t max shift_t²/(2σ²) over the ticks an event influences, with shift_0 = D and
    shift_k = |c_k|·D + S (D = cap/h + 1, S the rounding and float slack), summed by brute force
    up to a long horizon plus the remaining ``S²`` terms up to MAX_TICKS, is within the budget."""
    rho = 0.5
    mech = BltMechanism(p, 255, ZCDP(rho), 2.5)
    d = mech.cap / mech.unit + 1.0
    s = mech.slack_units
    # p = 1: the filter restarts every block of `horizon` ticks, so an event's shifts end with
    # its block (the worst case: an event at the block's first tick)
    n = 255 if p == 1.0 else 2_000_000
    c = blt_plan.coefficients(mech.theta, mech.w, n)
    # column scaling (p = 1: the block; p < 1: the start rows' table), so block positions s
    # are checked; the tick s + k draws noise of scale σ/(d_(s+k)·r_(s+k)) and its mean moves
    # by ≤ |c_k|·d_s·D/d_(s+k) + 1 + 2E/d_(s+k) units: its loss is that times r·d over σ, ≤
    # (r_(s+k)·|c_k|·d_s·D + S)²/(2σ²) (S = max(r·d) + 2E = mech.slack_units; r, d = 1 past
    # the tables)
    # p = 1: the block's table; 0.995: the start rows (kept at T = 255); 0.9, 0.999: none
    assert (mech.scales is not None) == (p in (0.995, 1.0))
    table = mech.scales if mech.scales is not None else np.ones(0)
    scales = np.ones(n)
    scales[: len(table)] = table
    rows = np.ones(n)
    if mech.rows is not None:
        rows[: len(mech.rows)] = mech.rows
    top = int(np.argmax(scales))
    positions = (range(len(table)) if p == 1.0 else
                 sorted({0, 1, 2, top, len(table) // 2, max(len(table) - 1, 0), len(table)}))
    for pos in positions:
        shifts = np.abs(c[: n - pos]) * d * float(scales[pos]) * rows[pos:]
        shifts[1:] += s
        total = math.fsum((shifts * shifts).tolist()) + (MAX_TICKS - (n - pos)) * s * s
        assert total / (2.0 * mech.sigma_units**2) <= rho * (1 + 1e-9), pos
    # and the slack is small: σ is within 0.2% of the slack-free Gaussian mechanism's
    exact = d * math.sqrt(float(np.sum(c * c))) / math.sqrt(2 * rho)
    assert mech.sigma_units <= exact * 1.002
    # the unit is a power of two with cap/h in [2^29, 2^30)
    assert 2**29 <= mech.cap / mech.unit < 2**30 and math.frexp(mech.unit)[0] == 0.5


@pytest.mark.parametrize("p", [0.99, 1.0])
def test_float_error_of_the_buffers_stays_below_the_bound(p: float) -> None:
    """Adversarial inputs (±clip, alternating in runs) through the float64 buffers, against the
    same recurrence in exact rational arithmetic: |f̂ − f| ≤ E at every tick."""
    mech = BltMechanism(p, 1023, ZCDP(0.5), 1.0)
    rng = np.random.default_rng(3)
    clip = mech.clip
    n_steps = 300
    signs = np.repeat(rng.choice([-1.0, 1.0], size=n_steps // 10), 10)
    inputs = signs * clip * rng.uniform(0.9, 1.0, size=n_steps)
    inputs = np.rint(inputs)
    th_f = [Fraction(float(t)) for t in mech.theta]
    w_f = [Fraction(float(v)) for v in mech.w]
    exact = [Fraction(0)] * len(th_f)
    buf = np.zeros((len(th_f), 1))
    buf_lo = np.zeros((len(th_f), 1))
    worst = 0.0
    for x in inputs:
        f = mech.feedback(buf)  # the mechanism's own float evaluation
        f_exact = sum((wi * si for wi, si in zip(w_f, exact, strict=True)), Fraction(0))
        worst = max(worst, abs(float(Fraction(float(f[0])) - f_exact)))
        mech.update_buffers(buf, buf_lo, np.array([x]))
        for i in range(len(th_f)):
            exact[i] = th_f[i] * exact[i] + Fraction(float(x))
    assert worst <= mech.float_error


def test_float_error_bound_is_small_where_float64_buffers_were_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At p = 1 the slowest decay is within ~10⁻⁴ of 1: the double-double buffers keep the
    float error E (units) far below one unit, where float64 buffers' bound ``2U·clip·Σ w a²``
    would be hundreds of units (and cost 0.7% of σ² in slack). The column-scaled filter (the
    row-scaled one's slack: tests/unit/test_blt_rows.py)."""
    monkeypatch.setattr(blt_plan, "row_fit", lambda horizon: None)
    mech = BltMechanism(1.0, 32767, ZCDP(0.5), 1.0)
    a = 1.0 / (1.0 - mech.theta)
    plain = 2.0 * 2.0**-53 * mech.clip * float(np.sum(mech.w * a * a))
    assert plain > 50.0
    assert mech.float_error < 1.0
    assert mech.sigma_units**2 * 2 * 0.5 <= mech.d_units**2 * (
        1.0 + blt_plan.square_sum(mech.theta, mech.w, 32767)) * (1 + 1e-6)


ZCDP_P = [0.5, 0.9, 0.99, 0.995, 0.999]


@pytest.mark.parametrize("p", ZCDP_P)
def test_issue_target_zcdp_within_five_percent_of_the_bound(p: float) -> None:
    horizon = 32767
    bound = mean_mse_bound(horizon, p, ZCDP(0.5))
    auto = expected_mse("auto", p, horizon, ZCDP(0.5))
    assert auto <= 1.05 * bound
    assert auto <= expected_mse("sqrt", p, horizon, ZCDP(0.5)) * (1 + 1e-12)


def test_issue_target_zcdp_at_p1() -> None:
    horizon = 32767
    bound = mean_mse_bound(horizon, 1.0, ZCDP(0.5))
    assert expected_mse("auto", 1.0, horizon, ZCDP(0.5)) <= 1.5 * bound
    assert expected_mse("blt", 1.0, horizon, ZCDP(0.5)) <= 1.5 * bound


def test_memory_per_stream_is_independent_of_the_horizon() -> None:
    # d ≤ BUFFERS double-double buffers and the release; the fit picks d (from p and
    # min(horizon, 2**16)), so the state is bounded by 2·BUFFERS + 1 floats whatever the horizon
    for horizon in (255, 1 << 20):
        mech = make_mechanism("blt", 0.999, horizon, ZCDP(0.5))
        state = mech.new_state(3)
        d = len(mech.theta)
        assert 1 <= d <= blt_plan.BUFFERS
        assert sum(v.size for v in state.values() if v.ndim) == 3 * (2 * d + 1)


def test_refusals_leave_the_state_unchanged() -> None:
    mech = BltMechanism(0.99, 255, ZCDP(0.5))
    bank = CounterBank(mech, ["a"], KEY)
    bank.step(np.array([1.0]))
    before = {k: np.array(v, copy=True) for k, v in bank._state.items()}
    with pytest.raises(ValueError, match="blt"):
        bank.step(np.array([mech.max_count() * 2]))
    assert all(np.array_equal(before[k], bank._state[k]) for k in before)
    state = mech.new_state(1)
    state["tick"] = np.array(MAX_TICKS, dtype=np.int64)
    with pytest.raises(ValueError, match="at most"):
        mech.step(state, np.zeros(1), bank._noise)
    assert int(state["tick"]) == MAX_TICKS
    with pytest.raises(ValueError, match="ZCDP"):
        BltMechanism(0.99, 255, PureDP(1.0))


def test_running_totals_neighbours_across_blocks_and_epochs() -> None:
    """p = 1: blocks of 8 ticks in epochs of 1, 2, 4, 8 blocks (super levels from the second
    epoch on); one event at a block's first or last tick, an epoch boundary or the last tick
    changes only its stream, only from its tick on, by exactly one count."""
    mech = BltMechanism(1.0, 8, ZCDP(0.5), 1.0)
    ticks = 15 * 8
    rng = np.random.default_rng(13)
    base = rng.integers(0, 4, size=(ticks, len(STREAMS))).astype(np.float64)
    check_one_event(lambda d: _run(mech, d), base, (0, 7, 8, 23, 24, 55, 56, ticks - 1), 1, 1.0)


def test_running_totals_grow_polylogarithmically() -> None:
    horizon = 32767
    mech = BltMechanism(1.0, horizon, ZCDP(0.5))
    v16, v256 = (mech.variance(k * horizon) for k in (16, 256))
    assert v256 <= 2.0 * v16
    curve = mech.mse_curve(5 * horizon)
    for t in (horizon, horizon + 1, 3 * horizon, 3 * horizon + 7, 5 * horizon):
        assert mech.variance(t) == pytest.approx(float(curve[t - 1]), rel=1e-12)


@pytest.mark.parametrize("p", [0.999, 1.0])
def test_released_mse_matches_the_claimed_mse_of_the_long_fits(p: float) -> None:
    """The fits behind the issue-#26 figures (T = 32767: five to eight buffers, decays within
    10⁻⁴ of 1) through a real CounterBank: the empirical per-release MSE over S streams against
    the exact ``mse_curve``, with the fixed bound of tests/unit/test_accuracy_all.py (sd of a
    mean of S squared errors ≤ σ²·√(5/S), Z = 4.9, two-sided p ≈ 1e-6 per comparison) plus the
    rounding bias. A mechanism whose noise filter or variance formula drifts (as the former
    direct-form reconstruction did at six buffers) fails here."""
    from stream_dp.figures import rounding_bias
    from tests.unit._montecarlo import empirical_mse_curve, mse_slack

    mech = make_mechanism("blt", p, 32767, ZCDP(0.5))
    assert len(mech.theta) >= 5
    n_streams, ticks, z = 4000, 400, 4.9
    rng = np.random.default_rng(26)
    sq, _ = empirical_mse_curve(mech, KEY, n_streams, ticks,
                                lambda t: rng.uniform(0.0, 3.0, size=n_streams))
    exact = mech.mse_curve(ticks)
    b = rounding_bias(mech, ticks)
    slack = mse_slack(exact, n_streams, b, z)
    for t in (1, 2, 10, 100, ticks):
        assert abs(sq[t - 1] - exact[t - 1]) <= slack[t - 1], (t, sq[t - 1], exact[t - 1])
    assert abs(sq.mean() - exact.mean()) <= slack.mean()


@pytest.mark.parametrize(("p", "target"), [(0.995, 1.002), (0.999, 1.0022), (1.0, 1.075)])
def test_issue_26_zcdp_targets(p: float, target: float) -> None:
    """blt's mean per-release MSE over T = 32767 ticks (slack, discrete-Gaussian variance and
    quantised parameters included) against the factorisation lower bound (issue #26: ≤ 1.002×
    for p ≤ 0.995, ≤ 1.0022× at 0.999, ≤ 1.075× at p = 1 — 1.0442× with the column scaling,
    1.0755× without, and 1.07507× for the best unscaled Toeplitz factorisation)."""
    horizon = 32767
    bound = mean_mse_bound(horizon, p, ZCDP(0.5))
    assert expected_mse("blt", p, horizon, ZCDP(0.5)) <= target * bound


def _dense_scaled(th: np.ndarray, w: np.ndarray, n: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(C, d, A)`` built from the definitions: the Toeplitz ``C`` of ``c_k``, the column scales
    ``d_j = √(S_n/S_(n−j))`` from brute-force square sums (not the plan's closed form, no
    rounding), and the running-sum workload ``A``."""
    c = blt_plan.coefficients(th, w, n)
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    big_c = np.where(lag >= 0, c[np.clip(lag, 0, None)], 0.0)
    col = np.array([math.fsum((c[: n - j] ** 2).tolist()) for j in range(n)])
    return big_c, np.sqrt(col[0] / col), np.tril(np.ones((n, n)))


@pytest.mark.parametrize("n", [63, 255])
def test_column_scaling_against_a_dense_oracle(n: int) -> None:
    """p = 1, one block of ``n`` ticks, dense matrices: ``C' = C·D`` has every column at most
    (and the first exactly) the norm of ``C``'s first column, ``B' = A·C'⁻¹`` reconstructs
    ``A``, the mean MSE ``‖B'‖_F²/n·max col² `` is the plan's :func:`scaled_mean_factor`, and
    against the lower bound (valid for every factorisation, so also for a non-Toeplitz one)
    it is ≥ 1 and below the unscaled Toeplitz ``C``'s."""
    th, w = (np.asarray(v) for v in blt_plan.fit(1.0, n))
    big_c, d_exact, a = _dense_scaled(th, w, n)
    scales = blt_plan.column_scales(th, w, n)
    np.testing.assert_allclose(scales, d_exact, rtol=2.0**-19, atol=0)  # the rounding only
    assert np.all(scales <= d_exact * (1 + 1e-12)) and np.all(np.diff(scales) >= 0)
    scaled = big_c * scales[None, :]
    cols = (scaled**2).sum(axis=0)
    assert cols.max() <= cols[0] * (1 + 1e-12)
    assert cols.min() >= cols[0] * (1 - 2.0**-18)  # equalised (up to the 2^-20 rounding)
    big_b = a @ np.linalg.inv(scaled)
    np.testing.assert_allclose(big_b @ scaled, a, atol=1e-9)
    dense = float(cols.max()) * float((big_b**2).sum()) / n
    assert blt_plan.scaled_mean_factor(n, th, w) == pytest.approx(dense, rel=1e-9)
    bound = blt_plan.mean_factor_sqrt_bound(1.0, n)
    toeplitz = float((big_c**2).sum(axis=0).max()) * float(
        ((a @ np.linalg.inv(big_c)) ** 2).sum()) / n
    assert toeplitz == pytest.approx(blt_plan.mean_factor(1.0, n, th, w), rel=1e-9)
    assert 1.0 <= dense / bound < toeplitz / bound - 0.02
    # the bound holds for arbitrary (non-Toeplitz) factorisations too: random lower-triangular L
    rng = np.random.default_rng(7)
    for _ in range(5):
        big_l = np.tril(rng.normal(size=(n, n))) + np.eye(n) * n
        big_b2 = a @ np.linalg.inv(big_l)
        assert float((big_l**2).sum(axis=0).max()) * float((big_b2**2).sum()) / n >= bound


def test_scaled_variance_curve_against_the_direct_sum() -> None:
    """The O(T·d²) recurrences against ``Var E_t = Σ_j u_j (Σ_{s=j..t} m_(s−j)/d_s)²`` summed
    directly, with unequal noise variances ``u_j`` (as the discrete Gaussian's at σ/d_j)."""
    n = 300
    th, w = (np.asarray(v) for v in blt_plan.fit(1.0, 1023))
    scales = blt_plan.column_scales(th, w, n)
    u = np.random.default_rng(5).uniform(0.5, 2.0, size=n)
    m = blt_plan.inverse_coefficients(th, w, n)
    direct = np.empty(n)
    for t in range(n):
        k = np.array([math.fsum((m[: t - j + 1] / scales[j: t + 1]).tolist()) for j in range(t + 1)])
        direct[t] = math.fsum((u[: t + 1] * k * k).tolist())
    np.testing.assert_allclose(blt_plan.scaled_variance_curve(th, w, scales, u), direct,
                               rtol=1e-11)


class _Forced:
    """Noise whose first draw of a tick returns ``value`` (every stream) and records the
    ``sigma`` the mechanism asked for; later draws of the tick (super levels) return 0."""

    def __init__(self) -> None:
        self.value = 0
        self.sigmas: list[float] = []
        self._first = True

    def discrete_gaussian(self, node: int, sigma: float) -> np.ndarray:
        if not self._first:
            return np.zeros(1, dtype=np.int64)
        self._first = False
        self.sigmas.append(float(sigma))
        return np.full(1, self.value, dtype=np.int64)

    def arm(self, value: int) -> None:
        self.value, self._first = int(value), True


def _means_and_outputs(mech: BltMechanism, counts: np.ndarray, outputs: np.ndarray | None,
                       rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run the real ``step`` on ``counts`` (one stream), tick by tick: first with zero noise on
    a copy of the state, which gives the mean of ``y_t`` given the past (``x_t − rint(f̂_t/d_t)``,
    read from the open block's noisy sum), then with the noise that makes ``y_t`` equal
    ``outputs[t]`` (the neighbour's replay of the same outputs) or a fresh draw."""
    state = mech.new_state(1)
    noise = _Forced()
    means, ys, sigmas = [], [], []
    for t, x in enumerate(counts):
        trial = {k: np.array(v, copy=True) for k, v in state.items()}
        noise.arm(0)
        mech.step(trial, np.array([x]), noise)  # type: ignore[arg-type]
        j = t % mech.horizon
        prior = float(state["block_sum"][0]) if j else 0.0
        mean = round(float(trial["block_sum"][0]) - prior)
        sigma = noise.sigmas[-1]
        z = (int(outputs[t]) - mean if outputs is not None
             else int(np.rint(rng.normal() * sigma)))
        noise.arm(z)
        mech.step(state, np.array([x]), noise)  # type: ignore[arg-type]
        y = round(float(state["block_sum"][0]) - prior)
        assert y == mean + z
        means.append(mean)
        ys.append(y)
        sigmas.append(sigma)
    assert noise.sigmas[0::2] == noise.sigmas[1::2]  # σ_t is public: the same in both calls
    return np.array(means), np.array(ys), np.array(sigmas)


@pytest.mark.parametrize("event", [0, 31, 62, 63, 100, 125])
def test_privacy_of_the_column_scaled_filter_with_neighbouring_inputs(event: int) -> None:
    """p = 1, blocks of 63 ticks: the run on ``x`` releases ``y``; the neighbour ``x'`` (one
    event of size cap at the block's first, middle or last tick, or the next block's) replays
    the same ``y``. Per tick, ``y_t`` is a discrete Gaussian of the scale the mechanism really
    drew (``σ_t = σ/d_j``) around an integer mean, so the event costs
    ``Σ_t (mean_t − mean'_t)²/(2σ_t²)``: it must stay within the block's budget (ρ in the first
    block, the nested budget after), and at the first and last tick of a block it must use
    nearly all of it (the scaled columns are equalised)."""
    from stream_dp.strategies._epochs import nested_budget

    rho, horizon, ticks = 0.5, 63, 126
    mech = BltMechanism(1.0, horizon, ZCDP(rho), 1.0)
    rng = np.random.default_rng(event)
    counts = rng.integers(0, 4, size=ticks).astype(np.float64)
    other = counts.copy()
    other[event] += mech.cap
    means, ys, sigmas = _means_and_outputs(mech, counts, None, rng)
    means2, ys2, sigmas2 = _means_and_outputs(mech, other, ys, rng)
    assert np.array_equal(ys, ys2) and np.array_equal(sigmas, sigmas2)
    assert np.array_equal(means[:event], means2[:event])  # nothing before the event
    end = (event // horizon + 1) * horizon
    assert np.array_equal(means[end:], means2[end:])  # nor after its block (the filter restarts)
    assert np.all(sigmas[1:horizon] <= sigmas[0]) and sigmas[horizon - 1] < sigmas[0] / 1.2
    spent = math.fsum((((means2 - means) / sigmas) ** 2 / 2.0).tolist())
    budget = rho if event < horizon else nested_budget(rho)
    assert spent <= budget
    if event % horizon in (0, horizon - 1):
        assert spent >= budget * 0.999


def test_a_worker_with_another_column_scale_table_refuses_the_checkpoint(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """p = 1: the column scales are bound into the description (SHA-256 of the table), so a
    host that computes another table — same (θ, w), one scale one quantum off — draws
    unrelated noise and refuses the first host's checkpoint instead of mixing the two filters."""
    from stream_dp.integrity import IntegrityError

    mech = BltMechanism(1.0, 63, ZCDP(0.5), 1.0)
    bank = CounterBank(mech, ["a"], KEY)
    bank.step(np.array([1.0]))
    blob = bank.to_bytes()
    real = blt_plan.column_scales

    def shifted(theta: np.ndarray, w: np.ndarray, block: int,
                sums: np.ndarray | None = None) -> np.ndarray:
        d = np.array(real(theta, w, block, sums), copy=True)
        d[block // 2] -= 2.0**-20  # still private (smaller), σ unchanged: another mechanism
        return d

    monkeypatch.setattr(blt_plan, "column_scales", shifted)
    other = BltMechanism(1.0, 63, ZCDP(0.5), 1.0)
    assert np.array_equal(other.theta, mech.theta) and np.array_equal(other.w, mech.w)
    assert other.sigma_units == mech.sigma_units
    assert other.canonical_bytes() != mech.canonical_bytes()
    with pytest.raises(IntegrityError):
        CounterBank.from_bytes(blob, KEY, mechanism=other)
    with pytest.raises(IntegrityError):  # rebuilt from the checkpoint's own configuration
        CounterBank.from_bytes(blob, KEY)
    monkeypatch.setattr(blt_plan, "column_scales", real)
    CounterBank.from_bytes(blob, KEY, mechanism=mech)  # the same table restores
    CounterBank.from_bytes(blob, KEY)


@pytest.mark.parametrize(("p", "rho", "cap", "error"), [
    (1.0, 1e21, 1.0, BudgetOutOfRange),  # noise below one unit: the super levels underflowed
    (1.0, 0.5, 1.5e-323, ValueError),  # a subnormal cap: h = cap/2^30 was 0
    (0.995, 0.5, 1e300, ValueError),  # h² overflowed
    (0.995, 0.5, 2.0**-401, ValueError),
])
def test_out_of_range_direct_construction_is_a_clear_error(p: float, rho: float, cap: float,
                                                            error: type[Exception]) -> None:
    """Outside the planner's ranges a direct ``BltMechanism`` raised ZeroDivisionError or
    OverflowError; it now refuses with a message naming the range (the planner passes a
    ``BudgetOutOfRange`` over)."""
    with pytest.raises(error, match=r"rho|range"):
        BltMechanism(p, 63, ZCDP(rho), cap)
    BltMechanism(p, 63, ZCDP(0.5), 2.0**-400)  # the ends of the range are served
    BltMechanism(p, 63, ZCDP(0.5), 2.0**400)
