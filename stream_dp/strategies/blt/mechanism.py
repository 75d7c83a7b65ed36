"""``blt``: correlated noise from a buffered-linear-Toeplitz filter, under ρ-zCDP, O(1) state.

Maths and fit: :mod:`stream_dp.strategies.blt.plan`. The counts themselves are never filtered:
at tick ``t`` the mechanism adds an integer noise ``N_t`` to the integer count ``x_t`` (units
``h``) and releases the decayed sum of ``y_t = x_t + N_t``. The noise is correlated over time,
``N_t = Z_t − rint(f_t)`` with ``f_t ≈ Σ_{k≥1} c_k N_(t−k)`` kept by ``d`` buffers
``s_i ← θ_i·s_i + clip(N_t)`` (``f = Σ w_i s_i``), ``Z_t`` exact discrete Gaussian. Without the
rounding this is ``N = C⁻¹Z``: the release error is ``B·Z`` (:mod:`.plan`). The buffers are
double-doubles (:mod:`stream_dp.strategies._dd`, issue #26): with decays near 1 (``1 − θ`` down
to ~10⁻⁵ at ``p = 1``) float64 buffers' error grew as ``U·clip/(1 − θ)²`` and cost 0.7% of σ² in
slack at ``p = 1``; now the feedback's float error is ``≈ (d + 1)·U·clip·Σ w_i/(1 − θ_i)``.

**Exactness.** ``x_t = rint(D_t/h)`` and ``y_t = x_t + N_t`` are int64 additions; the buffers
hold noise only. The release ``p·r + h·y_t`` is computed from ``y`` alone (post-processing), so
no float rounding ever touches the counts and the noise together.

**Privacy** (docs/privacy.md, "Correlated noise without float leaks"). Given the outputs so far,
``y_t = x_t + G_t(y_<t − x_<t) + Z_t`` with ``G_t = −rint(f̂_t)`` an integer function of the past
noise: a sequence of adaptively chosen discrete Gaussian mechanisms with integer means
(Canonne–Kamath–Steinke; zCDP composes adaptively, Bun–Steinke Lemma 2.3). One event of size
``≤ cap`` changes one ``x_s`` by at most ``D = cap/h + 1`` units. The mean of ``y_(s+k)`` then moves
by at most ``|c_k|·D + S`` units: ``c_k·D`` through the exact filter (``clip`` is 1-Lipschitz),
plus ``S = 1 + 2E`` for the two roundings and the float evaluation error ``E`` of the buffers,
bounded because their inputs are clipped to ``±N_max``. Summed over at most :data:`MAX_TICKS`
ticks:

    Σ shift² ≤ D²·‖c‖₂² + 2·D·S·Σ_{k≥1}|c_k| + MAX_TICKS·S²,      σ = √(Σ shift² / (2ρ)).

At ``p = 1`` the filter restarts every block of ``horizon`` ticks, so the shifts ``c_k·D`` end
with the event's block: ``‖c‖₂²`` is the column norm inside a block, ``Σ_{k<horizon} c_k²``
(:func:`.plan.square_sum` with ``block``). With ``cap/h ≈ 2**30`` the slack terms add < 10⁻⁶ to
σ² (:meth:`BltMechanism.describe` lists them).

**Column scaling at** ``p = 1`` (issue #26; :func:`.plan.column_scales`). An event at block
position ``j`` shifts only ``T − j`` ticks, so its column has slack; the mechanism equalises the
columns with ``d_j = √(S_T/S_(T−j)) ≥ 1`` (a table of ``horizon`` floats shared by all streams,
bound into :meth:`BltMechanism.describe` by its digest): the buffers hold the scaled noise
``M = d·N``, and at position ``j``

    N_t = Z_t − rint(f̂_t/d_j),    Z_t ~ discrete Gaussian(σ/d_j),    s_i ← θ_i·s_i + clip(d_j·N_t),

so ``N = D⁻¹C⁻¹D·Z`` (``Var(d_j Z_t) ≈ σ²``), the factorisation ``W = (W D⁻¹C⁻¹)(C D)``. Privacy:
tick ``t`` is a discrete Gaussian mechanism of scale ``σ/d_t`` with an integer mean that moves by
at most ``Δ_t = |c_k|·d_s·D/d_t + 1 + 2E/d_t`` units for an event at ``s = t − k``, so it spends
``(d_tΔ_t)²/(2σ²)`` with ``d_tΔ_t ≤ |c_k|·d_s·D + S'``, ``S' = d_max + 2E``; summed over the block
``d_s²·S_(T−s)·D² ≤ S_T·D²`` — the unscaled sensitivity — plus the slack terms with ``S'`` and an
extra ``d_max`` on the cross term. ``E`` gains ``2.1·U·clip·Σ w_i/(1 − θ_i)`` for the float products
``d_j·N_t`` and quotients ``f̂/d_j``. The release variance is :func:`.plan.scaled_variance_curve`;
measured at T = 32767, ρ = 0.5: 1.0442× the lower bound, against 1.0755× unscaled. ``step`` refuses tick ``MAX_TICKS + 1`` (``ValueError``, state unchanged).

**Row scales at** ``p = 1`` (issue #36; :func:`.plan.row_fit`, shipped fits only: T = 31, 4095,
32767). The block
measures with ``R·C·D``: the draw at position ``j`` has scale ``σ/(d_j·r_j)`` with a public table
``r ≤ 1`` (largest exactly 1; SHA-256 in the description) and ``d_j = √(K/S'_j)`` rounded down
(:func:`.plan.row_column_scales`; not monotone), ``S'_j = Σ_(k<T−j) r_(j+k)²c_k²``, ``K = max S'``.
Tick ``t`` spends ``(r_t·d_t·Δ_t)²/(2σ²)``, so an event at ``s`` spends ``d_s²·S'_s·D² ≤ K·D²`` plus
the slack with ``S'' = max(r·d) + 2E``; the clip grows by ``1/min r`` (the buffers' inputs
``C⁻¹R⁻¹ζ``). Both filters are built and the rows kept only if the first block's mean error is
lower (at a small ρ the larger clip's float-error slack grows with σ). At T = 32767, ρ = 0.5:
1.0200× the lower bound, and past the horizon every block's mean and worst tick lower.
**Start rows at** ``p < 1`` (issue #36; :func:`.plan.start_fit`, shipped for p = 0.995 and
0.9999). The stream's first ``t₁`` ticks (at most :data:`.plan.START_TICKS`) measure with
``R·C·D``: the draw at tick ``t < t₁`` has scale ``σ/(d_t·r_t)``, ``r_t < 1`` rising to 1 and
``d_t = √(S_∞/S'_t)`` rounded down, ``S'_t`` the *infinite* column of ``R·C``
(:func:`.plan.start_scales`); from ``t₁`` on the filter is the plain one. An event at ``s``
spends ``d_s²·S'_s·D² ≤ S_∞·D²`` — the plain sensitivity — plus the slack with ``S'' = max(1,
max r·d) + 2E`` and ``max d`` on the cross term; the clip grows by ``1/min r``. Kept only if the
mean error over ticks ``1..horizon`` is lower and the converged error (``t → ∞``) at most 10⁻⁶
above the plain filter's (at a small ρ the larger clip's slack would cost more forever: 10⁻³ at
ρ = 10⁻⁶, p = 0.9999): at T = 32767, ρ = 0.5, p = 0.995, 1.000513× → 1.000494× the lower
bound. The first ticks' error is higher (tick 1: +18 % / +8 %; lower from tick 30 / 3512 at
p = 0.995 / 0.9999); once the start has decayed it is the plain filter's up to
the slack (≤ 6.2·10⁻⁸ relative at ρ = 0.5). User-level deployments run the plain filter
(:func:`make_user_level`). :meth:`variance` is :func:`.plan.start_variance_curve`.
**Planned first horizon at** ``p < 1`` (``blt-horizon``, issue #36; by name only, ``auto`` does
not pick it). For ``3 ≤ T = horizon ≤`` :data:`.plan.FIRST_TICKS` the first ``T`` ticks draw at
``σ/d_t`` with ``d_t = √(S_∞/S_(T−t))`` rounded down (:func:`.plan.first_scales`), and the
filter restarts once, at tick ``T + 1`` (its buffers zeroed before the feedback is read): an
event at ``s < T`` moves the means of ticks ``s..T−1`` only and spends ``d_s²·S_(T−s)·D² ≤
S_∞·D²``, one at ``s ≥ T`` the plain filter's; slack as for the start rows (``S'' = max d +
2E``, ``max d`` on the cross term). The release at ``T + u`` carries ``p^(u+1)`` times the
error at ``T`` plus a fresh filter's (:func:`.plan.first_variance_curve`): lower error over the
horizon (1.00089× the bound at p = 0.999, T = 32767, ρ = 0.5), more after it, fading by
``p^(2T)`` a horizon. Kept where the mean over the horizon is lower and the converged error at
most 10⁻⁶ higher (:meth:`BltMechanism._planned_wins`); otherwise, and at ``p = 1``, the
mechanism is ``blt``'s under the name ``blt-horizon``.
A budget whose noise (the blocks', the later blocks' or any super level's before ``MAX_TICKS``) would leave the
sampler's range is refused when the mechanism is built (``BudgetOutOfRange``), not mid-run.

**Error.** ``variance(t) = h²·Var(Z)·Σ_{k<t} b_k²`` (exact for ``N = C⁻¹Z``; at ``p = 1``
:func:`.plan.scaled_variance_curve` of ``N = D⁻¹C⁻¹D·Z``); the feedback
rounding (``|e| ≤ ½ + E`` units per tick, filtered by ``B``) and the count rounding are in
:meth:`rounding_bound`. Clipping at ``N_max`` (≥ 256 standard deviations of ``N``; ≥ 198 in the
later epochs at ``p = 1``, whose noise is larger) never happens
in practice (probability < e^-30000 per tick). For ``p < 1`` there are no epochs and the error is
bounded forever. At ``p = 1`` the filter restarts every ``horizon`` ticks (a *block*), and the
blocks run in doubling epochs with super levels over them (:mod:`stream_dp.strategies._epochs`):
the first block is the plain mechanism at the full budget, and past it the error grows
polylogarithmically (``error_stays_bounded()`` is True).

**State** (stream axis last): the ``d`` double-double buffers and the release (``2d + 1`` floats
per stream, ``d ≤ 8`` chosen by the fit, independent of the horizon; at ``p = 1`` also the open block's noisy and exact sums and three
arrays of super levels); a tick is ``O(d)`` vector operations plus one noise draw.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, cast

import numpy as np

from stream_dp.budget import Privacy
from stream_dp.mechanism import BoundNoise, Float64Array, Mechanism, State
from stream_dp.noise import _fast
from stream_dp.noise.gaussian import (
    MAX_SIGMA,
    MIN_SIGMA,
    discrete_gaussian_variance,
    validate_sigma,
)
from stream_dp.strategies import _dd
from stream_dp.strategies._common import (
    BudgetOutOfRange,
    check_cap,
    check_horizon,
    check_n_streams,
    check_p,
    check_zcdp,
)
from stream_dp.strategies._epochs import (
    SUPER_SHARE,
    EpochNoise,
    add_limbs,
    epoch_noise,
    fold_block,
    levels_needed,
    nested_budget,
    super_variance_at,
    super_variance_curve,
)
from stream_dp.strategies.blt import plan as _plan

__all__ = ["MAX_TICKS", "UNIT_BITS", "BltHorizonMechanism", "BltMechanism", "make", "make_horizon", "make_user_level"]

#: Ticks a bank may release (the slack sum runs over them): 2**36 one-second ticks ≈ 2,000 years.
MAX_TICKS = 1 << 36
#: ``cap/h`` lies in ``[2**(UNIT_BITS−1), 2**UNIT_BITS)`` (a power-of-two cap: exactly the lower end).
UNIT_BITS = 30
#: |x_t| must stay below this many units (exact int64 sums with the noise).
_MAX_UNITS = float(2**52)
_U = 2.0**-53
#: Clip bound for the buffers' inputs, in standard deviations of N.
_CLIP_SDS = 256.0
#: ``cap`` range of the mechanism (its unit ``h`` and ``h²`` stay normal floats).
_MIN_CAP = 2.0**-400
_MAX_CAP = 2.0**400
#: Largest relative rise of the converged (p < 1) variance the start rows may cost.
_LIMIT_TOLERANCE = 1e-6
#: Ticks after which a p < 1 release's variance is taken as converged.
_CONVERGED = 1 << 22


class BltMechanism(Mechanism):
    """Count plus BLT-correlated discrete Gaussian noise; release = decayed sum (ρ-zCDP)."""

    name = "blt"

    def __init__(self, p: float, horizon: int, privacy: Privacy, cap: float = 1.0, *,
                 start_rows: bool = True, first_horizon: bool = False) -> None:
        """``start_rows=False``: at p < 1 the plain (Toeplitz) filter even where a start fit is
        shipped — a user-level deployment's, whose per-person factor is exact only for a
        Toeplitz measurement (:mod:`stream_dp.user_level.accounting`). ``first_horizon=True``:
        the strategy ``blt-horizon`` — at p < 1 (horizon ≤ :data:`.plan.FIRST_TICKS`) also the
        planned first horizon, kept where it lowers the mean error over ticks ``1..horizon``."""
        self.first = False
        self.p = check_p(p)
        self.horizon = check_horizon(horizon)
        self.cap = check_cap(cap)
        if not _MIN_CAP <= self.cap <= _MAX_CAP:
            # h = cap/2^30 and the reported variances ∝ h² must stay normal floats (the planner
            # accepts [1e-6, 1e9]; a direct caller gets this instead of an arithmetic error)
            raise ValueError(f"cap {self.cap!r} is outside blt's numeric range "
                             f"[2**-400, 2**400]")
        self.privacy = privacy = check_zcdp(privacy, "blt")
        # p = 1 with a shipped row fit for this horizon: its own (θ, w) and row scales r_t ≤ 1,
        # kept if its mean error over the first block is below the column-scaled filter's (at
        # a small ρ its larger clip, ∝ σ/min r, makes the float-error slack grow with σ)
        # p < 1 with a shipped start-row fit: the shipped (θ, w) and start rows r_t ≤ 1, kept if
        # its mean error over the horizon is below the plain filter's
        row_fit = _plan.row_fit(self.horizon) if self.p == 1.0 else None
        start_fit = _plan.start_fit(self.p) if start_rows else None
        planned: dict[str, Any] | None = None
        if first_horizon and self.p < 1.0 and 3 <= self.horizon <= _plan.FIRST_TICKS:
            try:
                self._build(*_plan.fit(self.p, self.horizon), None, first=True)
                planned = dict(self.__dict__)
            except (BudgetOutOfRange, ValueError):
                planned = None
            self.first = False
        with_rows: dict[str, Any] | None = None
        if row_fit is not None or start_fit is not None:
            if row_fit is not None:
                theta, w = row_fit[0], row_fit[1]
                rows = _plan.row_scales(row_fit[2], self.horizon)
            else:
                assert start_fit is not None
                theta, w = _plan.fit(self.p, self.horizon)
                rows = _plan.start_rows(start_fit)
            rows.setflags(write=False)
            try:
                self._build(theta, w, rows)
                with_rows = dict(self.__dict__)
            except (BudgetOutOfRange, ValueError):
                with_rows = None
        try:
            self._build(*_plan.fit(self.p, self.horizon), None)
        except (BudgetOutOfRange, ValueError):
            if with_rows is None and planned is None:
                raise
            self.__dict__.clear()
            self.__dict__.update(with_rows if with_rows is not None else planned)  # type: ignore[arg-type]
        else:
            if with_rows is not None and self._rows_win(self._mean_error(with_rows),
                                                        self._mean_error(self.__dict__)):
                self.__dict__.clear()
                self.__dict__.update(with_rows)
        if planned is not None and self._planned_wins(planned, self.__dict__):
            self.__dict__.clear()
            self.__dict__.update(planned)

    def _rows_win(self, rows: tuple[float, float], plain: tuple[float, float]) -> bool:
        """Keep the row-scaled filter: a lower mean error, and at ``p < 1`` a converged error
        within 10⁻⁶ of the plain filter's (the start rows' larger clip and ``max d`` cost slack
        forever: 6·10⁻⁸ at ρ = 0.5, but 10⁻³ at ρ = 10⁻⁶, where a running counter would trade
        its whole future for its first ticks)."""
        if not rows[0] < plain[0]:
            return False
        return self.p == 1.0 or rows[1] <= plain[1] * (1.0 + _LIMIT_TOLERANCE)

    def _planned_wins(self, planned: dict[str, Any], other: dict[str, Any]) -> bool:
        """Keep the planned first horizon (``blt-horizon``): a lower mean error over ticks
        ``1..horizon`` and a converged error within 10⁻⁶ of the other filter's. After the
        restart both run the same plain ``(θ, w)`` (start rows decay into it), so the converged
        errors stand in the ratio of their noise variances: the table's ``max d`` raises the
        slack (10⁻⁸ at ρ = 0.5; more at a tiny ρ, where the clip and its float error grow)."""
        if not self._mean_error(planned)[0] < self._mean_error(other)[0]:
            return False
        return bool(float(planned["unit_variance"])
                    <= float(other["unit_variance"]) * (1.0 + _LIMIT_TOLERANCE))

    def _mean_error(self, built: dict[str, Any]) -> tuple[float, float]:
        """``(mean, limit)`` error of a built filter (its ``__dict__``; units²): the mean over
        the first block at ``p = 1`` (limit: its last tick), over ticks ``1..horizon`` at ``p <
        1`` (past :data:`_CONVERGED` ticks the variance is the converged one, so a horizon up to
        2⁴⁰ costs no more than 2²² ticks) and the converged variance."""
        if self.p == 1.0:
            return float(np.mean(built["_part0"])), float(built["_part0"][-1])
        n = min(self.horizon, _CONVERGED)
        cum = float(built["unit_variance"]) * _unit_cum(
            self.p, built["theta"], built["w"], built["scales"], built["rows"], n,
            built["first"])
        limit = float(cum[-1])
        return (float(np.sum(cum)) + (self.horizon - n) * limit) / self.horizon, limit

    def _build(self, theta: tuple[float, ...], w: tuple[float, ...],
               rows: np.ndarray | None, *, first: bool = False) -> None:
        """Set the filter ``(θ, w)``, the row scales (``None``: none), the column scales, the
        slack and σ (``first``: the planned first horizon of ``blt-horizon`` at p < 1); raise
        :class:`BudgetOutOfRange` (or ``ValueError``) for a budget the sampler or the clip
        cannot serve."""
        privacy = self.privacy
        self.rows = rows
        self.first = first
        self.__dict__.pop("_unit_curve", None)  # cached per build (_block_curve, _curve)
        self.__dict__.pop("_cum", None)
        self.theta = np.asarray(theta, dtype=np.float64)
        self.w = np.asarray(w, dtype=np.float64)
        self._theta_c = np.ascontiguousarray(self.theta)  # the compiled kernels' operands
        self._w_c = np.ascontiguousarray(self.w)
        # h = 2^e with cap/h in [2^(UNIT_BITS-1), 2^UNIT_BITS)
        self.unit = math.ldexp(1.0, math.frexp(self.cap)[1] - UNIT_BITS)
        d_units = self.cap / self.unit + 1.0
        # p = 1: the filter restarts every block of `horizon` ticks, so an event's noise shifts
        # end with its block (the column norm of C inside a block); p < 1: the infinite column
        self.block = _plan.block_of(self.p, self.horizon)
        sq = 1.0 + _plan.square_sum(self.theta, self.w, self.block)
        # p = 1: equalise the columns inside a block (d_j ≥ 1, d_j²·S_(T−j) ≤ S_T); p < 1 has
        # no blocks (every column has the infinite norm), so no scaling
        self.scales: np.ndarray | None = None
        d_max = 1.0  # largest column scale d_s (the cross slack term)
        rd_max = 1.0  # largest r_t·d_t (the rounding slack in the scaled domain)
        r_min = 1.0
        if self.p == 1.0 and self.rows is None:
            sums = _plan.column_square_sums(self.theta, self.w, self.horizon)
            self.scales = _plan.column_scales(self.theta, self.w, self.horizon, sums)
            d_max = rd_max = float(self.scales[-1])
            sq = max(sq, float(np.max(self.scales**2 * sums[::-1])))  # certified, not assumed
        elif first:
            # planned first horizon: the filter restarts after tick T, so an event at j < T
            # spends d_j²·S_(T−j) ≤ S_∞ (its column ends with the first horizon), one at j ≥ T
            # the plain S_∞ (d = 1 there)
            self.scales, first_sums = _plan.first_scales(self.theta, self.w, self.horizon, sq)
            # S_n's closed form can pass S_∞ by an ulp where d = 1 (long columns): certified,
            # not assumed; and the closed forms themselves may sit an ulp below the true sums
            # (≤ 1e-14 relative against 80-bit brute force, adversarial review): a relative
            # margin of 2⁻³⁰ keeps every true column below sq (plain blt's σ is left as its
            # deployments published it; there the rounding slack's looseness absorbs the ulp)
            sq = max(sq, float(np.max(self.scales**2 * first_sums))) * _plan.FIRST_SQ_MARGIN
            d_max = rd_max = float(np.max(self.scales))
        elif self.rows is not None and self.p < 1.0:
            # start rows: an event at tick s < t1 spends d_s²·S'_s ≤ S_∞ (its infinite column
            # of R·C scaled), one at s ≥ t1 the plain S_∞ (d = r = 1 there)
            self.scales, start_sums = _plan.start_scales(self.theta, self.w, self.rows, sq)
            if not float(np.max(self.scales**2 * start_sums)) <= sq:  # pragma: no cover
                raise AssertionError("start-row columns above the infinite column")
            d_max = float(np.max(self.scales))
            rd_max = max(1.0, float(np.max(self.scales * self.rows)))
            r_min = float(np.min(self.rows))
        elif self.rows is not None:
            # an event at block position s spends d_s²·Σ_k r_(s+k)²c_k² = d_s²·S'_s ≤ K
            row_sums = _plan.row_column_square_sums(self.theta, self.w, self.rows)
            self.scales = _plan.row_column_scales(row_sums)
            sq = float(np.max(row_sums))  # K: d_j carry a 2^-30 margin below it
            if not float(np.max(self.scales**2 * row_sums)) <= sq:  # pragma: no cover
                raise AssertionError("row-scaled columns above the largest")
            d_max = float(np.max(self.scales))
            rd_max = float(np.max(self.scales * self.rows))
            r_min = float(np.min(self.rows))
        if self.scales is not None:
            self.scales.setflags(write=False)
            # the draw at block position j has scale σ/(d_j·r_j); d_j·r_j is exact: r_j ≤ 1 and
            # d_j < 2^12 are multiples of 2^-20 (at most 21 and 32 significant bits: < 2^53)
            if self.rows is not None and not float(np.max(self.scales)) < 2.0**12:
                raise ValueError("row-scaled column scales beyond 2^12 (the fit is unusable)")
            self._divisor = (self.scales if self.rows is None
                             else self.scales * self.rows)
            self._divisor.setflags(write=False)
        self._sq = sq  # the squared column norm σ covers (privacy-normalised, before d_units)
        ab = _plan.abs_sum(self.theta, self.w)
        root = math.sqrt(2.0 * privacy.rho)
        m = _plan.inverse_coefficients(self.theta, self.w, 1 << 16)
        n_sd = math.sqrt(float(np.sum(m * m)))
        sigma0 = d_units * math.sqrt(sq) / root
        # the buffers' inputs d·N = C⁻¹R⁻¹ζ: standard deviation ≤ σ·‖m‖/min r
        self.clip = math.ldexp(1.0, math.ceil(math.log2(
            _CLIP_SDS * sigma0 * max(1.0, n_sd) / r_min)))
        a = 1.0 / (1.0 - self.theta)
        aw = np.abs(self.w) * a
        k = len(self.theta)
        # |f̂ − f| (units): the buffers are double-doubles, each step off by ≤ 8U²·clip·a_i
        # (|s_i| ≤ clip·a_i), accumulated over ~a_i steps (≤ 16U²·clip·a_i² with margin); the
        # feedback sums the high parts in float64 (d products and d − 1 additions, plus the
        # dropped low parts: ≤ 1.01·(d + 1)·U·clip·Σ w_i a_i). Plain float64 buffers had
        # 2U·clip·a_i² here, which at a_i ≈ 10⁴ (θ near 1, p ≥ 0.9999) dominated the slack.
        # Column scaling (p = 1) adds the float products d_j·N_t fed to the buffers (≤ U·clip
        # per input, ≤ U·clip·Σ w_i a_i in f) and the quotient f̂/d_j (≤ U·|f̂|, scaled domain)
        scaled = 2.1 if self.scales is not None else 0.0
        self.float_error = 1.1 * _U * self.clip * float(
            16.0 * _U * np.sum(aw * a) + (1.01 * (k + 1) + scaled) * np.sum(aw))
        # scaled domain: the two roundings of f̂/d_t differ by ≤ 1 unit, r_t·d_t ≤ rd_max units
        # there (the tick's privacy loss is (r_t·d_t·Δ_t)²/(2σ²)); the float error E (r_t ≤ 1)
        self.slack_units = rd_max + 2.0 * self.float_error
        s = self.slack_units
        self._shift_sq = (d_units**2 * sq + 2.0 * d_units * s * d_max * ab
                          + float(MAX_TICKS) * s * s)
        self.sigma_units = math.sqrt(self._shift_sq) / root
        if not self.sigma_units >= MIN_SIGMA:  # pragma: no cover - σ ≥ 2^29/√(2ρ) here
            raise ValueError(f"noise scale {self.sigma_units!r} below the sampler's minimum")
        if not self.sigma_units <= MAX_SIGMA:  # ρ ≲ 4e-11 (p = 0.9): h ≈ cap/2^30 is fixed
            raise BudgetOutOfRange(
                f"rho {privacy.rho!r} is too small for blt: the noise scale would be "
                f"{self.sigma_units:.3g} units, beyond the sampler's {MAX_SIGMA:g}; use a larger "
                "rho or another strategy")
        if (self.rows is not None
                and not self.sigma_units / float(np.min(self._divisor)) <= MAX_SIGMA):
            raise BudgetOutOfRange(
                f"rho {privacy.rho!r} is too small for blt's row-scaled block: its largest "
                f"draw would be {self.sigma_units / float(np.min(self._divisor)):.3g} units, "
                f"beyond the sampler's {MAX_SIGMA:g}; use a larger rho or another strategy")
        if self.sigma_units * max(1.0, n_sd) * _CLIP_SDS / r_min > self.clip * 1.5:
            raise ValueError("slack too large for the clip bound (rho too small?)")
        if (self.scales is not None and self.p < 1.0
                and not self.sigma_units / float(np.max(self._divisor)) >= 64.0):
            # the start rows' and the first horizon's curves take Var(d·Z) = σ²/r² (exact to
            # < 10⁻³⁰⁰ from σ/(d·r) ≥ 64)
            raise ValueError("scaled draws need a scale ≥ 64 units")  # pragma: no cover
        self.unit_variance = self.unit**2 * discrete_gaussian_variance(self.sigma_units)
        self.d_units = d_units
        # p = 1: blocks of `horizon` ticks (the filter restarts), doubling epochs of blocks and
        # super levels over them from the second epoch on (stream_dp.strategies._epochs)
        self.super = self.p == 1.0
        if self.super and not self.sigma_units >= 1.0:
            # ρ ≳ 10¹⁸: below one unit of noise the super levels' variances underflow
            raise BudgetOutOfRange(
                f"rho {privacy.rho!r} is too large for blt at p = 1: the noise would be "
                f"{self.sigma_units:.3g} units, below one; use a smaller rho or another strategy")
        if self.super:
            self.sigma_units1 = math.sqrt(self._shift_sq) / math.sqrt(
                2.0 * nested_budget(privacy.rho))
            assert self.scales is not None
            self._part0 = self._block_curve(self.sigma_units)  # units², per block position
            self._part1 = self._block_curve(self.sigma_units1)
            self.max_super = levels_needed(MAX_TICKS // self.horizon)
            self._check_super_levels()

    def _check_super_levels(self) -> None:
        """``p = 1``: refuse a budget whose super-level noise some epoch could not draw.

        The level-1 scale of epoch ``e`` is ``D/√(2·0.4ρ/(e(e+1)/2))`` units: it grows with the
        epoch, and at ρ ≈ 10⁻⁸ it passes the sampler's ``2**46`` in epoch 17 while the block
        noise is still drawable — the mechanism was built and then raised at the end of that
        epoch's first block, and again after every restore (releases stopped for good). The
        scales only grow with ``e``, so the last epoch that can start (tick ≤ MAX_TICKS)
        decides; the later blocks' own draws (``σ₁/(d_j·r_j)``, above ``σ₁`` where ``d_j·r_j < 1``)
        are checked too.
        Raises :class:`BudgetOutOfRange` (the planner then passes ``blt`` over)."""
        e = (MAX_TICKS // self.horizon + 1).bit_length() - 1  # (2^e − 1)·T < MAX_TICKS at e
        while ((1 << e) - 1) * self.horizon >= MAX_TICKS:
            e -= 1
        try:
            if self.horizon < MAX_TICKS:  # a second block exists: its ticks draw σ₁/(d_j·r_j)
                validate_sigma(self.sigma_units1 / min(1.0, float(np.min(self._divisor))))
            if e >= 1:
                self.epoch_noise(1 << e)
        except ValueError as exc:
            raise BudgetOutOfRange(
                f"rho {self.privacy.rho!r} is too small for blt at p = 1: the noise of the later "
                f"blocks or of the super levels (last epoch {e}, blocks of {self.horizon} ticks) "
                f"would leave the sampler's range ({exc}); use a larger rho or another "
                "strategy") from None

    def _block_curve(self, sigma: float) -> np.ndarray:
        """``p = 1``: the release variance at block positions ``0..T−1`` (units²) when the
        block's noise has scale ``sigma`` in the scaled domain (``σ/(d_j·r_j)`` drawn at position
        ``j``; ``r = 1`` without row scales)."""
        assert self.scales is not None
        per_tick = sigma / self._divisor
        if float(np.min(per_tick)) >= 64.0:
            # discrete_gaussian_variance(σ/(d_j·r_j)) is (σ/(d_j·r_j))² there, so every scaled
            # draw d_j·Z has variance σ²/r_j²: one unit curve serves both budgets (epoch 0 and
            # later epochs)
            unit = getattr(self, "_unit_curve", None)
            if unit is None:
                u = (np.ones(len(self.scales)) if self.rows is None
                     else 1.0 / (self.rows * self.rows))
                unit = _plan.scaled_variance_curve(self.theta, self.w, self.scales, u)
                self._unit_curve = unit
            out: np.ndarray = sigma * sigma * unit
            return out
        var = np.array([discrete_gaussian_variance(float(v)) for v in per_tick])  # pragma: no cover - ρ ≳ 2^40
        return _plan.scaled_variance_curve(self.theta, self.w, self.scales,  # pragma: no cover
                                           var * self.scales * self.scales)

    def describe(self) -> dict[str, Any]:
        """Base description plus the filter ``(θ, w)``, the unit ``h``, ``σ`` and the slack
        (``p = 1``: and the column-scale table's SHA-256, with row scales theirs too; ``p < 1``
        with start rows: both start tables' — so a worker computing another table refuses the
        checkpoint instead of mixing noise)."""
        return super().describe() | {
            "family": "blt",
            "theta": np.asarray(self.theta, dtype=np.float64),
            "w": np.asarray(self.w, dtype=np.float64),
            "unit": self.unit,
            "sigma_units": self.sigma_units,
            "clip_units": self.clip,
            "slack_units": self.slack_units,
            "max_ticks": MAX_TICKS,
        } | ({"block_ticks": self.horizon, "super_share": SUPER_SHARE,
              "column_scales": "equalised-v1" if self.rows is None else "row-equalised-v1",
              "column_scales_sha256": hashlib.sha256(
                  np.ascontiguousarray(self.scales, dtype="<f8").tobytes()).hexdigest(),
              "super_allocation": "linear", "sigma_units_later": self.sigma_units1}
             if self.super else {}) | ({
                 "row_scales": f"fit-v{_plan.ROWS_VERSION}",
                 "row_scales_sha256": hashlib.sha256(
                     np.ascontiguousarray(self.rows, dtype="<f8").tobytes()).hexdigest()}
             if self.rows is not None and self.super else {}) | ({
                 "start_rows": f"fit-v{_plan.START_VERSION}",
                 "start_rows_sha256": hashlib.sha256(
                     np.ascontiguousarray(self.rows, dtype="<f8").tobytes()).hexdigest(),
                 "start_column_scales_sha256": hashlib.sha256(
                     np.ascontiguousarray(self.scales, dtype="<f8").tobytes()).hexdigest()}
             if self.rows is not None and not self.super else {}) | ({
                 "first_horizon": f"restart-v{_plan.FIRST_VERSION}",
                 "first_column_scales_sha256": hashlib.sha256(
                     np.ascontiguousarray(self.scales, dtype="<f8").tobytes()).hexdigest()}
             if self.first else {})

    def epoch_noise(self, n_blocks: int) -> EpochNoise:
        """Super-level noise of a later epoch of ``n_blocks`` blocks (``p = 1``; units ``h``)."""
        return epoch_noise("zcdp", float(self.privacy.rho), self.d_units,
                           float(self._part1[-1]), int(n_blocks))

    def max_count(self) -> float:
        """Largest per-tick count: ``|D/h| < 2**52`` (exact int64 sum with the noise)."""
        return _MAX_UNITS * self.unit * (1.0 - 2.0**-40)

    def new_state(self, n_streams: int) -> State:
        n = check_n_streams(n_streams)
        state: State = {
            "tick": np.array(0, dtype=np.int64),
            "buffers": np.zeros((len(self.theta), n), dtype=np.float64),  # double-double: high
            "buffers_lo": np.zeros((len(self.theta), n), dtype=np.float64),  # ... and low parts
            "release": np.zeros(n, dtype=np.float64),
        }
        if self.super:
            m = self.max_super
            state |= {
                "carry": np.zeros(n, dtype=np.float64),  # estimate of the closed blocks (units)
                "base": np.zeros(n, dtype=np.float64),  # ... of the closed epochs
                "block_sum": np.zeros(n, dtype=np.float64),  # Σ y of the open block
                "block_hi": np.zeros(n, dtype=np.int64),  # its exact Σ x, two 32-bit limbs
                "block_lo": np.zeros(n, dtype=np.int64),
                "held": np.zeros((m, n), dtype=np.float64),  # held super-node estimates
                "held_hi": np.zeros((m, n), dtype=np.int64),  # and their exact totals
                "held_lo": np.zeros((m, n), dtype=np.int64),
            }
        return state

    def step(self, state: State, counts: Float64Array, noise: BoundNoise) -> Float64Array:
        t = int(state["tick"]) + 1
        if t > MAX_TICKS:
            raise ValueError(f"blt releases at most {MAX_TICKS} ticks (privacy slack); state unchanged")
        units = np.asarray(counts, dtype=np.float64) / self.unit
        if units.size and not float(np.max(np.abs(units))) < _MAX_UNITS:
            raise ValueError(
                f"counts too large for blt's unit (|D/h| must be < 2**52, h = {self.unit!r}); "
                "state unchanged"
            )
        x = np.rint(units).astype(np.int64)
        buffers = cast(Float64Array, state["buffers"])  # float64 arrays, updated in place
        buffers_lo = cast(Float64Array, state["buffers_lo"])
        sigma = self.sigma_units
        if self.super:
            index, j = divmod(t - 1, self.horizon)
            if j == 0:
                buffers[...] = 0.0  # a new block: the noise filter restarts
                buffers_lo[...] = 0.0
            if index:
                sigma = self.sigma_units1
        elif self.first and t - 1 == self.horizon:
            # blt-horizon: the planned first horizon ends; the filter restarts, so no event of
            # ticks 1..T moves a later tick's noise (their columns end at T)
            buffers[...] = 0.0
            buffers_lo[...] = 0.0
        # in place where the arrays are this tick's own (same operations, fewer temporaries)
        f = self.feedback(buffers)
        if not self.super:
            j = t - 1  # p < 1: the start rows' (first horizon's) table covers ticks 0..len−1
        if self.scales is not None and j < len(self.scales):  # d_j ≥ 1 at position j
            scale = float(self.scales[j])
            f /= scale
            n = (noise.discrete_gaussian(t, sigma / float(self._divisor[j]))
                 - np.rint(f, out=f).astype(np.int64))
            fed = n.astype(np.float64)
            fed *= scale  # the buffers filter the scaled noise d·N
        else:
            n = noise.discrete_gaussian(t, sigma) - np.rint(f, out=f).astype(np.int64)
            fed = n.astype(np.float64)
        y = x + n
        self.update_buffers(buffers, buffers_lo, np.clip(fed, -self.clip, self.clip, out=fed))
        if self.super:
            release = self._running_total(state, index, j, x, y, noise)
        else:
            release = y.astype(np.float64)
            release *= self.unit
            release += self.p * np.asarray(state["release"], dtype=np.float64)
        state["release"] = release
        state["tick"] = np.array(t, dtype=np.int64)
        return np.array(release, dtype=np.float64, copy=True)

    def feedback(self, buffers: Float64Array) -> Float64Array:
        """``f̂ = Σ_i w_i·s_i`` over the buffers' high parts, in float64 (units; the error bound
        is :attr:`float_error`)."""
        kernels = _fast.kernels
        if kernels is not None and buffers.flags.c_contiguous:  # one pass, same operations
            out: Float64Array = np.empty(buffers.shape[1], dtype=np.float64)
            kernels.dd_feedback(buffers, self._w_c, out)
            return out
        f: Float64Array = self.w[0] * buffers[0]
        for i in range(1, len(self.theta)):
            f = f + self.w[i] * buffers[i]
        return f

    def update_buffers(self, buffers: Float64Array, buffers_lo: Float64Array,
                       clipped: Float64Array) -> None:
        """``s_i ← θ_i·s_i + clip(N_t)`` in double-double arithmetic, in place (``clipped`` is a
        float64 integer, ``|clipped| ≤ clip``)."""
        kernels = _fast.kernels
        if (kernels is not None and buffers.flags.c_contiguous and buffers_lo.flags.c_contiguous
                and clipped.flags.c_contiguous):
            # _dd.mul then _dd.add, operation by operation, in one pass (stream_dp/csrc)
            kernels.dd_update(buffers, buffers_lo, self._theta_c, clipped)
            return
        for i in range(len(self.theta)):
            hi, lo = _dd.mul(buffers[i], buffers_lo[i], float(self.theta[i]))
            buffers[i], buffers_lo[i] = _dd.add(hi, lo, clipped)

    def _running_total(self, state: State, index: int, j: int, x: np.ndarray, y: np.ndarray,
                       noise: BoundNoise) -> np.ndarray:
        """``p = 1``: the closed blocks' estimate plus the open block's noisy sum; at a block's
        end, fold it into the epoch's super levels."""
        block_sum = y.astype(np.float64)
        hi = np.zeros_like(x)
        lo = np.zeros_like(x)
        if j:
            block_sum += np.asarray(state["block_sum"], dtype=np.float64)
            hi = np.asarray(state["block_hi"], dtype=np.int64)
            lo = np.asarray(state["block_lo"], dtype=np.int64)
        hi, lo = add_limbs(hi, lo, x)
        carry = np.asarray(state["carry"], dtype=np.float64)
        release: np.ndarray = (carry + block_sum) * self.unit
        state["block_sum"], state["block_hi"], state["block_lo"] = block_sum, hi, lo
        if j == self.horizon - 1:
            state["carry"] = fold_block(
                state, index, 1, block_sum, hi, lo, self.epoch_noise,
                lambda node, scale: noise.discrete_gaussian(node, scale))
        return release

    def _curve(self, n: int) -> Float64Array:
        """``variance`` at ticks ``1..n``: a prefix of a cached cumulative curve, grown by
        doubling (a bank asks for the next tick's standard error at every release)."""
        cum = getattr(self, "_cum", None)
        if cum is None or len(cum) < n:
            size = max(n, 2 * (0 if cum is None else len(cum)), 1024)
            cum = _unit_cum(self.p, self.theta, self.w, self.scales, self.rows, size, self.first)
            cum.setflags(write=False)
            self._cum = cum
        out: Float64Array = self.unit_variance * cum[:n]
        return out

    def mse_curve(self, horizon: int) -> Float64Array:
        if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
            raise ValueError(f"horizon must be an integer ≥ 1, got {horizon!r}")
        if self.super:
            out: Float64Array = self.unit**2 * super_variance_curve(
                self._part0, self._part1, 1, self.epoch_noise, int(horizon))
            return out
        return self._curve(int(horizon))

    def variance(self, t: int) -> float:
        """Exact variance of the release at tick ``t`` (``p < 1``, ``t > 2**22``: the value at
        ``2**22``, the remaining terms being negligible)."""
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
            raise ValueError(f"t must be an integer ≥ 1, got {t!r}")
        if self.super:
            return self.unit**2 * super_variance_at(
                int(t), self.horizon, 1, self._part0, self._part1, self.epoch_noise)
        return float(self._curve(min(int(t), _CONVERGED))[-1])

    def error_stays_bounded(self) -> bool:
        # p < 1: bounded; p = 1: blocks in doubling epochs with super levels (polylogarithmic)
        return True

    def sensitivity(self) -> float:
        """L2 sensitivity of the noisy measurements (value units), slack included."""
        return math.sqrt(self._shift_sq) * self.unit

    def _abs_ticks(self) -> int:
        """``p < 1``: ticks over which ``Σ|b_k|`` (and the start rows' row sums) are taken: past
        the table and ``64/(1 − p)`` ticks (``b_k`` then below ``e⁻⁶⁴`` of its start), at most
        :data:`_CONVERGED` (2¹⁶ before: 3·10⁻⁷ short at p = 0.9999)."""
        table = 0 if self.scales is None else 2 * len(self.scales)
        return min(_CONVERGED, max(self.horizon, 1 << 16, table,
                                   math.ceil(64.0 / (1.0 - self.p))))

    def rounding_bound(self, ticks: int | None = None) -> float:
        """``h·(½·Σ p^k + (½ + E)·Σ|b_k|)`` over ``ticks`` (default: ``horizon``) ticks for
        ``p = 1``, else :meth:`_abs_ticks`: count rounding and feedback rounding, both
        filtered (at ``p = 1`` the filter restarts every block, so ``Σ|b_k|`` over one block per
        block started; with the column scaling the rows of ``W·D⁻¹C⁻¹·D`` replace ``Σ|b_k|``)."""
        if self.first:
            # blt-horizon: a row t ≥ T of the restarted operator is p^(t−T+1) times row T − 1 of
            # the first horizon's W·D⁻¹C⁻¹·D plus a row of the fresh plain filter (Σ|b_k|)
            assert self.scales is not None
            b = _plan.reconstruction(self.p, self.theta, self.w, self._abs_ticks())
            rows = (_plan.scaled_abs_rows(self.p, self.theta, self.w, self.scales)
                    + float(np.sum(np.abs(b))))
            return self.unit * (0.5 / (1.0 - self.p) + (0.5 + self.float_error) * rows)
        if self.scales is not None and not self.super:
            # p < 1 with start rows: rows of W·D⁻¹C⁻¹·D (Abel bound, |p^(L−l)·b_l| ≤ |b_l|) with
            # D = I past the table
            n = self._abs_ticks()
            d = np.ones(n)
            d[: len(self.scales)] = self.scales
            rows = _plan.scaled_abs_rows(self.p, self.theta, self.w, d)
            return self.unit * (0.5 / (1.0 - self.p) + (0.5 + self.float_error) * rows)
        if self.scales is not None:  # p = 1: rows of W·D⁻¹C⁻¹·D (Abel bound), one per block
            n_ticks = self.horizon if ticks is None or ticks <= self.horizon else int(ticks)
            blocks = -(-n_ticks // self.horizon)
            rows = _plan.scaled_abs_rows(1.0, self.theta, self.w, self.scales)
            return self.unit * (0.5 * n_ticks + blocks * (0.5 + self.float_error) * rows)
        n = self.horizon if self.p == 1.0 else self._abs_ticks()
        b = _plan.reconstruction(self.p, self.theta, self.w, n)
        decay = float(n) if self.p == 1.0 else 1.0 / (1.0 - self.p)
        return self.unit * (0.5 * decay + (0.5 + self.float_error) * float(np.sum(np.abs(b))))


def _unit_cum(p: float, theta: np.ndarray, w: np.ndarray, scales: np.ndarray | None,
              rows: np.ndarray | None, n: int, first: bool = False) -> np.ndarray:
    """``p < 1``: the release variance at ticks ``1..n`` per unit of ``Var(Z)`` at scale σ
    (``Σ_(k<t) b_k²``; with start rows :func:`.plan.start_variance_curve`, with the planned
    first horizon :func:`.plan.first_variance_curve`)."""
    if first and scales is not None:
        return _plan.first_variance_curve(p, theta, w, scales, n)
    if rows is None or scales is None:
        b = _plan.reconstruction(p, theta, w, n)
        return np.cumsum(b * b)
    return _plan.start_variance_curve(p, theta, w, scales, rows, n)


def make(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> BltMechanism:
    """Factory registered as ``"blt"``."""
    return BltMechanism(p, horizon, privacy, cap)


class BltHorizonMechanism(BltMechanism):
    """``blt-horizon``: ``blt`` with, at p < 1, the first ``horizon`` ticks planned as a run of
    their own (the filter restarts once, after them; :func:`.plan.first_scales`)."""

    name = "blt-horizon"

    def __init__(self, p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> None:
        super().__init__(p, horizon, privacy, cap, first_horizon=True)


def make_horizon(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> BltMechanism:
    """Factory registered as ``"blt-horizon"`` (``auto`` does not pick it: it trades later
    horizons' error for this one's)."""
    return BltHorizonMechanism(p, horizon, privacy, cap)


def make_user_level(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> BltMechanism:
    """Factory of a user-level deployment: no start rows (they would stretch the correlation of
    a person's first event with the rest of their events by up to ``max d``, so the exact
    Toeplitz factor of :mod:`stream_dp.user_level.accounting` would not hold)."""
    return BltMechanism(p, horizon, privacy, cap, start_rows=False)


def _register() -> None:
    from stream_dp.strategies.registry import register

    register("blt", make, models=("zcdp",), user_level_factory=make_user_level)
    register("blt-horizon", make_horizon, models=("zcdp",), user_level_factory=make_user_level,
             auto=False)


_register()
