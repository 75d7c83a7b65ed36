"""Binary-attribute marginals released live, tick after tick, re-deciding the tables per epoch.

The service's state for a binary-attribute domain (one object per deployment; no Kafka here).
Time is cut into **structure epochs** of ``epoch_ticks`` ticks (epoch ``e`` holds ticks
``e·E + 1 … (e + 1)·E``, a public function of the tick number). During epoch ``e``:

* every event of the epoch is counted in the tables of the structure ``S_e`` by a
  :class:`~stream_dp.attributes.release.MarginalRelease` that counts **only epoch e's events**
  (one :class:`~stream_dp.counters.CounterBank` per epoch, noise keyed by the epoch and ``S_e``);
  the released table is that bank's decayed count plus the *carry*: each earlier epoch's own
  consistent model (its bank's tables at its last tick, under its own structure) marginalised
  onto the table and decayed by ``p^Δ`` (post-processing);
* the same events are added to exact :class:`~stream_dp.attributes.dependence.BootstrapStats`;
  at the epoch's last tick they are measured once with the bootstrap of
  :func:`~stream_dp.attributes.dependence.measure_bootstrap` (budget ``ε₀``, noise keyed by the
  epoch) and ``S_{e+1}`` is chosen from the noisy pair tables of every epoch's measurement so
  far, summed (:func:`~stream_dp.attributes.structure.choose_structure`, post-processing:
  disjoint events, independent noise, the signal adds up).

``S_0`` has no bootstrap before it: the attributes in index order, in joint tables of
``max_cluster``.

**Accounting** (pure ε-DP per event, for the whole run): an event's timestamp puts it in exactly
one tick, hence one epoch ``e``. It changes one cell of each of the ``K_e`` tables of ``S_e`` by
its count (each table a ``ε_t``-DP counter bank over all its ticks: ``K_e·ε_t = ε − ε₀``), and the
epoch's bootstrap by at most its sensitivity (``ε₀``, scale calibrated to it). Structures,
carries, consistency and answers are post-processing of those releases; later epochs never see
the event's raw contribution (their banks count their own events only). Basic composition under
adaptive choice: ``ε₀ + (ε − ε₀) = ε``. Which structure an epoch uses depends on earlier noisy
outputs only, so changing it costs nothing; neither does the number of epochs (each event is in
one). With ``bootstrap_fraction = 0`` (or ``m = 1``) ``S_0`` is kept and the tables get all of ε.

Standard errors: a table's cell carries its bank's analytic noise variance plus ``p^{2Δ}`` times
the carry's; the carry's is the junction-tree bound (:meth:`JunctionTreeModel.stderr`) when the
new table lies inside an old one, else the scale of :func:`_spanning_variance`, and the table is
flagged ``carried_from_model``: its carry also holds model error and is a non-linear function
of the old tables, so that variance is a conservative scale (and the GLS weight), not a bound.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from stream_dp.attributes.consistency import make_consistent
from stream_dp.attributes.dependence import (
    BootstrapStats,
    PairSketch,
    check_bootstrap_scales,
    measure_bootstrap,
)
from stream_dp.attributes.model import JunctionTreeModel
from stream_dp.attributes.release import (
    MAX_EPOCH_TICKS,
    BudgetSplit,
    MarginalRelease,
    auto_bridge_size,
    bank_mechanism,
    max_tables,
    split_budget,
)
from stream_dp.attributes.structure import Structure, choose_structure

__all__ = ["LiveConfig", "LiveMarginals", "LiveTick", "check_live_range", "initial_structure",
           "patterns_to_bits"]

Float64Array = NDArray[np.float64]
_MAGIC = b"SDPLIVE1"
#: Most closed epochs kept for the carry at p = 1 (older ones are folded together).
MAX_HISTORY = 64


def patterns_to_bits(patterns: NDArray[np.uint64], m: int) -> NDArray[np.uint8]:
    """``(n, m)`` 0/1 matrix of events given as integers (bit ``i`` = attribute ``i``).

    >>> patterns_to_bits(np.array([0b101], dtype=np.uint64), 3).tolist()
    [[1, 0, 1]]
    """
    shifts = np.arange(m, dtype=np.uint64)
    out: NDArray[np.uint8] = (
        (np.asarray(patterns, dtype=np.uint64)[:, None] >> shifts) & np.uint64(1)
    ).astype(np.uint8)
    return out


def initial_structure(m: int, max_cluster: int) -> Structure:
    """``S_0``: attributes in index order, ``max_cluster`` to a joint table (no data needed)."""
    clusters = tuple(tuple(range(i, min(i + max_cluster, m))) for i in range(0, m, max_cluster))
    return Structure(m, clusters, (), ())


@dataclass(frozen=True)
class LiveConfig:
    """Public parameters of a live binary-attribute release.

    ``m`` attributes; ``epsilon`` per event for the whole run (pure DP); ``p`` decay per tick;
    ``epoch_ticks`` ticks per structure epoch; ``bootstrap_fraction`` of ε spent on each epoch's
    bootstrap; ``max_cluster`` attributes per joint table (and per bridge); ``strategy`` of the
    counters (integer counts, cap 1 per event and table).
    """

    m: int
    epsilon: float
    p: float
    epoch_ticks: int
    bootstrap_fraction: float = 0.2
    max_cluster: int = 4
    strategy: str = "auto"
    #: Public bound on one table cell's events in one tick (e.g. the service's
    #: ``max_events_per_tick``): counts above it are clipped, and every epoch's bank runs a
    #: strategy whose numeric range covers it. ``None``: each bank's own range. Not part of
    #: :meth:`describe` (it never changes a release below the bound; the bank's mechanism,
    #: which it may change, is bound into its checkpoint and noise by itself).
    max_cell_count: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.m, bool) or not isinstance(self.m, int) or not 1 <= self.m <= 64:
            raise ValueError(f"m must be an integer in [1, 64], got {self.m!r}")
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon)
                and self.epsilon > 0):
            raise ValueError(f"epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not (isinstance(self.p, (int, float)) and 0 < self.p <= 1):
            raise ValueError(f"p must be in (0, 1], got {self.p!r}")
        if isinstance(self.epoch_ticks, bool) or not isinstance(self.epoch_ticks, int) \
                or self.epoch_ticks < 1:
            raise ValueError(f"epoch_ticks must be an integer >= 1, got {self.epoch_ticks!r}")
        if not (isinstance(self.bootstrap_fraction, (int, float))
                and 0 <= self.bootstrap_fraction < 1):
            raise ValueError(
                f"bootstrap_fraction must be in [0, 1), got {self.bootstrap_fraction!r}")
        if isinstance(self.max_cluster, bool) or not isinstance(self.max_cluster, int) \
                or not 1 <= self.max_cluster <= 8:
            raise ValueError(f"max_cluster must be an integer in [1, 8], got {self.max_cluster!r}")
        if self.max_cell_count is not None and (
                isinstance(self.max_cell_count, bool) or not isinstance(self.max_cell_count, int)
                or self.max_cell_count < 1):
            raise ValueError(
                f"max_cell_count must be an integer >= 1 or None, got {self.max_cell_count!r}")

    @property
    def bootstrap_epsilon(self) -> float:
        """ε₀ per event (0 when the structure is never re-decided)."""
        return self.bootstrap_fraction * self.epsilon if self.m > 1 else 0.0

    def describe(self) -> dict[str, object]:
        """Canonical description (binds checkpoints and noise)."""
        return {
            "m": self.m, "epsilon": self.epsilon, "p": self.p, "epoch_ticks": self.epoch_ticks,
            "bootstrap_fraction": self.bootstrap_fraction, "max_cluster": self.max_cluster,
            "strategy": self.strategy,
        }


@dataclass(frozen=True)
class LiveTick:
    """One released tick: the noisy decayed tables of the epoch's structure.

    ``values[i]``: the ``2**len(tables[i])`` cells of table ``i`` (decayed counts, first
    attribute most significant); ``stderr[i]``: analytic noise standard error of one of its
    cells; ``carried_from_model[i]``: its carry spans several old tables (module doc);
    ``bootstrap``: at an epoch's last tick, what was measured and chosen for the next epoch.
    """

    tick: int
    epoch: int
    structure: Structure
    split: BudgetSplit
    values: tuple[Float64Array, ...]
    stderr: tuple[float, ...]
    carried_from_model: tuple[bool, ...]
    bootstrap: dict[str, object] | None = None

    @property
    def tables(self) -> tuple[tuple[int, ...], ...]:
        return self.structure.tables

    def model(self) -> JunctionTreeModel:
        """The estimator of this tick's released tables, made consistent (what the reconcile
        agent publishes for the tick; at an epoch's last tick, under the epoch's structure)."""
        variances = [s * s for s in self.stderr]
        consistent = make_consistent(self.tables, list(self.values),
                                     [max(v, 1e-12) for v in variances])
        return JunctionTreeModel(self.tables, consistent, variances)

    def table_kinds(self) -> tuple[str, ...]:
        """``"cluster"`` or ``"bridge"`` for each table."""
        extra = set(self.structure.bridge_tables or self.structure.bridges)
        return tuple("bridge" if t in extra else "cluster" for t in self.tables)


def _spanning_variance(table: tuple[int, ...], old: tuple[tuple[int, ...], ...],
                       variances: tuple[float, ...]) -> float:
    """Noise scale of a cell of ``table`` read from a model over the ``old`` tables it spans:
    the largest cell variance of an old table it meets, times ``2**(|old| − |table|)`` when the
    old table is larger (a cell then sums that many old cells). A scale, not a bound (module
    doc); it does not compound across epochs when tables keep their size."""
    best = 0.0
    for o, v in zip(old, variances, strict=True):
        if set(o) & set(table):
            best = max(best, v * (1 << max(0, len(o) - len(table))))
    return best


def check_live_range(config: LiveConfig) -> str:
    """Build the mechanism the first epoch's bank runs and return its name; ``ValueError``
    (one line) if a bank of any epoch could not cover ``config.max_cell_count``.

    Later epochs measure other numbers of tables K (1 … :func:`max_tables`), hence run at
    other ``ε_t``. ``auto`` picks per epoch among the strategies whose range covers the bound
    (``naive`` and the Fenwick strategies cover 2**29 at every ε_t, so one always does); a
    named strategy is also built at the largest and the smallest ``ε_t`` an epoch can have
    (every registered strategy's range is monotone in ε: ``tests/unit/test_attributes_range.py``).
    Every bootstrap an epoch's end may measure must also have a noise scale its sampler
    accepts (:func:`~stream_dp.attributes.dependence.check_bootstrap_scales`).
    """
    c = config
    check_bootstrap_scales(c.m, c.bootstrap_epsilon)  # an epoch's end must not fail either
    horizon = min(c.epoch_ticks, MAX_EPOCH_TICKS)
    first = len(initial_structure(c.m, c.max_cluster).tables)
    fixed = c.strategy == "auto" or c.bootstrap_epsilon == 0  # (no bootstrap: S_0 for good)
    counts = [first] if fixed else sorted({first, 1, max_tables(c.m)})
    name = ""
    for k in counts:
        split = split_budget(c.epsilon, k, c.bootstrap_epsilon)
        mech = bank_mechanism(c.p, horizon, split.per_table, c.strategy, c.max_cell_count)
        if k == first:
            name = mech.name
    return name


class LiveMarginals:
    """The live release (module doc). ``key`` is the noise secret, ``description`` a canonical
    text of the deployment (keys every noise draw together with the epoch and structure)."""

    def __init__(self, config: LiveConfig, key: bytes, description: str) -> None:
        self.config = config
        self._key = key
        self.description = description
        self.tick = 0
        self.epoch = 0
        self.structure = initial_structure(config.m, config.max_cluster)
        self.last_bootstrap: dict[str, object] | None = None
        #: each closed epoch's own consistent tables: (last tick, tables, values, cell variance)
        self.history: list[tuple[int, tuple[tuple[int, ...], ...], list[Float64Array], float]] = []
        #: pooled noisy pair tables of every epoch's bootstrap (decayed) and their noise variance
        self.pool: tuple[Float64Array, float] | None = None
        self.stats = BootstrapStats(config.m)
        self.carry: list[Float64Array] | None = None
        self.carry_var: list[float] = []
        self.carry_model: list[bool] = []
        self._open_epoch()

    # ------------------------------------------------------------------ epochs
    def _open_epoch(self) -> None:
        c = self.config
        n = len(self.structure.tables)
        self.split = split_budget(c.epsilon, n, c.bootstrap_epsilon)
        self.release = MarginalRelease(
            self.structure.tables, c.p, min(c.epoch_ticks, MAX_EPOCH_TICKS), self.split.per_table,
            self._key, f"{self.description}/epoch={self.epoch}/structure={self.structure.describe()}",
            c.strategy, c.max_cell_count,
        )

    @property
    def epoch_start(self) -> int:
        """The last tick before the current epoch (its carry is from then)."""
        return self.epoch * self.config.epoch_ticks

    def _current(self) -> tuple[list[Float64Array], list[float]]:
        p = self.config.p
        noisy = [np.asarray(v, dtype=np.float64).copy() for v in self.release.released()]
        var0 = self.release.cell_variance() if self.release.tick else 0.0
        variances = [var0] * len(noisy)
        if self.carry is not None:
            d = p ** (self.tick - self.epoch_start)
            for i, (cv, vv) in enumerate(zip(self.carry, self.carry_var, strict=True)):
                noisy[i] = noisy[i] + d * cv
                variances[i] = var0 + d * d * vv
        return noisy, variances

    def model(self) -> JunctionTreeModel:
        """Consistent tables and the junction-tree estimator at the current tick."""
        noisy, variances = self._current()
        weights = [max(v, 1e-12) for v in variances]
        consistent = make_consistent(self.structure.tables, noisy, weights)
        return JunctionTreeModel(self.structure.tables, consistent, variances)

    def _close_epoch(self) -> dict[str, object]:
        c = self.config
        # this epoch's own events, consistent under its own structure (bank only, no carry)
        var_b = self.release.cell_variance()
        own = make_consistent(self.structure.tables, self.release.released(),
                              [max(var_b, 1e-12)] * len(self.structure.tables))
        self.history.append((self.tick, self.structure.tables, own, var_b))
        self._prune_history()
        eps0 = c.bootstrap_epsilon
        sketch: PairSketch = measure_bootstrap(
            self.stats, eps0, self._key, f"{self.description}/bootstrap-epoch={self.epoch}")
        # Pool every epoch's noisy pair tables (free post-processing of released measurements):
        # the signal adds up over epochs while each epoch's noise is independent, so the
        # dependence estimate sharpens instead of restarting from one epoch's events. Not
        # decayed: which attributes depend on each other changes far more slowly than their
        # rates (decaying by p^E = 0.37 per epoch at p = 0.99, E = 100 kept the tree data's
        # structure at noise level).
        d = 1.0
        if self.pool is None:
            self.pool = (sketch.tables.copy(), sketch.noise_variance)
        else:
            self.pool = (d * self.pool[0] + sketch.tables,
                         d * d * self.pool[1] + sketch.noise_variance)
        pooled = dataclasses.replace(sketch, tables=self.pool[0], noise_variance=self.pool[1])
        excess = pooled.excess()
        structure = choose_structure(excess, max_cluster=c.max_cluster, bridge_size=2)
        if structure.bridges:
            per_table = (c.epsilon - eps0) / len(structure.tables)
            rate = sketch.total / c.epoch_ticks
            n_dec = rate / (1 - c.p) if c.p < 1 else sketch.total
            size = auto_bridge_size(n_dec, per_table, c.p, c.max_cluster)
            if size != 2:
                structure = choose_structure(excess, max_cluster=c.max_cluster, bridge_size=size)
        info: dict[str, object] = {
            "epoch": self.epoch, "method": sketch.method, "max_ones": sketch.max_ones,
            "epsilon": eps0, "sensitivity": sketch.sensitivity,
            "events_estimate": sketch.total, "next_tables": [list(t) for t in structure.tables],
        }
        # The carry of every new table: each past epoch's own model (its events under its own
        # structure) answered on the table, decayed to now. Each epoch's events are projected
        # once, from the structure they were counted in; re-projecting the previous carry at
        # every change would blur old dependence a little more each epoch.
        models = [(self.config.p ** (self.tick - end), JunctionTreeModel(tabs, vals, [v] * len(tabs)))
                  for end, tabs, vals, v in self.history]
        self.carry, self.carry_var, self.carry_model = [], [], []
        for t in structure.tables:
            acc = np.zeros(1 << len(t))
            var = 0.0
            spans = False
            for d, mod in models:
                acc += d * mod.answer(t)
                se = mod.stderr(t)
                spans = spans or se is None
                v = _spanning_variance(t, mod.tables, mod.cell_variance or ()) if se is None \
                    else se * se
                var += d * d * v
            self.carry.append(acc)
            self.carry_var.append(var)
            self.carry_model.append(spans)
        self.structure = structure
        self.epoch += 1
        self.stats = BootstrapStats(c.m)
        self._open_epoch()
        self.last_bootstrap = info
        return info

    def _prune_history(self) -> None:
        """Forget epochs whose weight has decayed below 1e-12; at p = 1 keep at most
        :data:`MAX_HISTORY` by folding the oldest epoch into the next one (projected onto its
        tables: the one place an old epoch is projected twice)."""
        p = self.config.p
        if p < 1:
            self.history = [h for h in self.history if p ** (self.tick - h[0]) >= 1e-12]
        while len(self.history) > MAX_HISTORY:
            (end0, tabs0, vals0, v0), (end1, tabs1, vals1, v1) = self.history[:2]
            old = JunctionTreeModel(tabs0, vals0, [v0] * len(tabs0))
            d = p ** (end1 - end0)
            merged = [np.asarray(x) + d * old.answer(t) for t, x in zip(tabs1, vals1, strict=True)]
            self.history[:2] = [(end1, tabs1, merged, max(v1, d * d * v0))]

    # ------------------------------------------------------------------ ticks
    def step(self, patterns: NDArray[np.uint64], counts: NDArray[np.float64],
             cell_clip: float | None = None) -> LiveTick:
        """Release the next tick, whose events are ``counts[r]`` events with attribute pattern
        ``patterns[r]`` (bit ``i`` = attribute ``i``; whole, non-negative counts).

        Every table cell's count in this tick is clipped to the bank's bound (the config's
        ``max_cell_count``, else the bank's numeric range) before it is measured — 1-Lipschitz,
        so the sensitivity is unchanged and no burst can leave the strategy's numeric range.
        ``cell_clip`` (events) clips further, if smaller."""
        pats = np.asarray(patterns, dtype=np.uint64).reshape(-1)
        w = np.asarray(counts, dtype=np.float64).reshape(-1)
        if pats.shape != w.shape:
            raise ValueError("one count per pattern is required")
        if w.size and (not np.all(np.isfinite(w)) or w.min() < 0 or np.any(w != np.floor(w))):
            raise ValueError("counts must be whole numbers >= 0")
        m = self.config.m
        if m < 64 and pats.size and int(pats.max()) >> m:
            raise ValueError(f"a pattern sets a bit at or above attribute {m}")
        bits = patterns_to_bits(pats, m)
        ids = self.release.cell_ids(bits)
        k = ids.shape[1]
        # float64 always: np.bincount of no ids (a tick without events) returns int64 zeros
        # even with float weights, and the in-place clip below cannot write floats into them
        cells = np.bincount(ids.reshape(-1), weights=np.repeat(w, k),
                            minlength=self.release.n_cells).astype(np.float64, copy=False)
        if cell_clip is not None:
            np.minimum(cells, float(cell_clip), out=cells)
        self.release.step_counts(cells)
        if self.config.bootstrap_epsilon > 0:
            self.stats.add(bits, w)
        self.tick += 1
        noisy, variances = self._current()
        out = LiveTick(
            self.tick, self.epoch, self.structure, self.split, tuple(noisy),
            tuple(math.sqrt(v) for v in variances),
            tuple(self.carry_model) if self.carry is not None else (False,) * len(noisy),
        )
        if self.config.bootstrap_epsilon > 0 and self.tick % self.config.epoch_ticks == 0:
            info = self._close_epoch()
            out = LiveTick(out.tick, out.epoch, out.structure, out.split, out.values, out.stderr,
                           out.carried_from_model, info)
        return out

    # ------------------------------------------------------------------ checkpoints
    def to_bytes(self) -> bytes:
        """The whole state (never the key); restore with :meth:`from_bytes`."""
        s = self.structure
        header = json.dumps({
            "config": self.config.describe(), "description": self.description,
            "tick": self.tick, "epoch": self.epoch,
            "structure": {"m": s.m, "clusters": s.clusters, "bridges": s.bridges,
                          "bridge_tables": s.bridge_tables},
            "carry": None if self.carry is None else [v.tolist() for v in self.carry],
            "carry_var": self.carry_var, "carry_model": self.carry_model,
            "last_bootstrap": self.last_bootstrap,
            "pool": None if self.pool is None else [self.pool[0].tolist(), self.pool[1]],
            "history": [[end, [list(t) for t in tabs], [np.asarray(x).tolist() for x in vals], v]
                        for end, tabs, vals, v in self.history],
        }, separators=(",", ":"), allow_nan=False).encode()
        stats = self.stats.to_bytes()
        bank = self.release.bank.to_bytes()
        return _MAGIC + struct.pack(">QQ", len(header), len(stats)) + header + stats + bank

    @classmethod
    def from_bytes(cls, data: bytes, config: LiveConfig, key: bytes,
                   description: str) -> LiveMarginals:
        """Restore :meth:`to_bytes` output; ``ValueError`` unless it was written for exactly
        ``config`` and ``description`` (the bank checks the key)."""
        from stream_dp.counters import CounterBank

        if not data.startswith(_MAGIC):
            raise ValueError("not a live-marginals checkpoint")
        hn, sn = struct.unpack(">QQ", data[8:24])
        header = json.loads(data[24 : 24 + hn])
        if header["config"] != json.loads(json.dumps(config.describe())) \
                or header["description"] != description:
            raise ValueError("live-marginals checkpoint of another configuration")
        obj = cls.__new__(cls)
        obj.config, obj._key, obj.description = config, key, description
        obj.tick, obj.epoch = int(header["tick"]), int(header["epoch"])
        st = header["structure"]
        obj.structure = Structure(
            int(st["m"]), tuple(tuple(c) for c in st["clusters"]),
            tuple((int(a), int(b)) for a, b in st["bridges"]),
            None if st["bridge_tables"] is None else tuple(tuple(t) for t in st["bridge_tables"]))
        obj.carry = None if header["carry"] is None else [
            np.asarray(v, dtype=np.float64) for v in header["carry"]]
        obj.carry_var = [float(v) for v in header["carry_var"]]
        obj.carry_model = [bool(v) for v in header["carry_model"]]
        obj.last_bootstrap = header["last_bootstrap"]
        obj.history = [(int(end), tuple(tuple(int(a) for a in t) for t in tabs),
                        [np.asarray(x, dtype=np.float64) for x in vals], float(v))
                       for end, tabs, vals, v in header.get("history", [])]
        pool = header.get("pool")
        obj.pool = None if pool is None else (np.asarray(pool[0], dtype=np.float64).reshape(-1, 4),
                                              float(pool[1]))
        obj.stats = BootstrapStats.from_bytes(data[24 + hn : 24 + hn + sn])
        obj._open_epoch()
        bank = CounterBank.from_bytes(data[24 + hn + sn :], key,
                                      mechanism=obj.release.bank.mechanism)
        if tuple(bank.names) != tuple(obj.release.bank.names):
            raise ValueError("live-marginals checkpoint: bank streams differ from the structure")
        if bank.tick != obj.tick - obj.epoch_start:
            raise ValueError("live-marginals checkpoint: bank tick does not match the epoch")
        obj.release.bank = bank
        return obj
