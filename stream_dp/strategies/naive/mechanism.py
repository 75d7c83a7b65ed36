"""``naive``: input perturbation. Measure each tick's count ``D_t`` with discrete Laplace noise
and release the decayed sum of the noisy counts, ``s_t = p·s_{t−1} + D̃_t`` (O(1) state).

Grid ``g`` = the largest power of two ``≤ cap / 2**17``; one event changes one measured coordinate
by at most ``cap/g`` grid units plus one unit of rounding slack, so the L1 sensitivity is
``cap + g``. ``D_t / g`` is exact in float64 (power-of-two grid), so no float-evaluation slack is
needed; integer counts lie on the grid and are measured without any rounding bias.
Per-release MSE: ``σ²·(1 − p^(2t))/(1 − p²)`` (``σ²·t`` for ``p = 1``), ``σ²`` the exact discrete
Laplace variance times ``g²`` — about ``2(cap/ε)²/(1 − p²)`` in the limit. No epochs are needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stream_dp.budget import Privacy
from stream_dp.mechanism import BoundNoise, Float64Array, Mechanism, State
from stream_dp.noise.grid import MAX_GRID_UNITS, choose_grid
from stream_dp.noise.laplace import MIN_SCALE
from stream_dp.strategies._common import (
    RESOLUTION_BITS,
    check_cap,
    check_horizon,
    check_n_streams,
    check_noise_scale,
    check_p,
    check_pure,
    discrete_laplace_variance,
)

__all__ = ["NaiveMechanism"]


class NaiveMechanism(Mechanism):
    """Input perturbation with the exact discrete Laplace sampler."""

    name = "naive"

    def __init__(self, p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> None:
        self.p = check_p(p)
        self.horizon = check_horizon(horizon)
        self.cap = check_cap(cap)
        self.privacy = check_pure(privacy, self.name)
        self.epsilon = self.privacy.epsilon
        self.grid = choose_grid(self.cap, resolution_bits=RESOLUTION_BITS)
        self._sensitivity = self.cap + self.grid
        self.scale_units = check_noise_scale(
            self._sensitivity / (self.epsilon * self.grid), MIN_SCALE, f"epsilon = {self.epsilon!r}"
        )
        self.measurement_variance = self.grid**2 * discrete_laplace_variance(self.scale_units)

    def describe(self) -> dict[str, Any]:
        """Base description plus the grid and the noise scale (grid units)."""
        return super().describe() | {
            "grid": self.grid,
            "scale_units": self.scale_units,
            "resolution_bits": RESOLUTION_BITS,
        }

    def max_count(self) -> float:
        """Counts must stay below ``2**52`` grid units (exact float64 arithmetic)."""
        return float(np.nextafter(MAX_GRID_UNITS / 2 * self.grid, 0.0))

    def new_state(self, n_streams: int) -> State:
        n_streams = check_n_streams(n_streams)
        return {
            "tick": np.array(0, dtype=np.int64),
            "release": np.zeros(n_streams, dtype=np.float64),
        }

    def step(self, state: State, counts: Float64Array, noise: BoundNoise) -> Float64Array:
        t = int(state["tick"]) + 1
        release = np.asarray(counts, dtype=np.float64) / self.grid  # exact: power-of-two grid
        if release.size and max(float(release.max()), -float(release.min())) >= MAX_GRID_UNITS / 2:
            raise ValueError(
                f"counts must be < {MAX_GRID_UNITS / 2 * self.grid:.6g} for naive "
                f"(cap={self.cap}); state unchanged"
            )
        np.rint(release, out=release)
        release += noise.discrete_laplace(t, self.scale_units)  # exact in float64 (< 2**53)
        release *= self.grid
        # p·s_(t−1) + D̃_t, reusing the previous release's array (same two roundings)
        previous = np.asarray(state["release"], dtype=np.float64)
        if previous.flags.writeable and previous.shape == release.shape:
            previous *= self.p
            previous += release
            release = previous
        else:
            release += self.p * previous
        state["release"] = release
        state["tick"] = np.array(t, dtype=np.int64)
        return release.copy()

    def variance(self, t: int) -> float:
        if t < 1:
            raise ValueError(f"t must be an integer ≥ 1, got {t!r}")
        if self.p == 1.0:
            return self.measurement_variance * t
        p2 = self.p * self.p
        return self.measurement_variance * float(-np.expm1(t * np.log(p2)) / (1.0 - p2))

    def mse_curve(self, horizon: int) -> Float64Array:
        t = np.arange(1, horizon + 1, dtype=np.float64)
        if self.p == 1.0:
            return self.measurement_variance * t
        p2 = self.p * self.p
        out: Float64Array = self.measurement_variance * (-np.expm1(t * np.log(p2)) / (1.0 - p2))
        return out

    def error_stays_bounded(self) -> bool:
        # p = 1: the release sums t noisy counts, so its variance grows linearly in t.
        return self.p < 1.0

    def sensitivity(self) -> float:
        return self._sensitivity

    def rounding_bound(self, ticks: int | None = None) -> float:
        """``g/2 · Σ p^i``: ``g/(2(1 − p))`` for p < 1 (every tick); for p = 1 ``g/2 · ticks``
        over the first ``ticks`` ticks (default ``horizon``). Zero for counts on the grid
        (e.g. integers)."""
        if self.p < 1.0:
            return 0.5 * self.grid / (1.0 - self.p)
        return 0.5 * self.grid * float(self.horizon if ticks is None else ticks)


def make(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> NaiveMechanism:
    """Factory registered as ``"naive"``."""
    return NaiveMechanism(p, horizon, privacy, cap)
