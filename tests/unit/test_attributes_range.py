"""Binary attributes: whether a tick is released never depends on the raw counts (issue 37).

Every table cell's count in a tick is clipped to a public bound, the banks run a strategy whose
numeric range covers that bound, and the range checked is the one of the mechanism that really
runs (at ε_t, every epoch). Before: the banks ran ``auto`` at ε_t with no bound, a burst past
their range made ``bank.step`` raise and the releases stop (offline: exit 2).
"""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.attributes.live import LiveConfig, LiveMarginals, check_live_range
from stream_dp.attributes.release import bank_mechanism, run_offline, split_budget
from stream_dp.budget import PureDP
from stream_dp.strategies.registry import available, make

KEY = bytes(range(32))
#: p = 1, ε_t ≈ 10⁴: the unrestricted pick is tree-ls, whose range is only ~5.2e5 events; the
#: bootstrap gets ε₀ = 1 (its samplers refuse scales below 2**-8: ε₀ of thousands)
P, EPS, EPOCH, FRACTION = 1.0, 1e4, 4, 1e-4


def _pattern_steps(live: LiveMarginals, burst: float, ticks: int = 6
                   ) -> list[tuple[np.ndarray, ...]]:
    """Steps ``live`` through ``ticks`` ticks of a fixed mix; tick 3 adds ``burst`` events of
    pattern 0b101. Returns every tick's released cells."""
    out = []
    for t in range(1, ticks + 1):
        pats = np.array([0b001, 0b011, 0b101, 0b110], dtype=np.uint64)
        counts = np.array([3.0, 1.0, 2.0, 4.0])
        if t == 3:
            counts[2] += burst
        out.append(tuple(v.copy() for v in live.step(pats, counts).values))
    return out


def test_a_live_burst_far_past_the_range_is_clipped_and_releases_go_on() -> None:
    cfg = LiveConfig(m=3, epsilon=EPS, p=P, epoch_ticks=EPOCH, bootstrap_fraction=FRACTION,
                     max_cell_count=1000)
    unbounded = bank_mechanism(P, EPOCH, split_budget(EPS, 1, FRACTION * EPS).per_table)
    assert unbounded.name == "tree-ls" and unbounded.max_count() < 1e6  # the old pick
    burst = 5e7  # 50× past that strategy's range, 5·10⁴× past the bound
    got = _pattern_steps(LiveMarginals(cfg, KEY, "d"), burst)
    assert len(got) == 6  # every tick released, across the epoch change at tick 4
    # the burst counts exactly as the bound: bit-identical to 1000 − 2 extra events
    same = _pattern_steps(LiveMarginals(cfg, KEY, "d"), 1000 - 2)
    for a, b in zip(got[:EPOCH], same[:EPOCH], strict=True):
        assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))
    # against no burst: only the burst's own cell (one per table) differs, from tick 3 on
    quiet = _pattern_steps(LiveMarginals(cfg, KEY, "d"), 0)
    live = LiveMarginals(cfg, KEY, "d")
    for t in range(EPOCH):
        for i, (x, y) in enumerate(zip(got[t], quiet[t], strict=True)):
            changed = np.nonzero(x != y)[0].tolist()
            table = live.structure.tables[i]
            own = sum(((0b101 >> a) & 1) << (len(table) - 1 - j) for j, a in enumerate(table))
            assert changed == ([] if t < 2 else [own]), (t, i)


def test_without_a_bound_the_burst_is_clipped_at_the_banks_own_range() -> None:
    cfg = LiveConfig(m=3, epsilon=EPS, p=P, epoch_ticks=EPOCH, bootstrap_fraction=FRACTION)
    live = LiveMarginals(cfg, KEY, "d")
    assert live.release.bank.mechanism.name == "tree-ls"  # published bytes: the same pick
    limit = live.release.clip
    assert limit == float(int(live.release.bank.mechanism.max_count()))
    got = _pattern_steps(live, 1e9)
    same = _pattern_steps(LiveMarginals(cfg, KEY, "d"), limit - 2)
    for a, b in zip(got[:EPOCH], same[:EPOCH], strict=True):
        assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


def test_offline_a_burst_past_the_range_is_clipped_not_an_error() -> None:
    """``run_offline`` (what ``stream-dp marginals`` runs): one cell of one tick gets more events
    than its bank's range; the release goes on and equals the run with the cell at the range."""
    rng = np.random.default_rng(3)
    base = (rng.random((60, 3)) < 0.4).astype(np.uint8)
    ticks = rng.integers(1, 6, 60)
    kw = {"epsilon": EPS, "p": P, "key": KEY, "description": "d", "last_tick": 5,
          "bridge_size": 2, "max_cluster": 4, "bootstrap_fraction": FRACTION}
    first = run_offline(base, ticks, **kw)  # type: ignore[arg-type]
    mech = first.release.bank.mechanism
    limit = int(mech.max_count())
    assert mech.name == "tree-ls" and limit < 10**6
    in_cell = int(np.sum((ticks == 2) & np.all(base == [1, 0, 1], axis=1)))

    def with_extra(extra: int) -> np.ndarray:
        bits = np.vstack([base, np.tile(np.array([[1, 0, 1]], dtype=np.uint8), (extra, 1))])
        t = np.concatenate([ticks, np.full(extra, 2)])
        res = run_offline(bits, t, **kw)  # type: ignore[arg-type]
        assert res.structure.tables == first.structure.tables  # one table of all three
        return np.concatenate(res.release.released())

    burst = with_extra(limit + 400_000)  # exit 2 before
    clipped = with_extra(limit - in_cell)
    assert burst.tobytes() == clipped.tobytes()


def test_an_explicit_bound_restricts_the_pick_and_is_checked_every_epoch() -> None:
    big = 2**29  # the service's largest max_events_per_tick
    cfg = LiveConfig(m=5, epsilon=EPS, p=P, epoch_ticks=EPOCH, max_cell_count=big)
    name = check_live_range(cfg)
    assert name != "tree-ls" and make(name, P, EPOCH, PureDP(EPS), 1.0).max_count() >= big
    live = LiveMarginals(cfg, KEY, "d")
    assert live.release.bank.mechanism.max_count() >= big
    with pytest.raises(ValueError, match="numeric range of tree-ls"):
        check_live_range(LiveConfig(m=5, epsilon=EPS, p=P, epoch_ticks=EPOCH,
                                    strategy="tree-ls", max_cell_count=big))
    # a named strategy whose range covers the first epoch only (K = 2 tables) is refused at
    # start-up already: an epoch with one table runs at a larger ε_t, a smaller range
    k1 = bank_mechanism(P, EPOCH, split_budget(1.0, 1, 0.2).per_table, "tree-ls")
    k2 = bank_mechanism(P, EPOCH, split_budget(1.0, 2, 0.2).per_table, "tree-ls")
    assert k1.max_count() < k2.max_count()
    between = int((k1.max_count() + k2.max_count()) / 2)
    with pytest.raises(ValueError, match="numeric range"):
        check_live_range(LiveConfig(m=5, epsilon=1.0, p=P, epoch_ticks=EPOCH, max_cluster=3,
                                    strategy="tree-ls", max_cell_count=between))


@pytest.mark.parametrize(("p", "horizon"), [(1.0, 5), (0.95, 1440), (0.99, 100)])
def test_every_strategy_s_range_is_monotone_in_epsilon(p: float, horizon: int) -> None:
    """What ``check_live_range`` relies on to check a named strategy at the two extreme ε_t only."""
    for name in available("pure", integer_counts=True):
        ranges = []
        for eps in (1e-3, 0.05, 1.0, 20.0, 300.0):
            try:
                ranges.append(make(name, p, horizon, PureDP(eps), 1.0).max_count())
            except ValueError:  # a budget the strategy refuses (naive-int at a huge ε)
                continue
        assert ranges == sorted(ranges, reverse=True), (name, ranges)


def test_a_bootstrap_budget_its_sampler_refuses_is_refused_at_start_up() -> None:
    """ε₀ = 2000 over 3 attributes: the pair tables' scale C(3,2)/ε₀ is below the sampler's
    2**-8, so the first epoch's end would raise and stop the releases; refused up front."""
    cfg = LiveConfig(m=3, epsilon=1e4, p=P, epoch_ticks=2, bootstrap_fraction=0.2)
    with pytest.raises(ValueError, match=r"bootstrap budget .* too large") as err:
        check_live_range(cfg)
    assert "\n" not in str(err.value)
    live = LiveMarginals(cfg, KEY, "d")
    live.step(np.array([1], dtype=np.uint64), np.array([1.0]))
    with pytest.raises(ValueError, match="scale must be a number"):  # what it would do live
        live.step(np.array([1], dtype=np.uint64), np.array([1.0]))
    check_live_range(LiveConfig(m=3, epsilon=1e4, p=P, epoch_ticks=2, bootstrap_fraction=1e-4))


def test_whether_an_offline_run_fails_never_depends_on_the_noisy_choice_of_bootstrap() -> None:
    """ε = 1, bootstrap share 5·10⁻¹²: the ones histogram and the pair tables have noise scales
    the exact sampler accepts, the co-occurrence bootstrap at K = 8 does not. Which one runs
    is read from the noisy histogram, so before the fix some keys released and others
    failed (exit 2 in ``marginals``) on the very same log. Now every key is refused the same
    way, before any noise is drawn (the check the live service runs at start-up)."""
    bits = (np.random.default_rng(0).random((30, 64)) < 0.05).astype(np.uint8)
    ticks = np.ones(30, dtype=np.int64)
    outcomes = set()
    for k in range(8):
        try:
            run_offline(bits, ticks, epsilon=1.0, p=0.9, key=bytes([k]) * 32, description="d",
                        last_tick=2, bootstrap_fraction=5e-12)
            outcomes.add("released")
        except ValueError as exc:
            outcomes.add(str(exc).split(":")[0])
    assert outcomes == {"the bootstrap budget ε₀ = 5e-12 is too small for 64 attributes"}
