"""Plain running totals (p = 1): doubling epochs with super levels (stream_dp/strategies/_epochs).

Oracle independent of the closed forms: the release error of ``tree-ls`` and ``blt`` is a
linear function of the noise samples. A recording source lists every noise node a run draws (id
and scale); then each node in turn gets a large impulse (every other node zero) and the change
of the releases, divided by the impulse, is that node's column of the error map. The variance at
tick ``t`` is ``Σ_node column_t² · Var(node)``: it must equal ``Mechanism.variance``/``mse_curve``
across epochs and super levels. Plus the exact limb arithmetic against Python integers.
"""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.budget import ZCDP, PureDP
from stream_dp.noise.gaussian import discrete_gaussian_variance
from stream_dp.noise.laplace import discrete_laplace_variance
from stream_dp.planner import make_mechanism
from stream_dp.strategies._epochs import add_limbs, epoch_of_block, limbs_value
from stream_dp.strategies.ls_tree.mechanism import LsTreeMechanism
from stream_dp.strategies.ls_tree.plan import LsPlan


class _Recording:
    def __init__(self) -> None:
        self.nodes: dict[int, tuple[str, float]] = {}

    def discrete_laplace(self, node: int, scale: float) -> np.ndarray:
        self.nodes[node] = ("laplace", scale)
        return np.zeros(1, dtype=np.int64)

    def discrete_gaussian(self, node: int, sigma: float) -> np.ndarray:
        self.nodes[node] = ("gaussian", sigma)
        return np.zeros(1, dtype=np.int64)


class _Impulse:
    def __init__(self, node: int, size: int) -> None:
        self.node, self.size = node, size

    def _draw(self, node: int) -> np.ndarray:
        return np.full(1, self.size if node == self.node else 0, dtype=np.int64)

    def discrete_laplace(self, node: int, scale: float) -> np.ndarray:
        return self._draw(node)

    def discrete_gaussian(self, node: int, sigma: float) -> np.ndarray:
        return self._draw(node)


def _run(mech: object, noise: object, ticks: int) -> np.ndarray:
    state = mech.new_state(1)  # type: ignore[attr-defined]
    return np.array([mech.step(state, np.zeros(1), noise)[0] for _ in range(ticks)])  # type: ignore[attr-defined]


def _impulse_variance(mech: object, ticks: int, unit: float, size: int) -> np.ndarray:
    rec = _Recording()
    base = _run(mech, rec, ticks)
    assert not base.any()
    out = np.zeros(ticks)
    for node, (kind, scale) in rec.nodes.items():
        column = _run(mech, _Impulse(node, size), ticks) / (size * unit)
        var = discrete_laplace_variance(scale) if kind == "laplace" else (
            discrete_gaussian_variance(scale))
        out += column**2 * var * unit * unit
    return out


@pytest.mark.parametrize("schedule", [(), ((0.3, 0.3, 0.4), (0.6, 0.3, 0.1))],
                         ids=["uniform", "schedule"])
@pytest.mark.parametrize("privacy", [PureDP(1.0), ZCDP(0.5)], ids=["pure", "zcdp"])
def test_tree_ls_epoch_variance_equals_the_impulse_oracle(
        privacy: object, schedule: tuple[tuple[float, ...], ...]) -> None:
    # with a schedule (issue #26) epoch 0 has two blocks, each with its own shares
    horizon = 8 if schedule else 4
    mech = LsTreeMechanism(1.0, horizon, privacy, 1.0,  # type: ignore[arg-type]
                           plan=LsPlan((2, 4), (0.4, 0.3, 0.3), schedule))
    ticks = 4 * 15  # epochs of 1, 2, 4, 8 blocks (of 2, 4, 8 with a schedule)
    got = _impulse_variance(mech, ticks, mech.grid, 1)
    np.testing.assert_allclose(mech.mse_curve(ticks), got, rtol=1e-9)
    assert mech.variance(ticks) == pytest.approx(got[-1], rel=1e-9)


def test_blt_epoch_variance_equals_the_impulse_oracle() -> None:
    mech = make_mechanism("blt", 1.0, 4, ZCDP(0.5))
    ticks = 4 * 15
    # impulses large against the feedback rounding (≤ ½ unit), small against the clip bound
    size = 1 << 30
    assert size * 64 < mech.clip  # type: ignore[attr-defined]
    got = _impulse_variance(mech, ticks, mech.unit, size)  # type: ignore[attr-defined]
    np.testing.assert_allclose(mech.mse_curve(ticks), got, rtol=1e-6)


def test_limbs_are_exact() -> None:
    rng = np.random.default_rng(1)
    hi = np.zeros(1000, dtype=np.int64)
    lo = np.zeros(1000, dtype=np.int64)
    exact = [0] * 1000
    for _ in range(200):
        x = rng.integers(-(2**62), 2**62, size=1000, dtype=np.int64)
        hi, lo = add_limbs(hi, lo, x)
        exact = [a + int(b) for a, b in zip(exact, x, strict=True)]
    assert all(int(h) * 2**32 + int(lo_) == e for h, lo_, e in zip(hi, lo, exact, strict=True))
    assert ((lo >= 0) & (lo < 2**32)).all()
    np.testing.assert_allclose(limbs_value(hi, lo), np.array(exact, dtype=float), rtol=1e-15)


def test_epoch_geometry() -> None:
    # n0 = 3 blocks, then 6, 12, ...
    assert [epoch_of_block(b, 3)[:2] for b in (0, 2, 3, 8, 9, 20, 21)] == [
        (0, 0), (0, 2), (1, 0), (1, 5), (2, 0), (2, 11), (3, 0)]


@pytest.mark.parametrize(("name", "privacy"), [("tree-ls", PureDP(1.0)), ("blt", ZCDP(0.5))])
def test_checkpoints_restore_mid_block_and_mid_epoch_bit_for_bit(name: str, privacy: object) -> None:
    """A bank written to bytes at any tick (inside a block, at a block's end, inside a later
    epoch with super levels held) and restored continues exactly as the uninterrupted one."""
    from stream_dp.counters import CounterBank

    key = b"epoch-checkpoint-key-0123456789!!"
    mech = make_mechanism(name, 1.0, 6, privacy)  # type: ignore[arg-type]
    rng = np.random.default_rng(2)
    data = rng.integers(0, 3, size=(80, 4)).astype(np.float64)
    whole = CounterBank(mech, ["a", "b", "c", "d"], key)
    expect = np.array([whole.step(row) for row in data])
    for cut in (1, 5, 6, 7, 18, 19, 41, 79):
        bank = CounterBank(mech, ["a", "b", "c", "d"], key)
        for row in data[:cut]:
            bank.step(row)
        restored = CounterBank.from_bytes(bank.to_bytes(), key, mechanism=mech)
        rest = np.array([restored.step(row) for row in data[cut:]])
        assert np.array_equal(rest, expect[cut:]), cut
