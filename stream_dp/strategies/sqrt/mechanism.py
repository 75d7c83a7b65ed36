"""``sqrt``: the Toeplitz square-root factorisation ``W_p ≈ B·L_K`` under ρ-zCDP.

Maths and exact error: :mod:`stream_dp.strategies.sqrt.toeplitz`. ``L_K`` holds the first ``K`` coefficients of
``W_p^½`` (``c_k = binom(2k, k)/4^k·p^k``), ``B = W_p·L_K⁻¹`` exactly, so the release is unbiased.
``K`` is chosen per ``(p, horizon)`` (:func:`stream_dp.strategies.sqrt.toeplitz.choose_taps`: the smallest power
of two after which doubling improves the mean error by < 1%).

**Measurement** at tick ``t``: ``y_t = round_to_grid(Σ_{k<K} c_k·D_{t−k} / g) + Z_t``, ``Z`` exact
discrete Gaussian with ``σ = Δ₂/(√(2ρ)·g)`` grid units (Canonne–Kamath–Steinke: ρ-zCDP for an
integer query of L2 sensitivity ``Δ₂`` grid units). One event of size ``cap`` moves ``K``
coordinates by ``cap·c_k`` each, plus ≤ 2 grid units of slack per coordinate: one for rounding,
one for the float64 evaluation error of the ``K``-term sum on both neighbours (non-negative terms:
error ≤ ``2K·2^-53·m``; :meth:`step` keeps ``|m/g| < 2**50/K``, so < 3/8 unit each, raising
``ValueError`` with the state unchanged otherwise):
``Δ₂ = cap·‖c‖₂ + 2√K·g``. Grid ``g``: largest power of two ≤ ``cap·‖c‖₂/√(2ρ)/2**17``.

**Release**: ``u_t = g·y_t − Σ_{1≤k<K} c_k u_{t−k}``, ``s_t = p·s_{t−1} + u_t`` (stable:
:mod:`stream_dp.strategies.sqrt.toeplitz`). Exact per-release MSE ``g²·Var(Z)·Σ_{k<t} B_k²``.

**State** (stream axis last): the last ``K − 1`` counts and ``u`` values as rings (slot
``t mod (K − 1)``) plus the release: ``2K − 1`` floats per stream. A tick is ``2K`` vector
operations over streams (explicit per-tap loop, no BLAS reduction, so a stream's release never
depends on its bank). No epochs; noise node = tick (unique per stream up to 2**48).

**p = 1.** Allowed: ``B_k → 1/L_K(1)``, so the error grows linearly in ``t``; :meth:`variance`
reports it exactly. ``auto`` never prefers it there (the trees are polylogarithmic).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stream_dp.budget import Privacy
from stream_dp.mechanism import BoundNoise, Float64Array, Mechanism, State
from stream_dp.noise.gaussian import MIN_SIGMA, discrete_gaussian_variance
from stream_dp.noise.grid import choose_grid
from stream_dp.strategies._common import (
    MAX_GRID_BUDGET,
    RESOLUTION_BITS,
    check_cap,
    check_horizon,
    check_n_streams,
    check_noise_scale,
    check_p,
    check_zcdp,
)
from stream_dp.strategies.sqrt.toeplitz import (
    choose_taps,
    error_curve_factor,
    l2_sensitivity,
    reconstruction_coefficients,
    sqrt_coefficients,
)

__all__ = ["SqrtMechanism", "make"]

#: |m/g| must stay below this divided by K (float64 evaluation error < 3/8 grid unit).
MAX_MEASURED_UNITS = float(2**50)
#: Slack per measured coordinate an event touches, in grid units (rounding + float evaluation).
SLACK_UNITS = 2.0
#: Ticks after which the variance of a p < 1 release is taken as converged (B_k² < 1e-300).
_CONVERGED = 1 << 22


class SqrtMechanism(Mechanism):
    """Truncated Toeplitz square root with exact reconstruction, discrete Gaussian noise."""

    name = "sqrt"

    def __init__(
        self, p: float, horizon: int, privacy: Privacy, cap: float = 1.0, taps: int | None = None
    ) -> None:
        self.p = check_p(p)
        self.horizon = check_horizon(horizon)
        self.cap = check_cap(cap)
        self.privacy = privacy = check_zcdp(privacy, "sqrt")
        if taps is None:
            taps = choose_taps(self.p, self.horizon)
        if (
            isinstance(taps, bool)
            or not isinstance(taps, (int, np.integer))
            or not 2 <= taps <= 4096
        ):
            raise ValueError(f"taps must be an integer in [2, 4096], got {taps!r}")
        self.taps = int(taps)
        self.coefficients = sqrt_coefficients(self.p, self.taps)
        root = math.sqrt(2.0 * privacy.rho)
        base = self.cap * l2_sensitivity(self.p, self.taps)
        self.grid = choose_grid(base / min(root, MAX_GRID_BUDGET), resolution_bits=RESOLUTION_BITS)
        self._sensitivity = base + SLACK_UNITS * math.sqrt(self.taps) * self.grid
        self.sigma_units = check_noise_scale(
            self._sensitivity / (root * self.grid), MIN_SIGMA, f"rho = {privacy.rho!r}"
        )
        self.unit_variance = self.grid**2 * discrete_gaussian_variance(self.sigma_units)

    def describe(self) -> dict[str, Any]:
        """Base description plus the taps ``K``, the coefficients, the grid and ``σ``."""
        return super().describe() | {
            "family": "toeplitz-sqrt",
            "taps": self.taps,
            "coefficients": np.asarray(self.coefficients, dtype=np.float64),
            "grid": self.grid,
            "sigma_units": self.sigma_units,
            "slack_units": SLACK_UNITS,
            "max_units": MAX_MEASURED_UNITS,
            "resolution_bits": RESOLUTION_BITS,
        }

    def max_count(self) -> float:
        """Largest per-tick count ``D``: the measurement ``Σ_k c_k·D/g`` (``c_k ≥ 0``) must stay
        below ``2**50/K`` grid units (the check in :meth:`step`)."""
        total = float(np.sum(self.coefficients))
        return MAX_MEASURED_UNITS / self.taps * self.grid / total * (1.0 - 2.0**-40)

    def new_state(self, n_streams: int) -> State:
        n_streams = check_n_streams(n_streams)
        r = self.taps - 1
        return {
            "tick": np.array(0, dtype=np.int64),
            "counts": np.zeros((r, n_streams), dtype=np.float64),
            "u": np.zeros((r, n_streams), dtype=np.float64),
            "release": np.zeros(n_streams, dtype=np.float64),
        }

    def step(self, state: State, counts: Float64Array, noise: BoundNoise) -> Float64Array:
        t = int(state["tick"]) + 1
        r = self.taps - 1
        d = np.asarray(counts, dtype=np.float64)
        hist = state["counts"]
        uh = state["u"]
        c = self.coefficients
        g = self.grid
        m = c[0] * d
        for k in range(1, self.taps):
            m += c[k] * hist[(t - k) % r]
        units = m / g
        limit = MAX_MEASURED_UNITS / self.taps
        if units.size and not float(np.max(np.abs(units))) < limit:
            raise ValueError(
                f"counts too large for sqrt's grid (|L·D/g| must be < {limit:.3g}, grid={g!r}); "
                "state unchanged"
            )
        y = np.rint(units).astype(np.int64)
        y += noise.discrete_gaussian(t, self.sigma_units)
        u = y.astype(np.float64) * g
        for k in range(1, self.taps):
            u -= c[k] * uh[(t - k) % r]
        release = self.p * np.asarray(state["release"], dtype=np.float64) + u
        slot = t % r
        hist[slot] = d
        uh[slot] = u
        state["release"] = release
        state["tick"] = np.array(t, dtype=np.int64)
        return np.array(release, dtype=np.float64, copy=True)

    def mse_curve(self, horizon: int) -> Float64Array:
        if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
            raise ValueError(f"horizon must be an integer ≥ 1, got {horizon!r}")
        out: Float64Array = self.unit_variance * error_curve_factor(self.p, self.taps, int(horizon))
        return out

    def variance(self, t: int) -> float:
        """Exact variance of the release at tick ``t`` (for ``p < 1`` and ``t > 2**22``, the value
        at ``2**22``: the remaining terms are below 1e-300)."""
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
            raise ValueError(f"t must be an integer ≥ 1, got {t!r}")
        n = int(t) if self.p == 1.0 else min(int(t), _CONVERGED)
        return float(self.unit_variance * error_curve_factor(self.p, self.taps, n)[-1])

    def error_stays_bounded(self) -> bool:
        # p = 1: no doubling epochs here, so the error grows linearly past the horizon.
        return self.p < 1.0

    def sensitivity(self) -> float:
        """L2 sensitivity of the grid measurements (value units), slack included."""
        return self._sensitivity

    def rounding_bound(self) -> float:
        """``g/2·Σ_{k<n} |B_k|`` with ``n = horizon`` for ``p = 1``, else ``max(horizon, 2**16)``."""
        n = self.horizon if self.p == 1.0 else max(self.horizon, 1 << 16)
        b = reconstruction_coefficients(self.p, self.taps, n)
        return 0.5 * self.grid * float(np.sum(np.abs(b)))


def make(p: float, horizon: int, privacy: Privacy, cap: float = 1.0) -> SqrtMechanism:
    """Factory registered as ``"sqrt"``."""
    return SqrtMechanism(p, horizon, privacy, cap)


def _register() -> None:
    from stream_dp.strategies.registry import register

    register("sqrt", make, models=("zcdp",))


_register()
