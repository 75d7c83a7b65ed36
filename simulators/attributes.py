"""Events with many yes/no attributes: clusters of dependent attributes, sparse 1s, drift.

Model (deterministic given ``seed``; synthetic *input* data, never privacy noise):

* the ``m`` attributes are split into clusters of 3–6 (a random permutation, so clusters are
  not contiguous index ranges);
* each cluster ``k`` has a latent switch ``Z_k``: with probability ``chain`` it copies the
  previous cluster's switch (dependence *between* clusters), otherwise ``Z_k ~ Bernoulli(π_k(t))``;
* attribute ``i`` of cluster ``k`` is 1 with probability ``high_i ∈ [0.5, 0.9]`` if ``Z_k = 1``,
  ``low_i ∈ [0.005, 0.04]`` otherwise: sparse 1-rates (about 0.05–0.2) with strong dependence
  inside a cluster, including higher-order (not only pairwise) dependence;
* drift: ``π_k(t) = base_k · (1 + drift · sin(2π t / period + phase_k))``, ``base_k ∈ [0.05, 0.25]``;
* events per tick ~ Poisson(``rate``), times uniform inside the tick on a millisecond grid.

Output lines are ``{"ts": <unix seconds>, "attrs": "<m characters 0/1>"}``, the input of
``stream-dp marginals``; simulated tick ``t`` (0-based) is released as tick ``t + 1`` when the
command's ``--origin`` is ``start``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["AttributeEvents", "TreeAttributes", "attribute_domain_toml",
           "attribute_settings_toml"]

DEFAULT_START = 1_704_067_200


def _lines(bits: NDArray[np.uint8], ts: NDArray[np.float64]) -> Iterator[str]:
    chars = (bits + np.uint8(48)).view("S1").reshape(bits.shape)
    for row, t in zip(chars, ts, strict=True):
        yield json.dumps({"ts": float(t), "attrs": row.tobytes().decode("ascii")})



def attribute_domain_toml(m: int, name: str = "attributes") -> str:
    """A binary-attribute domain file for ``m`` attributes named ``a0 … a{m-1}`` (the names
    the simulated events' characters stand for)."""
    names = ", ".join(json.dumps(f"a{i}") for i in range(m))
    return f'name = {json.dumps(name)}\nkind = "binary"\nattributes = [{names}]\n'


def attribute_settings_toml(origin: float, tick_seconds: float, domain_file: str) -> str:
    """Worker settings for replaying a simulated attribute log (``stream-dp replay``)."""
    return "\n".join([
        "# Worker settings for the attributes simulation (see docs/configuration.md).",
        f"domain_file = {json.dumps(domain_file)}",
        f"origin = {origin!r}",
        f"tick_seconds = {float(tick_seconds)!r}",
        "p = 0.99",
        "epsilon = 1.0",
        "shards = 1",
        "attribute_epoch_ticks = 100",
        "# a historical log: ticks close at the close markers `stream-dp replay` writes",
        'schedule = "markers"',
        "",
    ])


def _in_time_order(
    bits: NDArray[np.uint8], ticks: NDArray[np.int64], rng: np.random.Generator,
    tick_seconds: float, start: float,
) -> tuple[NDArray[np.uint8], NDArray[np.int64], NDArray[np.float64]]:
    """Give each event a millisecond time inside its tick (drawn from ``rng``) and sort by it."""
    tick_ms = round(tick_seconds * 1000)
    ms = round(start * 1000) + ticks * tick_ms + rng.integers(0, tick_ms, ticks.size)
    order = np.argsort(ms, kind="stable")
    return bits[order], ticks[order], ms[order] / 1000.0

@dataclass
class AttributeEvents:
    """The generator; :meth:`generate` gives the events as arrays, :meth:`lines` as JSON lines."""

    m: int = 32
    ticks: int = 300
    rate: float = 300.0
    seed: int = 0
    tick_seconds: float = 60.0
    start: float = DEFAULT_START
    chain: float = 0.3
    drift: float = 0.5
    period: float = 200.0
    clusters: list[list[int]] = field(init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.m <= 64:
            raise ValueError(f"m must be in 1..64, got {self.m}")
        if self.ticks < 1 or not self.rate > 0 or not self.tick_seconds > 0 or self.seed < 0:
            raise ValueError("ticks ≥ 1, rate > 0, tick_seconds > 0 and seed ≥ 0 are required")
        rng = np.random.default_rng([self.seed, 13])
        perm = rng.permutation(self.m)
        self.clusters = []
        pos = 0
        while pos < self.m:
            size = int(rng.integers(3, 7))
            self.clusters.append(sorted(int(a) for a in perm[pos : pos + size]))
            pos += size
        k = len(self.clusters)
        self._base = rng.uniform(0.05, 0.25, k)
        self._phase = rng.uniform(0, 2 * np.pi, k)
        self._high = rng.uniform(0.5, 0.9, self.m)
        self._low = rng.uniform(0.005, 0.04, self.m)
        self._cluster_of = np.zeros(self.m, dtype=np.int64)
        for c, members in enumerate(self.clusters):
            self._cluster_of[members] = c

    def generate(self) -> tuple[NDArray[np.uint8], NDArray[np.int64], NDArray[np.float64]]:
        """``(bits (n, m) uint8, tick (n,) 0-based, ts (n,) unix seconds)``, sorted by time."""
        rng = np.random.default_rng([self.seed, 14])
        all_bits = []
        all_ticks = []
        for t in range(self.ticks):
            n = int(rng.poisson(self.rate))
            pi = self._base * (1 + self.drift * np.sin(2 * np.pi * t / self.period + self._phase))
            z = np.zeros((n, len(self.clusters)), dtype=bool)
            for c in range(len(self.clusters)):
                own = rng.random(n) < pi[c]
                if c == 0:
                    z[:, c] = own
                else:
                    copy = rng.random(n) < self.chain
                    z[:, c] = np.where(copy, z[:, c - 1], own)
            zi = z[:, self._cluster_of]
            p1 = np.where(zi, self._high, self._low)
            all_bits.append((rng.random((n, self.m)) < p1).astype(np.uint8))
            all_ticks.append(np.full(n, t, dtype=np.int64))
        bits = np.concatenate(all_bits) if all_bits else np.zeros((0, self.m), np.uint8)
        ticks = np.concatenate(all_ticks)
        return _in_time_order(bits, ticks, rng, self.tick_seconds, self.start)

    def lines(self) -> Iterator[str]:
        """The events as JSON lines (no trailing newline)."""
        bits, _, ts = self.generate()
        return _lines(bits, ts)

    def log_events(self) -> Iterator[Any]:
        """The events as :class:`simulators.logfile.Event` (with ``attrs``), in time order."""
        from simulators.logfile import Event

        bits, _, ts = self.generate()
        chars = (bits + np.uint8(48)).view("S1").reshape(bits.shape)
        for row, t in zip(chars, ts, strict=True):
            yield Event("", float(t), 1.0, row.tobytes().decode("ascii"))

    def describe(self) -> str:
        """One line: sizes and parameters."""
        return (
            f"attributes m={self.m}, {len(self.clusters)} clusters "
            f"{[len(c) for c in self.clusters]}, {self.ticks} ticks × ~{self.rate:g} events"
        )


@dataclass
class TreeAttributes:
    """Dense attributes on a random tree (a robustness check for the benchmark): attribute 0 is
    1 with probability 0.5, every other attribute copies a random earlier one (its parent) and
    flips it with probability ``flip``; 1-rates ≈ 0.5, every event has ≈ m/2 ones. Same
    :meth:`generate` / :meth:`lines` interface as :class:`AttributeEvents`, no drift."""

    m: int = 32
    ticks: int = 300
    rate: float = 300.0
    seed: int = 0
    tick_seconds: float = 60.0
    start: float = DEFAULT_START
    flip: float = 0.15
    parents: list[int] = field(init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.m <= 64 or self.ticks < 1 or not self.rate > 0 or self.seed < 0:
            raise ValueError("m in 1..64, ticks ≥ 1, rate > 0 and seed ≥ 0 are required")
        rng = np.random.default_rng([self.seed, 15])
        self.parents = [-1] + [int(rng.integers(0, i)) for i in range(1, self.m)]

    @property
    def clusters(self) -> list[list[int]]:
        """The tree's edges (parent, child), listed where the cluster generator lists clusters."""
        return [[p, i] for i, p in enumerate(self.parents) if p >= 0]

    def generate(self) -> tuple[NDArray[np.uint8], NDArray[np.int64], NDArray[np.float64]]:
        """``(bits (n, m) uint8, tick (n,) 0-based, ts (n,) unix seconds)``, sorted by time."""
        rng = np.random.default_rng([self.seed, 16])
        counts = rng.poisson(self.rate, self.ticks)
        ticks = np.repeat(np.arange(self.ticks, dtype=np.int64), counts)
        n = ticks.size
        bits = np.zeros((n, self.m), dtype=np.uint8)
        bits[:, 0] = rng.random(n) < 0.5
        for i in range(1, self.m):
            flip = rng.random(n) < self.flip
            bits[:, i] = np.where(flip, 1 - bits[:, self.parents[i]], bits[:, self.parents[i]])
        return _in_time_order(bits, ticks, rng, self.tick_seconds, self.start)

    def lines(self) -> Iterator[str]:
        """The events as JSON lines (no trailing newline)."""
        bits, _, ts = self.generate()
        return _lines(bits, ts)

    def describe(self) -> str:
        """One line: sizes and parameters."""
        return (
            f"tree attributes m={self.m}, flip {self.flip:g}, {self.ticks} ticks × "
            f"~{self.rate:g} events"
        )
