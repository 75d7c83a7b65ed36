"""``tree-ls``: a two-level tree (leaves + blocks of ``b`` ticks) with non-causal least-squares
decoding, computed exactly.

**Measurements** (conceptual; grid ``g`` a power of two, counts rounded once to
``q_s = rint(D_s/g)``, exact): every tick ``s`` is a leaf ``y_s = q_s + Z_s``; every block ``k`` of
``b`` ticks is a node ``Y_k = Σ_i K_i·q_(start+i) + Z'_k`` with the integer coefficients
``K_i = round(2**F·p^(b−1−i))`` of :func:`.plan.coefficients` (the block's decayed sum in
fixed point). ``Z`` is exact discrete Laplace (ε-DP) or discrete Gaussian (ρ-zCDP) on the
integers; ``Z'`` on the integer lattice of ``K·q`` (units ``g·2**-F``), so any change of the data
shifts each measurement by a lattice vector. One event changes one ``q_s`` by at most
``Δ = cap/g + 1`` (its count, plus one unit of rounding), hence one leaf by ``Δ`` and one node by
``K_i·Δ ≤ 2**F·Δ``: the leaf noise is calibrated to ``Δ`` with the share ``a`` of the budget, the
node noise to ``2**F·Δ`` with ``1 − a`` (pure: ε·a + ε·(1−a) = ε; zCDP: the ρ's add).

**Release** (the best linear unbiased estimate from all of the open block's measurements, past and
future): with ``R_k = Y_k − Σ_i K_i·y_(start+i) = Z'_k − Σ_i K_i·Z_(start+i)`` the block's residual
— an exact integer function of the *final* measurements which carries no data —

``release_t = g·(p^j·C + Σ_{s≤t in block} p^(t−s)·y_s + β_j·R_k·2**-F)``

(``j`` ticks of the block released, ``C`` the estimate carried at the previous block's end,
``β_j`` the optimal weight, :func:`.plan.block_terms`). Everything it reads — the leaves up to
``t``, ``R_k`` and ``C`` — is a function of the noisy measurements only, and ``R_k`` is computed
in exact integer arithmetic from the noise alone: the future leaves' noise is keyed, so it is
drawn at the block's start exactly as it will be drawn at its tick. Hence every release is
post-processing of ``(y, Y)`` (docs/privacy.md, "Non-causal decoding"): the float evaluation of
the formula is a deterministic function of the measurements and leaks nothing, and the argument
holds for adaptively chosen data (the noise is drawn independently of it). The variance
(:meth:`variance`) is exact for what is released; no horizon or epochs are needed (node ids
``(level << 40) | index`` are unique for 2**40 ticks). At ``p = 1`` the carried estimate adds one
block's variance per block, so the error grows linearly past the horizon
(``error_stays_bounded`` is False there, and ``auto`` prefers a strategy whose error grows
polylogarithmically).

**State** per stream: ``carry`` (C), ``partial`` (the decayed leaf sum of the open block, grid
units) and ``residual`` (``R_k``, int64): three numbers; O(1) work per tick plus O(b) at a block's
start (its leaves' noise), O(1) amortised.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.mechanism import BoundNoise, Float64Array, Mechanism, State
from stream_dp.noise.gaussian import MAX_SIGMA, MIN_SIGMA
from stream_dp.noise.grid import MAX_GRID_UNITS, choose_grid
from stream_dp.noise.laplace import MAX_SCALE, MIN_SCALE
from stream_dp.strategies._common import (
    MAX_GRID_BUDGET,
    RESOLUTION_BITS,
    check_cap,
    check_horizon,
    check_n_streams,
    check_noise_scale,
    check_p,
)
from stream_dp.strategies.ls_tree.plan import (
    COEFF_BITS,
    LsPlan,
    Model,
    best_plan,
    block_terms,
    coefficients,
    curve,
    noise_scales,
)

__all__ = ["LsTreeMechanism", "make"]

_NODE_SHIFT = 40
#: |leaf noise| below this keeps Σ K_i·Z_i (≤ 2**12 terms of ≤ 2**F·|Z|) exact in int64; a
#: sample beyond it (probability < exp(−2**19) at the noise scales used) stops the tick.
_MAX_LEAF_NOISE = 2 ** (62 - COEFF_BITS - 12)


def _model(privacy: Privacy) -> tuple[Model, float]:
    if isinstance(privacy, PureDP):
        return "pure", float(privacy.epsilon)
    if isinstance(privacy, ZCDP):
        return "zcdp", float(privacy.rho)
    raise ValueError(
        f"privacy for strategy 'tree-ls' must be PureDP(epsilon) or ZCDP(rho), got {privacy!r}"
    )


class LsTreeMechanism(Mechanism):
    """Leaves + blocks of ``b`` ticks, least-squares decoded with the future noise (exact)."""

    name = "tree-ls"

    def __init__(self, p: float, horizon: int, privacy: Privacy, cap: float = 1.0,
                 plan: LsPlan | None = None) -> None:
        self.p = check_p(p)
        self.horizon = check_horizon(horizon)
        self.cap = check_cap(cap)
        self.privacy = privacy
        self.model, self.budget = _model(privacy)
        factor = self.budget if self.model == "pure" else math.sqrt(2.0 * self.budget)
        # grid relative to the smallest noise scale (leaf share ≤ 0.9), as the other strategies
        self.grid = choose_grid(
            0.1 * self.cap / min(factor, MAX_GRID_BUDGET), resolution_bits=RESOLUTION_BITS
        )
        self.slack_units = self.cap / self.grid + 1.0
        self.plan = plan if plan is not None else (
            best_plan(self.p, max(self.horizon, 2), self.model, self.budget, self.slack_units))
        if not (self.plan.block >= 2 and 0.0 < self.plan.leaf_share < 1.0):
            raise ValueError(f"invalid tree-ls plan {self.plan!r}")
        self.block = self.plan.block
        s1, s2, self.v1, self.v2 = noise_scales(
            self.model, self.budget, self.plan.leaf_share, self.slack_units)
        lo, hi = (MIN_SCALE, MAX_SCALE) if self.model == "pure" else (MIN_SIGMA, MAX_SIGMA)
        what = f"epsilon = {self.budget!r}" if self.model == "pure" else f"rho = {self.budget!r}"
        self.leaf_scale = check_noise_scale(s1, lo, what)
        self.node_scale = check_noise_scale(s2, lo, what)
        if self.node_scale > hi:
            raise ValueError(f"{what} is too small for tree-ls: node noise scale {s2:.3g} > {hi:g}")
        self.coeffs = np.asarray(coefficients(self.p, self.block), dtype=np.int64)
        self.beta, self.part = block_terms(self.p, self.block, self.v1, self.v2)

    def describe(self) -> dict[str, Any]:
        return super().describe() | {
            "grid": self.grid,
            "block": self.block,
            "leaf_share": self.plan.leaf_share,
            "coeff_bits": COEFF_BITS,
            "leaf_scale_units": self.leaf_scale,
            "node_scale_units": self.node_scale,
            "resolution_bits": RESOLUTION_BITS,
        }

    # -- noise -------------------------------------------------------------------------------
    def _leaf_noise(self, noise: BoundNoise, tick: int) -> np.ndarray:
        node = tick  # level 0 (leaves): node id = tick (1-based)
        if self.model == "pure":
            return noise.discrete_laplace(node, self.leaf_scale)
        return noise.discrete_gaussian(node, self.leaf_scale)

    def _node_noise(self, noise: BoundNoise, index: int) -> np.ndarray:
        node = (1 << _NODE_SHIFT) | index
        if self.model == "pure":
            return noise.discrete_laplace(node, self.node_scale)
        return noise.discrete_gaussian(node, self.node_scale)

    # -- Mechanism ----------------------------------------------------------------------------
    def new_state(self, n_streams: int) -> State:
        n = check_n_streams(n_streams)
        return {
            "tick": np.array(0, dtype=np.int64),
            "carry": np.zeros(n, dtype=np.float64),
            "partial": np.zeros(n, dtype=np.float64),
            "residual": np.zeros(n, dtype=np.int64),
        }

    def max_count(self) -> float:
        """Counts must stay below ``2**50`` grid units (leaf values exact in float64)."""
        return float(np.nextafter(MAX_GRID_UNITS / 8 * self.grid, 0.0))

    def step(self, state: State, counts: Float64Array, noise: BoundNoise) -> Float64Array:
        t = int(state["tick"]) + 1
        j = (t - 1) % self.block  # 0-based offset in the block
        q = np.asarray(counts, dtype=np.float64) / self.grid  # exact: power-of-two grid
        if q.size and max(float(q.max()), -float(q.min())) >= MAX_GRID_UNITS / 8:
            raise ValueError(
                f"counts must be < {self.max_count():.6g} for tree-ls (cap={self.cap}); "
                "state unchanged"
            )
        np.rint(q, out=q)
        residual = np.asarray(state["residual"], dtype=np.int64)
        if j == 0:
            # the block opens: its residual R = Z' − Σ K_i·Z_i from the node's and every leaf's
            # keyed noise (the same samples the leaves draw at their ticks), in exact integers
            first = t
            residual = self._node_noise(noise, (t - 1) // self.block).astype(np.int64)
            for i in range(self.block):
                z = self._leaf_noise(noise, first + i).astype(np.int64)
                if z.size and int(np.abs(z).max()) >= _MAX_LEAF_NOISE:
                    raise RuntimeError("leaf noise sample beyond the exact range; state unchanged")
                residual = residual - int(self.coeffs[i]) * z
        y = q + self._leaf_noise(noise, t).astype(np.float64)  # exact (< 2**53)
        partial = y if j == 0 else self.p * np.asarray(state["partial"], dtype=np.float64) + y
        carry = np.asarray(state["carry"], dtype=np.float64)
        estimate = (self.p ** (j + 1)) * carry + partial + float(self.beta[j]) * np.ldexp(
            residual.astype(np.float64), -COEFF_BITS)
        release = estimate * self.grid
        state["tick"] = np.array(t, dtype=np.int64)
        state["residual"] = residual
        state["partial"] = partial
        if j == self.block - 1:
            state["carry"] = estimate
        return np.asarray(release, dtype=np.float64)

    def variance(self, t: int) -> float:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
            raise ValueError(f"t must be an integer ≥ 1, got {t!r}")
        k, j = divmod(int(t) - 1, self.block)
        last = float(self.part[-1])
        if self.p == 1.0:
            carried = last * k
        else:
            q2 = self.p ** (2 * self.block)
            carried = last * (-math.expm1(k * math.log(q2)) / (1.0 - q2)) if q2 > 0 else (
                last if k > 0 else 0.0)
        g2 = self.grid * self.grid
        return g2 * (carried * self.p ** (2 * (j + 1)) + float(self.part[j]))

    def mse_curve(self, horizon: int) -> Float64Array:
        return self.grid * self.grid * curve(self.p, self.block, self.v1, self.v2, horizon)

    def error_stays_bounded(self) -> bool:
        # p = 1: every completed block adds its variance to the carried estimate (linear growth)
        return self.p < 1.0

    def sensitivity(self) -> float:
        """``cap + g`` (value units): one event moves one leaf by ``Δ·g`` and one node by
        ``K·Δ·g·2**-F ≤ Δ·g``; the noise of each is calibrated to that with its share."""
        return self.cap + self.grid

    def rounding_bound(self, ticks: int | None = None) -> float:
        """``g/2·Σ p^i`` as for ``naive``: the data enter the release only through the rounded
        counts ``q_s`` (the node coefficients cancel exactly)."""
        if self.p < 1.0:
            return 0.5 * self.grid / (1.0 - self.p)
        return 0.5 * self.grid * float(self.horizon if ticks is None else ticks)


def make(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> LsTreeMechanism:
    """Factory registered as ``"tree-ls"``."""
    return LsTreeMechanism(p, horizon, privacy, cap)


def _register() -> None:
    from stream_dp.strategies.registry import register

    register("tree-ls", make, models=("pure", "zcdp"))


_register()
