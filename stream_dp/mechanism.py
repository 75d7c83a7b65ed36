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

import hashlib
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

#: Per-bank mechanism state. Arrays whose last axis has length ``n_streams`` are per-stream;
#: 0-d arrays (``np.int64``/``np.float64``) hold bank-wide scalars such as the tick counter.
State = dict[str, NDArray[np.generic]]

Float64Array = NDArray[np.float64]
Int64Array = NDArray[np.int64]

#: Version of the canonical mechanism description (:meth:`Mechanism.canonical_bytes`). The noise
#: key of every bank and the context of every checkpoint derive from it, so any change to the
#: description's layout or meaning must bump it (it changes every noise sample).
DESCRIPTION_VERSION = 1


def canonical_value(value: object) -> object:
    """A JSON value describing ``value`` *exactly* (for hashing into keys and MAC contexts).

    Floats become their exact ``float.hex`` (ε = 1 and ε = 1.99998 never collide, nor do
    values that print alike); ints stay ints; NumPy arrays become their dtype, shape and the
    SHA-256 of their little-endian bytes; mappings are canonicalised key by key (sorted on
    output); sequences element by element; objects with ``as_dict()`` (privacy budgets) by it.
    Anything else raises ``TypeError`` so that nothing is silently left out.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if not math.isfinite(f):
            raise TypeError(f"cannot describe a non-finite float {f!r}")
        return {"f": f.hex()}
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        le = a.astype(a.dtype.newbyteorder("<"), copy=False)
        return {
            "array": le.dtype.str,
            "shape": list(a.shape),
            "sha256": hashlib.sha256(le.tobytes()).hexdigest(),
        }
    if isinstance(value, Mapping):
        return {str(k): canonical_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        # a domain's 10^7 names or parents: plain strings or ints describe themselves (the same
        # JSON as element by element, without a call per element)
        if all(type(v) is str for v in value) or all(type(v) is int for v in value):
            return list(value)
        return [canonical_value(v) for v in value]
    as_dict = getattr(value, "as_dict", None)
    if callable(as_dict):
        return canonical_value(as_dict())
    raise TypeError(f"cannot describe a value of type {type(value).__name__}")


def canonical_json(obj: Mapping[str, object]) -> bytes:
    """Canonical JSON bytes of ``obj`` (keys sorted, no spaces, ASCII, exact floats)."""
    return json.dumps(
        canonical_value(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
        allow_nan=False,
    ).encode("ascii")


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

    def describe(self) -> dict[str, Any]:
        """Everything that defines this mechanism's measurements and noise, as a mapping.

        The base lists what every strategy has: strategy name, privacy model and budget (exact),
        decay ``p``, ``horizon``, ``cap``, and the exact sensitivity. Each strategy extends it
        (``super().describe() | {...}``) with its grid, noise scale, weights/lambdas and plan
        parameters. Two mechanisms whose descriptions differ in anything get unrelated noise
        under one key (:class:`stream_dp.counters.CounterBank` hashes
        :meth:`canonical_bytes` into the noise key) and refuse each other's checkpoints.
        """
        privacy = getattr(self, "privacy", None)
        return {
            "strategy": self.name,
            "privacy": privacy.as_dict() if privacy is not None else None,
            "p": self.p,
            "horizon": self.horizon,
            "cap": self.cap,
            "sensitivity": self.sensitivity(),
        }

    def canonical_bytes(self) -> bytes:
        """Canonical, versioned bytes of :meth:`describe` (exact floats, sorted keys)."""
        return canonical_json({"description_version": DESCRIPTION_VERSION,
                               "mechanism": self.describe()})

    def fingerprint(self) -> str:
        """SHA-256 (hex) of :meth:`canonical_bytes`."""
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    @property
    def tag(self) -> str:
        """Domain-separation label of the mechanism: its name and :meth:`fingerprint`."""
        return f"{self.name}/{self.fingerprint()}"

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

    def max_count(self) -> float:
        """Numeric range: the largest per-tick count (value units, per stream) such that *any*
        sequence of counts each ``≤`` it is released on every tick, forever.

        :meth:`step` raises ``ValueError`` (state unchanged) for counts beyond the range; the
        service refuses at start-up a configuration whose ``cap × max_events_per_tick`` exceeds
        this (docs/accuracy.md, "Numeric range"). ``math.inf`` means the strategy handles every
        finite count exactly. Strategies with a finite range override it.
        """
        return math.inf

    @abstractmethod
    def sensitivity(self) -> float:
        """Sensitivity of the noisy measurements to one event of size ``cap``.

        L1 under pure ε-DP, L2 under zCDP; in measurement units, grid slack included.
        """

    @abstractmethod
    def rounding_bound(self) -> float:
        """Largest possible |release − (true decayed sum + zero-mean noise)| from grid rounding."""
