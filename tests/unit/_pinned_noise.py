"""The configurations pinned by ``test_pinned_noise.py`` and the code that computes their values.

``python -m tests.unit._pinned_noise`` (from the repository root) rewrites
``tests/unit/data/pinned_noise.json``: run it only when a change is *meant* to alter samples
(and then bump ``NOISE_FORMAT``). The stored values were computed by the code before the
vectorised-sampler optimisations of issue #35, so the test fails if any of them changes a
single bit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from stream_dp.budget import ZCDP, PureDP
from stream_dp.counters import CounterBank
from stream_dp.noise.keyed import KeyedNoise
from stream_dp.noise.keys import stream_ids
from stream_dp.planner import make_mechanism

FIXTURE = Path(__file__).parent / "data" / "pinned_noise.json"
KEY = bytes(range(100, 132))

#: (strategy, p, horizon, privacy model, budget, ticks): naive, blt and tree-ls at p < 1 and
#: p = 1 (blt's column scaling and block restarts, tree-ls's super levels past the horizon)
BANKS: list[tuple[str, float, int, str, float, int]] = [
    ("naive", 0.999, 63, "pure", 1.0, 6),
    ("naive", 1.0, 63, "pure", 0.01, 4),
    ("blt", 0.99, 63, "zcdp", 0.5, 6),
    ("blt", 1.0, 7, "zcdp", 0.5, 17),
    ("tree-ls", 0.99, 63, "pure", 1.0, 6),
    ("tree-ls", 0.999, 63, "zcdp", 0.5, 6),
    ("tree-ls", 1.0, 7, "pure", 1.0, 17),
]
N_STREAMS = 40

#: (distribution, parameter in grid units): tiny (t < 2**12, rescaled), powers of two (t' a power
#: of two: no U rejection), odd numerators (U rejection), large scales
SAMPLES: list[tuple[str, float]] = [
    ("laplace", 2.0**-8), ("laplace", 0.75), ("laplace", 1.0), ("laplace", 3.0),
    ("laplace", 1000.0), ("laplace", 2.0**17), ("laplace", 131073.5), ("laplace", 2.0**40 + 3),
    ("gaussian", 2.0**-8), ("gaussian", 0.5), ("gaussian", 1.0), ("gaussian", 7.3),
    ("gaussian", 1000.0), ("gaussian", 2.0**29 + 0.25), ("gaussian", 2.0**45),
]
N_SAMPLES = 20_000


def _privacy(model: str, budget: float) -> PureDP | ZCDP:
    return PureDP(budget) if model == "pure" else ZCDP(budget)


def bank_releases(strategy: str, p: float, horizon: int, model: str, budget: float,
                  ticks: int) -> list[list[str]]:
    """The releases of a fixed bank over ``ticks`` ticks of fixed counts, as ``float.hex``."""
    mech = make_mechanism(strategy, p, horizon, _privacy(model, budget))
    bank = CounterBank(mech, [f"s{i}" for i in range(N_STREAMS)], KEY)
    rng = np.random.default_rng(7)
    out = []
    for _ in range(ticks):
        counts = rng.poisson(3.0, N_STREAMS).astype(np.float64)
        counts[::5] = 0.0
        counts[1::7] += 0.3  # off the integer grid
        out.append([float(v).hex() for v in bank.step(counts)])
    return out


def sample_digest(kind: str, param: float) -> dict[str, Any]:
    """SHA-256 of ``N_SAMPLES`` samples (int64, little-endian) at two nodes, and the first 8."""
    noise = KeyedNoise(KEY, "pinned", stream_ids([f"x{i}" for i in range(N_SAMPLES)]))
    draws = []
    for node in (0, 123456789):
        if kind == "laplace":
            draws.append(noise.discrete_laplace(node, param))
        else:
            draws.append(noise.discrete_gaussian(node, param))
    both = np.concatenate(draws).astype("<i8")
    return {"sha256": hashlib.sha256(both.tobytes()).hexdigest(),
            "head": [int(v) for v in both[:8]]}


def compute() -> dict[str, Any]:
    return {
        "banks": {"/".join(map(str, cfg)): bank_releases(*cfg) for cfg in BANKS},
        "samples": {f"{k}/{float(v).hex()}": sample_digest(k, v) for k, v in SAMPLES},
    }


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(compute(), indent=0, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
