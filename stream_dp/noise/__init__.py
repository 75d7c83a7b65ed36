"""Secure noise: keyed cryptographic bits, exact discrete samplers, grid rounding, key loading.

Public names (docs/CONTRACTS.md): :func:`choose_grid`, :func:`round_to_grid`, :func:`from_grid`.
More (``load_key``, ``stream_id``, ``KeyedNoise``) are added as their modules land.
"""

from __future__ import annotations

from stream_dp.noise.grid import MAX_GRID_UNITS, choose_grid, from_grid, round_to_grid

__all__ = ["MAX_GRID_UNITS", "choose_grid", "from_grid", "round_to_grid"]
