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
