"""Shared validation and noise arithmetic for the pure-DP strategies (private helpers)."""

from __future__ import annotations

import math

import numpy as np

from stream_dp.budget import Privacy, PureDP

#: Fine grid: the rounding slack adds at most 2**-17 (relative) to the L1 sensitivity, so the
#: paper's worked example (25.635/ε²) still reproduces to three decimals.
RESOLUTION_BITS = 17


def check_p(p: float) -> float:
    """``p`` as a float in (0, 1], else ``ValueError``."""
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise ValueError(f"p must be a number in (0, 1], got {p!r}")
    pf = float(p)
    if not (math.isfinite(pf) and 0.0 < pf <= 1.0):
        raise ValueError(f"p must be a number in (0, 1], got {p!r}")
    return pf


def check_horizon(horizon: int) -> int:
    """``horizon`` as an int in [1, 2**40], else ``ValueError``."""
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)):
        raise ValueError(f"horizon must be an integer in [1, 2**40], got {horizon!r}")
    h = int(horizon)
    if not 1 <= h <= 1 << 40:
        raise ValueError(f"horizon must be an integer in [1, 2**40], got {horizon!r}")
    return h


def check_cap(cap: float) -> float:
    """``cap`` as a finite float > 0, else ``ValueError``."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float, np.integer, np.floating)):
        raise ValueError(f"cap must be a finite number > 0, got {cap!r}")
    c = float(cap)
    if not (math.isfinite(c) and c > 0.0):
        raise ValueError(f"cap must be a finite number > 0, got {cap!r}")
    return c


def check_pure(privacy: Privacy, strategy: str) -> PureDP:
    """The budget if it is pure ε-DP, else ``ValueError`` (these strategies use Laplace noise)."""
    if not isinstance(privacy, PureDP):
        raise ValueError(
            f"privacy for strategy {strategy!r} must be PureDP(epsilon); got {privacy!r} "
            "(zCDP strategies: see stream_dp.strategies.available('zcdp'))"
        )
    return privacy


def discrete_laplace_variance(scale: float) -> float:
    """Variance of the discrete Laplace law ``P(k) ∝ exp(−|k|/scale)`` (grid units², exact).

    ``2q/(1−q)²`` with ``q = exp(−1/scale)``; equals ``2·scale² − 1/6 + O(scale⁻²)``.

    >>> round(discrete_laplace_variance(1.0), 6)
    1.841347
    """
    q = math.exp(-1.0 / scale)
    one_minus_q = -math.expm1(-1.0 / scale)
    return 2.0 * q / (one_minus_q * one_minus_q)
