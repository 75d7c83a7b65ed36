"""The general solution ``x + M⁺(b − M x)`` (seed 000, Theorem 1): test oracle and baseline.

Never the production path: the dense form costs O(m n²) time and O(m n) memory. Kept for
tests (small problems, an independent oracle) and for benchmarks (the paper's baseline).

Weighted (GLS) form, for independent noise with per-coordinate variances ``v``
(``Σ = diag(v)``): ``x + Σ Mᵀ (M Σ Mᵀ)⁺ (b − M x)``, computed as the unweighted solution in the
rescaled coordinates ``y = Σ^{-1/2} x``, ``M' = M Σ^{1/2}``.

Methods:

* ``"dense"``: Moore–Penrose pseudo-inverse via ``numpy.linalg.lstsq`` (SVD, rank-revealing),
  the paper's general solution;
* ``"sparse-lsqr"``: one sparse least-squares solve, ``scipy.sparse.linalg.lsqr`` (minimum-norm
  solution of ``M' d = r``), tolerances near machine precision;
* ``"dense-normal"``: ``M⁺ = Mᵀ (M Mᵀ)⁻¹`` (seed 000, property 1) with a dense Cholesky
  factorisation of ``M Mᵀ``, O(m³) (requires full row rank);
* ``"sparse-normal"``: sparse LU of the normal matrix ``M' M'ᵀ`` (requires full row rank).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from numpy.typing import ArrayLike, NDArray

Float64Array = NDArray[np.float64]
Method = Literal["auto", "dense", "dense-normal", "sparse-lsqr", "sparse-normal"]

__all__ = ["general_solution", "weighted_general_solution"]


def _check(M: object, b: ArrayLike, x: ArrayLike) -> tuple[object, Float64Array, Float64Array]:
    if sp.issparse(M):
        m, n = M.shape  # type: ignore[attr-defined]
        mat: object = sp.csr_matrix(M, dtype=np.float64)
    else:
        arr = np.asarray(M, dtype=np.float64)
        if arr.ndim != 2:
            raise ValueError(
                f"M must be a 2-D matrix (constraints × values), got shape {arr.shape}"
            )
        m, n = arr.shape
        mat = arr
    bb = np.asarray(b, dtype=np.float64).reshape(-1)
    xx = (
        np.asarray(x, dtype=np.float64).reshape(-1)
        if np.ndim(x)
        else np.asarray(x, dtype=np.float64)
    )
    if xx.ndim != 1 or xx.size != n:
        raise ValueError(f"x must have shape ({n},) to match M {m}×{n}, got {np.shape(x)}")
    if bb.size != m:
        raise ValueError(f"b must have shape ({m},) to match M {m}×{n}, got {np.shape(b)}")
    if not (np.all(np.isfinite(xx)) and np.all(np.isfinite(bb))):
        raise ValueError("x and b must hold finite numbers (no NaN or inf)")
    return mat, bb, xx


def general_solution(
    M: object, b: ArrayLike, x: ArrayLike, method: Method = "auto"
) -> Float64Array:
    """Least-squares projection of ``x`` onto ``{y : M y = b}``: ``x + M⁺(b − M x)``.

    ``M``: dense array or SciPy sparse matrix, shape ``(m, n)``; ``b``: ``(m,)``; ``x``: ``(n,)``.
    ``method="auto"`` is ``"dense"`` for a dense ``M`` and ``"sparse-lsqr"`` for a sparse one.
    """
    mat, bb, xx = _check(M, b, x)
    if method == "auto":
        method = "sparse-lsqr" if sp.issparse(mat) else "dense"
    r = bb - mat @ xx  # type: ignore[operator]
    if method == "dense":
        dense = mat.toarray() if sp.issparse(mat) else np.asarray(mat)  # type: ignore[attr-defined]
        d = np.linalg.lstsq(dense, r, rcond=None)[0]
    elif method == "dense-normal":
        dense = mat.toarray() if sp.issparse(mat) else np.asarray(mat)  # type: ignore[attr-defined]
        factor = sla.cho_factor(dense @ dense.T)
        d = dense.T @ sla.cho_solve(factor, r)
    elif method == "sparse-lsqr":
        A = sp.csr_matrix(mat)
        d = spla.lsqr(A, r, atol=1e-15, btol=1e-15, conlim=1e12, iter_lim=100 * max(A.shape))[0]
    elif method == "sparse-normal":
        A = sp.csr_matrix(mat)
        normal = (A @ A.T).tocsc()
        d = A.T @ spla.splu(normal).solve(r)
    else:
        raise ValueError(
            f"method must be one of auto, dense, dense-normal, sparse-lsqr, sparse-normal; got {method!r}"
        )
    return np.asarray(xx + d, dtype=np.float64)


def weighted_general_solution(
    M: object, b: ArrayLike, x: ArrayLike, variances: ArrayLike, method: Method = "auto"
) -> Float64Array:
    """GLS projection ``x + Σ Mᵀ (M Σ Mᵀ)⁺ (b − M x)`` with ``Σ = diag(variances)``.

    Minimises ``Σ_i (y_i − x_i)² / v_i`` subject to ``M y = b``. ``variances``: shape ``(n,)``,
    finite and > 0.
    """
    mat, bb, xx = _check(M, b, x)
    v = np.asarray(variances, dtype=np.float64).reshape(-1)
    if v.size != xx.size:
        raise ValueError(f"variances must have shape ({xx.size},), got {np.shape(variances)}")
    if not (np.all(np.isfinite(v)) and np.all(v > 0)):
        raise ValueError("variances must be finite and > 0")
    sd = np.sqrt(v)
    scaled = sp.csr_matrix(mat) @ sp.diags(sd) if sp.issparse(mat) else np.asarray(mat) * sd
    y = general_solution(scaled, bb, xx / sd, method=method)
    return np.asarray(y * sd, dtype=np.float64)
