"""CPU of one ingest checkpoint encoding (``IngestState.to_bytes``, sealed) with two open
50 000-key buckets of a 10^6-leaf hierarchy: the bucket columns as Python lists (the first
path), as int64 arrays from NumPy (``np.fromiter`` + ``argsort``) and as int64 arrays from the
compiled pass (``_fastingest.dict_columns``: one dict pass + radix sort; issue #25),
alternating, median of 21 process-CPU timings each; also checks the bytes are equal.

Usage: python benchmarks/checkpoint_columns.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents.config.settings import Settings
from agents.ingest import bucket_columns as bc
from agents.ingest.routing import Router
from agents.ingest.state import IngestState
from stream_dp.domain import Domain

dom = Domain.from_paths([f"r{i}/m{j}/l{k}" for i in range(10) for j in range(100)
                         for k in range(999)])
router = Router(dom, 4)
st = IngestState(Settings(origin=1000.0), router, 0, key=b"k" * 32)
rng = np.random.default_rng(3)
leaves = np.array(sorted(router.declared.values()))
st.buckets = {t: {int(k): int(v) for k, v in zip(rng.choice(leaves, size=50_000, replace=False),
                                                   rng.integers(1, 2**40, size=50_000),
                                                   strict=True)} for t in (5, 6)}
new = bc.bucket_columns


def old(bucket: dict[int, int], clip: int, int_keys: bool, *, arrays: bool = False) -> Any:
    return new(bucket, clip, int_keys)  # lists, as before


def med(n: int = 21) -> float:
    xs = []
    for _ in range(n):
        t0 = time.process_time()
        st.to_bytes()
        xs.append(time.process_time() - t0)
    return sorted(xs)[n // 2] * 1e3


compiled = bc._dict_columns
for rnd in range(3):
    bc.bucket_columns = old  # type: ignore[assignment]
    bc._dict_columns = None
    a, ba = med(), st.to_bytes()
    bc.bucket_columns = new
    b, bb = med(), st.to_bytes()
    bc._dict_columns = compiled
    c, bcb = med(), st.to_bytes()
    print(f"round {rnd + 1}: lists {a:.1f} ms, NumPy arrays {b:.1f} ms, compiled arrays "
          f"{c:.1f} ms CPU per to_bytes; bytes equal: {ba == bb == bcb}"
          + ("" if compiled is not None else " (compiled extension not built)"))
