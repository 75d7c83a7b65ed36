"""LiveMarginals (the service's binary-attribute release): accounting from first principles,
the carry across structure epochs against a recomputation, bootstrap statistics against the
direct vectors, and accuracy on data with real dependence."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from simulators.attributes import AttributeEvents
from stream_dp.attributes.dependence import (
    BootstrapStats,
    cooccurrence_sensitivity,
    cooccurrence_vector,
    ones_histogram,
    pair_sensitivity,
    pair_vector,
)
from stream_dp.attributes.live import LiveConfig, LiveMarginals, initial_structure, patterns_to_bits
from stream_dp.attributes.tables import count_table
from stream_dp.budget import PureDP

KEY = b"live-marginals-test-key-01234567"


def _pats(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint64) << np.arange(bits.shape[1], dtype=np.uint64)).sum(axis=1)


def _data(m: int, ticks: int, rate: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    sim = AttributeEvents(m=m, ticks=ticks, rate=rate, seed=seed)
    bits, t0, _ = sim.generate()
    return bits, t0 + 1


class _Recorder:
    """Runs a LiveMarginals and records, per tick, every bank's input vector and, per epoch,
    the bootstrap statistics it measured (the inputs the noise is calibrated against)."""

    def __init__(self, cfg: LiveConfig) -> None:
        self.live = LiveMarginals(cfg, KEY, "audit")
        self.inputs: list[tuple[int, tuple[tuple[int, ...], ...], np.ndarray]] = []
        self.stats: list[BootstrapStats] = []
        self.budgets: list[tuple[float, float, int, float]] = []

    def run(self, bits: np.ndarray, ticks: np.ndarray, last: int) -> None:
        pats = _pats(bits)
        for t in range(1, last + 1):
            live = self.live
            bank = live.release.bank
            seen: list[np.ndarray] = []
            step = bank.step

            def spy(counts: Any, _step: Any = step, _seen: list[np.ndarray] = seen) -> Any:
                _seen.append(np.asarray(counts, dtype=np.float64).copy())
                return _step(counts)

            bank.step = spy  # type: ignore[method-assign]
            priv = bank.mechanism.privacy
            assert isinstance(priv, PureDP)
            self.budgets.append((live.split.bootstrap, live.split.per_table, live.split.n_tables,
                                 float(priv.epsilon)))
            stats_before = live.stats
            epoch, tables = live.epoch, live.structure.tables
            u, c = np.unique(pats[ticks == t], return_counts=True)
            live.step(u, c.astype(np.float64))
            self.inputs.append((epoch, tables, seen[0]))
            if live.stats is not stats_before:  # the epoch closed: stats_before was measured
                self.stats.append(stats_before)


@pytest.mark.parametrize("extra", ["all-ones", "exactly-K", "empty"])
def test_accounting_from_first_principles(extra: str) -> None:
    """One added event (the nastiest shapes: every attribute set — above any K, down-weighted —
    exactly K ones, or none) changes, for the whole run: one cell of every table of its epoch by
    1 in its own tick (nothing else, no other tick or epoch), one bin of the ones histogram by 1,
    and the co-occurrence / pair vectors by at most their sensitivity; and every epoch spends
    ε₀ + K·ε_t ≤ ε with each bank calibrated to ε_t. So the run is ε-DP by composition."""
    m, eps, epoch = 12, 1.0, 4
    bits, ticks = _data(m, 12, 50, seed=2)
    k = {"all-ones": m, "exactly-K": 8, "empty": 0}[extra]
    row = np.zeros((1, m), dtype=np.uint8)
    row[0, :k] = 1
    where = 6  # inside epoch 1 (ticks 5..8), after one re-decision
    cfg = LiveConfig(m=m, epsilon=eps, p=0.95, epoch_ticks=epoch, max_cluster=3)
    a, b = _Recorder(cfg), _Recorder(cfg)
    a.run(bits, ticks, 12)
    b.run(np.vstack([bits, row]), np.append(ticks, where), 12)
    for t, ((ea, ta, xa), (eb, tb, xb)) in enumerate(zip(a.inputs, b.inputs, strict=True), 1):
        if ta != tb:  # a different structure is a different mechanism run: only after the event
            assert t > where and ea == eb and ea > (where - 1) // epoch
            continue
        diff = xb - xa
        if t != where:
            assert not np.any(diff), t
            continue
        # one cell per table, by exactly 1: the table sensitivity is 1 per table
        offsets = np.concatenate([[0], np.cumsum([1 << len(x) for x in ta])])
        for i in range(len(ta)):
            part = diff[offsets[i] : offsets[i + 1]]
            assert sorted(part.tolist()) == [0.0] * (part.size - 1) + [1.0]
    # the event's epoch's bootstrap statistics: histogram moves 1, vectors ≤ sensitivity
    sa, sb = a.stats[(where - 1) // epoch], b.stats[(where - 1) // epoch]
    assert np.abs(sb.ones_histogram() - sa.ones_histogram()).sum() == 1.0
    for kk in range(2, m + 1):
        d = np.abs(sb.cooccurrence_vector(kk) - sa.cooccurrence_vector(kk)).sum()
        assert d <= cooccurrence_sensitivity(kk) + 1e-12
    assert np.abs(sb.pair_vector() - sa.pair_vector()).sum() == pair_sensitivity(m)
    for other, (x, y) in enumerate(zip(a.stats, b.stats, strict=True)):
        if other != (where - 1) // epoch:
            assert np.array_equal(x.gram, y.gram) and np.array_equal(x.counts, y.counts)
    # budgets: every tick's bank is calibrated to ε_t, and the epoch's split stays within ε
    for boot, per, n, bank_eps in a.budgets + b.budgets:
        assert boot == pytest.approx(0.2 * eps)
        assert bank_eps == per and boot + n * per <= eps


def test_bootstrap_statistics_equal_the_direct_vectors_and_round_trip() -> None:
    rng = np.random.default_rng(7)
    bits = (rng.random((3000, 15)) < rng.uniform(0.02, 0.6, 15)).astype(np.uint8)
    weights = rng.integers(1, 4, 3000).astype(np.float64)
    s = BootstrapStats(15)
    for lo in range(0, 3000, 700):  # streamed in pieces, with repeat counts
        s.add(bits[lo : lo + 700], weights[lo : lo + 700])
    expanded = np.repeat(bits, weights.astype(np.int64), axis=0)
    for kk in (2, 5, 9):
        assert np.array_equal(s.cooccurrence_vector(kk), cooccurrence_vector(expanded, kk))
    assert np.array_equal(s.pair_vector(), pair_vector(expanded))
    assert np.array_equal(s.ones_histogram(), ones_histogram(expanded))
    back = BootstrapStats.from_bytes(s.to_bytes())
    assert np.array_equal(back.gram, s.gram) and np.array_equal(back.counts, s.counts)
    with pytest.raises(ValueError):
        BootstrapStats.from_bytes(s.to_bytes()[:-8])


def test_carry_is_the_decayed_model_marginal_plus_the_new_bank() -> None:
    """After a re-decision every table is the previous epoch's consistent model marginal,
    decayed by p^Δ, plus a bank that counts only the new epoch's events (recomputed here)."""
    m, p = 10, 0.9
    bits, ticks = _data(m, 9, 80, seed=3)
    cfg = LiveConfig(m=m, epsilon=3.0, p=p, epoch_ticks=5, max_cluster=4)
    live = LiveMarginals(cfg, KEY, "carry")
    pats = _pats(bits)
    for t in range(1, 6):
        u, c = np.unique(pats[ticks == t], return_counts=True)
        live.step(u, c.astype(np.float64))
    # the carry was taken from the model at tick 5 under the old structure
    assert live.epoch == 1 and live.carry is not None
    carry = [v.copy() for v in live.carry]
    for t in range(6, 10):
        u, c = np.unique(pats[ticks == t], return_counts=True)
        out = live.step(u, c.astype(np.float64))
        bank = live.release.released()
        for v, cv, bv in zip(out.values, carry, bank, strict=True):
            assert np.allclose(v, bv + p ** (t - 5) * cv, rtol=0, atol=1e-9)
    # the banks of epoch 1 count only epoch 1's events: recompute them exactly (noise-free
    # check: their noise has mean zero; the bank's exact part is the decayed count)
    w = np.where((ticks >= 6) & (ticks <= 9), p ** (9 - ticks).astype(np.float64), 0.0)
    for attrs, bv in zip(live.structure.tables, live.release.released(), strict=True):
        exact = count_table(bits, attrs, w)
        assert np.all(np.abs(bv - exact) <= 6 * math.sqrt(live.release.cell_variance()) + 1e-9)


def test_initial_structure_and_validation() -> None:
    s = initial_structure(10, 4)
    assert s.tables == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9))
    assert patterns_to_bits(np.array([0b1001], dtype=np.uint64), 4).tolist() == [[1, 0, 0, 1]]
    for bad in ({"m": 0}, {"epsilon": float("nan")}, {"p": 1.5}, {"epoch_ticks": 0},
                {"bootstrap_fraction": 1.0}, {"max_cluster": 9}):
        args: dict[str, Any] = {"m": 4, "epsilon": 1.0, "p": 0.9, "epoch_ticks": 5} | bad
        with pytest.raises(ValueError):
            LiveConfig(**args)
    live = LiveMarginals(LiveConfig(4, 1.0, 0.9, 5), KEY, "v")
    with pytest.raises(ValueError, match="bit"):
        live.step(np.array([1 << 5], dtype=np.uint64), np.array([1.0]))
    with pytest.raises(ValueError, match="whole"):
        live.step(np.array([1], dtype=np.uint64), np.array([0.5]))
    assert live.tick == 0  # refused ticks change nothing


def test_live_accuracy_beats_independence_on_dependent_data() -> None:
    """m = 24, ε = 1, p = 0.99: after two re-decisions the live tables answer 3-way queries
    (mean total variation at the last tick) clearly better than the independence product of the
    exact one-way marginals."""
    m, p = 24, 0.99
    bits, ticks = _data(m, 300, 300, seed=1)
    live = LiveMarginals(LiveConfig(m, 1.0, p, 100), KEY, "accuracy")
    pats = _pats(bits)
    for t in range(1, 301):
        u, c = np.unique(pats[ticks == t], return_counts=True)
        out = live.step(u, c.astype(np.float64))
    model = out.model()
    w = p ** (300 - ticks).astype(np.float64)
    rng = np.random.default_rng(0)
    tv_live, tv_ind = [], []
    for _ in range(60):
        q = [int(a) for a in rng.choice(m, 3, replace=False)]
        exact = count_table(bits, q, w)
        exact = exact / exact.sum()
        got = model.answer(q)
        tv_live.append(0.5 * np.abs(got / got.sum() - exact).sum())
        ind = np.ones(1)
        for a in q:
            pa = count_table(bits, [a], w)
            ind = np.kron(ind, pa / pa.sum())
        tv_ind.append(0.5 * np.abs(ind - exact).sum())
    assert np.mean(tv_live) < 0.75 * np.mean(tv_ind), (np.mean(tv_live), np.mean(tv_ind))


def test_a_tick_without_events_is_released_with_the_cell_clip() -> None:
    """A tick with no events (the first tick of a live demo, a quiet tick) with ``cell_clip``
    set, as the service always steps. ``np.bincount`` of no ids returns int64 zeros even with
    float weights, and clipping those in place to a float raised numpy's UFuncTypeError
    (the attributes demo's intermittent 'no tick released'). Oracle: a twin (same key and
    description) stepped with the same empty tick without a clip, and a twin fed one event
    pattern with a zero count (float cells): every table bit-identical at every tick, across
    an epoch boundary."""
    cfg = LiveConfig(6, 1.0, 0.9, 3)
    clipped = LiveMarginals(cfg, KEY, "empty-ticks")
    plain = LiveMarginals(cfg, KEY, "empty-ticks")
    zero = LiveMarginals(cfg, KEY, "empty-ticks")
    none_p, none_c = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.float64)
    busy_p, busy_c = np.array([0b000011, 0b110000], dtype=np.uint64), np.array([2.0, 1.0])
    # empty at the first tick, in the middle and at an epoch's last tick (3, 6)
    for t in range(1, 8):
        empty = t in (1, 3, 5, 6)
        pats, counts = (none_p, none_c) if empty else (busy_p, busy_c)
        a = clipped.step(pats, counts, cell_clip=1000.0)
        b = plain.step(pats, counts)
        c = zero.step(np.array([0], dtype=np.uint64), np.array([0.0])) if empty \
            else zero.step(pats, counts)
        assert a.tick == b.tick == c.tick == t and a.epoch == b.epoch == c.epoch
        for x, y, z in zip(a.values, b.values, c.values, strict=True):
            assert x.dtype == np.float64
            assert x.tobytes() == y.tobytes() == z.tobytes(), t
