"""Offline demo: a few synthetic streams, true vs released decayed counts, tick by tick.

No broker, no service: one :class:`~stream_dp.counters.CounterBank` fed by a seeded synthetic
workload (a steady stream, a bursty one and a growing one, cycling). The noise key is derived
from the seed and printed as such: it is a **demo key**, not a secret — real deployments load
theirs with :func:`stream_dp.noise.load_key`.

>>> import io
>>> buf = io.StringIO()
>>> run_offline_demo(ticks=3, streams=2, seed=1, out=buf)
0
>>> "tick" in buf.getvalue()
True
"""

from __future__ import annotations

import hashlib
import sys
from typing import TextIO

import numpy as np

from stream_dp.budget import PureDP
from stream_dp.counters import CounterBank
from stream_dp.planner import make_mechanism

__all__ = ["run_offline_demo", "synthetic_counts"]

_KINDS = ("steady", "bursty", "growing")


def synthetic_counts(ticks: int, streams: int, seed: int) -> np.ndarray:
    """Seeded per-tick event counts, shape ``(ticks, streams)`` (non-negative integers)."""
    rng = np.random.default_rng(seed)
    out = np.zeros((ticks, streams), dtype=np.float64)
    t = np.arange(ticks, dtype=np.float64)
    for s in range(streams):
        kind = _KINDS[s % len(_KINDS)]
        if kind == "steady":
            rate = np.full(ticks, 5.0 + s)
        elif kind == "bursty":
            rate = np.where((t // 10) % 3 == 0, 20.0, 1.0)
        else:
            rate = 0.5 + t / 4.0
        out[:, s] = rng.poisson(rate)
    return out


def run_offline_demo(
    ticks: int = 30,
    streams: int = 3,
    seed: int = 0,
    out: TextIO | None = None,
    p: float = 0.9,
    epsilon: float = 1.0,
    strategy: str = "auto",
    horizon: int = 1023,
) -> int:
    """Print ``ticks`` rows of true vs released decayed counts for ``streams`` streams; exit code."""
    if ticks < 1 or streams < 1:
        raise ValueError(f"ticks and streams must be ≥ 1, got ticks={ticks}, streams={streams}")
    stream = out if out is not None else sys.stdout
    names = [f"{_KINDS[s % len(_KINDS)]}-{s}" for s in range(streams)]
    mech = make_mechanism(strategy, p, horizon, PureDP(epsilon))
    demo_key = hashlib.sha256(f"stream-dp offline demo key, seed {seed}".encode()).digest()
    bank = CounterBank(mech, names, demo_key)
    counts = synthetic_counts(ticks, streams, seed)
    print(
        f"offline demo: strategy {mech.name}, p = {p:g}, ε = {epsilon:g} per event, cap 1, "
        f"{streams} streams, demo noise key derived from seed {seed} (not a secret)",
        file=stream,
    )
    header = "tick " + " ".join(f"{n + ' true':>16} {n + ' released':>18}" for n in names)
    print(header + "   ±stderr", file=stream)
    true = np.zeros(streams)
    for t in range(ticks):
        true = p * true + counts[t]
        rel = bank.step(counts[t])
        cells = " ".join(f"{true[i]:>16.2f} {rel[i]:>18.2f}" for i in range(streams))
        print(f"{t + 1:>4} {cells}   ±{bank.stderr:.2f}", file=stream)
    return 0
