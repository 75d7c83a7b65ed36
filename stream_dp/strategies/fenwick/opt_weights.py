"""Optimal diagonal Λ for the Fenwick strategy: problem (21) of paper 004, solved numerically.

Problem (21): minimise ``f(λ) = Σ_j c_j / λ_j²`` subject to every column sum of ``ΛL`` being ≤ 1
(``λ > 0``), with ``c_j = ‖B(:, j)‖²`` — the squared norm of column j of the reconstruction
matrix over the released rows. ``f`` is convex on ``λ > 0`` and the constraints are linear.

Method: dual ascent. For multipliers ``μ ≥ 0`` the Lagrangian is minimised in closed form by
``λ_j(μ) = (2 c_j / (Lμ)_j)^(1/3)``; the dual ``q(μ) = 3·2^(−2/3) Σ_j c_j^(1/3) (Lμ)_j^(2/3) − Σ μ`` is
concave with gradient ``Lᵀλ(μ) − 1`` (the column sums minus one), and we take multiplicative steps
``μ ← μ · (Lᵀλ(μ))²``. Every iterate is made feasible by dividing ``λ(μ)`` by its largest column
sum, and the best feasible iterate is kept. Both products (``Lμ`` and ``Lᵀλ``) use the tree
structure, O(n) work per product, no matrix.

**Carry.** The last release of an epoch is carried into the next ones, so its error weighs on
many later releases; (21) alone would starve the nodes of the last query path (e.g. the root at
``p = 1``). :func:`optimal_weights` therefore also scores candidates with the last row of ``B``
weighted by :func:`carry_weight`.

**Never worse than ``dm`` or ``dmfda``.** Among DM's uniform ``1/‖L‖₁``, DMFDA's Λ and the solves,
only candidates whose own-epoch error (sensitivity including the grid slack, squared, times
``f``) is ≤ the better of DM and DMFDA are eligible for the first epoch; the tests check it.

**Cache.** One solve per ``(p, n, rows)``, stored as ``.npy`` under ``$STREAM_DP_CACHE_DIR``
(default ``~/.cache/stream-dp``). A cached file only affects accuracy, never privacy: the
mechanism recomputes the exact sensitivity of whatever weights it uses.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from stream_dp.noise.grid import choose_grid
from stream_dp.strategies.fenwick.dmfda_weights import lambdas as dmfda_lambdas
from stream_dp.strategies.fenwick.plan import column_sums, levels_for

__all__ = [
    "CACHE_ENV",
    "CACHE_VERSION",
    "cache_dir",
    "carry_norms",
    "carry_weight",
    "column_norms",
    "mechanism_score",
    "objective",
    "optimal_weights",
    "solve",
]

Float64Array = NDArray[np.float64]

#: Environment variable naming the cache directory.
CACHE_ENV = "STREAM_DP_CACHE_DIR"
#: Bumped whenever the solver or the selection changes (part of the file name).
CACHE_VERSION = 2
#: Mirrors ``stream_dp.strategies.fenwick.base`` (grid slack per coordinate and resolution).
_SLACK_UNITS = 2.0
_RESOLUTION_BITS = 17


def cache_dir() -> Path:
    """The on-disk cache directory (``$STREAM_DP_CACHE_DIR`` or ``~/.cache/stream-dp``)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "stream-dp"


def column_norms(n: int, p: float, rows: int | None = None) -> Float64Array:
    """``c_j = ‖B(:, j)‖²`` over rows ``t ≤ rows`` (default ``n``): ``Σ_{d < min(lowbit j, rows−j+1)} p^(2d)``."""
    r = n if rows is None else rows
    j = np.arange(1, n + 1, dtype=np.int64)
    count: Float64Array = np.clip(np.minimum(j & -j, r - j + 1), 0, None).astype(np.float64)
    if p == 1.0:
        return count
    p2 = p * p
    out: Float64Array = -np.expm1(count * math.log(p2)) / (1.0 - p2)
    return out


def objective(weights: Float64Array, c: Float64Array) -> float:
    """``f(λ) = Σ_j c_j / λ_j²``."""
    return float(np.sum(c / (weights * weights)))


def mechanism_score(weights: Float64Array, p: float, c: Float64Array) -> float:
    """Exact error proxy of the mechanism with these weights: ``(L1 sensitivity)² · f(λ)``, cap 1.

    The sensitivity includes the grid slack exactly as the mechanism computes it.
    """
    n = weights.shape[0]
    levels = levels_for(n)
    grid = choose_grid(1.0 / (_SLACK_UNITS * levels), resolution_bits=_RESOLUTION_BITS)
    sums, lengths = column_sums(weights, p)
    sens = float(np.max(sums + _SLACK_UNITS * grid * lengths))
    return sens * sens * objective(weights, c)


def _node_sums(mu: Float64Array, p: float) -> Float64Array:
    """``L·μ``: Fenwick node sums ``Σ_{m in (j − lowbit j, j]} p^(j−m) μ_m``, by level, O(n)."""
    n = mu.shape[0]
    s = mu.copy()
    lv = 1
    while (1 << lv) <= n:
        start = (1 << lv) - 1  # 0-based index of the first node of level lv
        step = 1 << (lv + 1)
        for i in range(lv):
            off = 1 << i
            count = len(range(start, n, step))
            s[start::step] += (p**off) * s[start - off :: step][:count]
        lv += 1
    return s


def _col_sums(lam: Float64Array, p: float) -> Float64Array:
    """``Lᵀ·λ``: column sums (:func:`stream_dp.strategies.fenwick.plan.column_sums`), O(n)."""
    return column_sums(lam, p)[0]


def solve(
    n: int,
    p: float,
    rows: int | None = None,
    max_iter: int = 3000,
    tol: float = 1e-11,
    c: Float64Array | None = None,
) -> Float64Array:
    """Feasible weights (column sums of ΛL ≤ 1) minimising ``f`` by dual ascent (see module doc).

    ``c`` overrides the column weights (default :func:`column_norms`).
    """
    if c is None:
        c = column_norms(n, p, rows)
    positive = c > 0
    c_eff = np.where(positive, c, 1e-300)  # rows beyond `rows` carry no error: keep λ tiny-cost
    mu = np.ones(n, dtype=np.float64)
    best_f = math.inf
    best = np.ones(n, dtype=np.float64)
    stall = 0
    for _ in range(max_iter):
        a = _node_sums(mu, p)
        lam = np.cbrt(2.0 * c_eff / a)
        col = _col_sums(lam, p)
        feasible = lam / float(col.max())
        f = objective(feasible, c)
        if f < best_f * (1.0 - tol):
            best_f, best, stall = f, feasible, 0
        else:
            stall += 1
            if stall >= 60:
                break
        mu = mu * col * col
        mu = np.maximum(mu, 1e-300)
    return best


def _file(n: int, p: float, rows: int, carry: float, first: bool) -> Path:
    return cache_dir() / (
        f"fenwick-opt-v{CACHE_VERSION}-p{p.hex()}-n{n}-rows{rows}"
        f"-carry{carry.hex()}-first{int(first)}.npy"
    )


def carry_weight(n: int, p: float) -> float:
    """How much the last release of an epoch of ``n`` ticks weighs on later releases.

    ``p < 1`` (equal epochs, steady state): ``Σ_{τ=1..n} p^(2τ) / (1 − p^(2n))``;
    ``p = 1`` (doubling epochs): the ``2n`` ticks of the next epoch.
    """
    if p == 1.0:
        return 2.0 * n
    p2 = p * p
    return p2 / (1.0 - p2)


def carry_norms(n: int, p: float, rows: int | None, carry: float) -> Float64Array:
    """:func:`column_norms` plus ``carry`` times the squared row ``n`` of ``B`` (the last release)."""
    c = column_norms(n, p, rows).copy()
    if carry > 0.0:
        k = n
        while k > 0:
            c[k - 1] += carry * p ** (2 * (n - k))
            k -= k & -k
    return c


def optimal_weights(
    n: int,
    p: float,
    rows: int | None = None,
    use_cache: bool = True,
    carry: float | None = None,
    first_epoch: bool = True,
) -> Float64Array:
    """The best weights for an epoch of ``n`` ticks (cached on disk).

    Two criteria, both exact mechanism errors (:func:`mechanism_score`): the mean MSE of the
    epoch's own ``rows`` releases (``rows`` default ``n``), and the same plus the error the last
    release passes on to later epochs through the carry (``carry``, default
    :func:`carry_weight`). Candidates: DM, DMFDA and dual-ascent solves for several carry
    weights. With ``first_epoch`` the choice is restricted to candidates whose own-epoch error is
    ≤ the better of DM and DMFDA (so ``fenwick-opt`` is never worse than either over a horizon);
    among those (or all, without ``first_epoch``) the lowest carry-aware error wins.
    """
    r = n if rows is None else int(rows)
    if not 1 <= r <= n:
        raise ValueError(f"rows must be an integer in [1, n={n}], got {rows!r}")
    kappa = carry_weight(n, p) if carry is None else float(carry)
    if not (math.isfinite(kappa) and kappa >= 0.0):
        raise ValueError(f"carry must be a finite number ≥ 0, got {carry!r}")
    path = _file(n, p, r, kappa, first_epoch)
    if use_cache and path.exists():
        try:
            w = np.load(path, allow_pickle=False)
            if (
                w.shape == (n,)
                and w.dtype == np.float64
                and np.all(np.isfinite(w))
                and np.all(w > 0)
            ):
                return np.asarray(w, dtype=np.float64)
        except (OSError, ValueError):
            pass  # unreadable cache: recompute
    c_own = column_norms(n, p, r)
    c_all = carry_norms(n, p, r, kappa)
    uniform = np.full(n, 1.0 / float(_col_sums(np.ones(n), p).max()), dtype=np.float64)
    baselines = [dmfda_lambdas(n, p), uniform]
    solved = [solve(n, p, c=c_own)]
    for k in (kappa, kappa / 16.0) if kappa > 0.0 else ():
        solved.append(solve(n, p, c=carry_norms(n, p, r, k)))
    own = [mechanism_score(w, p, c_own) for w in baselines + solved]
    both = [mechanism_score(w, p, c_all) for w in baselines + solved]
    limit = min(own[:2])
    best_i = -1
    for i in range(len(own)):
        ok = (not first_epoch) or own[i] <= limit * (1.0 + 1e-12)
        # a solve must beat the baselines clearly (not by float noise) to be preferred
        margin = 1.0 if i < 2 else 1.0 - 1e-9
        if ok and (best_i < 0 or both[i] < both[best_i] * margin):
            best_i = i
    best = (baselines + solved)[best_i]
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy.tmp")
            with os.fdopen(fd, "wb") as fh:
                np.save(fh, best, allow_pickle=False)
            os.replace(tmp, path)
        except OSError:
            pass  # read-only home etc.: the result is still returned
    return best
