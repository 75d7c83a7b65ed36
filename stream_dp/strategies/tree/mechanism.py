"""``tree`` and ``binary-tree``: sparse dyadic hierarchies with the causal Honaker estimate.

The mathematics (level sets, weights, exact variance, plan search) is in :mod:`stream_dp.strategies.tree.plan`.
``tree`` uses the plan minimising the exact mean release variance for ``(p, horizon, model)``
(cached on disk); ``binary-tree`` keeps every level ``0..⌊log2 horizon⌋`` with equal weights (the
classic binary mechanism with Honaker's estimate), as a baseline.

**Measurements.** Level ``i`` (blocks of ``b_i = 2**ℓ_i`` ticks) measures, when a block completes,
``y = round_to_grid(w_i·S / g) + Z`` in grid units, ``S`` the block's decayed sum (cap units)
and ``Z`` exact discrete Laplace (pure ε-DP) or discrete Gaussian (ρ-zCDP) noise, the same scale
for every level; the weights ``w`` have unit L1 (pure) or L2 (zCDP) norm.

**Sensitivity.** One event of size ``cap`` changes one coordinate per level by at most
``cap·w_i`` (exactly ``cap·w_i`` when its tick ends a top block), plus 2 grid units of slack per
coordinate: one for rounding, one for the evaluation error of ``w·S`` on both neighbours. The
block sums are kept in **double-double** arithmetic (:mod:`stream_dp.strategies._dd`, ~106
bits, non-negative operands) and built **lazily**: level ``i ≥ 1`` is updated only when a block
of level ``i − 1`` completes, ``R_i ← p^(b_(i−1))·R_i + S_(i−1)`` (``p^b`` a double-double power),
so a tick updates about one level instead of all of them (level 0 is one tick, ``S_0 = D``).
Along the way to a top block's sum there are at most ``b_top`` such folds, each off by a relative
``≤ 3·2**-102`` (power, product, sum), and ``w·S/g`` is evaluated in double-double too and rounded
to two float64 integers to which the integer noise is added (the noisy measurement is an exact
integer of any size). :meth:`step` keeps every ``|w·R/g|`` below ``2**97/b_top`` grid units, so
each evaluation is off by < 1/8 unit, raising ``ValueError`` with the state unchanged
otherwise). L1: ``cap + 2mg``; L2: ``cap + 2√m·g``. Noise: discrete Laplace with
scale ``Δ₁/(ε g)`` grid units (ε-DP), discrete Gaussian with ``σ = Δ₂/(√(2ρ) g)`` (ρ-zCDP,
Canonne–Kamath–Steinke). Grid ``g``: largest power of two ≤ (noise scale without slack)/2**17.

**State** (stream axis last): ``raw[i]``/``raw_lo[i]`` (double-double) the decayed sum of the
open level-``i`` block's completed children, as of the last child's completion (``raw[0]`` is
unused: level 0 is one tick),
``acc[i]`` decayed sum of the estimates of the completed level-``i`` blocks inside the open
parent (all completed top blocks for the top level), ``release``: ``2m + 1`` floats per stream.
No epochs: the structure is periodic and the stream may run forever (noise node ids
``(level << 40) | block index`` are unique up to 2**40 ticks). For ``p = 1`` the error grows
linearly in the number of completed top blocks (see :meth:`variance`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.mechanism import BoundNoise, Float64Array, Mechanism, State
from stream_dp.noise.gaussian import MIN_SIGMA, discrete_gaussian_variance
from stream_dp.noise.grid import choose_grid
from stream_dp.noise.laplace import MIN_SCALE, discrete_laplace_variance
from stream_dp.strategies import _dd
from stream_dp.strategies._common import (
    MAX_GRID_BUDGET,
    RESOLUTION_BITS,
    check_cap,
    check_horizon,
    check_n_streams,
    check_noise_scale,
    check_p,
)
from stream_dp.strategies.tree.plan import (
    Model,
    TreePlan,
    best_plan,
    binary_plan,
    level_coefficients,
    node_variances,
    rounding_bounds,
)

__all__ = ["BinaryTreeMechanism", "TreeMechanism", "make", "make_binary"]

#: |w·R/g| must stay below this divided by the longest block (double-double evaluation error
#: < 1/8 grid unit).
MAX_MEASURED_UNITS = float(2**97)
#: Slack per measured coordinate an event touches, in grid units (rounding + float evaluation).
SLACK_UNITS = 2.0
_NODE_SHIFT = 40


def _model(privacy: Privacy, strategy: str) -> Model:
    if isinstance(privacy, PureDP):
        return "pure"
    if isinstance(privacy, ZCDP):
        return "zcdp"
    raise ValueError(
        f"privacy for strategy {strategy!r} must be PureDP(epsilon) or ZCDP(rho), got {privacy!r}"
    )


class TreeMechanism(Mechanism):
    """Sparse dyadic hierarchy, per-level weights, causal Honaker estimate (pure DP or zCDP)."""

    name = "tree"

    def __init__(
        self,
        p: float,
        horizon: int,
        privacy: Privacy,
        cap: float = 1.0,
        plan: TreePlan | None = None,
    ) -> None:
        self.p = check_p(p)
        self.horizon = check_horizon(horizon)
        self.cap = check_cap(cap)
        self.model = _model(privacy, self.name)
        self.privacy = privacy
        if plan is None:
            plan = self._default_plan()
        self.plan = plan.normalised(self.model)
        self.levels = self.plan.levels
        self.weights = np.asarray(self.plan.weights, dtype=np.float64)
        m = len(self.levels)
        if self.model == "pure":
            assert isinstance(privacy, PureDP)
            base = self.cap / min(privacy.epsilon, MAX_GRID_BUDGET)
            self.grid = choose_grid(base, resolution_bits=RESOLUTION_BITS)
            l1 = float(np.sum(self.weights))  # 1 up to float rounding
            self._sensitivity = self.cap * max(1.0, l1) + SLACK_UNITS * m * self.grid
            self.scale_units = check_noise_scale(
                self._sensitivity / (privacy.epsilon * self.grid),
                MIN_SCALE,
                f"epsilon = {privacy.epsilon!r}",
            )
            self.unit_variance = self.grid**2 * discrete_laplace_variance(self.scale_units)
        else:
            assert isinstance(privacy, ZCDP)
            root = math.sqrt(2.0 * privacy.rho)
            self.grid = choose_grid(
                self.cap / min(root, MAX_GRID_BUDGET), resolution_bits=RESOLUTION_BITS
            )
            l2 = math.sqrt(float(np.sum(self.weights * self.weights)))
            self._sensitivity = self.cap * max(1.0, l2) + SLACK_UNITS * math.sqrt(m) * self.grid
            self.scale_units = check_noise_scale(
                self._sensitivity / (root * self.grid), MIN_SIGMA, f"rho = {privacy.rho!r}"
            )
            self.unit_variance = self.grid**2 * discrete_gaussian_variance(self.scale_units)
        # value-unit variance of each level's estimate and Honaker own-measurement weights
        self.node_variance, self.alpha = node_variances(
            self.levels, self.weights, self.p, self.unit_variance
        )
        self._blocks = tuple(1 << lv for lv in self.levels)
        if self._blocks[0] != 1:  # pragma: no cover - every plan measures single ticks
            raise AssertionError("tree plans start with level 0 (blocks of one tick)")
        #: p^(b_(i−1)) per level i ≥ 1 as double-double (index 0 unused): the lazy fold's decay
        self._fold = ((1.0, 0.0), *(_dd.power(self.p, b) for b in self._blocks[:-1]))
        #: bound on |w·R/g| (grid units) keeping the evaluation error < 1/8 unit
        self.max_units = MAX_MEASURED_UNITS / float(self._blocks[-1])

    def _default_plan(self) -> TreePlan:
        return best_plan(self.p, self.horizon, self.model)

    def describe(self) -> dict[str, Any]:
        """Base description plus the plan (levels, normalised weights, Honaker weights), the
        grid, the noise scale and the value range."""
        return super().describe() | {
            "family": "tree",
            "model": self.model,
            "levels": list(self.levels),
            "weights": self.weights,
            "alpha": np.asarray(self.alpha, dtype=np.float64),
            "grid": self.grid,
            "scale_units": self.scale_units,
            "max_units": self.max_units,
            "slack_units": SLACK_UNITS,
            "arithmetic": "double-double, lazy folds",
            "node_shift": _NODE_SHIFT,
            "resolution_bits": RESOLUTION_BITS,
        }

    # ------------------------------------------------------------------ state and step
    def new_state(self, n_streams: int) -> State:
        n_streams = check_n_streams(n_streams)
        m = len(self.levels)
        return {
            "tick": np.array(0, dtype=np.int64),
            "raw": np.zeros((m, n_streams), dtype=np.float64),
            "raw_lo": np.zeros((m, n_streams), dtype=np.float64),
            "acc": np.zeros((m, n_streams), dtype=np.float64),
            "release": np.zeros(n_streams, dtype=np.float64),
        }

    def _sample(self, noise: BoundNoise, node: int) -> np.ndarray:
        if self.model == "pure":
            return noise.discrete_laplace(node, self.scale_units)
        return noise.discrete_gaussian(node, self.scale_units)

    def step(self, state: State, counts: Float64Array, noise: BoundNoise) -> Float64Array:
        t = int(state["tick"]) + 1
        if t >= 1 << _NODE_SHIFT:
            raise ValueError(f"tick must stay below 2**{_NODE_SHIFT} for tree; state unchanged")
        d = np.asarray(counts, dtype=np.float64)
        p = self.p
        raw: Float64Array = state["raw"]  # type: ignore[assignment]
        raw_lo: Float64Array = state["raw_lo"]  # type: ignore[assignment]
        acc: Float64Array = state["acc"]  # type: ignore[assignment]
        done = [i for i, b in enumerate(self._blocks) if t % b == 0]  # a prefix 0..c
        g = self.grid
        m = len(self._blocks)
        c = done[-1]
        # 1. everything that can fail, before any mutation (state unchanged on error): bounds of
        #    the sums this tick forms (the completed blocks 1..c and the fold into level c + 1)
        if d.size:
            bound = float(np.max(np.abs(d)))
            worst = bound * float(self.weights[0])
            for i in range(1, min(c + 1, m - 1) + 1):
                bound = self._fold[i][0] * float(np.max(np.abs(raw[i]))) + bound
                worst = max(worst, bound * float(self.weights[i]))
            if not worst / g < self.max_units:
                raise ValueError(
                    f"counts too large for tree's grid (|w·R/g| must stay < {self.max_units:.3g}, "
                    f"grid={g!r}); state unchanged"
                )
        meas = []
        cur_hi, cur_lo = d, np.zeros_like(d)  # S_0 = D (exact)
        for i in done:
            if i > 0:  # S_i = p^(b_(i−1))·R_i + S_(i−1), double-double
                f_hi, f_lo = self._fold[i]
                if p == 1.0:  # the fold's decay is exactly 1: skip the product
                    cur_hi, cur_lo = _dd.add(raw[i], raw_lo[i], cur_hi, cur_lo)
                else:
                    r_hi, r_lo = _dd.mul_dd(raw[i], raw_lo[i], f_hi, f_lo)
                    cur_hi, cur_lo = _dd.add(r_hi, r_lo, cur_hi, cur_lo)
            u_hi, u_lo = _dd.mul(cur_hi, cur_lo, float(self.weights[i]))
            y_hi, y_lo = _dd.round_split(u_hi / g, u_lo / g)
            y_lo += self._sample(noise, (i << _NODE_SHIFT) | (t // self._blocks[i]))
            meas.append((y_hi + y_lo) * (g / self.weights[i]))
        # 2. in-place update: the completed blocks' sums restart, the next level folds S_c in
        raw[1 : c + 1] = 0.0
        raw_lo[1 : c + 1] = 0.0
        if c + 1 < m:
            f_hi, f_lo = self._fold[c + 1]
            if p == 1.0:
                n_hi, n_lo = _dd.add(raw[c + 1], raw_lo[c + 1], cur_hi, cur_lo)
            else:
                r_hi, r_lo = _dd.mul_dd(raw[c + 1], raw_lo[c + 1], f_hi, f_lo)
                n_hi, n_lo = _dd.add(r_hi, r_lo, cur_hi, cur_lo)
            raw[c + 1] = n_hi
            raw_lo[c + 1] = n_lo
        acc *= p
        est = meas[0]
        for i in done[1:]:
            children = acc[i - 1] + est
            acc[i - 1] = 0.0
            a = float(self.alpha[i])
            est = a * meas[i] + (1.0 - a) * children
        acc[done[-1]] += est
        release = acc.sum(axis=0) if acc.shape[0] > 1 else acc[0].copy()
        state["release"] = release
        state["tick"] = np.array(t, dtype=np.int64)
        return np.array(release, dtype=np.float64, copy=True)

    def max_count(self) -> float:
        """Largest per-tick count ``D`` with every open block in range, forever: level ``i``'s
        open block holds at most ``b_i`` decayed counts, so ``D·w_i·Σ_{k<b_i} p^k/g`` must stay
        below ``max_units`` (the check in :meth:`step` is this bound)."""
        worst = 0.0
        for w, b in zip(self.weights.tolist(), self._blocks, strict=True):
            geo = float(b) if self.p == 1.0 else -math.expm1(b * math.log(self.p)) / -math.expm1(
                math.log(self.p)
            )
            worst = max(worst, w * geo)
        return self.max_units * self.grid / worst * (1.0 - 2.0**-40)

    # ------------------------------------------------------------------ exact figures
    def mse_curve(self, horizon: int) -> Float64Array:
        if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
            raise ValueError(f"horizon must be an integer ≥ 1, got {horizon!r}")
        out: Float64Array = self.node_variance @ level_coefficients(
            self.levels, self.p, int(horizon)
        )
        return out

    def variance(self, t: int) -> float:
        """Exact variance of the release at tick ``t`` (1-based; O(m) closed form)."""
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
            raise ValueError(f"t must be an integer ≥ 1, got {t!r}")
        total = 0.0
        lp = math.log(self.p)
        for i, lv in enumerate(self.levels):
            r = int(t) if i + 1 == len(self.levels) else int(t) % (1 << self.levels[i + 1])
            b = 1 << lv
            dd, rem = divmod(r, b)
            geo = (
                float(dd) if self.p == 1.0 else math.expm1(dd * 2 * b * lp) / math.expm1(2 * b * lp)
            )
            total += math.exp(2.0 * rem * lp) * geo * float(self.node_variance[i])
        return total

    def error_stays_bounded(self) -> bool:
        # p = 1: no doubling epochs here, so the error grows linearly past the horizon.
        return self.p < 1.0

    def sensitivity(self) -> float:
        """L1 (pure) or L2 (zCDP) sensitivity of the grid measurements, value units."""
        return self._sensitivity

    def rounding_bound(self) -> float:
        return rounding_bounds(
            self.plan,
            self.p,
            self.grid,
            self.horizon,
        )

    # ------------------------------------------------------------------ dense oracle
    def dense_matrices(self, n: int) -> tuple[Float64Array, Float64Array]:
        """``(L, B)`` for ticks ``1..n`` (tests only): measurements ``L·D`` (measurement units,
        one row per block completed by tick ``n``, ordered by completion tick then level) and the
        reconstruction ``B`` (``n × rows``, the division by ``w`` and the Honaker weights included),
        so the release is ``B @ (L @ D + g·z)`` for grid-unit noise ``z`` (up to grid rounding).
        """
        rows: list[tuple[int, int]] = []  # (level index, block end)
        for t in range(1, n + 1):
            for i, b in enumerate(self._blocks):
                if t % b == 0:
                    rows.append((i, t))
        index = {r: k for k, r in enumerate(rows)}
        big_l = np.zeros((len(rows), n))
        for k, (i, e) in enumerate(rows):
            b = self._blocks[i]
            for j in range(e - b + 1, e + 1):
                big_l[k, j - 1] = self.weights[i] * self.p ** (e - j)
        # estimate of each block as a linear combination of measurements
        est: dict[tuple[int, int], Float64Array] = {}
        for i, e in rows:
            own = np.zeros(len(rows))
            own[index[(i, e)]] = 1.0 / self.weights[i]
            if i == 0:
                est[(i, e)] = own
            else:
                cb = self._blocks[i - 1]
                children = sum(
                    (self.p ** (e - ce)) * est[(i - 1, ce)]
                    for ce in range(e - self._blocks[i] + cb, e + 1, cb)
                )
                a = float(self.alpha[i])
                est[(i, e)] = a * own + (1.0 - a) * children
        big_b = np.zeros((n, len(rows)))
        for t in range(1, n + 1):
            covered = 0
            for i in range(len(self._blocks) - 1, -1, -1):  # greedy, top level first
                b = self._blocks[i]
                while covered + b <= t:
                    covered += b
                    big_b[t - 1] += self.p ** (t - covered) * est[(i, covered)]
        return big_l, big_b


class BinaryTreeMechanism(TreeMechanism):
    """Every dyadic level ``0..⌊log2 horizon⌋``, equal weights, causal Honaker estimate."""

    name = "binary-tree"

    def _default_plan(self) -> TreePlan:
        return binary_plan(self.horizon, self.model)


def make(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> TreeMechanism:
    """Factory registered as ``"tree"``."""
    return TreeMechanism(p, horizon, privacy, cap)


def make_binary(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> BinaryTreeMechanism:
    """Factory registered as ``"binary-tree"``."""
    return BinaryTreeMechanism(p, horizon, privacy, cap)


def _register() -> None:
    from stream_dp.strategies.registry import register

    register("tree", make, models=("pure", "zcdp"))
    register("binary-tree", make_binary, models=("pure", "zcdp"))


_register()
