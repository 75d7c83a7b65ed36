"""The compiled kernels (:mod:`stream_dp._fastnoise`, optional) or ``None``.

They compute the vectorised common path of the samplers (:mod:`.laplace`, :mod:`.gaussian`) and
blt's double-double buffers in one C loop each instead of dozens of NumPy passes (issue #35).
The Python code is authoritative: without the extension (no C compiler at install time) the
library runs it and gives bit-identical samples and releases; ``tests/unit/test_fastnoise.py``
compares the two. Callers read :data:`kernels` at each call, so a test can switch it off.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FAST_PATH_STATUS", "kernels"]

kernels: Any
try:
    from stream_dp import _fastnoise as kernels
except ImportError as _exc:  # pragma: no cover - the test command requires the build
    kernels = None
    FAST_PATH_STATUS = f"noise: pure-Python path (compiled kernels unavailable: {_exc})"
else:
    FAST_PATH_STATUS = "noise: compiled kernels (stream_dp._fastnoise)"
