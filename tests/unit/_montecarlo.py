"""Monte-Carlo oracle shared by the strategy tests: many streams = many independent samples."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stream_dp import CounterBank
from stream_dp.mechanism import Mechanism


def empirical_mse_curve(
    mechanism: Mechanism,
    key: bytes,
    n_streams: int,
    ticks: int,
    draw: Callable[[int], np.ndarray],
) -> tuple[np.ndarray, CounterBank]:
    """Per-tick mean squared error of real ``CounterBank`` releases against the exact decayed sum.

    ``draw(t)`` returns tick ``t``'s counts for every stream. The noise is keyed per stream id, so
    the streams' errors are independent samples of one release's error.
    """
    bank = CounterBank(mechanism, [f"s{i}" for i in range(n_streams)], key)
    truth = np.zeros(n_streams)
    sq = np.zeros(ticks)
    for t in range(ticks):
        d = draw(t)
        truth = mechanism.p * truth + d
        sq[t] = float(np.mean((bank.step(d) - truth) ** 2))
    return sq, bank


#: standard errors allowed between the empirical and the claimed MSE (two-sided p ≈ 1e-6 each)
Z = 4.9


def mse_slack(exact: np.ndarray, n_streams: int, bias: float, z: float = Z) -> np.ndarray:
    """The fixed loose bound on ``|empirical − claimed|`` per-release MSE: the mean of ``n``
    squared errors has a standard deviation ≤ ``σ²·√(5/n)`` (a heavier-than-Gaussian error
    included), ``z`` of those, plus the rounding bias ``b`` (``2b·σ + b²``)."""
    out: np.ndarray = z * exact * np.sqrt(5.0 / n_streams) + 2.0 * bias * np.sqrt(exact) + bias * bias
    return out


def check_claim(mechanism: Mechanism, key: bytes, ticks: int, at: tuple[int, ...],
                windows: tuple[tuple[int, int], ...], seed: int, n_streams: int = 20_000,
                z: float = Z) -> np.ndarray:
    """Claimed vs empirical MSE of ``mechanism`` over ``ticks`` ticks of counts uniform in
    [0, 3) on ``n_streams`` keyed streams: at the ticks ``at`` (1-based) and over the windows
    ``[lo, hi)`` (0-based), within :func:`mse_slack` plus the rounding bias. Returns the claimed
    curve."""
    from stream_dp.figures import rounding_bias

    rng = np.random.default_rng(seed)
    sq, _ = empirical_mse_curve(mechanism, key, n_streams, ticks,
                                lambda t: rng.uniform(0.0, 3.0, size=n_streams))
    exact: np.ndarray = mechanism.mse_curve(ticks)
    slack = mse_slack(exact, n_streams, rounding_bias(mechanism, ticks), z)
    for t in at:
        assert abs(sq[t - 1] - exact[t - 1]) <= slack[t - 1], (t, sq[t - 1], exact[t - 1])
    for lo, hi in windows:
        assert abs(sq[lo:hi].mean() - exact[lo:hi].mean()) <= slack[lo:hi].mean(), (lo, hi)
    return exact
