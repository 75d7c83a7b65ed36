"""Shared validation and noise arithmetic for the pure-DP strategies (private helpers)."""

from __future__ import annotations

import math

import numpy as np

from stream_dp.budget import ZCDP, Privacy, PureDP


class BudgetOutOfRange(ValueError):
    """A strategy cannot follow this budget (its noise would leave the exact samplers' range at
    some tick of its life): it refuses when built, and the planner passes it over (``auto``
    then picks a strategy that can follow the budget)."""


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


def check_n_streams(n_streams: int) -> int:
    """``n_streams`` as an int ≥ 0, else ``ValueError``."""
    if isinstance(n_streams, bool) or not isinstance(n_streams, (int, np.integer)) or n_streams < 0:
        raise ValueError(f"n_streams must be an integer ≥ 0, got {n_streams!r}")
    return int(n_streams)


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


#: Largest budget factor (ε, or √(2ρ)) the noise-relative grids follow. Beyond it the grid stops
#: shrinking, so counts keep a usable range (≈ 2**53 grid units) and the noise scale shrinks
#: towards the samplers' minimum instead, where :func:`check_noise_scale` refuses the budget.
MAX_GRID_BUDGET = 2.0**10


def check_noise_scale(scale_units: float, minimum: float, budget: str) -> float:
    """``scale_units`` if the exact sampler accepts it, else ``ValueError`` naming the budget.

    A noise scale below ``minimum`` grid units means the budget is so large that the noise is
    below the rounding grid (P(noise ≠ 0) < e^-256): the samplers refuse it, so the strategy
    must refuse the budget up front rather than fail in the middle of a tick.
    """
    if not scale_units >= minimum:
        raise ValueError(
            f"{budget} is too large for this cap and grid: the noise scale would be "
            f"{scale_units:.3g} grid units, below the exact sampler's minimum {minimum:g}; "
            f"use a budget at most {minimum / scale_units:.3g} times smaller (the noise is "
            "already negligible there)"
        )
    return scale_units


def discrete_laplace_variance(scale: float) -> float:
    """Variance of the discrete Laplace law ``P(k) ∝ exp(−|k|/scale)`` (grid units², exact).

    ``2q/(1−q)²`` with ``q = exp(−1/scale)``; equals ``2·scale² − 1/6 + O(scale⁻²)``.

    >>> round(discrete_laplace_variance(1.0), 6)
    1.841347
    """
    q = math.exp(-1.0 / scale)
    one_minus_q = -math.expm1(-1.0 / scale)
    return 2.0 * q / (one_minus_q * one_minus_q)


def check_zcdp(privacy: Privacy, strategy: str) -> ZCDP:
    """The budget if it is ρ-zCDP, else ``ValueError`` (these strategies use Gaussian noise)."""
    if not isinstance(privacy, ZCDP):
        raise ValueError(
            f"privacy for strategy {strategy!r} must be ZCDP(rho) (Gaussian noise), got {privacy!r}"
        )
    return privacy
