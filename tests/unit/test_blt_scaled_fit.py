"""The column-scaled ``p = 1`` loss of ``blt`` and its complex-step gradient (issue #36).

Oracle: the definition with dense matrices — ``C`` Toeplitz from its coefficients, ``D`` the
unrounded equalising scales from brute-force column norms, ``B' = W·D⁻¹·C⁻¹`` by a triangular
solve, ``L = S_T·‖B'‖_F²/T`` — and central differences of that oracle for the gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import solve_triangular

from stream_dp.strategies.blt import plan as blt_plan
from stream_dp.strategies.blt._scaled_fit import scaled_loss, scaled_loss_and_gradient


def _dense_loss(x: np.ndarray, n: int) -> float:
    d = len(x) // 2
    th, w = 1.0 / (1.0 + np.exp(-x[:d])), np.exp(x[d:])
    k = np.arange(1, n)
    c = np.concatenate(([1.0], (w[None, :] * th[None, :] ** (k[:, None] - 1.0)).sum(axis=1)))
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    big_c = np.where(lag >= 0, c[np.clip(lag, 0, None)], 0.0)
    norms = np.sum(big_c**2, axis=0)  # column j: Σ_{k<n−j} c_k²
    scales = np.sqrt(norms[0] / norms)
    scaled = big_c * scales[None, :]
    assert np.allclose(np.sum(scaled**2, axis=0), norms[0])  # equalised columns
    big_w = np.tril(np.ones((n, n)))
    big_b = solve_triangular(scaled.T, big_w.T, lower=False).T
    return float(norms[0] * np.sum(big_b**2) / n)


def _filters() -> list[np.ndarray]:
    rng = np.random.default_rng(36)
    out = []
    for d in (1, 3, 6):
        th = np.sort(rng.uniform(0.3, 0.995, d))[::-1]
        w = rng.uniform(0.02, 0.3, d)
        w *= min(1.0, 0.8 / float(np.sum(w / (1.0 + th))))  # stable: C(−1) > 0
        assert blt_plan._stable(th, w)
        out.append(np.concatenate([np.log(th / (1.0 - th)), np.log(w)]))
    return out


@pytest.mark.parametrize("x", _filters())
@pytest.mark.parametrize("n", [2, 17, 64])
def test_scaled_loss_matches_the_dense_definition(x: np.ndarray, n: int) -> None:
    d = len(x) // 2
    value = scaled_loss(1.0 / (1.0 + np.exp(-x[:d])), np.exp(x[d:]), n)
    assert value.imag == 0.0
    assert value.real == pytest.approx(_dense_loss(x, n), rel=1e-11)


@pytest.mark.parametrize("x", _filters())
def test_gradient_matches_central_differences_of_the_dense_loss(x: np.ndarray) -> None:
    n = 48
    value, grad = scaled_loss_and_gradient(x, n)
    assert value == pytest.approx(_dense_loss(x, n), rel=1e-11)
    h = 1e-5
    fd = np.empty_like(x)
    for k in range(len(x)):
        up, dn = x.copy(), x.copy()
        up[k] += h
        dn[k] -= h
        fd[k] = (_dense_loss(up, n) - _dense_loss(dn, n)) / (2.0 * h)
    # central differences are accurate to O(h²·L''') + rounding/h ≈ 1e-9 here
    assert np.max(np.abs(grad - fd)) <= 1e-7 * max(1.0, float(np.max(np.abs(fd))))
    assert np.max(np.abs(fd)) > 1e-3  # a non-trivial point (the check has something to check)


def test_shipped_fit_at_32767_agrees_with_the_mechanism_curve() -> None:
    """The loss at the shipped ``p = 1`` fit equals ``S_T`` times the mean of the plan's
    :func:`.plan.scaled_variance_curve` with unrounded scales (the mechanism's recurrences)."""
    th, w = (np.array(v) for v in blt_plan.fit(1.0, 32767))
    n = 32767
    sums = blt_plan.column_square_sums(th, w, n)
    scales = np.sqrt(sums[-1] / sums[::-1])
    ref = float(sums[-1]) * float(blt_plan.scaled_variance_curve(th, w, scales, np.ones(n)).mean())
    assert scaled_loss(th, w, n).real == pytest.approx(ref, rel=1e-9)
