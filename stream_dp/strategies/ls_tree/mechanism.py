"""``tree-ls``: a sparse tree (leaves + nested blocks, two to four levels) with non-causal
least-squares decoding, computed exactly.

**Measurements** (conceptual; grid ``g`` a power of two, counts rounded once to
``q_s = rint(D_s/g)``, exact): every tick ``s`` is a leaf ``y_s = q_s + Z_s``; every block ``k`` of
``L_ℓ`` ticks at level ``ℓ`` is a node ``Y_n = Σ_i K_i·q_(start+i) + Z'_n`` with the integer
coefficients ``K_i = round(2**F·p^(L_ℓ−1−i))`` of :func:`.plan.coefficients` (the node's decayed
sum in fixed point); the levels nest inside a *top block* of ``B`` ticks. ``Z`` is exact discrete Laplace (ε-DP) or discrete Gaussian (ρ-zCDP) on the
integers; ``Z'`` on the integer lattice of ``K·q`` (units ``g·2**-F``), so any change of the data
shifts each measurement by a lattice vector. One event changes one ``q_s`` by at most
``Δ = cap/g + 1`` (its count, plus one unit of rounding), hence one leaf by ``Δ`` and one node by
``K_i·Δ ≤ 2**F·Δ`` per level: the leaf noise is calibrated to ``Δ`` with the share ``a_0`` of the
budget, level ``ℓ``'s node noise to ``2**F·Δ`` with ``a_ℓ`` (Σ a ≤ 1 exactly; pure: the ε's add,
zCDP: the ρ's add).

**Hat levels** (issue #36, :attr:`.plan.LsPlan.shapes`): a level may measure overlapping
triangles instead (:func:`.plan.hat_rows`: ``B/L + 1`` per top block, node ``r`` peaking at
offset ``r·L − 1``), whose two coefficients at any tick add up to exactly ``2**F``: one event
moves the level's measurements by at most ``2**F·Δ`` in total, and the level is calibrated as a
decayed one (Laplace: the losses of the two nodes add to ``2**F·Δ/b``; Gaussian: the squared
changes add to at most ``(2**F·Δ)²``). A flat level measures the plain sum (``K_i = 2**F``).
Everything below holds for any integer rows inside the top block.

**Release** (the best linear unbiased estimate from all of the open top block's measurements, past
and future): with ``R_n = Y_n − Σ_i K_i·y_(start+i) = Z'_n − Σ_i K_i·Z_(start+i)`` each node's
residual — an exact integer function of the *final* measurements which carries no data —

``release_t = g·(p^(j+1)·C + Σ_{s≤t in block} p^(t−s)·y_s + (β_j · R)·2**-F)``

(``j`` the 0-based offset in the top block, ``C`` the estimate carried at the previous top block's
end, ``β_j`` the optimal weights, :func:`.plan.block_terms`). Everything it reads — the leaves up
to ``t``, ``R`` and ``C`` — is a function of the noisy measurements only, and ``R`` is computed
in exact integer arithmetic from the noise alone: the future leaves' noise is keyed, so it is
drawn ahead of time (during the previous block) exactly as it will be drawn at its tick. Hence every release is
post-processing of ``(y, Y)`` (docs/privacy.md, "Non-causal decoding"): the float evaluation of
the formula is a deterministic function of the measurements and leaks nothing, and the argument
holds for adaptively chosen data (the noise is drawn independently of it). The variance
(:meth:`variance`) is exact for what is released; for ``p < 1`` no horizon or epochs are needed
(node ids ``(level << 40) | index`` are unique below tick 2**40, :data:`MAX_TICKS`).

**p = 1** (plain running totals): a fixed tree would add one block's variance per block forever.
The blocks are grouped into doubling epochs, and from the second epoch on a share of the budget
goes to super levels over the blocks (:mod:`stream_dp.strategies._epochs`): the error inside
the horizon is the plain plan's, and past it grows polylogarithmically (``error_stays_bounded`` is True). Their exact
totals are kept in two 32-bit limbs, so the measurement ``M = X + Z`` is exact for any count up to
:meth:`max_count` on every tick up to :data:`MAX_TICKS`.

**Per-block shares** (``p = 1``, :attr:`.plan.LsPlan.schedule`): each top block of the
horizon may have its own shares; an event lies in one top block, so each block's shares add up
to at most 1 on their own, and every leaf and node of a block — drawn ahead for the decoder or at
its tick — is drawn at that block's scales. ``β`` is computed when a block with new shares
starts (at most two kept), the variance from one ``part`` row per block.

**State** per stream: ``carry`` (C), ``partial`` (the decayed leaf sum of the open top block, grid
units), ``residual`` (the open top block's residuals, one per node: 1 for two levels,
``B/L_1 + 1`` for three, ``B/L_1 + B/L_2 + 1`` for four; exact int64 sums converted to float64
once per block) and ``next_residual`` (the next block's, int64, accumulated one leaf per tick);
at ``p = 1`` also the epoch's base, the open block's exact total and, per super level, a held
estimate and its exact total (about ``24·(log₂(2**40/B) + 1)`` bytes). O(nodes) work and at most
three noise draws per tick (the very first block draws its ``B`` leaves at once), O(super levels)
at a block's end.
"""

from __future__ import annotations

import itertools
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
from stream_dp.strategies.ls_tree.plan import (
    COEFF_BITS,
    HAT,
    MAX_BLOCK,
    SHAPES,
    LsPlan,
    Model,
    best_plan,
    block_part,
    block_terms,
    curve,
    noise_scales,
    structure,
)

__all__ = ["LsTreeMechanism", "make"]

_NODE_SHIFT = 40
#: |leaf noise| below this keeps Σ K_i·Z_i (≤ 2**12 terms of ≤ 2**F·|Z|) exact in int64; a
#: sample beyond it (probability < exp(−2**19) at the noise scales used) stops the tick.
_MAX_LEAF_NOISE = 2 ** (62 - COEFF_BITS - 12)
#: Node ids are unique below this tick: a bank releases ticks ``1..MAX_TICKS − 1`` (the leaf of
#: tick ``2**40`` would draw under the id of level 1's first node, ``(1 << 40) | 0``).
MAX_TICKS = 1 << 40


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
        levels, shares = self.plan.levels, self.plan.shares
        self.block = levels[-1] if levels else 0
        self.first_blocks = -(-self.horizon // self.block) if self.block else 0
        if (not levels or levels[0] < 2
                or any(b % a or b <= a for a, b in itertools.pairwise(levels))
                or levels[-1] > MAX_BLOCK
                or any(len(v) != len(levels) + 1 or min(v) <= 0.0 or math.fsum(v) > 1.0
                       or sum(v) > 1.0 for v in (shares, *self.plan.schedule))
                # a schedule covers epoch 0 of p = 1 only (later epochs: the super levels)
                or (self.plan.schedule and (self.p != 1.0
                                            or len(self.plan.schedule) > self.first_blocks))
                # hats below a decayed top level (issue #36)
                or (self.plan.shapes and (len(self.plan.shapes) != len(levels)
                                          or self.plan.shapes[-1] == HAT
                                          or any(x not in SHAPES for x in self.plan.shapes)))):
            raise ValueError(f"invalid tree-ls plan {self.plan!r}")
        lo, hi = (MIN_SCALE, MAX_SCALE) if self.model == "pure" else (MIN_SIGMA, MAX_SIGMA)
        what = f"epsilon = {self.budget!r}" if self.model == "pure" else f"rho = {self.budget!r}"

        def checked(vec: tuple[float, ...], budget: float) -> tuple[tuple[float, ...],
                                                                     tuple[float, ...]]:
            raw, var = noise_scales(self.model, budget, vec, self.slack_units)
            out = tuple(check_noise_scale(x, lo, what) for x in raw)
            if max(out) > hi:
                raise ValueError(
                    f"{what} is too small for tree-ls: node noise scale {max(out):.3g} > {hi:g}")
            return out, var

        self.scales, self.variances = checked(shares, self.budget)
        # per-block schedule (issue #26): each top block's scales and variances, by its shares
        self._profiles = {v: checked(v, self.budget) for v in {shares, *self.plan.schedule}}
        self.leaf_scale = self.scales[0]
        self.shapes = self.plan.level_shapes
        self.coeffs, level = structure(self.p, levels, self.plan.shapes)
        self.node_level = level
        # nodes per top block and level: B/L (decayed), B/L + 1 (hats: one peaks before the block)
        self.level_nodes = tuple(int(np.count_nonzero(level == ell))
                                 for ell in range(1, len(levels) + 1))
        if self.coeffs.shape[0] > self.block:
            # the prefetch draws node j of the next block at offset j: at most B nodes
            raise ValueError(f"invalid tree-ls plan {self.plan!r}: more nodes than ticks per block")
        # node index within its level, for the noise node ids: top index × nodes per top + m
        self.node_offset = np.concatenate(
            [np.arange(count) for count in self.level_nodes]).astype(np.int64)
        self.part = block_part(self.p, levels, self.model, self.budget, shares, self.slack_units,
                               self.plan.shapes)
        # β (B × nodes floats) per share vector, computed when a block with those shares starts;
        # at most two kept (the open block's and the next one's)
        self._betas: dict[tuple[tuple[float, ...], float], np.ndarray] = {}
        # p = 1: doubling epochs of whole blocks, super levels from epoch 1 on (strategies._epochs)
        self.super = self.p == 1.0
        if self.super:
            self.scales1, self.variances1 = checked(shares, nested_budget(self.budget))
            self.part1 = block_part(self.p, levels, self.model, nested_budget(self.budget),
                                    shares, self.slack_units, self.plan.shapes)
            self.max_super = levels_needed(MAX_TICKS // self.block)
            # epoch 0's own variance by block (one row per block: the schedule's shares)
            self.part0 = np.vstack([
                block_part(self.p, levels, self.model, self.budget, self.plan.shares_of(k),
                           self.slack_units, self.plan.shapes) for k in range(self.first_blocks)
            ]) if self.plan.schedule else self.part
        # for each leaf offset, the residual rows whose node contains it (one per level)
        self._rows_of_leaf = [np.flatnonzero(self.coeffs[:, i]) for i in range(self.block)]
        self._coeff_of_leaf = [self.coeffs[rows, i] for i, rows in enumerate(self._rows_of_leaf)]

    def describe(self) -> dict[str, Any]:
        out = super().describe() | {
            "grid": self.grid,
            "levels": list(self.plan.levels),
            "shares": list(self.plan.shares),
            "coeff_bits": COEFF_BITS,
            "scale_units": list(self.scales),
            "resolution_bits": RESOLUTION_BITS,
            "prefetch": "one leaf per tick, float residual",
        }
        if self.plan.shapes:
            # issue #36: only plans with hats say so (a checkpoint of an all-decayed plan keeps
            # its description, and one with hats is refused by a library without them)
            out |= {"shapes": list(self.plan.shapes)}
        if self.plan.schedule:
            # the scales each block really draws with: a library whose scales for the same
            # shares differ (e.g. the exact accounting's ulp nudges) keys other noise, so its
            # checkpoint must be refused, not resumed with residuals of the other noise
            out |= {"schedule": [list(v) for v in self.plan.schedule],
                    "schedule_scale_units": [list(self._profiles[v][0])
                                             for v in self.plan.schedule]}
        if self.super:
            out |= {"epoch_blocks": self.first_blocks, "super_share": SUPER_SHARE,
                    "super_allocation": "linear", "scale_units_later": list(self.scales1)}
        return out

    def epoch_noise(self, n_blocks: int) -> EpochNoise:
        """Super-level noise of a later epoch of ``n_blocks`` blocks (``p = 1``)."""
        return epoch_noise(self.model, self.budget, self.slack_units, float(self.part1[-1]),
                           int(n_blocks))

    # -- noise -------------------------------------------------------------------------------
    def _scales_at(self, tick: int) -> tuple[float, ...]:
        top = (tick - 1) // self.block
        if self.super and top >= self.first_blocks:
            return self.scales1
        return self._profiles[self.plan.shares_of(top)][0]

    def _beta_at(self, top: int) -> np.ndarray:
        """The decoder weights ``β`` of top block ``top`` (0-based), by its shares and budget."""
        if self.super and top >= self.first_blocks:
            key = (self.plan.shares, nested_budget(self.budget))
        else:
            key = (self.plan.shares_of(top), self.budget)
        beta = self._betas.get(key)
        if beta is None:
            _, variances = noise_scales(self.model, key[1], key[0], self.slack_units)
            beta, _ = block_terms(self.p, self.plan.levels, variances, self.plan.shapes)
            if len(self._betas) >= 2:
                self._betas.pop(next(iter(self._betas)))
            self._betas[key] = beta
        return beta

    def _draw(self, noise: BoundNoise, node: int, scale: float) -> np.ndarray:
        if self.model == "pure":
            return noise.discrete_laplace(node, scale)
        return noise.discrete_gaussian(node, scale)

    def _leaf_noise(self, noise: BoundNoise, tick: int) -> np.ndarray:
        # level 0 (leaves): node id = tick (1-based)
        return self._draw(noise, tick, self._scales_at(tick)[0])

    def _node_noise(self, noise: BoundNoise, level: int, index: int) -> np.ndarray:
        node = (level << _NODE_SHIFT) | index
        # index = top block × nodes per top block + m: its top block decides the epoch
        top = index // self.level_nodes[level - 1]
        return self._draw(noise, node, self._scales_at(top * self.block + 1)[level])

    # -- Mechanism ----------------------------------------------------------------------------
    def _new_residual(self, n_streams: int) -> np.ndarray:
        return np.zeros((self.coeffs.shape[0], n_streams), dtype=np.int64)

    def _checked_leaf_noise(self, noise: BoundNoise, tick: int) -> np.ndarray:
        z = self._leaf_noise(noise, tick).astype(np.int64)
        if z.size and int(np.abs(z).max()) >= _MAX_LEAF_NOISE:
            raise RuntimeError("leaf noise sample beyond the exact range; state unchanged")
        return z

    def _residual_node_noise(self, noise: BoundNoise, row: int, top: int) -> np.ndarray:
        """Noise of residual row ``row`` (a node) of top block ``top``."""
        level = int(self.node_level[row])
        index = top * self.level_nodes[level - 1] + int(self.node_offset[row])
        return self._node_noise(noise, level, index).astype(np.int64)

    def new_state(self, n_streams: int) -> State:
        n = check_n_streams(n_streams)
        state: State = {
            "tick": np.array(0, dtype=np.int64),
            "carry": np.zeros(n, dtype=np.float64),
            "partial": np.zeros(n, dtype=np.float64),
            # the last release: CounterBank.releases (and checkpoints) read it back
            "release": np.zeros(n, dtype=np.float64),
            "residual": np.zeros((self.coeffs.shape[0], n), dtype=np.float64),
            "next_residual": np.zeros((self.coeffs.shape[0], n), dtype=np.int64),
        }
        if self.super:
            m = self.max_super
            state |= {
                "base": np.zeros(n, dtype=np.float64),  # Σ of the completed epochs' estimates
                "block_total": np.zeros(n, dtype=np.int64),  # exact Σ q of the open block
                "held": np.zeros((m, n), dtype=np.float64),  # estimates of held nodes
                "held_hi": np.zeros((m, n), dtype=np.int64),  # their exact totals,
                "held_lo": np.zeros((m, n), dtype=np.int64),  # in two 32-bit limbs
            }
        return state

    def max_count(self) -> float:
        """Counts must stay below ``2**50`` grid units (leaf values exact in float64)."""
        return float(np.nextafter(MAX_GRID_UNITS / 8 * self.grid, 0.0))

    def step(self, state: State, counts: Float64Array, noise: BoundNoise) -> Float64Array:
        t = int(state["tick"]) + 1
        if t >= MAX_TICKS:
            # leaf ids are ticks, node ids (level << 40) | index: tick 2**40 is level 1's node 0
            raise ValueError(f"tree-ls releases at most {MAX_TICKS - 1} ticks; state unchanged")
        j = (t - 1) % self.block  # 0-based offset in the block
        q = np.asarray(counts, dtype=np.float64) / self.grid  # exact: power-of-two grid
        if q.size and max(float(q.max()), -float(q.min())) >= MAX_GRID_UNITS / 8:
            raise ValueError(
                f"counts must be < {self.max_count():.6g} for tree-ls (cap={self.cap}); "
                "state unchanged"
            )
        np.rint(q, out=q)
        residual = np.asarray(state["residual"], dtype=np.float64)
        top = (t - 1) // self.block
        if j == 0 and t == 1:
            # the first top block: its residuals are drawn at once (later blocks' are drawn one
            # leaf per tick during the block before, see below)
            residual = self._new_residual(q.size)
            for i in range(self.block):
                z = self._checked_leaf_noise(noise, t + i)
                rows = self._rows_of_leaf[i]
                residual[rows] -= self._coeff_of_leaf[i][:, None] * z[None, :]
            for r in range(residual.shape[0]):
                residual[r] += self._residual_node_noise(noise, r, top)
            residual = residual.astype(np.float64)
        elif j == 0:
            # exact int64 sums, then one conversion per block: the decoder reads floats (a
            # function of the noise only, so its rounding is post-processing)
            residual = np.asarray(state["next_residual"], dtype=np.int64).astype(np.float64)
        # Prefetch: the next top block's residual R = Z' − Σ K_i·Z_i from its nodes' and leaves'
        # keyed noise (the same samples the leaves draw at their ticks), exactly: leaf j and node
        # j (if any) of the next block at offset j of this one, so no tick draws more than three
        # samples per stream (a block start would otherwise draw B).
        z_next = self._checked_leaf_noise(noise, t + self.block)
        nxt = self._new_residual(q.size) if j == 0 else state["next_residual"]
        rows = self._rows_of_leaf[j]
        nxt[rows] -= self._coeff_of_leaf[j][:, None] * z_next[None, :]
        if j < nxt.shape[0]:
            nxt[j] += self._residual_node_noise(noise, j, top + 1)
        state["next_residual"] = nxt
        y = q + self._leaf_noise(noise, t).astype(np.float64)  # exact (< 2**53)
        partial = y if j == 0 else self.p * np.asarray(state["partial"], dtype=np.float64) + y
        carry = np.asarray(state["carry"], dtype=np.float64)
        beta = self._beta_at(top)
        correction = beta[j] @ residual  # over nodes, per stream
        own = partial + np.ldexp(correction, -COEFF_BITS)
        estimate = (self.p ** (j + 1)) * carry + own
        release = estimate * self.grid
        if self.super:
            total = q.astype(np.int64)
            if j:
                total += np.asarray(state["block_total"], dtype=np.int64)
            state["block_total"] = total
        state["tick"] = np.array(t, dtype=np.int64)
        state["residual"] = residual
        state["partial"] = partial
        release = np.asarray(release, dtype=np.float64)
        state["release"] = release
        if j == self.block - 1:
            state["carry"] = self._close_block(state, (t - 1) // self.block, own, noise) \
                if self.super else estimate
        return release

    def _close_block(self, state: State, block: int, own: np.ndarray, noise: BoundNoise
                     ) -> np.ndarray:
        """``p = 1``: fold the closed block's estimate ``own`` (grid units) and exact total into
        the epoch's super levels (:mod:`stream_dp.strategies._epochs`)."""
        x = np.asarray(state["block_total"], dtype=np.int64)  # < 2**59: one block's Σ q
        hi, lo = add_limbs(np.zeros_like(x), np.zeros_like(x), x)
        return fold_block(state, block, self.first_blocks, own, hi, lo, self.epoch_noise,
                          lambda node, scale: self._draw(noise, node, scale))

    def variance(self, t: int) -> float:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
            raise ValueError(f"t must be an integer ≥ 1, got {t!r}")
        if self.super:
            return self._super_variance(int(t))
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

    def _super_variance(self, t: int) -> float:
        """``p = 1``: the closed form of :mod:`stream_dp.strategies._epochs` at one tick."""
        return self.grid * self.grid * super_variance_at(
            t, self.block, self.first_blocks, self.part0, self.part1, self.epoch_noise)

    def mse_curve(self, horizon: int) -> Float64Array:
        if self.super:
            out: Float64Array = self.grid * self.grid * super_variance_curve(
                self.part0, self.part1, self.first_blocks, self.epoch_noise, int(horizon))
            return out
        return self.grid * self.grid * curve(self.p, self.block, self.part, horizon)

    def error_stays_bounded(self) -> bool:
        # p < 1: bounded; p = 1: doubling epochs with super levels, O(log⁵ t) (strategies._epochs)
        return True

    def sensitivity(self) -> float:
        """``cap + g`` (value units): one event moves one leaf by ``Δ·g`` and one node per level
        by ``K·Δ·g·2**-F ≤ Δ·g`` (two nodes of a hat level by ``Δ·g`` in total); the noise of
        each is calibrated to that with its share."""
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
