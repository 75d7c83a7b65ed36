"""DMFDA's diagonal scaling Λ (paper 004, section 3.2, recursion (30) and Alg. 4 *getLambda*).

Reading adopted by this project (seeds/README.md): ``err_1 = 1``, ``δ_1 = 1 − p``; for ``m ≥ 2``
with ``c_m = 2^(m−1)·p²``::

    δ_m   = ∛err_{m−1} / (∛err_{m−1} + ∛c_m), clamped to [1 − p, 1]
    err_m = err_{m−1}/δ_m² + c_m/(1 − δ_m)² + err_{m−1}

and ``λ_k`` is Alg. 4 verbatim: walk from the root of the complete tree of size ``2^M − 1``
(``M = floor(log2 T) + 1``) towards node ``k``, multiplying by ``δ_m`` each time ``k`` lies in the
left half, and finish with ``(1 − δ_m)/p`` at the level where ``k`` is the middle node.

Guarantee (checked in the tests for every ``T = 2^m − 1``, ``m ≤ 20``): every column sum of
``ΛL`` is ≤ 1, so measuring ``ΛLD`` has L1 sensitivity ≤ 1 per unit of ``D``. For a horizon
that is not of the form ``2^M − 1`` the first ``T`` values of the ``2^M − 1`` solution are used
(dropping rows of ``L`` can only lower column sums).

>>> lam = lambdas(7, 0.3)
>>> [round(float(x), 4) for x in lam]
[0.4947, 0.7068, 0.7068, 0.9774, 0.7, 1.0, 1.0]
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

__all__ = ["deltas", "lambda_at", "lambdas"]


def _check(horizon: int, p: float) -> tuple[int, float]:
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or int(horizon) < 1:
        raise ValueError(f"horizon must be an integer ≥ 1, got {horizon!r}")
    pf = float(p)
    if not (math.isfinite(pf) and 0.0 < pf <= 1.0):
        raise ValueError(f"p must be a number in (0, 1], got {p!r}")
    return int(horizon), pf


@lru_cache(maxsize=256)
def deltas(m_max: int, p: float) -> tuple[float, ...]:
    """``(δ_1, …, δ_{m_max})`` of recursion (30), δ clamped to ``[1 − p, 1]``."""
    if m_max < 1:
        raise ValueError(f"m_max must be an integer ≥ 1, got {m_max!r}")
    lo = 1.0 - p
    out = [lo]
    err = 1.0
    for m in range(2, m_max + 1):
        c = math.ldexp(1.0, m - 1) * p * p
        a, b = math.cbrt(err), math.cbrt(c)
        delta = min(max(a / (a + b), lo), 1.0)
        out.append(delta)
        # δ < 1 always here (c > 0), so the division is safe.
        err = err / (delta * delta) + c / ((1.0 - delta) ** 2) + err
    return tuple(out)


def lambda_at(horizon: int, k: int, p: float) -> float:
    """``λ_k`` for the given horizon: Alg. 4 *getLambda* verbatim, O(log T)."""
    horizon, p = _check(horizon, p)
    if isinstance(k, bool) or not 1 <= int(k) <= horizon:
        raise ValueError(f"k must be an integer in [1, horizon={horizon}], got {k!r}")
    m = horizon.bit_length()  # floor(log2 T) + 1
    d = deltas(m, p)
    lam = 1.0
    kt = int(k)
    div = 1 << (m - 1)
    while div != kt:
        if kt < div:
            lam *= d[m - 1]
        else:
            kt -= div
        div >>= 1
        m -= 1
    return lam * (1.0 - d[m - 1]) / p


def lambdas(horizon: int, p: float) -> NDArray[np.float64]:
    """``λ_1..λ_T`` (length ``horizon``), Alg. 4 for every k, vectorised: O(T log T)."""
    horizon, p = _check(horizon, p)
    m_top = horizon.bit_length()
    d = np.asarray(deltas(m_top, p), dtype=np.float64)
    kt = np.arange(1, horizon + 1, dtype=np.int64)
    lam = np.ones(horizon, dtype=np.float64)
    done = np.zeros(horizon, dtype=bool)
    final_m = np.zeros(horizon, dtype=np.int64)
    m = m_top
    div = 1 << (m - 1)
    while m >= 1:
        hit = ~done & (kt == div)
        final_m[hit] = m
        done |= hit
        left = ~done & (kt < div)
        lam[left] *= d[m - 1]
        right = ~done & (kt > div)
        kt[right] -= div
        div >>= 1
        m -= 1
    if not done.all():  # pragma: no cover - every k meets its middle node by m = 1
        raise AssertionError("getLambda did not terminate for some k")
    result: NDArray[np.float64] = lam * (1.0 - d[final_m - 1]) / p
    return result
