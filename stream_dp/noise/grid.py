"""Power-of-two grids: where floating-point values meet the exact integer noise.

Mechanisms measure ``round_to_grid(value, grid) + Z`` where ``Z`` is an exact discrete noise sample
in *grid units* (:mod:`stream_dp.noise.keyed`), then convert back with :func:`from_grid`.

Why a power of two: ``x / grid`` and ``k * grid`` are then exact in binary floating point (no
rounding at all, as long as the integer ``k`` has magnitude below 2**53), so the only rounding
in the whole release path is the single, documented :func:`round_to_grid` step.

Rounding rule: **round half to even** (``numpy.rint``) of the exact quotient ``x / grid``. The
result differs from ``x / grid`` by at most 1/2 grid unit, so two neighbouring inputs whose true
values differ by ``Δ`` give rounded values differing by at most ``Δ + 1`` grid unit per
coordinate: mechanisms add one grid unit per measured coordinate that an event touches to their
sensitivity (the "grid slack"), see docs/CONTRACTS.md.

Range: ``|x / grid|`` must stay below 2**53 (beyond that float64 no longer represents every
integer, and int64 arithmetic on the sum with noise could overflow); :func:`round_to_grid` raises
``ValueError`` otherwise. With the default of :func:`choose_grid` (grid ≤ noise scale / 2**20) values
up to about ``noise_scale * 2**33`` are representable.

>>> g = choose_grid(1.0)
>>> g == 2.0 ** -20
True
>>> round_to_grid([0.5, 1.5, 2.5, -0.5], 1.0).tolist()
[0, 2, 2, 0]
>>> from_grid(round_to_grid([3.25], 0.25), 0.25).tolist()
[3.25]
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["MAX_GRID_UNITS", "choose_grid", "from_grid", "round_to_grid", "validate_grid"]

#: Largest magnitude (exclusive) of a value in grid units: 2**53.
MAX_GRID_UNITS = 2**53

#: Default number of binary digits of resolution below the noise scale.
DEFAULT_RESOLUTION_BITS = 20


def validate_grid(grid: float) -> float:
    """Return ``grid`` as a float if it is a positive, finite, normal power of two, else raise."""
    if isinstance(grid, bool) or not isinstance(grid, (int, float, np.floating, np.integer)):
        raise ValueError(f"grid must be a positive power of two, got {grid!r}")
    g = float(grid)
    if not (math.isfinite(g) and g > 0.0):
        raise ValueError(f"grid must be a positive power of two, got {grid!r}")
    mantissa, _ = math.frexp(g)
    if mantissa != 0.5 or g < np.finfo(np.float64).tiny:
        raise ValueError(f"grid must be a positive power of two (2**k, normal float), got {grid!r}")
    return g


def choose_grid(noise_scale: float, resolution_bits: int = DEFAULT_RESOLUTION_BITS) -> float:
    """The largest power of two ``≤ noise_scale / 2**resolution_bits``.

    ``noise_scale`` is the noise's scale (Laplace ``b`` or Gaussian ``σ``) in the value's own units
    (finite, > 0); ``resolution_bits`` (0..60) sets how fine the grid is relative to it: the noise
    scale in grid units then lies in ``[2**resolution_bits, 2**(resolution_bits + 1))``, so the
    grid slack adds a relative ``≤ 2**-resolution_bits`` to the sensitivity. Finer grids shrink
    the representable range (see the module docstring).

    >>> choose_grid(3.0, resolution_bits=0)
    2.0
    >>> choose_grid(0.1, resolution_bits=4) == 2.0 ** -8
    True
    """
    if isinstance(noise_scale, bool) or not isinstance(
        noise_scale, (int, float, np.floating, np.integer)
    ):
        raise ValueError(f"noise_scale must be a finite number > 0, got {noise_scale!r}")
    s = float(noise_scale)
    if not (math.isfinite(s) and s > 0.0):
        raise ValueError(f"noise_scale must be a finite number > 0, got {noise_scale!r}")
    if isinstance(resolution_bits, bool) or not isinstance(resolution_bits, (int, np.integer)):
        raise ValueError(f"resolution_bits must be an integer in [0, 60], got {resolution_bits!r}")
    if not 0 <= int(resolution_bits) <= 60:
        raise ValueError(f"resolution_bits must be an integer in [0, 60], got {resolution_bits!r}")
    _, exponent = math.frexp(s)  # s = m * 2**exponent, m in [0.5, 1): floor(log2 s) = exponent - 1
    grid = math.ldexp(1.0, exponent - 1 - int(resolution_bits))
    return validate_grid(grid)


def round_to_grid(x: ArrayLike, grid: float) -> NDArray[np.int64]:
    """``x`` in grid units, rounded half to even, as int64 (same shape as ``x``).

    Raises ``ValueError`` if ``grid`` is not a positive power of two, if any value is NaN or
    infinite, or if any ``|x / grid| ≥ 2**53``.
    """
    g = validate_grid(grid)
    arr = np.asarray(x, dtype=np.float64)
    q = arr / g  # exact: division by a power of two (barring subnormal results, which round to 0)
    if not np.all(np.isfinite(q)):
        raise ValueError("x must be finite (no NaN or inf) for round_to_grid")
    if q.size and float(np.max(np.abs(q))) >= MAX_GRID_UNITS:
        raise ValueError(
            f"|x / grid| must be < 2**53 for round_to_grid (grid={g!r}); "
            "use a coarser grid or smaller values"
        )
    return np.rint(q).astype(np.int64)


def from_grid(k: ArrayLike, grid: float) -> NDArray[np.float64]:
    """Grid units back to values: ``k * grid`` as float64 (exact for ``|k| < 2**53``)."""
    g = validate_grid(grid)
    return np.asarray(k, dtype=np.int64).astype(np.float64) * g
