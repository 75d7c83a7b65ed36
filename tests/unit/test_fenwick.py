"""Dense builders of paper 004 (Alg. 1, Alg. 2, W_p) and the structured Fenwick helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_dp.strategies.fenwick.plan import (
    column_sums,
    decay_workload,
    level,
    levels_for,
    lowbit,
    query_path,
    query_sums,
    reconstruction_matrix,
    strategy_matrix,
    update_path,
)

PS = (0.1, 0.3, 0.5, 0.9, 0.99, 1.0)


@pytest.mark.parametrize("p", PS)
def test_workload_factorises_for_every_n_up_to_64(p: float) -> None:
    for n in range(1, 65):
        W = decay_workload(n, p)
        np.testing.assert_allclose(
            reconstruction_matrix(n, p) @ strategy_matrix(n, p), W, rtol=1e-12, atol=1e-15
        )


def test_workload_is_the_decayed_sum_by_brute_force() -> None:
    n, p = 9, 0.7
    D = np.arange(1.0, n + 1)
    W = decay_workload(n, p)
    for t in range(1, n + 1):
        assert W[t - 1] @ D == pytest.approx(sum(p ** (t - j) * D[j - 1] for j in range(1, t + 1)))


def test_paper_example_matrices_and_numbers() -> None:
    """Paper 004, eqs. (16)–(17): T = 7, p = 0.3, ‖L‖₁ = 1.327, error 25.635/ε²."""
    L = strategy_matrix(7, 0.3)
    B = reconstruction_matrix(7, 0.3)
    L_paper = np.eye(7)
    L_paper[1, 0] = 0.3
    L_paper[3, :3] = [0.027, 0.09, 0.3]
    L_paper[5, 4] = 0.3
    np.testing.assert_allclose(L, L_paper, atol=1e-12)
    B_paper = np.eye(7)
    B_paper[2, 1] = 0.3
    B_paper[4, 3] = 0.3
    B_paper[5, 3] = 0.09
    B_paper[6, 3], B_paper[6, 5] = 0.027, 0.3
    np.testing.assert_allclose(B, B_paper, atol=1e-12)
    norm1 = float(np.abs(L).sum(axis=0).max())
    assert round(norm1, 3) == 1.327
    assert round(2 * np.trace(B.T @ B) * norm1**2, 3) == 25.635
    # Scaling row 7 of L by 1.3 and B[7, 7] to 1/1.3 gives 24.196/ε² (same sensitivity).
    B2 = B.copy()
    B2[6, 6] = 0.769  # as printed in eq. (17)
    assert round(2 * np.trace(B2.T @ B2) * norm1**2, 3) == 24.196


def test_last_row_of_L_is_built() -> None:
    """Alg. 1 with ``i ≤ N`` (the text's ``i < N`` would leave row N empty)."""
    for n in (1, 5, 8):
        assert strategy_matrix(n, 0.5)[n - 1, n - 1] == 1.0


def test_paths_and_bits_by_brute_force() -> None:
    n = 100
    for j in range(1, n + 1):
        assert lowbit(j) == max(1 << b for b in range(8) if j % (1 << b) == 0)
        assert level(j) == int(math.log2(lowbit(j)))
        covering = [i for i in range(1, n + 1) if i - lowbit(i) < j <= i]
        assert update_path(j, n) == covering
        assert sorted(query_path(j), reverse=True) == query_path(j)
        # query path nodes partition (0, j]
        covered = sorted(x for k in query_path(j) for x in range(k - lowbit(k) + 1, k + 1))
        assert covered == list(range(1, j + 1))
    assert [levels_for(n) for n in (1, 2, 3, 7, 8, 1023, 1024)] == [1, 2, 2, 3, 4, 10, 11]


@pytest.mark.parametrize("p", (0.3, 0.95, 1.0))
def test_structured_sums_match_dense(p: float) -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 64, 100, 255):
        w = rng.uniform(0.2, 1.5, n)
        L = strategy_matrix(n, p)
        B = reconstruction_matrix(n, p)
        sums, lengths = column_sums(w, p)
        np.testing.assert_allclose(sums, (w[:, None] * L).sum(axis=0), rtol=1e-12)
        np.testing.assert_array_equal(lengths, (L != 0).sum(axis=0))
        np.testing.assert_allclose(
            query_sums(w, p, 2.0), ((B / w[None, :]) ** 2).sum(axis=1), rtol=1e-12
        )
        np.testing.assert_allclose(query_sums(w, p, 1.0), (B / w[None, :]).sum(axis=1), rtol=1e-12)


@pytest.mark.parametrize(
    ("n", "p", "match"),
    [
        (0, 0.5, "n must"),
        (3, 0.0, "p must"),
        (3, 1.5, "p must"),
        (3, math.nan, "p must"),
        (3, -0.1, "p must"),
    ],
)
def test_bad_input(n: int, p: float, match: str) -> None:
    for builder in (strategy_matrix, reconstruction_matrix, decay_workload):
        with pytest.raises(ValueError, match=match):
            builder(n, p)
    with pytest.raises(ValueError, match="i must"):
        lowbit(0)
    with pytest.raises(ValueError, match="j must"):
        update_path(5, 4)
