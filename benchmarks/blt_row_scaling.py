"""How far a row scaling would take ``blt`` at p = 1 (issue #36; a measurement, not a mechanism).

The mechanism measures with ``C·D`` (BLT ``C``, equalising column scales ``D``); its best fit over
(θ, w) stops at 1.0361× the bound at T = 32767 whatever the number of buffers
(``benchmarks/blt_scaled_refit.py``). This script adds a row scaling: ``C' = R·C·D`` with
``R = diag(r_t)`` and ``D`` equalising the columns of ``R·C``, i.e. noise ``N = D⁻¹C⁻¹R⁻¹ζ`` —
in the mechanism the same filter with the tick-``t`` discrete Gaussian at scale ``σ/(d_t·r_t)``
instead of ``σ/d_t``. ``log r_t = α·log(1 + t/a) + β·log(1 + (T − 1 − t)/b)`` (four parameters;
the shape of the free optimum at T = 255 rises then falls). The slack-free loss

    L = mean_t Var(Σ_{s≤t} √S'_s·M_s),   M = C⁻¹R⁻¹ζ,   S'_j = Σ_{k<T−j} r_(j+k)²·c_k²

(every column of ``C'`` scaled to one norm) is evaluated in ``O(T·d²)`` and minimised over
(θ, w, α, β, log a, log b) by L-BFGS-B with complex-step gradients. ``--dense`` checks the loss
against the dense definition at a small ``T`` first.

Usage::

    python benchmarks/blt_row_scaling.py --horizon 32767 --buffers 7
    python benchmarks/blt_row_scaling.py --horizon 255 --buffers 4 --dense 40 --general
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import solve_triangular
from scipy.optimize import minimize
from scipy.signal import lfilter

from stream_dp.strategies.blt import plan
from stream_dp.strategies.blt._scaled_fit import _poles

STEP = 1e-30


def rows(z: NDArray[np.complex128], n: int) -> NDArray[np.complex128]:
    """``r_t``, ``t = 0..n−1``, from ``z = (α, β, log a, log b)``."""
    t = np.arange(n, dtype=np.float64)
    return np.exp(z[0] * np.log1p(t / np.exp(z[2])) + z[1] * np.log1p((n - 1 - t) / np.exp(z[3])))


def curve(theta: NDArray[np.complex128], w: NDArray[np.complex128], r: NDArray[np.complex128],
          p: float = 1.0, sums: NDArray[np.complex128] | None = None
          ) -> NDArray[np.complex128]:
    """The slack-free release variance at every tick of one block (``S'``-normalised: compare
    with the bound directly); ``p < 1``: of the decayed sum, ``Var E_t = p²·Var E_(t−1) +
    2p·e_t·Cov(E_(t−1), M_t) + e_t²·Var M_t`` (benchmarks/blt_restart_blocks.py). ``sums``:
    the columns' square norms ``S'`` if not the block's own (benchmarks/blt_start_rows.py)."""
    n = len(r)
    r2 = r * r
    d = len(theta)
    if sums is None:
        s = r2.copy()  # S'_j = r_j² + Σ_il w_i w_l G_il(j), G(j) = r_(j+1)² + q G(j+1)
        for i in range(d):
            for j in range(i, d):
                q = theta[i] * theta[j]
                g = np.zeros(n, dtype=np.complex128)
                g[:-1] = lfilter([1.0], [1.0, -q], r2[1:][::-1])[::-1]
                s += (1.0 if i == j else 2.0) * w[i] * w[j] * g
    else:
        s = sums
    e = np.sqrt(s)  # 1/d_j up to the common factor, which cancels
    u = 1.0 / r2
    lam, a = _poles(theta, w)
    var_m = u.copy()
    big_r = np.tile(u, (d, 1))
    for i in range(d):
        for j in range(i, d):
            q_ij = np.concatenate(([0.0], lfilter([1.0], [1.0, -lam[i] * lam[j]], u[:-1])))
            big_r[i] += lam[i] * a[j] * q_ij
            if j != i:
                big_r[j] += lam[j] * a[i] * q_ij
            var_m += (1.0 if i == j else 2.0) * a[i] * a[j] * q_ij
    cross = np.zeros(n, dtype=np.complex128)
    for i in range(d):
        cross[1:] += a[i] * lfilter([1.0], [1.0, -p * lam[i]], e[:-1] * big_r[i][:-1])
    step = 2.0 * p * e * cross + e * e * var_m
    out: NDArray[np.complex128] = (np.cumsum(step) if p == 1.0
                                   else lfilter([1.0], [1.0, -p * p], step))
    return out


def loss(theta: NDArray[np.complex128], w: NDArray[np.complex128], r: NDArray[np.complex128],
         end_weight: float = 0.0, p: float = 1.0) -> complex:
    """The slack-free mean release variance over the block, plus ``end_weight`` times the
    variance at its last tick (the block estimate later blocks build on)."""
    c = curve(theta, w, r, p)
    return complex(np.mean(c) + end_weight * c[-1])


def unpack(x: NDArray[np.complex128], n: int) -> tuple[NDArray[np.complex128], ...]:
    d = (len(x) - 4) // 2
    return 1.0 / (1.0 + np.exp(-x[:d])), np.exp(x[d:2 * d]), rows(x[2 * d:], n)


def value_and_gradient(x: NDArray[np.float64], n: int, end_weight: float = 0.0
                       ) -> tuple[float, NDArray[np.float64]]:
    d = (len(x) - 4) // 2
    th, w, _ = unpack(x.astype(np.complex128), n)
    if not plan._stable(th.real, w.real) or np.any(th.real > plan._MAX_THETA):
        return 1e30, np.zeros_like(x)
    value = loss(*unpack(x.astype(np.complex128), n), end_weight).real
    grad = np.empty(len(x))
    for k in range(len(x)):
        xc = x.astype(np.complex128)
        xc[k] += 1j * STEP
        grad[k] = loss(*unpack(xc, n), end_weight).imag / STEP
    del d
    return (value, grad) if math.isfinite(value) else (1e30, np.zeros_like(x))


def dense(x: NDArray[np.float64], n: int) -> float:
    """The definition: ``C' = R·C`` columns normalised, ``L = ‖W·C'⁻¹‖_F²/n``."""
    th, w, r = (v.real for v in unpack(x.astype(np.complex128), n))
    c = plan.coefficients(th, w, n)
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    k = np.where(lag >= 0, c[np.clip(lag, 0, None)], 0.0) * r[:, None]
    k = k / np.sqrt(np.sum(k * k, axis=0))[None, :]
    b = solve_triangular(k.T, np.tril(np.ones((n, n))).T, lower=False).T
    return float(np.sum(b * b) / n)


def as_a_mechanism_would(x: NDArray[np.float64], n: int) -> tuple[float, float, float, bool]:
    """The slack-free ratio with the rounding a mechanism would need: (θ, w) quantised
    (``plan._quantised``), ``r`` scaled to max 1 and rounded down to ``2⁻²⁰``, the column scales
    ``d_j = √(K/S'_j)`` (``K = max S'``, margin ``1 − 2⁻³⁰``) rounded down to ``2⁻²⁰``, release
    variance by the plan's own ``scaled_variance_curve`` with ``u_j = 1/r_j²``. Returns
    ``(ratio, min r, max d, monotone)``; monotone: whether ``d`` is non-decreasing, as
    ``plan.column_scales`` guarantees today and ``plan.scaled_abs_rows`` (the rounding bound's
    Abel summation) assumes — with rows it need not be, and forcing it (``d_j ← min_(i≥j) d_i``)
    costs most of the gain (1.0963× at T = 32767)."""
    d = (len(x) - 4) // 2
    th, w = plan._quantised(1.0 / (1.0 + np.exp(-x[:d])), np.exp(x[d:2 * d]))
    r = rows(x[2 * d:].astype(np.complex128), n).real
    r = np.maximum(np.floor(r / r.max() / 2.0**-20) * 2.0**-20, 2.0**-20)
    # S'_j = Σ_{k<n−j} r_(j+k)² c_k²: the same recurrences as loss(), in float64
    s = loss_sums(th, w, r)
    k_max = float(s.max())
    exact = np.sqrt(k_max / s)
    scales = np.maximum(np.floor(exact * (1.0 - 2.0**-30) / 2.0**-20) * 2.0**-20, 1.0)
    monotone = bool(np.all(np.diff(scales) >= 0))
    assert float(np.max(scales**2 * s)) <= k_max
    curve = plan.scaled_variance_curve(th, w, scales, 1.0 / (r * r))
    sens = float(np.max(scales**2 * s))
    return sens * float(curve.mean()) / plan.mean_factor_sqrt_bound(1.0, n), float(r.min()), \
        float(scales.max()), monotone


def slack_share(x: NDArray[np.float64], n: int) -> float:
    """An estimate of what the present privacy slack would add to σ² with these rows (relative):
    ``(2·D·S'·d_max·Σ|c_k| + MAX_TICKS·S'²)/(D²·K)`` with ``S' = d_max + 2E``, ``K = max S'_j``,
    ``D`` and ``E`` from the shipped mechanism, ``E`` grown with the clip (``×2^⌈log₂(1/min r)⌉``)
    and with ``Σ w_i/(1 − θ_i)``. An estimate: the mechanism does not exist."""
    from stream_dp.budget import ZCDP
    from stream_dp.planner import make_mechanism
    from stream_dp.strategies.blt.mechanism import MAX_TICKS

    d = (len(x) - 4) // 2
    th, w = plan._quantised(1.0 / (1.0 + np.exp(-x[:d])), np.exp(x[d:2 * d]))
    r = rows(x[2 * d:].astype(np.complex128), n).real
    r = np.maximum(np.floor(r / r.max() / 2.0**-20) * 2.0**-20, 2.0**-20)
    s = loss_sums(th, w, r)
    k_max = float(s.max())
    d_max = float(np.max(np.floor(np.sqrt(k_max / s) / 2.0**-20) * 2.0**-20))
    mech = make_mechanism("blt", 1.0, n, ZCDP(0.5))
    ab = plan.abs_sum(th, w)
    err = mech.float_error * 2.0 ** math.ceil(math.log2(1.0 / float(r.min()))) * (
        ab / plan.abs_sum(mech.theta, mech.w))
    slack = d_max + 2.0 * err
    big_d = mech.d_units
    return (2.0 * big_d * slack * d_max * ab + MAX_TICKS * slack * slack) / (big_d**2 * k_max)


def loss_sums(th: NDArray[np.float64], w: NDArray[np.float64], r: NDArray[np.float64]
              ) -> NDArray[np.float64]:
    """``S'_j = Σ_{k<n−j} r_(j+k)²·c_k²`` for ``j = 0..n−1`` (``O(n·d²)``)."""
    n = len(r)
    r2 = r * r
    s = r2.copy()
    for i in range(len(th)):
        for j in range(i, len(th)):
            g = np.zeros(n)
            g[:-1] = lfilter([1.0], [1.0, -th[i] * th[j]], r2[1:][::-1])[::-1]
            s += (1.0 if i == j else 2.0) * w[i] * w[j] * g
    return s


def general_optimum(n: int, iters: int) -> float:
    """The best *streaming* factorisation at p = 1 over one block (dense, small ``n``): every
    lower-triangular ``C'`` (columns normalised inside the objective, so the gradient is exact),
    ``L = ‖W·C'⁻¹‖_F²/n``, L-BFGS-B from the square-root factorisation. Over the bound."""
    low = np.tril_indices(n)
    work = np.tril(np.ones((n, n)))

    def objective(v: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        k = np.zeros((n, n))
        k[low] = v
        norms = np.sqrt(np.sum(k * k, axis=0))
        c = k / norms
        inv = solve_triangular(c, np.eye(n), lower=True)
        b = work @ inv
        g = -2.0 * (inv @ b.T @ b).T / n  # d‖W C⁻¹‖² = −2 tr(C⁻¹ Bᵀ B dC)
        gk = g / norms - k * (np.sum(g * k, axis=0) / norms**3)
        return float(np.sum(b * b)) / n, gk[low]

    root = np.ones(n)
    for i in range(1, n):
        root[i] = root[i - 1] * (2 * i - 1) / (2 * i)  # (1 − x)^(−1/2)
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    start = np.where(lag >= 0, root[np.clip(lag, 0, None)], 0.0)[low]
    res = minimize(objective, start, jac=True, method="L-BFGS-B",
                   options={"maxiter": iters, "maxcor": 30, "ftol": 0.0, "gtol": 1e-14})
    return float(res.fun) / plan.mean_factor_sqrt_bound(1.0, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--horizon", type=int, default=32767)
    ap.add_argument("--buffers", type=int, default=7)
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--dense", type=int, default=0, help="check against the dense loss at this T")
    ap.add_argument("--general", action="store_true",
                    help="also the best lower-triangular factorisation (dense, small T)")
    ap.add_argument("--x", type=str, default="", help="comma-separated start point (θ, w, rows)")
    ap.add_argument("--end-weight", type=float, default=0.0,
                    help="weight of the block's last-tick variance in the loss (what later "
                         "blocks build on; 0.04 keeps it at or below the column-scaled fit's)")
    ap.add_argument("--max-logit", type=float, default=9.5,
                    help="upper bound on logit θ (1 − θ ≥ e^-x: keeps Σ w/(1 − θ), hence the "
                         "mechanism's float-error slack, small)")
    ap.add_argument("--write", action="store_true",
                    help="write the result as the packaged row fit fits/blt-rows-v1-n<T>.json")
    args = ap.parse_args()
    n, d = int(args.horizon), int(args.buffers)
    th0, w0 = (np.array(v) for v in plan.fit(1.0, 32767))
    if len(th0) != d:
        x_tw = plan._spread(1.0, n, d)
    else:
        x_tw = np.concatenate([np.log(th0 / (1.0 - th0)), np.log(w0)])
    x0 = np.concatenate([x_tw, [0.0, 0.0, 0.0, 0.0]])
    if args.x:
        x0 = np.array([float(v) for v in args.x.split(",")])
    if args.dense:
        m = int(args.dense)
        x1 = np.concatenate([x_tw, [0.3, 0.2, 1.0, 0.5]])
        print("dense check", loss(*unpack(x1.astype(np.complex128), m)).real, dense(x1, m))
    if args.general:
        print(f"best lower-triangular factorisation: {general_optimum(n, 5000):.6f}", flush=True)
    bound = plan.mean_factor_sqrt_bound(1.0, n)
    label = "given start" if args.x else "start (no row scaling)"
    print(f"T = {n}, d = {d}: {label} {value_and_gradient(x0, n)[0] / bound:.6f}", flush=True)
    t0 = time.perf_counter()
    it = [0]

    def report(xk: NDArray[np.float64]) -> None:
        it[0] += 1
        if it[0] % 10 == 0:
            print(f"  it {it[0]}: {value_and_gradient(xk, n)[0] / bound:.6f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)

    x0[:d] = np.minimum(x0[:d], args.max_logit)
    bounds = [(None, args.max_logit)] * d + [(None, None)] * (len(x0) - d)
    res = minimize(value_and_gradient, x0, args=(n, args.end_weight), jac=True,
                   method="L-BFGS-B", callback=report, bounds=bounds,
                   options={"maxiter": args.iters, "maxcor": 30, "ftol": 1e-13, "gtol": 1e-12})
    plain = value_and_gradient(res.x, n)[0]
    end = loss(*unpack(res.x.astype(np.complex128), n), 1.0).real - plain
    print(f"row-scaled slack-free ratio {plain / bound:.6f}, last-tick variance {end:.4f} "
          f"after {res.nit} iterations, "
          f"{time.perf_counter() - t0:.0f} s; x = {res.x.tolist()}", flush=True)
    ratio, r_min, d_max, monotone = as_a_mechanism_would(res.x, n)
    print(f"as a mechanism would round it: {ratio:.6f} (min r {r_min:.4f}, max d {d_max:.4f}, "
          f"d non-decreasing: {monotone})", flush=True)
    share = slack_share(res.x, n)
    print(f"estimated slack share of σ² with the present formula: {share:.2e} "
          f"(ratio with it ≈ {ratio * (1.0 + share):.6f})", flush=True)
    if args.write:
        import json

        th_q, w_q = plan._quantised(1.0 / (1.0 + np.exp(-res.x[:d])), np.exp(res.x[d:2 * d]))
        path = plan._PACKAGED / plan._rows_name(n)
        path.write_text(json.dumps({
            "theta": [float(v) for v in th_q], "w": [float(v) for v in w_q],
            "rows": [float(v) for v in res.x[2 * d:]], "end_weight": args.end_weight,
            "command": f"python benchmarks/blt_row_scaling.py --horizon {n} --buffers {d} "
                       f"--end-weight {args.end_weight} --max-logit {args.max_logit} "
                       f"--iters {args.iters} --write"}) + "\n")
        print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
