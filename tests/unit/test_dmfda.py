"""DMFDA's Λ (paper 004 §3.2): recursion (30) with the clamp, Alg. 4, the sensitivity bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_dp.strategies.fenwick.dmfda_weights import deltas, lambda_at, lambdas
from stream_dp.strategies.fenwick.plan import column_sums, strategy_matrix

PS = (0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999, 1.0)


@pytest.mark.parametrize("p", PS)
def test_column_sums_at_most_one_for_every_complete_horizon(p: float) -> None:
    for m in range(1, 21):
        T = 2**m - 1
        lam = lambdas(T, p)
        assert lam.shape == (T,)
        assert np.all(lam > 0)
        sums, _ = column_sums(lam, p)
        assert float(sums.max()) <= 1.0 + 1e-12, (m, float(sums.max()))


@pytest.mark.parametrize("p", (0.3, 0.9, 1.0))
def test_column_sums_dense_oracle(p: float) -> None:
    for T in (1, 3, 7, 15, 31, 63, 127, 255, 10, 100):
        lam = lambdas(T, p)
        dense = (lam[:, None] * strategy_matrix(T, p)).sum(axis=0)
        assert float(dense.max()) <= 1.0 + 1e-12


@pytest.mark.parametrize("p", PS)
def test_vectorised_equals_alg4_verbatim(p: float) -> None:
    for T in (1, 2, 7, 8, 31, 100, 255):
        np.testing.assert_allclose(
            lambdas(T, p), [lambda_at(T, k, p) for k in range(1, T + 1)], rtol=1e-15
        )


def _recursion_30(m_max: int, p: float) -> list[float]:
    """Independent transcription of recursion (30) and the clamped δ (seeds/README.md)."""
    out, err = [1 - p], 1.0
    for m in range(2, m_max + 1):
        c = 2 ** (m - 1) * p**2
        d = err ** (1 / 3) / (err ** (1 / 3) + c ** (1 / 3))
        d = min(max(d, 1 - p), 1.0)
        out.append(d)
        err = err / d**2 + c / (1 - d) ** 2 + err
    return out


@pytest.mark.parametrize("p", PS)
def test_deltas_follow_recursion_and_clamp(p: float) -> None:
    d = deltas(20, p)
    np.testing.assert_allclose(d, _recursion_30(20, p), rtol=1e-12)
    assert all(1 - p <= x <= 1 for x in d)


def test_unclamped_minimum_matches_paper_closed_form() -> None:
    """Where the clamp is inactive, err_m = (∛err + ∛c)³ + err (the paper's eq. (30))."""
    p = 0.9
    err = 1.0
    for m in range(2, 12):
        c = 2 ** (m - 1) * p**2
        d = deltas(m, p)[m - 1]
        assert 1 - p < d < 1
        new = err / d**2 + c / (1 - d) ** 2 + err
        assert new == pytest.approx((math.cbrt(err) + math.cbrt(c)) ** 3 + err, rel=1e-12)
        err = new


@pytest.mark.parametrize("p", (0.3, 0.9, 1.0))
def test_block_structure_eq_28(p: float) -> None:
    """Λ_{2^m − 1} = diag(δ_m Λ_{2^(m−1) − 1}, (1 − δ_m)/p, Λ_{2^(m−1) − 1})."""
    for m in range(2, 10):
        half = lambdas(2 ** (m - 1) - 1, p)
        full = lambdas(2**m - 1, p)
        d = deltas(m, p)[m - 1]
        np.testing.assert_allclose(full[: half.size], d * half, rtol=1e-13)
        assert full[half.size] == pytest.approx((1 - d) / p, rel=1e-13)
        np.testing.assert_allclose(full[half.size + 1 :], half, rtol=1e-13)


def test_prefix_for_incomplete_horizon() -> None:
    np.testing.assert_array_equal(lambdas(100, 0.7), lambdas(127, 0.7)[:100])


@pytest.mark.parametrize(("T", "p"), [(0, 0.5), (7, 0.0), (7, 1.01), (7, math.nan), (True, 0.5)])
def test_bad_input(T: int, p: float) -> None:
    with pytest.raises(ValueError, match=r"horizon|p must"):
        lambdas(T, p)
    with pytest.raises(ValueError, match=r"horizon|p must|k must"):
        lambda_at(T, 1, p)
