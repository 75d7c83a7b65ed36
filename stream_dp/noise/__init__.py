"""Secure noise: keyed cryptographic bits, exact discrete samplers, grid rounding, key loading.

Public names (docs/CONTRACTS.md):

* :func:`load_key`, :class:`SecretKey`, :func:`stream_id`, :func:`stream_ids` — the secret and
  the stable 64-bit stream ids (:mod:`stream_dp.noise.keys`);
* :class:`KeyedNoise` — implements ``BoundNoise``: exact discrete Laplace / Gaussian samples in
  grid units, keyed by ``(secret, tag, stream id, node)`` (:mod:`stream_dp.noise.keyed`);
* :func:`choose_grid`, :func:`round_to_grid`, :func:`from_grid` — power-of-two grids
  (:mod:`stream_dp.noise.grid`);
* :func:`discrete_laplace_variance`, :func:`discrete_gaussian_variance` — exact variances of the
  samplers, for the analytic error of mechanisms.
"""

from __future__ import annotations

from stream_dp.noise.gaussian import discrete_gaussian_variance
from stream_dp.noise.grid import MAX_GRID_UNITS, choose_grid, from_grid, round_to_grid
from stream_dp.noise.keyed import NOISE_FORMAT, KeyedNoise, NoiseExhaustedError
from stream_dp.noise.keys import SecretKey, load_key, stream_id, stream_ids
from stream_dp.noise.laplace import discrete_laplace_variance

__all__ = [
    "MAX_GRID_UNITS",
    "NOISE_FORMAT",
    "KeyedNoise",
    "NoiseExhaustedError",
    "SecretKey",
    "choose_grid",
    "discrete_gaussian_variance",
    "discrete_laplace_variance",
    "from_grid",
    "load_key",
    "round_to_grid",
    "stream_id",
    "stream_ids",
]
