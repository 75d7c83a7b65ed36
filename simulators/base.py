"""What every simulator shares: per-tick counts over declared keys, spread into timed events.

A simulator draws, for each tick ``t = 0, 1, …``, a vector of non-negative integer counts over its
declared event keys (the *truth*, kept so tests have an exact oracle), and turns each tick's counts
into events with times uniformly spread inside the tick, on a millisecond grid, sorted by time.

Determinism: everything comes from one ``numpy.random.Generator`` seeded with ``seed``; the same
(simulator, parameters, seed) gives the same events byte for byte. This is synthetic *input* data;
privacy noise never comes from here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from simulators.domainfile import DomainSpec
from simulators.logfile import Event

#: 2024-01-01T00:00:00Z: the default start of simulated time (a multiple of every usual tick).
DEFAULT_START = 1_704_067_200


@dataclass(frozen=True)
class TimeAxis:
    """Simulated time: tick ``t`` covers ``[start + t·tick_seconds, start + (t+1)·tick_seconds)``.

    ``start`` (Unix seconds) and ``tick_seconds`` are whole milliseconds; ``ticks`` ≥ 1.
    """

    ticks: int
    tick_seconds: float = 1.0
    start: float = DEFAULT_START

    def __post_init__(self) -> None:
        if self.ticks < 1:
            raise ValueError(f"ticks must be ≥ 1, got {self.ticks}")
        if not self.tick_seconds >= 0.001 or round(self.tick_seconds * 1000) != self.tick_seconds * 1000:
            raise ValueError(
                f"tick_seconds must be a positive whole number of milliseconds, got {self.tick_seconds}"
            )
        if round(self.start * 1000) != self.start * 1000:
            raise ValueError(f"start must be a whole number of milliseconds, got {self.start}")

    @property
    def tick_ms(self) -> int:
        return round(self.tick_seconds * 1000)

    @property
    def start_ms(self) -> int:
        return round(self.start * 1000)


class Simulator(ABC):
    """A deterministic synthetic event source over a declared domain."""

    #: short name used by ``stream-dp simulate NAME``
    name: str

    def __init__(self, axis: TimeAxis, seed: int) -> None:
        if seed < 0:
            raise ValueError(f"seed must be ≥ 0, got {seed}")
        self.axis = axis
        self.seed = seed

    @property
    @abstractmethod
    def keys(self) -> tuple[str, ...]:
        """The declared event keys (leaf streams or grid cells), in count-vector order."""

    @abstractmethod
    def domain(self) -> DomainSpec:
        """The domain the worker must declare to accept every key this simulator emits."""

    @abstractmethod
    def _counts(self, rng: np.random.Generator) -> Iterator[NDArray[np.int64]]:
        """Yield one count vector (length ``len(keys)``) per tick, ``axis.ticks`` of them."""

    def tick_counts(self) -> Iterator[NDArray[np.int64]]:
        """The true per-tick counts (same draws as :meth:`events`)."""
        rng = np.random.default_rng(self.seed)
        yield from self._counts(rng)

    def events(self) -> Iterator[Event]:
        """Events in time order; per tick, times uniform on the millisecond grid of the tick."""
        rng = np.random.default_rng(self.seed)
        time_rng = np.random.default_rng([self.seed, 1])
        keys = self.keys
        tick_ms, start_ms = self.axis.tick_ms, self.axis.start_ms
        for t, counts in enumerate(self._counts(rng)):
            total = int(counts.sum())
            if total == 0:
                continue
            idx = np.repeat(np.arange(len(keys)), counts)
            offsets = time_rng.integers(0, tick_ms, size=total)
            order = np.argsort(offsets, kind="stable")
            base = start_ms + t * tick_ms
            for i in order.tolist():
                yield Event(keys[idx[i]], (base + int(offsets[i])) / 1000.0, 1.0)

    def describe(self) -> str:
        return (
            f"{self.name}: {len(self.keys)} keys, {self.axis.ticks} ticks of "
            f"{self.axis.tick_seconds:g} s from {self.axis.start:.0f}, seed {self.seed}"
        )
