"""Type stub of the compiled sampler and blt kernels (stream_dp/csrc/fastnoise.c).

Arguments are C-contiguous NumPy arrays; outputs are written in place.
"""

from typing import Any

from numpy.typing import NDArray

def laplace_attempt(
    words: NDArray[Any], tp: int, neg_inv_t: float, j: int, margin: float, table: NDArray[Any],
    thresh: NDArray[Any], exp_digits: NDArray[Any], status: NDArray[Any], values: NDArray[Any], /,
) -> None: ...
def gaussian_accept(
    words: NDArray[Any], y: NDArray[Any], q: float, two_s2: float, margin2: float, tiny: float,
    status: NDArray[Any], /,
) -> None: ...
def dd_update(
    buffers: NDArray[Any], buffers_lo: NDArray[Any], theta: NDArray[Any], clipped: NDArray[Any], /
) -> None: ...
def dd_feedback(buffers: NDArray[Any], w: NDArray[Any], out: NDArray[Any], /) -> None: ...
def prf_input(
    ids: NDArray[Any], node_hi: int, counters: NDArray[Any], blocks: NDArray[Any], /
) -> int: ...
