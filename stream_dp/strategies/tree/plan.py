"""Sparse dyadic hierarchies for decayed sums: exact error, causal Honaker estimate, plan search.

A **plan** keeps a subset ``ℓ_0 = 0 < ℓ_1 < … < ℓ_{m−1}`` of the dyadic levels; level ``ℓ`` has
blocks of ``b = 2**ℓ`` ticks ``(k·b, (k+1)·b]``. Block ``v`` of level ``i`` is measured when it
completes (at its last tick ``e_v``) as the *decayed* block sum

    S_v = Σ_{j in v} p^(e_v − j) D_j,   y_v = w_i·S_v + Z_v,

``Z`` i.i.d. noise of variance ``σ²`` (the same for every coordinate), so the node estimate
``y_v / w_i`` has variance ``σ_i² = σ²/w_i²``. Every tick ``j`` lies in exactly one block per
level, and its coefficient in level ``i`` is ``w_i·p^(e−j) ≤ w_i``, with equality when ``j`` ends
a top-level block: the L1 sensitivity is exactly ``Σ w_i`` and the L2 sensitivity ``‖w‖₂``
(per unit of contribution; one measured coordinate per level).

**Causal Honaker estimate.** A parent of level ``i ≥ 1`` completes at the same tick as its last
child, so bottom-up inverse-variance weighting (Honaker 2015, the upward pass) is causal:

    Ŝ_v = α_i·(y_v / w_i) + (1 − α_i)·Σ_c p^(e_v − e_c) Ŝ_c,
    C_i = V_{i−1}·Σ_{r<k_i} p^(2r·b_{i−1}),   V_i = 1/(1/σ_i² + 1/C_i),   α_i = V_i/σ_i²,

with ``k_i = 2**(ℓ_i − ℓ_{i−1})`` children. ``Ŝ_v`` is the best linear unbiased estimate of
``S_v`` from the measurements inside ``v`` — and those are all the completed measurements that
carry information on ``S_v`` (disjoint blocks have independent data and noise).

**Release.** ``[1, t]`` is the disjoint union of completed blocks: all completed top-level blocks,
then at each lower level the completed blocks inside the open parent. The release is
``Σ_v p^(t − e_v) Ŝ_v`` and its exact variance is ``Σ_i coef_i(t)·V_i`` with (closed form)

    coef_i(t) = p^(2(r mod b_i))·(1 − q^d)/(1 − q),   q = p^(2 b_i),   d = ⌊r / b_i⌋,

where ``r = t mod b_{i+1}`` (``r = t`` at the top level). The structured code keeps, per level, the
true partial sum of the open block and the decayed sum of the estimates of its completed blocks
inside the open parent: ``2m`` numbers per stream, no epochs.

**Plan search** (:func:`best_plan`): minimise the mean over ``t = 1..horizon`` of the release
variance over level sets and per-level weights (weights by L-BFGS on ``log w``; level sets by a
local search from evenly spaced sets: add, drop or move one level). The plan with only level 0 is
input perturbation (``naive``), so the search is never worse than it. Plans are cached as JSON
under ``$STREAM_DP_CACHE_DIR`` (default ``~/.cache/stream-dp``).

>>> plan = TreePlan(levels=(0,), weights=(1.0,))
>>> t = np.arange(1, 4096)
>>> naive = float(np.mean(2.0 * (1 - 0.25**t) / 0.75))  # σ²·(1 − p^(2t))/(1 − p²), p = 0.5
>>> abs(mean_variance(plan, 0.5, 4095, 2.0) - naive) < 1e-12
True
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
from scipy.optimize import minimize

from stream_dp.mechanism import Float64Array

__all__ = [
    "CACHE_ENV",
    "CACHE_VERSION",
    "Model",
    "TreePlan",
    "best_plan",
    "binary_plan",
    "cache_dir",
    "level_coefficients",
    "mean_variance",
    "node_variances",
    "rounding_bounds",
    "variance_curve",
]

Model = Literal["pure", "zcdp"]

#: Environment variable naming the cache directory (same convention as ``fenwick_opt``).
CACHE_ENV = "STREAM_DP_CACHE_DIR"
#: Bumped whenever the search or the error model changes (part of the cache file name).
CACHE_VERSION = 2
#: Levels whose optimised weight falls below this fraction of the largest are dropped.
_PRUNE = 1e-3
#: Highest dyadic level considered (blocks of 2**40 ticks).
MAX_LEVEL = 40


def cache_dir() -> Path:
    """The on-disk cache directory (``$STREAM_DP_CACHE_DIR`` or ``~/.cache/stream-dp``)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "stream-dp"


@dataclass(frozen=True)
class TreePlan:
    """Kept dyadic levels (increasing, starting at 0) and their measurement weights (> 0).

    Weights are relative: the mechanism normalises them to unit sensitivity of its model
    (``Σ w = 1`` under pure DP, ``‖w‖₂ = 1`` under zCDP).
    """

    levels: tuple[int, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        lv = tuple(int(x) for x in self.levels)
        w = tuple(float(x) for x in self.weights)
        if not lv or lv[0] != 0 or any(b <= a for a, b in itertools.pairwise(lv)):
            raise ValueError(f"levels must be strictly increasing and start at 0, got {lv!r}")
        if lv[-1] > MAX_LEVEL:
            raise ValueError(f"levels must be in [0, {MAX_LEVEL}], got {lv!r}")
        if len(w) != len(lv) or not all(math.isfinite(x) and x > 0 for x in w):
            raise ValueError(f"weights must be {len(lv)} finite numbers > 0, got {w!r}")
        object.__setattr__(self, "levels", lv)
        object.__setattr__(self, "weights", w)

    def normalised(self, model: Model) -> TreePlan:
        """Weights scaled to unit L1 (``"pure"``) or L2 (``"zcdp"``) sensitivity."""
        w = np.asarray(self.weights)
        norm = float(w.sum()) if model == "pure" else float(np.sqrt(np.sum(w * w)))
        return TreePlan(self.levels, tuple(float(x) for x in w / norm))

    def sensitivity(self, model: Model) -> float:
        """Exact sensitivity per unit contribution: ``Σ w`` (L1, pure) or ``‖w‖₂`` (L2, zCDP)."""
        w = np.asarray(self.weights)
        return float(w.sum()) if model == "pure" else float(np.sqrt(np.sum(w * w)))


def _geo(d: Float64Array | float, log_q: float) -> Float64Array:
    """``Σ_{r<d} q^r = (1 − q^d)/(1 − q)`` with ``q = exp(log_q) ≤ 1`` (``d`` when ``q = 1``)."""
    dd = np.asarray(d, dtype=np.float64)
    if log_q == 0.0:
        return dd.copy()
    out: Float64Array = np.expm1(dd * log_q) / math.expm1(log_q)
    return out


def level_coefficients(levels: Iterable[int], p: float, horizon: int) -> Float64Array:
    """``coef[i, t−1]``: weight of ``V_i`` in the variance of the release at tick ``t``.

    Shape ``(m, horizon)``; see the module docstring for the closed form.
    """
    lv = tuple(levels)
    return np.stack(
        [_coef(lv[i], lv[i + 1] if i + 1 < len(lv) else None, p, horizon) for i in range(len(lv))]
    )


def _coef_array(level: int, upper: int | None, p: float, horizon: int) -> Float64Array:
    t = np.arange(1, horizon + 1, dtype=np.int64)
    b = 1 << level
    r = t if upper is None else t & ((1 << upper) - 1)
    d = (r >> level).astype(np.float64)
    rem = (r & (b - 1)).astype(np.float64)
    log_p = math.log(p)
    out: Float64Array = np.exp(2.0 * rem * log_p) * _geo(d, 2.0 * b * log_p)
    return out


def _coef(level: int, upper: int | None, p: float, horizon: int) -> Float64Array:
    return _coef_array(level, upper, float(p), int(horizon))


@lru_cache(maxsize=4096)
def _mean_coef(level: int, upper: int | None, p: float, horizon: int) -> float:
    return float(_coef_array(level, upper, p, horizon).mean())


def node_variances(
    levels: Iterable[int], weights: Iterable[float], p: float, unit_variance: float
) -> tuple[Float64Array, Float64Array]:
    """``(V, α)``: variance of each level's causal Honaker estimate and its own-measurement weight.

    ``unit_variance`` is the variance of one noise coordinate (measurement units²).
    """
    lv = tuple(levels)
    w = np.asarray(tuple(weights), dtype=np.float64)
    sig2 = unit_variance / (w * w)
    v = np.empty(len(lv))
    alpha = np.empty(len(lv))
    v[0], alpha[0] = sig2[0], 1.0
    log_p = math.log(p)
    for i in range(1, len(lv)):
        k = 1 << (lv[i] - lv[i - 1])
        c = v[i - 1] * float(_geo(float(k), 2.0 * (1 << lv[i - 1]) * log_p))
        v[i] = 1.0 / (1.0 / sig2[i] + 1.0 / c)
        alpha[i] = c / (sig2[i] + c)
    return v, alpha


def variance_curve(plan: TreePlan, p: float, horizon: int, unit_variance: float) -> Float64Array:
    """Exact variance of the release at ticks ``1..horizon`` (weights used as given)."""
    v, _ = node_variances(plan.levels, plan.weights, p, unit_variance)
    coef = level_coefficients(plan.levels, p, horizon)
    out: Float64Array = v @ coef
    return out


def mean_variance(plan: TreePlan, p: float, horizon: int, unit_variance: float) -> float:
    """Mean of :func:`variance_curve` over ``1..horizon``, in O(m) once the coefficients are known."""
    v, _ = node_variances(plan.levels, plan.weights, p, unit_variance)
    lv = plan.levels
    a = [
        _mean_coef(lv[i], lv[i + 1] if i + 1 < len(lv) else None, p, horizon)
        for i in range(len(lv))
    ]
    return float(np.dot(v, a))


def rounding_bounds(plan: TreePlan, p: float, grid: float, horizon: int) -> float:
    """Largest |release − (true + noise)| caused by rounding each measurement to ``grid``.

    Each measurement is off by ≤ ``grid/2`` (measurement units), i.e. ``grid/(2 w_i)`` in value
    units; the estimator is a convex combination per level, so the error of a level-``i`` estimate
    is ≤ ``E_i = α_i·g/(2w_i) + (1 − α_i)·E_{i−1}·Σ_{r<k_i} p^(r b_{i−1})``. The release adds at
    most ``k_{i+1} − 1`` decayed estimates per level and all completed top blocks (for ``p = 1``:
    those within ``horizon`` ticks).
    """
    _, alpha = node_variances(plan.levels, plan.weights, p, 1.0)
    lv = plan.levels
    w = plan.weights
    log_p = math.log(p)
    e = np.empty(len(lv))
    e[0] = grid / (2.0 * w[0])
    for i in range(1, len(lv)):
        k = 1 << (lv[i] - lv[i - 1])
        carry = float(_geo(float(k), (1 << lv[i - 1]) * log_p))
        e[i] = alpha[i] * grid / (2.0 * w[i]) + (1.0 - alpha[i]) * e[i - 1] * carry
    total = 0.0
    for i in range(len(lv)):
        b = 1 << lv[i]
        if i + 1 < len(lv):
            count = float((1 << (lv[i + 1] - lv[i])) - 1)
        else:
            count = float(max(1, horizon // b)) if p == 1.0 else math.inf
        total += (
            e[i] * float(_geo(count, b * log_p))
            if math.isfinite(count)
            else e[i] / -math.expm1(b * log_p)
        )
    return total


# ---------------------------------------------------------------------------------- search
# With every dyadic level 0..top present and weight w_i ≥ 0 (w_i = 0: level not measured, its
# estimate is the sum of its children), the recursion has a closed form: 1/V_i = Q_i/N with
# Q_i = Σ_{j≤i} w_j²·h_ji, h_ji = 1/Π_{j<l≤i} (1 + p^(2^l)), N = (Σw)² (pure) or Σw² (zCDP).
# So the mean variance is F(w) = N(w)·Σ_i a_i/Q_i(w) with a_i the mean level coefficients of the
# full binary hierarchy, a smooth function of w with an analytic gradient; the support of the
# optimum is the level set. Under zCDP F is convex in u = w² on the simplex; under pure DP it is
# not, so several sparse starts are tried.


def _full_tables(p: float, horizon: int, top: int) -> tuple[Float64Array, Float64Array]:
    a = np.array(
        [_mean_coef(i, i + 1 if i < top else None, p, horizon) for i in range(top + 1)],
        dtype=np.float64,
    )
    log_g = np.array(
        [0.0]
        + [
            math.log1p(math.exp((1 << min(lv, 1000)) * math.log(p))) if p < 1.0 else math.log(2.0)
            for lv in range(1, top + 1)
        ]
    )
    cum = np.cumsum(log_g)
    # h[j, i] = exp(-(cum[i] - cum[j])) for j ≤ i, 0 otherwise
    diff = cum[None, :] - cum[:, None]
    h = np.where(
        np.triu(np.ones((top + 1, top + 1), dtype=bool)), np.exp(-np.maximum(diff, 0.0)), 0.0
    )
    return a, h


def _score_grad(
    w: Float64Array, a: Float64Array, h: Float64Array, model: Model
) -> tuple[float, Float64Array]:
    q = (w * w) @ h
    s = float(np.sum(a / q))
    if model == "pure":
        tot = float(w.sum())
        n, dn = tot * tot, np.full_like(w, 2.0 * tot)
    else:
        n, dn = float(np.sum(w * w)), 2.0 * w
    grad = dn * s - 2.0 * n * w * (h @ (a / (q * q)))
    return n * s, grad


def _optimise(
    w0: Float64Array, a: Float64Array, h: Float64Array, model: Model, free: Float64Array
) -> tuple[float, Float64Array]:
    """L-BFGS-B on ``w ≥ 0`` (``w_0 ≥ 1e-9``); coordinates with ``free == 0`` stay at 0."""
    bounds = [(1e-9, None)] + [(0.0, None if f else 0.0) for f in free[1:]]

    def f(x: Float64Array) -> tuple[float, Float64Array]:
        return _score_grad(x, a, h, model)

    res = minimize(f, w0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": 2000})
    x = np.asarray(res.x, dtype=np.float64)
    return float(f(x)[0]), x / x.sum()


def _search(p: float, horizon: int, model: Model) -> TreePlan:
    top = max(0, min(MAX_LEVEL, math.floor(math.log2(horizon))))
    a, h = _full_tables(p, horizon, top)
    m = top + 1
    starts = [np.eye(m)[0], np.ones(m)]
    for gap in range(2, 6):
        for off in range(gap):
            s = np.zeros(m)
            s[0] = 1.0
            s[[x for x in range(1, m) if (x - off) % gap == 0]] = 1.0
            starts.append(s)
    free_all = np.ones(m)
    best_val, best_w = math.inf, starts[0]
    for s in starts:
        val, w = _optimise(s / s.sum(), a, h, model, free_all)
        # prune negligible levels and polish on the support
        support = (w >= _PRUNE * float(w.max())).astype(np.float64)
        support[0] = 1.0
        w = np.where(support > 0, w, 0.0)
        val, w = _optimise(w / w.sum(), a, h, model, support)
        w = np.where(support > 0, w, 0.0)
        val = _score_grad(w, a, h, model)[0]
        if val < best_val * (1.0 - 1e-12):
            best_val, best_w = val, w
    keep = [i for i in range(m) if i == 0 or best_w[i] > 0.0]
    plan = TreePlan(tuple(keep), tuple(float(best_w[i]) for i in keep)).normalised(model)
    # 12 significant digits: the optimum is flat there, and a restore on another platform
    # (different BLAS/scipy) then almost surely rebuilds bit-identical weights
    return TreePlan(plan.levels, tuple(float(f"{x:.12g}") for x in plan.weights))


def _cache_file(p: float, horizon: int, model: Model) -> Path:
    return cache_dir() / f"tree-plan-v{CACHE_VERSION}-{model}-p{p.hex()}-T{horizon}.json"


@lru_cache(maxsize=256)
def best_plan(p: float, horizon: int, model: Model = "pure", use_cache: bool = True) -> TreePlan:
    """The level set and weights minimising the mean release variance over ``1..horizon``.

    ``p`` ∈ (0, 1] decay per tick, ``horizon`` ≥ 1 ticks, ``model`` ``"pure"`` (L1 sensitivity) or
    ``"zcdp"`` (L2). Weights are normalised to unit sensitivity of the model. Cached on disk.
    """
    if not (0.0 < p <= 1.0) or horizon < 1 or model not in ("pure", "zcdp"):
        raise ValueError(
            f"best_plan needs p in (0, 1], horizon ≥ 1, model 'pure'|'zcdp'; got {p!r}, {horizon!r}, {model!r}"
        )
    path = _cache_file(float(p), int(horizon), model)
    if use_cache and path.exists():
        try:
            doc = json.loads(path.read_text())
            return TreePlan(tuple(doc["levels"]), tuple(doc["weights"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable cache: recompute
    plan = _search(float(p), int(horizon), model)
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".json.tmp")
            with os.fdopen(fd, "w") as fh:
                json.dump({"levels": list(plan.levels), "weights": list(plan.weights)}, fh)
            os.replace(tmp, path)
        except OSError:
            pass  # read-only cache dir: the plan is still returned
    return plan


def binary_plan(horizon: int, model: Model = "pure") -> TreePlan:
    """The classic binary tree: every level ``0..⌊log2 horizon⌋``, equal weights."""
    top = max(0, min(MAX_LEVEL, math.floor(math.log2(max(1, horizon)))))
    return TreePlan(tuple(range(top + 1)), (1.0,) * (top + 1)).normalised(model)
