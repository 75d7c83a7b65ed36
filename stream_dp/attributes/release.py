"""The whole pipeline for a binary-attribute stream, with its exact privacy accounting.

1. **Bootstrap** (budget ``ε₀ = bootstrap_fraction · ε``), once over the whole log:
   :func:`~stream_dp.attributes.dependence.measure_bootstrap` — a noisy histogram of ones per
   event (5 % of ε₀, sensitivity 1) to choose K, then bounded co-occurrence counts (L1
   sensitivity ``1 + K + C(K, 2)``) or, when smaller, all pair tables (sensitivity ``C(m, 2)``).
2. **Structure** (free, post-processing of 1): :func:`~stream_dp.attributes.structure.choose_structure`.
3. **Tables** (budget ``ε − ε₀``, split equally over the ``K`` measured tables, ``ε_t`` each):
   every cell of every table is a stream of a :class:`~stream_dp.counters.CounterBank` at
   ``PureDP(ε_t)``, cap 1, decay ``p``; its per-tick count is the number of the tick's events in
   that cell, clipped to a public bound (:class:`MarginalRelease`; 1-Lipschitz, so one event
   still moves one cell per table by at most 1, and no burst leaves the bank's numeric range).
   A bank is ``ε_t``-DP for a unit change of one stream's count in one tick.
4. **Answers** (free): GLS consistency (:mod:`stream_dp.attributes.consistency`) and the
   junction-tree estimator (:mod:`stream_dp.attributes.model`).

**Accounting from first principles.** Adding or removing one event changes: one bin of the
ones histogram by 1 (scale ``1/ε_h`` → ``ε_h``), the bootstrap's measured vector by at most its
sensitivity Δ₀ in L1 (scale ``Δ₀/(ε₀ − ε_h)`` → ``ε₀ − ε_h``), and,
in the one tick the event's own timestamp selects, one cell of each of the ``K`` measured tables
by 1 (``K`` streams, each ``ε_t``-DP → ``K·ε_t``). Basic composition (the structure is chosen
adaptively from the bootstrap's output, which adaptive composition allows) gives
``ε₀ + K·ε_t ≤ ε``, checked in exact rational arithmetic on the floats the samplers receive
(:func:`split_budget`, :func:`~stream_dp.attributes.dependence.bootstrap_budgets`; every scale
is rounded up, so each measurement spends at most its float budget). No parallel composition
across attribute groups is used: every event lies in every table. Releasing every tick costs nothing more (the decayed counters' guarantee covers all
ticks), and everything after step 3 is post-processing.

**Re-deciding the structure** (the live service, :mod:`stream_dp.attributes.live`): bootstrap
epoch k's events, choose epoch k+1's tables from that, count only epoch k+1's events in them, and
start their decayed values from epoch k's consistent model decayed by ``p^Δ``
(post-processing). Each event lies in one epoch, hence in one bootstrap and one set of tables:
the cost per event stays ``ε₀ + K·ε_t``. The offline ``stream-dp marginals`` bootstraps once
over the whole log (it can look ahead).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from stream_dp.attributes.consistency import make_consistent
from stream_dp.attributes.dependence import PairSketch, check_bootstrap_scales, measure_bootstrap
from stream_dp.attributes.model import JunctionTreeModel
from stream_dp.attributes.structure import Structure, choose_structure
from stream_dp.attributes.tables import cell_index
from stream_dp.exact_budget import exact_decimal, lower_until
from stream_dp.mechanism import Mechanism

__all__ = [
    "BudgetSplit",
    "MarginalRelease",
    "OfflineResult",
    "auto_bridge_size",
    "bank_mechanism",
    "cell_bound",
    "decayed_total_estimate",
    "max_tables",
    "run_offline",
    "split_budget",
    "worst_spent",
]

Float64Array = NDArray[np.float64]

#: Default share of ε spent on the bootstrap measurement.
DEFAULT_BOOTSTRAP_FRACTION = 0.2
#: Default largest number of attributes of one joint table.
DEFAULT_MAX_CLUSTER = 4
#: Largest epoch (ticks) of the counters: longer runs roll into new epochs, carrying the decayed
#: release forward (post-processing). Keeps the planner's exact-error search short; for p < 1 the
#: error of every strategy stays bounded across epochs.
MAX_EPOCH_TICKS = 4095
_CHUNK_EVENTS = 1 << 17


@dataclass(frozen=True)
class BudgetSplit:
    """ε per event: ``bootstrap`` once, ``per_table`` for each of ``n_tables`` tables.

    The floats are the budgets the measurements are calibrated to (each spends at most its
    budget exactly: noise scales are rounded up); :attr:`spent_exact` is their exact sum."""

    epsilon: float
    bootstrap: float
    per_table: float
    n_tables: int
    bootstrap_sensitivity: float
    bootstrap_method: str = "none"

    @property
    def spent_exact(self) -> Fraction:
        """Total ε per event in exact rational arithmetic: ``bootstrap + n_tables · per_table``
        (≤ ``epsilon`` exactly, :func:`split_budget`)."""
        return Fraction(self.bootstrap) + self.n_tables * Fraction(self.per_table)

    @property
    def spent(self) -> float:
        """:attr:`spent_exact` rounded to the nearest float (≤ ``epsilon``: rounding is
        monotone and ``epsilon`` is a float)."""
        return float(self.spent_exact)

    @property
    def spent_text(self) -> str:
        """:attr:`spent_exact` as its exact decimal expansion."""
        return exact_decimal(self.spent_exact)

    def lines(self) -> list[str]:
        """Human-readable accounting (the total as its exact decimal expansion)."""
        return [
            f"bootstrap ({self.bootstrap_method}): L1 sensitivity {self.bootstrap_sensitivity:g} "
            f"per event, ε₀ = {self.bootstrap:.6g}",
            f"tables: {self.n_tables} measured tables, one cell each per event, "
            f"ε_t = {self.per_table:.6g} each, {self.n_tables * self.per_table:.6g} together",
            f"total per event: {self.spent_text} ≤ ε = {self.epsilon!r} (exactly: the float "
            f"{self.epsilon!r} is {exact_decimal(Fraction(self.epsilon))}; pure DP, all ticks)",
        ]


def split_budget(
    epsilon: float,
    n_tables: int,
    bootstrap: float,
    bootstrap_sensitivity: float = 0.0,
    bootstrap_method: str = "none",
) -> BudgetSplit:
    """The split with ``ε_t = (ε − bootstrap)/n_tables`` rounded to a float, then lowered ulp
    by ulp until ``bootstrap + n_tables·ε_t ≤ ε`` holds in exact rational arithmetic (a float
    check passed ε = 1.1, three tables, for an exact sum 1.1e-16 above the float 1.1)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if n_tables < 1:
        raise ValueError("at least one table must be measured")
    if not 0 <= bootstrap < epsilon:
        raise ValueError(f"bootstrap budget must be in [0, ε), got {bootstrap!r}")
    room = Fraction(epsilon) - Fraction(bootstrap)
    per = lower_until((epsilon - bootstrap) / n_tables, lambda x: n_tables * Fraction(x) <= room)
    return BudgetSplit(epsilon, bootstrap, per, n_tables, bootstrap_sensitivity, bootstrap_method)


def max_tables(m: int) -> int:
    """The most tables a structure over ``m`` attributes can measure (``2m − 1``: at most one
    table per cluster and one per bridge, and a forest over ``m`` attributes has fewer than
    ``m`` edges)."""
    return max(1, 2 * m - 1)


def worst_spent(epsilon: float, m: int, bootstrap: float) -> Fraction:
    """The largest exact ε per event over every table count an epoch can have
    (``1 … max_tables(m)``): what one event can spend, whatever structure is chosen."""
    return max(split_budget(epsilon, k, bootstrap).spent_exact for k in range(1, max_tables(m) + 1))


def bank_mechanism(
    p: float,
    horizon: int,
    epsilon_per_table: float,
    strategy: str = "auto",
    max_cell_count: float | None = None,
) -> Mechanism:
    """The mechanism of every cell of a :class:`MarginalRelease`: ``strategy`` at
    ``PureDP(epsilon_per_table)``, cap 1, whole-number counts (``auto`` may pick ``naive-int``).

    ``max_cell_count`` (events per cell and tick, public): ``auto`` picks among the strategies
    whose numeric range covers it, and any strategy whose range does not is refused with a
    one-line ``ValueError`` (:func:`stream_dp.planner.check_range`). Without it ``auto`` is the
    unrestricted pick (what the cells ran before the bound existed)."""
    from stream_dp.budget import PureDP
    from stream_dp.planner import check_range, make_mechanism, pick
    from stream_dp.strategies.registry import check_arguments

    privacy = PureDP(epsilon_per_table)
    if strategy == "auto" and max_cell_count is not None:
        p, horizon, _, _ = check_arguments(p, horizon, privacy, 1.0)
        strategy = pick(p, horizon, privacy, cap=1.0, integer_counts=True,
                        max_tick_count=max_cell_count)
    mech = make_mechanism(strategy, p, horizon, privacy, 1.0, integer_counts=True)
    if max_cell_count is not None:
        check_range(mech, max_cell_count,
                    what=f"a table cell's count per tick (up to {_count(max_cell_count)} events)")
    return mech


def _count(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def cell_bound(mechanism: Mechanism, max_cell_count: float | None) -> float:
    """Every cell's count in a tick is clipped to this (events): ``max_cell_count`` when given,
    else the largest whole count in the mechanism's numeric range (a public function of the
    parameters); ``inf`` when the range is unbounded."""
    if max_cell_count is not None:
        return float(max_cell_count)
    limit = mechanism.max_count()
    return float(math.floor(limit)) if math.isfinite(limit) else math.inf


class MarginalRelease:
    """Decayed DP counts of every cell of the measured ``tables``, tick after tick.

    One :class:`~stream_dp.counters.CounterBank` of :func:`bank_mechanism` (``epsilon_per_table``,
    cap 1, decay ``p`` per tick, ``horizon`` ticks per epoch); stream names
    ``"{description}/table={attrs}/cell={c}"`` so no two tables or runs share noise.

    Every cell's count in a tick is clipped to :attr:`clip` (:func:`cell_bound`) before it is
    measured: one event still changes one cell per table by at most 1 (clipping is
    1-Lipschitz), and no burst can leave the mechanism's numeric range, so whether a tick is
    released never depends on the counts.
    """

    def __init__(
        self,
        tables: Sequence[Sequence[int]],
        p: float,
        horizon: int,
        epsilon_per_table: float,
        key: bytes,
        description: str,
        strategy: str = "auto",
        max_cell_count: float | None = None,
    ) -> None:
        from stream_dp.counters import CounterBank

        self.tables = tuple(tuple(int(a) for a in t) for t in tables)
        sizes = [1 << len(t) for t in self.tables]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        names = [
            f"{description}/table={','.join(map(str, t))}/cell={c}"
            for t in self.tables
            for c in range(1 << len(t))
        ]
        mech = bank_mechanism(p, horizon, epsilon_per_table, strategy, max_cell_count)
        #: largest count of one cell in one tick that is measured as it is (events)
        self.clip = cell_bound(mech, max_cell_count)
        self.bank = CounterBank(mech, names, key)

    @property
    def n_cells(self) -> int:
        """Streams in the bank (cells of all tables)."""
        return int(self.offsets[-1])

    def cell_ids(self, bits: NDArray[np.uint8]) -> NDArray[np.int64]:
        """``(n, K)`` bank positions of each event's cell in each table."""
        return np.stack(
            [cell_index(bits, t) + self.offsets[i] for i, t in enumerate(self.tables)], axis=1
        ).astype(np.int64)

    def step_ids(self, ids: NDArray[np.int64]) -> None:
        """Release one tick whose events have the bank positions ``ids`` (``(n, K)``)."""
        self.step_counts(np.bincount(ids.reshape(-1), minlength=self.n_cells))

    def step_counts(self, counts: NDArray[np.float64] | NDArray[np.int64]) -> None:
        """Release one tick whose cells hold ``counts`` events (clipped to :attr:`clip`)."""
        cells = np.minimum(np.asarray(counts, dtype=np.float64), self.clip)
        self.bank.step(cells)

    def step(self, bits: NDArray[np.uint8]) -> None:
        """Release one tick whose events are the rows of the 0/1 matrix ``bits``."""
        self.step_ids(self.cell_ids(bits))

    @property
    def tick(self) -> int:
        """Ticks released so far."""
        return self.bank.tick

    def released(self) -> list[Float64Array]:
        """The last tick's noisy decayed counts, one flat array per table."""
        rel = self.bank.releases
        return [rel[self.offsets[i] : self.offsets[i + 1]] for i in range(len(self.tables))]

    def cell_variance(self) -> float:
        """Noise variance of one released cell at the current tick (counts², analytic)."""
        return float(self.bank.stderr**2)

    def model(self) -> JunctionTreeModel:
        """Consistent tables and the junction-tree estimator for the current tick."""
        noisy = self.released()
        consistent = make_consistent(self.tables, noisy)
        var = self.cell_variance()
        return JunctionTreeModel(self.tables, consistent, [var] * len(self.tables))


#: Signal-to-noise a bridge table's average cell must keep (decayed events per cell over the
#: noise standard deviation of a cell), for :func:`auto_bridge_size`.
BRIDGE_SNR = 8.0


def decayed_total_estimate(n_total: float, ticks: int, p: float) -> float:
    """Decayed count at the last tick if ``n_total`` events were spread evenly over ``ticks``."""
    if ticks < 1:
        return 0.0
    rate = n_total / ticks
    if p >= 1.0:
        return n_total
    return rate * (1.0 - p**ticks) / (1.0 - p)


def auto_bridge_size(
    n_decayed: float, epsilon_per_table: float, p: float, max_size: int, snr: float = BRIDGE_SNR
) -> int:
    """Largest bridge-table size ``s`` in ``[2, max_size]`` whose average cell
    ``n_decayed / 2**s`` is at least ``snr`` times the noise of one cell, approximated by input
    perturbation's ``√(2/(ε_t²(1 − p²)))`` (an upper bound on the planner's pick); 2 if none.

    More attributes per bridge keep more dependence between clusters but spread the events over
    more cells; measured on the attribute simulator (benchmarks/marginals.py), 4-attribute
    bridges help at ~95 000 decayed events and hurt at ~4 800.
    """
    if p < 1.0:
        sigma = math.sqrt(2.0 / (epsilon_per_table**2 * (1.0 - p * p)))
    else:
        sigma = math.sqrt(2.0) / epsilon_per_table
    best = 2
    for size in range(2, max(2, max_size) + 1):
        if n_decayed / (1 << size) >= snr * sigma:
            best = size
    return best


def _method(sketch: PairSketch | None) -> str:
    if sketch is None:
        return "none"
    parts = [sketch.method if sketch.max_ones is None else f"{sketch.method}, K={sketch.max_ones}"]
    if sketch.histogram_epsilon > 0:
        parts.append(f"ones histogram ε {sketch.histogram_epsilon:.4g} of it, sensitivity 1")
    return "; ".join(parts)


@dataclass(frozen=True)
class OfflineResult:
    """Outcome of :func:`run_offline` at the last tick."""

    tick: int
    structure: Structure
    split: BudgetSplit
    sketch: PairSketch | None
    model: JunctionTreeModel
    release: MarginalRelease


def run_offline(
    bits: NDArray[np.uint8],
    ticks: NDArray[np.int64],
    *,
    epsilon: float,
    p: float,
    key: bytes,
    description: str,
    bootstrap_fraction: float = DEFAULT_BOOTSTRAP_FRACTION,
    max_cluster: int = DEFAULT_MAX_CLUSTER,
    max_ones: int | None = None,
    bridge_size: int | None = None,
    last_tick: int | None = None,
    strategy: str = "auto",
    progress: Callable[[str], None] | None = None,
    max_cell_count: float | None = None,
) -> OfflineResult:
    """Bootstrap, choose the structure, release ticks ``1 … max(ticks)``; the model at the end.

    ``bits``: ``(n, m)`` 0/1 events; ``ticks``: each event's tick (≥ 1, from its own timestamp);
    ``epsilon`` per event for the whole run; ``p`` decay per tick; ``key`` the noise secret;
    ``description`` a canonical text of the run (keys the noise); ``last_tick`` the public last
    tick to release (default: the last event's tick, which then is *not* protected: removing the
    last event can change it); ``max_cell_count`` the public bound on one cell's events in one
    tick (:class:`MarginalRelease`: counts above it are clipped, ``auto`` picks a strategy whose
    range covers it; default: the picked strategy's own numeric range).
    """
    n, m = bits.shape
    if ticks.shape != (n,):
        raise ValueError("give one tick per event")
    if n == 0 and last_tick is None:
        # with a public last tick an empty log is released like any other (zero counts plus
        # noise): refusing it would tell an empty log from a log of one event
        raise ValueError("give at least one event, or the last tick to release")
    if n and int(ticks.min()) < 1:
        raise ValueError("ticks must be ≥ 1")
    if not 0 <= bootstrap_fraction < 1:
        raise ValueError(f"bootstrap fraction must be in [0, 1), got {bootstrap_fraction!r}")
    say = progress or (lambda _msg: None)
    last = int(ticks.max()) if n else 1
    if last_tick is not None:
        if last_tick < last:
            raise ValueError(
                f"an event falls in tick {last}, after the declared last tick {last_tick}"
            )
        last = int(last_tick)
    sketch: PairSketch | None = None
    eps0 = bootstrap_fraction * epsilon if m > 1 else 0.0
    if eps0 > 0:
        if max_ones is None:
            # which bootstrap runs depends on the noisy histogram: check every one it may
            # choose first, so whether the run fails never depends on that draw (as the live
            # service does at start-up)
            check_bootstrap_scales(m, eps0)
        sketch = measure_bootstrap(bits, eps0, key, description, max_ones)
        excess = sketch.excess()
        structure = choose_structure(excess, max_cluster=max_cluster, bridge_size=2)
        if bridge_size is None and structure.bridges:
            # the table count does not depend on the bridge size: size the bridges from the
            # noisy total (post-processing) and the per-table budget this structure leaves
            per_table = (epsilon - eps0) / len(structure.tables)
            n_dec = decayed_total_estimate(sketch.total, last, p)
            bridge_size = auto_bridge_size(n_dec, per_table, p, max_cluster)
        if bridge_size is not None and bridge_size != 2:
            structure = choose_structure(excess, max_cluster=max_cluster, bridge_size=bridge_size)
    else:
        structure = Structure(m, tuple((a,) for a in range(m)), ())
    split = split_budget(
        epsilon,
        len(structure.tables),
        eps0,
        sketch.sensitivity if sketch else 0.0,
        _method(sketch),
    )
    say(
        f"structure: {len(structure.tables)} tables "
        f"({len(structure.tables) - len(structure.bridges)} cluster tables, "
        f"{len(structure.bridges)} bridge tables); " + "; ".join(split.lines())
    )
    rel = MarginalRelease(
        structure.tables,
        p,
        min(max(last, 1), MAX_EPOCH_TICKS),
        split.per_table,
        key,
        f"{description}/structure={structure.describe()}",
        strategy,
        max_cell_count,
    )
    order = np.argsort(ticks, kind="stable")
    sorted_bits = bits[order]
    bounds = np.searchsorted(ticks[order], np.arange(1, last + 2), side="left")
    step = max(1, last // 20)
    t = 1
    while t <= last:
        # a chunk of ticks with at most ~2**17 events (bounded memory for the cell ids)
        end = int(np.searchsorted(bounds, bounds[t - 1] + _CHUNK_EVENTS, side="right")) - 1
        end = min(max(end, t), last)
        lo = int(bounds[t - 1])
        ids = rel.cell_ids(sorted_bits[lo : int(bounds[end])])
        for u in range(t, end + 1):
            rel.step_ids(ids[int(bounds[u - 1]) - lo : int(bounds[u]) - lo])
            if u % step == 0 or u == last:
                say(f"tick {u}/{last}")
        t = end + 1
    return OfflineResult(last, structure, split, sketch, rel.model(), rel)
