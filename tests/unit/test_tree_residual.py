"""``TreePlan.residual`` (the reconcile diagnostic, computed every tick) against two oracles:
the previous implementation (``np.add.at``, bit for bit) and a plain Python loop over the nodes
adding the children in node order (the same floating-point additions)."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.consistency.tree import TreePlan
from tests.unit.test_consistency_tree import random_tree


def residual_add_at(parent: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The implementation before ``np.bincount`` (kept here as the bit-for-bit oracle)."""
    n = parent.size
    xt = np.moveaxis(np.asarray(x, dtype=np.float64), -1, 0)
    has_parent = parent >= 0
    child_sum = np.zeros_like(xt)
    np.add.at(child_sum, parent[has_parent], xt[has_parent])
    internal = np.bincount(parent[has_parent], minlength=n) > 0
    return np.moveaxis((xt - child_sum)[internal], 0, -1)


def residual_loop(parent: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Independent oracle: for each internal node in index order, x_p minus its children
    summed one by one from 0.0 in node order."""
    sums: dict[int, float] = {}
    for i, p in enumerate(parent.tolist()):
        if p >= 0:
            sums[p] = sums.get(p, 0.0) + float(x[i])
    return np.array([float(x[p]) - sums[p] for p in sorted(sums)])


@pytest.mark.parametrize("seed", range(6))
def test_residual_bit_identical_to_add_at_and_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    parent = random_tree(rng, n, max_fanout=int(rng.integers(1, 9)))
    if seed % 2:  # a forest: cut a few edges
        cut = rng.choice(n, size=max(1, n // 20), replace=False)
        parent[cut] = -1
    plan = TreePlan(parent)
    # values of very different magnitudes and signs, so the order of additions matters
    x = rng.normal(0.0, 1.0, n) * 10.0 ** rng.integers(-8, 9, n)
    got = plan.residual(x)
    assert got.tobytes() == residual_add_at(parent, x).tobytes()
    assert got.tobytes() == residual_loop(parent, x).tobytes()
    batch = np.stack([x, -x, rng.normal(size=n)])
    got_b = plan.residual(batch)
    assert got_b.shape == (3, got.size)
    assert got_b.tobytes() == residual_add_at(parent, batch).tobytes()
    assert plan.residual(x).tobytes() == got.tobytes()  # the cached index arrays are reused


def test_residual_of_a_consistent_vector_is_zero_and_shape_is_checked() -> None:
    parent = np.array([-1, 0, 0, 1, 1, 2])
    x = np.array([4.0, 3.0, 1.0, 1.0, 2.0, 1.0])  # 4 = 3 + 1, 3 = 1 + 2, 1 = 1
    plan = TreePlan(parent)
    assert plan.residual(x).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        plan.residual(np.zeros(5))
