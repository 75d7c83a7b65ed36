"""The contract every release strategy implements, vectorised over many streams.

A :class:`Mechanism` is one strategy configured for a decay ``p``, a horizon (ticks per epoch),
a privacy budget per stream and a contribution cap. It holds no per-stream data itself: the
state lives in a :data:`State` mapping of NumPy arrays whose *last* axis is the stream axis, so
that :class:`~stream_dp.counters.CounterBank` can serialise, slice and restore it generically,
and so that one tick is a handful of vector operations over all streams.

Determinism rule (DESIGN.md §2.5): ``step`` may only use element-wise array operations along the
stream axis (no reductions across streams), so the release of one stream never depends on which
other streams share its bank, and a replay from a checkpoint is bit-identical.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

#: Per-bank mechanism state. Arrays whose last axis has length ``n_streams`` are per-stream;
#: 0-d arrays (``np.int64``/``np.float64``) hold bank-wide scalars such as the tick counter.
State = dict[str, NDArray[np.generic]]

Float64Array = NDArray[np.float64]
Int64Array = NDArray[np.int64]


class BoundNoise(Protocol):
    """Secure noise bound to the stream ids of one bank (see :mod:`stream_dp.noise`).

    Every method returns one sample per stream, in *grid units* (integers). For a given
    ``(key, tag, stream id, node)`` the sample is deterministic; distinct nodes or streams give
    independent samples. ``node`` is any integer in ``[0, 2**48)`` that the mechanism uses at
    most once per stream for each distinct random quantity.
    """

    def discrete_laplace(self, node: int, scale: float) -> Int64Array:
        """Exact discrete Laplace: ``P(k) ∝ exp(-|k| / scale)``, ``scale`` in grid units."""
        ...

    def discrete_gaussian(self, node: int, sigma: float) -> Int64Array:
        """Exact discrete Gaussian: ``P(k) ∝ exp(-k² / (2 sigma²))``, ``sigma`` in grid units."""
        ...


class Mechanism(ABC):
    """One release strategy, configured, for any number of streams.

    Units: ``p`` is the decay per tick; ``horizon`` counts ticks per epoch; the privacy budget is
    per event, per stream; ``cap`` bounds one event's contribution to one tick's count.
    """

    #: Registry name, e.g. ``"dmfda"``.
    name: ClassVar[str]

    p: float
    horizon: int
    cap: float

    @property
    def tag(self) -> str:
        """Domain-separation label for the noise generator (strategy and its parameters)."""
        return f"{self.name}/p={self.p!r}/T={self.horizon}/cap={self.cap!r}"

    @abstractmethod
    def new_state(self, n_streams: int) -> State:
        """Fresh state for ``n_streams`` streams at tick 0 (nothing released yet)."""

    @abstractmethod
    def step(self, state: State, counts: Float64Array, noise: BoundNoise) -> Float64Array:
        """Advance every stream by one tick with that tick's (clamped) counts.

        Mutates ``state`` in place and returns the release for the new tick, one per stream.
        ``counts`` has already been validated (finite, ≥ 0, right shape) by the caller.
        """

    @abstractmethod
    def variance(self, t: int) -> float:
        """Exact expected squared error of the release at tick ``t`` (1-based, across epochs).

        Includes every slack the implementation adds (grid rounding, truncation); excludes the
        deterministic rounding bias bounded by :meth:`rounding_bound`.
        """

    def mse_curve(self, horizon: int) -> Float64Array:
        """``variance(t)`` for ``t = 1..horizon``; subclasses override with an O(T log T) form."""
        return np.array([self.variance(t) for t in range(1, horizon + 1)], dtype=np.float64)

    def error_stays_bounded(self) -> bool:
        """Whether the per-release error stays small on an *unbounded* stream, past the horizon.

        True when the error is bounded in t (p < 1) or grows at most polylogarithmically
        (p = 1, e.g. doubling epochs). The planner never picks a strategy for which this is
        False while another one qualifies, because the service runs streams forever.
        """
        return True

    @abstractmethod
    def sensitivity(self) -> float:
        """Sensitivity of the noisy measurements to one event of size ``cap``.

        L1 under pure ε-DP, L2 under zCDP; in measurement units, grid slack included.
        """

    @abstractmethod
    def rounding_bound(self) -> float:
        """Largest possible |release − (true decayed sum + zero-mean noise)| from grid rounding."""
