"""The neighbouring-input check shared by the strategy tests (library-private test helper).

``run(data)`` feeds a ``ticks × streams`` count matrix through a fresh bank and returns the
releases (same shape) and a list of the noise-only state it keeps per tick (residuals, noise
buffers). Adding one event of size ``cap`` = 1 at tick ``s`` of ``stream`` must change nothing
before ``s`` and no other stream (bit for bit), never the noise-only state, and the stream's
releases from ``s`` on by exactly ``p^(t−s)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

Run = Callable[[np.ndarray], tuple[np.ndarray, list[np.ndarray]]]


def check_one_event(run: Run, base: np.ndarray, ticks: Iterable[int], stream: int, p: float,
                    *, rel_tol: float = 1e-12) -> None:
    released, noise = run(base)
    tol = rel_tol * max(1.0, float(np.abs(released[:, stream]).max()))
    mask = np.arange(base.shape[1]) != stream
    for s in ticks:
        other = base.copy()
        other[s, stream] += 1.0
        rel2, noise2 = run(other)
        assert np.array_equal(released[:s], rel2[:s]), s
        assert np.array_equal(released[:, mask], rel2[:, mask]), s
        assert all(np.array_equal(a, b) for a, b in zip(noise, noise2, strict=True)), s
        diff = rel2[s:, stream] - released[s:, stream]
        np.testing.assert_allclose(diff, p ** np.arange(len(base) - s), rtol=0, atol=max(tol, 1e-9))
