"""How much one person can move a mechanism's measurements: user-level sensitivity factors.

A mechanism measures ``M·x`` plus noise, where ``x`` is one stream's per-tick count vector and
``M`` its *privacy-normalised* measurement matrix (each row divided by its noise scale: Laplace
scale for pure DP, Gaussian σ for zCDP), calibrated so that one event of size ``cap`` in any one
tick spends the declared per-stream budget. A person whose bounded contribution to the stream is
``n`` events (at most ``n`` unit columns, ``b`` ticks apart when ``b > 0``, else several in one
tick) moves the measurements by ``M·x`` with ``x`` a sum of ``n`` unit vectors. The per-person
budget of the stream is the per-event one times a **factor**:

* pure DP: ``max_x ‖M x‖₁ / max_j ‖M e_j‖₁`` — :func:`pure_factor`; with ``M ≥ 0`` (every
  strategy shipped) ``‖M x‖₁ = Σ x_j ‖M e_j‖₁``, so the maximum is the largest sum of ``n``
  column norms with the spacing, found exactly by a one-dimensional dynamic program
  (:func:`max_spaced_sum`; VecSens of Choquette-Choo et al., "(Amplified) Banded Matrix
  Factorization", 2023, Alg. 3). For a matrix with negative entries the same value is an upper
  bound (the triangle inequality), never an underestimate.
* zCDP: ``max_x ‖M x‖₂² / max_j ‖M e_j‖₂²`` — :func:`zcdp_factor` (ρ scales with the square
  of the sensitivity). Exact closed forms: ``n²`` when ``b = 0`` (all events in the column of
  largest norm); for lower-triangular Toeplitz ``M`` with non-negative, non-increasing
  coefficients, ``n`` events exactly ``b`` apart from the first tick (Kalinin & Lampert,
  arXiv 2405.13763, Thm. 2) — :func:`toeplitz_spaced_norm_sq`. Otherwise the upper bound of
  Choquette-Choo et al. 2023, Alg. 4 (:func:`gram_upper_bound_sq`), which is exact for
  ``b``-banded Gram matrices. :func:`brute_force_norm_sq` enumerates every pattern: the test
  oracle for small instances.

Factors are floats computed from exact float matrices; callers that turn them into a budget
round the budget *up* (a factor is an upper bound on the privacy loss ratio only as computed;
see :mod:`stream_dp.user_level` for how the accountant uses them).

>>> import numpy as np
>>> max_spaced_sum(np.array([1.0, 5.0, 4.0, 3.0]), count=2, min_sep=2)
8.0
>>> max_spaced_sum(np.array([1.0, 5.0, 4.0, 3.0]), count=2, min_sep=0)
10.0
>>> ones = np.tril(np.ones((4, 4)))  # running sums measured directly: Toeplitz, coefficients 1
>>> float(toeplitz_spaced_norm_sq(np.ones(4), count=2, min_sep=2))
10.0
>>> float(brute_force_norm_sq(ones, count=2, min_sep=2))
10.0
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "brute_force_norm_sq",
    "gram_upper_bound_sq",
    "max_spaced_sum",
    "max_spaced_sums",
    "pure_factor",
    "toeplitz_spaced_norm_sq",
    "zcdp_factor",
]

Float64Array = NDArray[np.float64]


def _check_pattern(count: int, min_sep: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an integer >= 1, got {count!r}")
    if isinstance(min_sep, bool) or not isinstance(min_sep, int) or min_sep < 0:
        raise ValueError(f"min_sep must be an integer >= 0, got {min_sep!r}")


def max_spaced_sum(values: Float64Array, count: int, min_sep: int) -> float:
    """``max Σ_{j∈S} values[j]`` over multisets ``S`` of at most ``count`` indices, any two at
    least ``min_sep`` apart (``min_sep = 0``: an index may repeat; ``1``: distinct indices).

    Exact, O(len(values) · count): ``F_k[i] = max(values[i] + F_{k−1}[i + min_sep], F_k[i+1])``.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError("values must be a non-empty vector")
    return float(max_spaced_sums(v[None, :], count, min_sep)[0, -1])


def max_spaced_sums(rows: Float64Array, count: int, min_sep: int) -> Float64Array:
    """:func:`max_spaced_sum` of every row of ``rows`` (a 2-D array) for every count
    ``0 … count`` at once: an array ``(rows, count + 1)``, non-decreasing along the counts.

    >>> max_spaced_sums(np.array([[1.0, 5.0, 4.0, 3.0]]), count=2, min_sep=2).tolist()
    [[0.0, 5.0, 8.0]]
    """
    _check_pattern(count, min_sep)
    v = np.asarray(rows, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] == 0:
        raise ValueError("rows must be a non-empty 2-D array")
    out = np.zeros((v.shape[0], count + 1))
    if min_sep == 0:
        best = np.maximum(v.max(axis=1), 0.0)
        out[:] = best[:, None] * np.arange(count + 1)[None, :]
        return out
    n = v.shape[1]
    f = np.zeros((v.shape[0], n + min_sep))
    for k in range(1, count + 1):
        g = np.zeros_like(f)
        g[:, :n] = v + f[:, min_sep:min_sep + n]
        f = np.maximum.accumulate(np.maximum(g, 0.0)[:, ::-1], axis=1)[:, ::-1]
        out[:, k] = f[:, 0]
    return out


def pure_factor(m: Float64Array, count: int, min_sep: int) -> float:
    """The pure-DP user-level factor of measurement matrix ``m`` (rows: measurements, columns:
    ticks) for ``count`` events ``min_sep`` apart; exact when ``m ≥ 0``, an upper bound
    otherwise."""
    norms = np.abs(np.asarray(m, dtype=np.float64)).sum(axis=0)
    return max_spaced_sum(norms, count, min_sep) / float(norms.max())


def toeplitz_spaced_norm_sq(coefficients: Float64Array, count: int, min_sep: int) -> float:
    """``max_x ‖C x‖₂²`` for the lower-triangular Toeplitz ``C`` (``n × n``, first column
    ``coefficients``) over ``count`` unit events ``min_sep`` apart: exact when the coefficients
    are non-negative and non-increasing (checked; otherwise ``ValueError``), by placing the
    events at ticks ``0, b, 2b, …`` (``b = 0``: all at tick 0)."""
    _check_pattern(count, min_sep)
    c = np.asarray(coefficients, dtype=np.float64)
    if c.ndim != 1 or c.size == 0:
        raise ValueError("coefficients must be a non-empty vector")
    if (c < 0).any() or (np.diff(c) > 0).any():
        raise ValueError("the closed form needs non-negative, non-increasing coefficients")
    n = c.size
    x = np.zeros(n)
    if min_sep == 0:
        x[0] = count
    else:
        x[0:min(n, count * min_sep):min_sep] = 1.0
    y = np.convolve(c, x)[:n]
    return float(y @ y)


def gram_upper_bound_sq(m: Float64Array, count: int, min_sep: int) -> float:
    """An upper bound of ``max_x ‖m x‖₂²`` (Choquette-Choo et al. 2023, Alg. 4): per row of
    ``|mᵀm|`` the best spaced sum, then the best spaced sum of those; exact when columns further
    than ``min_sep`` apart are orthogonal. ``min_sep = 0`` gives the exact ``count² ·
    max_j ‖m e_j‖²``."""
    _check_pattern(count, min_sep)
    mm = np.asarray(m, dtype=np.float64)
    if min_sep == 0:
        return float(count * count * (mm * mm).sum(axis=0).max())
    gram = np.abs(mm.T @ mm)
    rows = np.array([max_spaced_sum(row, count, min_sep) for row in gram])
    return max_spaced_sum(rows, count, min_sep)


def brute_force_norm_sq(m: Float64Array, count: int, min_sep: int) -> float:
    """``max_x ‖m x‖₂²`` by enumerating every pattern of at most ``count`` events (the test
    oracle; exponential in ``count``)."""
    _check_pattern(count, min_sep)
    mm = np.asarray(m, dtype=np.float64)
    n = mm.shape[1]
    best = 0.0
    for k in range(1, count + 1):
        picks = (itertools.combinations_with_replacement(range(n), k) if min_sep == 0
                 else itertools.combinations(range(n), k))
        for pick in picks:
            if min_sep and any(b - a < min_sep for a, b in itertools.pairwise(pick)):
                continue
            y = mm[:, list(pick)].sum(axis=1)
            best = max(best, float(y @ y))
    return best


def zcdp_factor(m: Float64Array, count: int, min_sep: int) -> float:
    """The zCDP user-level factor of ``m`` (ρ_person = factor · ρ per event): the exact value
    for ``min_sep = 0``, the upper bound :func:`gram_upper_bound_sq` otherwise (use
    :func:`toeplitz_spaced_norm_sq` for Toeplitz strategies: exact and O(n))."""
    mm = np.asarray(m, dtype=np.float64)
    single = float((mm * mm).sum(axis=0).max())
    return gram_upper_bound_sq(mm, count, min_sep) / single
