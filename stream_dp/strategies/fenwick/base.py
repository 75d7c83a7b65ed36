"""The Fenwick-tree release mechanism shared by ``dm``, ``dmfda`` and ``fenwick-opt``.

A strategy supplies per-node weights ``a_k > 0`` (``k = 1..n`` in an epoch of ``n`` ticks; the
diagonal ``Λ`` of paper 004). At tick ``τ`` of the epoch the mechanism measures the single new
node ``τ``::

    y_τ = round_to_grid(a_τ · S_τ / g) + Z_τ,   Z_τ ~ discrete Laplace(scale = Δ / (ε g))

in grid units, and releases ``s = p^τ · carry + Σ_{k on query path of τ} p^(τ−k) · g·y_k / a_k``,
i.e. exactly ``B Λ⁻¹ (g·round(ΛLD/g) + g·z)`` (eq. 18), from the noisy measurements only.

**Per-tick cost.** Two arrays of shape ``(levels, S)`` (stream axis last): ``S[i]`` = true sum of
the newest node of level ``i``, ``R[i]`` = reconstructed release at that node. The new node needs
``S_τ = D_τ + Σ_{i < level(τ)} p^(2^i) S[i]`` (amortised two vector operations) and the release
is ``R_τ = Ŝ_τ + p^lowbit(τ) · R[level(τ − lowbit τ)]`` (one), so a tick is O(S) work with no
Python loop over streams.

**Grid and sensitivity.** ``g`` is the largest power of two ``≤ cap / (2·levels) / 2**17``.
Each measured coordinate an event touches gets a slack of 2 grid units: one for rounding and one
for the evaluation error of ``a·S/g`` on the two neighbouring inputs (≤ 1/2 unit each):

* node sums are kept and combined in **double-double** arithmetic (:mod:`stream_dp.strategies._dd`,
  ~106 bits; every operand is non-negative), and the measurement ``a·S/g`` is evaluated in it
  too and rounded to two float64 integers ``(m_hi, m_lo)``; the noise is added to ``m_lo``, so
  the noisy measurement is an exact integer of any size. Over ``L`` levels the relative error of
  ``a·S/g`` is at most ``(2L + 3)·2**-102``, so ``|a·S/g|`` up to ``2**100 / (2(L+2)²)`` grid
  units (rounded down to a power of two; 2**90 for 20 levels) is off by less than 1/2 unit:
  node values up to about 10^19 caps, i.e. ≥ 10^12 caps per tick at every ``p`` and horizon;
* ``p < 1``: the decay factors ``p^(2^i)`` are float64 roundings, so the functional actually
  measured has coefficients within a relative ``L·2**-51`` of the exact ``p^(k−j)``; the
  sensitivity's data term is therefore scaled by ``1 + 2**-40`` (it concerns the *difference* of
  neighbouring inputs, one count of size ≤ ``cap``, not the node values);
* ``p = 1``: counts are first rounded to the grid (an event then changes a count by at most
  ``cap + g``, which the sensitivity uses), so every ``S`` is an exact multiple of ``g`` (exact in
  double-double) and only the final product by ``a`` rounds.

:meth:`step` raises ``ValueError`` with the state unchanged when a node leaves its range. The
L1 sensitivity is the exact ``max_j Σ_{k on update path of j} (cap'·a_k·p^(k−j) + 2g)`` (``cap'``
= ``cap``, or ``cap + g`` for ``p = 1``) — at most ``cap·(1 + 2**-16)`` for weights whose column
sums are ≤ 1.

**Epochs.** For ``p < 1`` every epoch has ``horizon`` ticks; at the roll the last release is carried
(``s ← p^τ·s_last``, post-processing). For ``p = 1`` epochs double (Chan–Shi–Song's hybrid
mechanism): epoch ``e`` has ``B·2^e`` ticks with ``B`` the smallest power of two ≥ ``horizon``, so the
carried value is the epoch's single root node and the error stays polylogarithmic in ``t``.
Epoch lengths stop doubling at ``max(B, 2**24)`` ticks (bounded memory for the per-epoch weights);
beyond ≈ 2**24·2 ticks the carried variance grows by one root-node variance per epoch.

Noise node ids are the global tick numbers (one node measured per tick), unique per stream.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream_dp.budget import Privacy
from stream_dp.mechanism import BoundNoise, Float64Array, Mechanism, State
from stream_dp.noise.grid import choose_grid
from stream_dp.noise.laplace import MIN_SCALE
from stream_dp.strategies import _dd
from stream_dp.strategies._common import (
    RESOLUTION_BITS,
    check_cap,
    check_horizon,
    check_n_streams,
    check_noise_scale,
    check_p,
    check_pure,
    discrete_laplace_variance,
)
from stream_dp.strategies.fenwick.plan import column_sums, levels_for, query_sums

#: Relative inflation of the sensitivity's data term for ``p < 1`` (float64 decay factors).
COEFFICIENT_SLACK = 2.0**-40


def max_measured_units(levels: int, p: float) -> float:
    """Largest ``|a·S/g|`` whose double-double evaluation error stays below 1/2 grid unit:
    ``2**100 / (2(L+2)²)`` rounded down to a power of two (see module doc; ``p`` is accepted for
    the callers' convenience, the bound is the same for every ``p``)."""
    bound = 2.0**100 / (2.0 * (levels + 2) ** 2)
    return math.ldexp(1.0, math.frexp(bound)[1] - 1)


#: Slack per measured coordinate an event touches, in grid units (rounding + float evaluation).
SLACK_UNITS = 2.0
#: Epoch lengths for p = 1 stop doubling here (unless the first epoch is already longer).
MAX_DOUBLING_EPOCH = 1 << 24


@dataclass(frozen=True)
class EpochPlan:
    """Everything fixed for an epoch of ``n`` ticks (same for every stream)."""

    n: int
    levels: int
    grid: float
    max_colsum: float
    sensitivity: float
    scale_units: float
    unit_variance: float
    ppow: tuple[float, ...]
    max_units: float

    @property
    def measurement_variance(self) -> float:
        """Variance of one noisy measurement ``g·y_k`` (value units², before dividing by a_k)."""
        return self.grid * self.grid * self.unit_variance


class FenwickMechanism(Mechanism):
    """Fenwick strategy with per-node weights supplied by a subclass (see module docstring)."""

    def __init__(self, p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> None:
        self.p = check_p(p)
        self.horizon = check_horizon(horizon)
        self.cap = check_cap(cap)
        self.privacy = check_pure(privacy, self.name)
        self.epsilon = self.privacy.epsilon
        self._plans: dict[int, EpochPlan] = {}
        self._weights_cache: dict[int, Float64Array] = {}
        self._curves: dict[int, Float64Array] = {}
        self._base = 1 << (self.horizon - 1).bit_length()  # smallest power of two ≥ horizon
        self._max_epoch = max(self._base, MAX_DOUBLING_EPOCH)

    # ------------------------------------------------------------------ strategy hooks
    @abstractmethod
    def _compute_weights(self, n: int) -> Float64Array:
        """Weights ``a_1..a_n`` (all > 0) for an epoch of ``n`` ticks."""

    def weights(self, n: int) -> Float64Array:
        """Cached, read-only weights of an epoch of ``n`` ticks (the diagonal Λ)."""
        w = self._weights_cache.get(n)
        if w is None:
            w = np.ascontiguousarray(self._compute_weights(n), dtype=np.float64)
            if w.shape != (n,) or not np.all(np.isfinite(w)) or not np.all(w > 0):
                raise AssertionError(f"{self.name}: weights must be {n} finite values > 0")
            w.setflags(write=False)
            self._weights_cache[n] = w
        return w

    def describe(self) -> dict[str, Any]:
        """Base description plus the Fenwick layout: epoch lengths, the first epoch's grid,
        noise scale, value range, and its weights (the diagonal Λ, exact bytes hashed).

        Later epochs (p = 1 doubling) derive their weights from these same inputs.
        """
        n = self.epoch_of(1)[2]
        plan = self.plan(n)
        return super().describe() | {
            "family": "fenwick",
            "epoch_base": self._base,
            "epoch_max": self._max_epoch,
            "first_epoch": n,
            "levels": plan.levels,
            "grid": plan.grid,
            "scale_units": plan.scale_units,
            "max_units": plan.max_units,
            "slack_units": SLACK_UNITS,
            "resolution_bits": RESOLUTION_BITS,
            "arithmetic": "double-double",
            "coefficient_slack": COEFFICIENT_SLACK if self.p < 1.0 else 0.0,
            "weights": self.weights(n),
        }

    def max_count(self) -> float:
        """Largest per-tick count ``D`` with every node value in range, forever.

        ``p < 1``: node ``τ`` sums at most ``lowbit(τ)`` decayed counts, so it stays in range iff
        ``D·a_τ·Σ_{i<lowbit τ} p^i < max_units·g`` (every epoch has the same plan).
        ``p = 1``: counts are rounded to the grid (≤ ``D + g/2``) and node ``τ`` sums
        ``lowbit(τ) ≤ n`` of them; the bound is taken over every epoch length up to the largest
        (``max(B, 2**24)``), with ``max(1, a) ≤ max(1, max a of the first epoch)`` — the
        weights of ``dm``, ``dmfda`` and ``fenwick-opt`` are ≤ 1 (own column sum ≤ 1).
        """
        if self.p < 1.0:
            n = self.horizon
            plan = self.plan(n)
            w = self.weights(n)
            tau = np.arange(1, n + 1, dtype=np.int64)
            low = (tau & -tau).astype(np.float64)
            geo = -np.expm1(low * math.log(self.p)) / -math.expm1(math.log(self.p))
            worst = float(np.max(w * geo))
            return plan.max_units * plan.grid / worst * (1.0 - 2.0**-40)
        a_bound = max(1.0, float(np.max(self.weights(self.epoch_of(1)[2]))))
        best = math.inf
        n = self._base
        while True:
            grid = choose_grid(self.cap / (SLACK_UNITS * levels_for(n)),
                               resolution_bits=RESOLUTION_BITS)
            units = max_measured_units(levels_for(n), 1.0)
            best = min(best, units * grid / (a_bound * n) - grid / 2)
            if n >= self._max_epoch:
                break
            n = min(2 * n, self._max_epoch)
        return best * (1.0 - 2.0**-40)

    # ------------------------------------------------------------------ epochs and plans
    def epoch_of(self, t: int) -> tuple[int, int, int]:
        """``(epoch index, ticks before the epoch, epoch length)`` for global tick ``t ≥ 1``."""
        if t < 1:
            raise ValueError(f"t must be an integer ≥ 1, got {t!r}")
        if self.p < 1.0:
            e = (t - 1) // self.horizon
            return e, e * self.horizon, self.horizon
        b = self._base
        q = (t - 1) // b + 1
        e = q.bit_length() - 1
        n = b << e
        if n <= self._max_epoch:
            return e, b * ((1 << e) - 1), n
        # Doubling stopped: epochs of fixed length after the last doubled one.
        e_cap = (self._max_epoch // b).bit_length() - 1
        start_fixed = b * ((1 << (e_cap + 1)) - 1)
        k = (t - 1 - start_fixed) // self._max_epoch
        return e_cap + 1 + k, start_fixed + k * self._max_epoch, self._max_epoch

    def plan(self, n: int) -> EpochPlan:
        """Grid, exact sensitivity and noise scale for an epoch of ``n`` ticks (cached)."""
        cached = self._plans.get(n)
        if cached is not None:
            return cached
        levels = levels_for(n)
        grid = choose_grid(self.cap / (SLACK_UNITS * levels), resolution_bits=RESOLUTION_BITS)
        sums, lengths = column_sums(self.weights(n), self.p)
        # p = 1: counts rounded to g; p < 1: float64 decay factors (module docstring)
        cap_eff = self.cap + grid if self.p == 1.0 else self.cap * (1.0 + COEFFICIENT_SLACK)
        sens = float(np.max(cap_eff * sums + SLACK_UNITS * grid * lengths))
        scale = check_noise_scale(
            sens / (self.epsilon * grid), MIN_SCALE, f"epsilon = {self.epsilon!r}"
        )
        plan = EpochPlan(
            n=n,
            levels=levels,
            grid=grid,
            max_colsum=float(np.max(sums)),
            sensitivity=sens,
            scale_units=scale,
            unit_variance=discrete_laplace_variance(scale),
            ppow=tuple(self.p ** (1 << i) for i in range(levels)),
            max_units=max_measured_units(levels, self.p),
        )
        self._plans[n] = plan
        return plan

    def curve(self, n: int) -> Float64Array:
        """Release variance within one epoch of ``n`` ticks, carry excluded: ``τ = 1..n``."""
        c = self._curves.get(n)
        if c is None:
            plan = self.plan(n)
            c = plan.measurement_variance * query_sums(self.weights(n), self.p, 2.0)
            c.setflags(write=False)
            self._curves[n] = c
        return c

    # ------------------------------------------------------------------ Mechanism API
    def new_state(self, n_streams: int) -> State:
        n_streams = check_n_streams(n_streams)
        levels = self.plan(self.epoch_of(1)[2]).levels
        return {
            "tick": np.array(0, dtype=np.int64),
            "S": np.zeros((levels, n_streams), dtype=np.float64),
            "S_lo": np.zeros((levels, n_streams), dtype=np.float64),
            "R": np.zeros((levels, n_streams), dtype=np.float64),
            "carry": np.zeros(n_streams, dtype=np.float64),
            "release": np.zeros(n_streams, dtype=np.float64),
        }

    def step(self, state: State, counts: Float64Array, noise: BoundNoise) -> Float64Array:
        t = int(state["tick"]) + 1
        _, start, n = self.epoch_of(t)
        tau = t - start
        plan = self.plan(n)
        w = self.weights(n)
        S = state["S"]
        S_lo = state["S_lo"]
        R = state["R"]
        roll = tau == 1 and t > 1
        if roll and S.shape[0] != plan.levels:
            S = np.zeros((plan.levels, S.shape[1]), dtype=np.float64)
            S_lo = np.zeros_like(S)
            R = np.zeros_like(S)
        ell = (tau & -tau).bit_length() - 1
        if self.p == 1.0:  # counts on the grid: every S is an exact multiple of g
            hi = np.asarray(counts, dtype=np.float64) / plan.grid
            np.rint(hi, out=hi)
            hi *= plan.grid
        else:
            hi = np.array(counts, dtype=np.float64, copy=True)
        lo = np.zeros_like(hi)
        for i in range(ell):  # S_tau = D_tau + sum_i p^(2^i) S[i], in double-double
            if self.p == 1.0:
                hi, lo = _dd.add(hi, lo, S[i], S_lo[i])
            else:
                m_hi, m_lo = _dd.mul(S[i], S_lo[i], plan.ppow[i])
                hi, lo = _dd.add(hi, lo, m_hi, m_lo)
        a = float(w[tau - 1])
        big = max(float(hi.max()), -float(hi.min())) if hi.size else 0.0
        limit = plan.max_units * plan.grid / (max(1.0, a) if self.p == 1.0 else a)
        if big >= limit:
            raise ValueError(
                f"counts too large for {self.name}: a node value reached {big:.6g}, above the "
                f"mechanism's range {limit:.6g} (cap={self.cap}); state unchanged"
            )
        # the measured value a*S/g in grid units (double-double; g is a power of two), rounded
        # to two float64 integers; the integer noise goes to the low part (exact)
        u_hi, u_lo = _dd.mul(hi, lo, a)
        y_hi, y_lo = _dd.round_split(u_hi / plan.grid, u_lo / plan.grid)
        y_lo += noise.discrete_laplace(t, plan.scale_units)
        est = y_hi + y_lo  # the correctly rounded noisy integer measurement
        est *= plan.grid / a  # the noisy estimate of S_tau (post-processing)
        low = 1 << ell
        if tau != low:
            upper = tau - low
            est += plan.ppow[ell] * R[((upper & -upper).bit_length() - 1)]
        carry = np.asarray(state["release"] if roll else state["carry"], dtype=np.float64)
        release = est + (self.p**tau) * carry if t > tau else est.copy()
        # Commit (nothing above mutated the state).
        if roll:
            state["carry"] = np.array(carry, dtype=np.float64, copy=True)
            state["S"], state["S_lo"], state["R"] = S, S_lo, R
        S[ell] = hi
        S_lo[ell] = lo
        R[ell] = est
        state["release"] = release
        state["tick"] = np.array(t, dtype=np.int64)
        return release.copy()

    def _epoch_variance(self, n: int, tau: int) -> float:
        """Release variance at tick ``tau`` of an epoch of ``n`` ticks, carry excluded, O(log n)."""
        w = self.weights(n)
        total = 0.0
        k = tau
        while k > 0:
            total += (self.p ** (2 * (tau - k))) / (float(w[k - 1]) ** 2)
            k -= k & -k
        return self.plan(n).measurement_variance * total

    def _carry_variance(self, epoch: int) -> float:
        """Variance of the value carried into ``epoch`` (the last release of the previous one)."""
        var = 0.0
        t = 0
        for _ in range(epoch):
            _, _, n = self.epoch_of(t + 1)
            var = self._epoch_variance(n, n) + (self.p ** (2 * n)) * var
            t += n
        return var

    def variance(self, t: int) -> float:
        e, start, n = self.epoch_of(t)
        tau = t - start
        v = self._epoch_variance(n, tau)
        if e > 0:
            v += (self.p ** (2 * tau)) * self._carry_variance(e)
        return v

    def mse_curve(self, horizon: int) -> Float64Array:
        out = np.empty(horizon, dtype=np.float64)
        done = 0
        carry = 0.0
        while done < horizon:
            _, _, n = self.epoch_of(done + 1)
            m = min(n, horizon - done)
            c = self.curve(n)
            tau = np.arange(1, m + 1, dtype=np.float64)
            out[done : done + m] = c[:m] + np.power(self.p, 2.0 * tau) * carry
            carry = float(c[n - 1]) + (self.p ** (2 * n)) * carry
            done += m
        return out

    def sensitivity(self) -> float:
        return self.plan(self.epoch_of(1)[2]).sensitivity

    def rounding_bound(self, ticks: int | None = None) -> float:
        """Bound on the grid-rounding bias of any release.

        ``p < 1``: valid for every tick. ``p = 1``: the bias of carried epoch totals accumulates
        (by at most half a grid unit over the root weight per epoch) and so does the rounding of
        the counts to the grid (none for counts on the grid, e.g. integers), so the bound covers
        the first ``ticks`` ticks (default: the first epoch).
        """

        def epoch_bound(n: int) -> tuple[float, float]:
            g = self.plan(n).grid
            r = 0.5 * g * query_sums(self.weights(n), self.p, 1.0)
            return float(np.max(r)), float(r[n - 1])

        if self.p < 1.0:
            worst, end = epoch_bound(self.horizon)
            pn = self.p**self.horizon
            return worst + (end / (1.0 - pn) if pn < 1.0 else math.inf)
        limit = self._base if ticks is None else int(ticks)
        total = 0.0
        worst_all = 0.0
        t = 0
        while t < limit:
            _, _, n = self.epoch_of(t + 1)
            worst, end = epoch_bound(n)
            worst_all = max(worst_all, total + worst)
            total += end
            t += n
        # plus the rounding of the counts to the grid (zero for counts on the grid, e.g. integers)
        return worst_all + 0.5 * self.plan(self.epoch_of(1)[2]).grid * limit
