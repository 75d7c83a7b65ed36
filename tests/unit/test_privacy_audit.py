"""Statistical privacy audit: empirical privacy loss on neighbouring inputs (one count differs by the cap).

For each mechanism we draw 10^5 releases (one per stream of a bank; the keyed noise is independent
across stream ids) on input D (all zeros) and on D' (cap added at tick j), recover from the
*released values only* the measurements the event touches (pure post-processing), and compute each
sample's log-likelihood ratio statistic. The empirical privacy loss is the largest |log| ratio of the
two empirical probabilities over the statistic's values that both samples hit at least 2000
times. It must stay ≤ ε + 0.15 (sampling margin ≈ 4σ). A control run with the noise scale halved
must exceed ε + 0.15, which shows the audit can fail.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stream_dp.budget import PureDP
from stream_dp.counters import CounterBank
from stream_dp.mechanism import BoundNoise, Int64Array, Mechanism
from stream_dp.strategies import make_mechanism
from stream_dp.strategies._fenwick_base import FenwickMechanism

N = 100_000
EPS = 1.0
CAP = 2.0
MARGIN = 0.15
MIN_COUNT = 2000


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))


class _Weakened:
    """Wraps real keyed noise but halves the scale: a deliberately broken mechanism (control)."""

    def __init__(self, inner: BoundNoise) -> None:
        self.inner = inner

    def discrete_laplace(self, node: int, scale: float) -> Int64Array:
        return self.inner.discrete_laplace(node, scale / 2)

    def discrete_gaussian(self, node: int, sigma: float) -> Int64Array:  # pragma: no cover
        return self.inner.discrete_gaussian(node, sigma / 2)


def _releases(
    mech: Mechanism, j: int, ticks: int, neighbour: bool, weaken: bool, tag: str
) -> np.ndarray:
    bank = CounterBank(mech, [f"{tag}-{i}" for i in range(N)], bytes(range(32)))
    if weaken:
        bank._noise = _Weakened(bank._noise)
    out = np.zeros((ticks, N))
    for t in range(1, ticks + 1):
        counts = np.full(N, CAP if (neighbour and t == j) else 0.0)
        out[t - 1] = bank.step(counts)
    return out


def _measurements(
    mech: Mechanism, rel: np.ndarray, nodes: list[int]
) -> tuple[np.ndarray, list[float]]:
    """Grid-unit measurements of ``nodes`` recovered from the releases, and their weights."""
    p = mech.p
    if not isinstance(mech, FenwickMechanism):  # naive: y_t = (s_t − p s_{t−1}) / g
        g = mech.grid  # type: ignore[attr-defined]
        prev = rel[nodes[0] - 2] if nodes[0] > 1 else 0.0
        return np.rint((rel[nodes[0] - 1] - p * prev) / g)[None, :], [1.0]
    n = mech.epoch_of(1)[2]
    w = mech.weights(n)
    g = mech.plan(n).grid
    ys = []
    for k in nodes:  # Ŝ_k = s_k − p^lowbit(k) s_{k − lowbit(k)}, y_k = Ŝ_k·a_k/g
        low = k & -k
        prev = rel[k - low - 1] if k > low else 0.0
        ys.append(np.rint((rel[k - 1] - p**low * prev) * w[k - 1] / g))
    return np.array(ys), [float(w[k - 1]) for k in nodes]


def _empirical_loss(strategy: str, weaken: bool) -> float:
    mech = make_mechanism(strategy, 0.8, 7, PureDP(EPS), cap=CAP)
    j = 1
    if isinstance(mech, FenwickMechanism):
        nodes = [1, 2, 4]  # update path of tick 1 in an epoch of 7
        n = mech.epoch_of(1)[2]
        g = mech.plan(n).grid
        scale = mech.plan(n).scale_units / (2 if weaken else 1)
        shift = [np.rint(CAP * mech.weights(n)[k - 1] * 0.8 ** (k - j) / g) for k in nodes]
    else:
        nodes = [1]
        g = mech.grid  # type: ignore[attr-defined]
        scale = mech.scale_units / (2 if weaken else 1)  # type: ignore[attr-defined]
        shift = [np.rint(CAP / g)]
    ticks = max(nodes)
    y0, _ = _measurements(mech, _releases(mech, j, ticks, False, weaken, "d"), nodes)
    y1, _ = _measurements(mech, _releases(mech, j, ticks, True, weaken, "n"), nodes)

    def llr(
        y: np.ndarray,
    ) -> np.ndarray:  # log P_D(y) − log P_D'(y) for discrete Laplace coordinates
        return sum((np.abs(y[i] - shift[i]) - np.abs(y[i])) / scale for i in range(len(nodes)))  # type: ignore[return-value]

    # Discretise the statistic into 40 bins over its range (a post-processing of the output).
    s0, s1 = llr(y0), llr(y1)
    edges = np.linspace(min(s0.min(), s1.min()), max(s0.max(), s1.max()) + 1e-9, 41)
    c0, _ = np.histogram(s0, edges)
    c1, _ = np.histogram(s1, edges)
    ok = (c0 >= MIN_COUNT) & (c1 >= MIN_COUNT)
    assert ok.sum() >= 2
    return float(np.max(np.abs(np.log(c0[ok] / c1[ok]))))


@pytest.mark.parametrize("strategy", ["naive", "naive-int", "dmfda"])
def test_empirical_privacy_loss_within_epsilon(strategy: str) -> None:
    loss = _empirical_loss(strategy, weaken=False)
    assert loss <= EPS + MARGIN, loss
    assert loss >= 0.5 * EPS  # the audit is sharp enough to see most of ε


@pytest.mark.parametrize("strategy", ["naive", "naive-int", "dmfda"])
def test_audit_detects_a_broken_mechanism(strategy: str) -> None:
    assert _empirical_loss(strategy, weaken=True) > EPS + MARGIN
