"""Prometheus metrics of one worker process.

Conventions (Prometheus naming guide): base units (seconds, messages), ``_total`` counters, and
**no per-stream labels** — labels only take values from small fixed sets (``result``, ``reason``).
Raw per-stream counts are never exported (DESIGN.md §2.6). The **operator-only counters**
(:data:`EVENT_COUNT_METRICS`: ``stream_dp_events_total``, ``stream_dp_dead_letters_total``,
``stream_dp_consumer_lag_messages``, ``stream_dp_clipped_total``,
``stream_dp_ingest_checkpoint_seconds`` and ``stream_dp_user_bounded_events_total``) move with raw counts: the first three are exact totals of
events without noise (with one declared stream, the accepted total *is* that stream's count);
``stream_dp_clipped_total`` moves exactly when one stream's raw count in one tick reaches
``cap × max_events_per_tick`` (one event more or less decides it); and the number of ingest
checkpoints follows the arrival of records (a quiet partition writes none). They are operator
data, never for publication, and the worker exports them only when ``metrics_event_counts = 1``
(``Metrics(event_counts=...)``); otherwise they are kept on a private registry that no endpoint
renders. Every exported series follows the public schedule and the noisy releases only
(``tests/integration/test_metrics_neighbours.py`` compares the whole exposition of two runs on
neighbouring logs).

Each :class:`Metrics` owns its own :class:`~prometheus_client.CollectorRegistry`, so several
workers (or tests) in one process never collide; :meth:`Metrics.exposition` renders it for
``/metrics`` (see :mod:`agents.worker.web`).

Metric list (documented for operators in ``docs/operations.md``):

=========================================  =========  ===============================================
name                                       type       meaning
=========================================  =========  ===============================================
``stream_dp_events_total{result}``         counter    events consumed; ``result`` ∈ accepted,
                                                      dead_lettered, late
``stream_dp_dead_letters_total{reason}``   counter    messages written to the dead-letter topic
``stream_dp_ticks_released_total``         counter    ticks released by this worker (all its streams)
``stream_dp_releases_total``               counter    (stream, tick) values published
``stream_dp_tick_latency_seconds``         histogram  tick end (event time) → release published
``stream_dp_checkpoint_seconds``           histogram  time to write one release checkpoint (one per
                                                      release commit: follows the schedule)
``stream_dp_ingest_checkpoint_seconds``    histogram  time to write one ingest checkpoint (operator
                                                      only: written when records arrive)
``stream_dp_consumer_lag_messages``        gauge      input messages behind the log end, summed over
                                                      the worker's assigned partitions
``stream_dp_ready``                        gauge      1 when state is restored and not rebalancing
``stream_dp_reconcile_seconds``            histogram  consistency solve time per histogram
``stream_dp_histograms_published_total``   counter    consistent histograms published (leader only)
``stream_dp_reconcile_iterations``         gauge      iterations of the last solve
``stream_dp_reconcile_residual``           gauge      max constraint residual of the last solve
``stream_dp_reconcile_leader``             gauge      1 while this worker is the reconcile leader
``stream_dp_reconcile_last_tick``          gauge      last tick with a published histogram
``stream_dp_release_conflicts_total``      counter    (stream, tick) seen with two different values
                                                      (must stay 0: a release rule violation)
``stream_dp_reconcile_skipped_ticks_total`` counter   ticks without a histogram (incomplete or
                                                      unsolvable input)
``stream_dp_reconcile_errors_total{reason}`` counter  ticks the reconcile agent could not publish;
                                                      ``reason`` ∈ too_large (the histogram exceeds
                                                      the topic's limit), unsolvable; the agent
                                                      skips the tick and goes on (no restart loop)
``stream_dp_clipped_total``                counter    (stream, tick)s clipped to
                                                      cap × max_events_per_tick (releases go on;
                                                      operator only: a raw threshold bit)
``stream_dp_user_bounded_events_total``    counter    events over their person's bounds, dropped
                                                      (privacy_unit = user; operator only: a raw
                                                      count)
``stream_dp_release_errors_total{reason}`` counter    fatal release errors; ``reason`` ∈ overflow
                                                      (counts beyond the strategy's numeric range),
                                                      checkpoint_refused (tampered / other key /
                                                      other configuration), record_too_large (a
                                                      record above a topic's limit: nothing of its
                                                      transaction is committed), commit_bug (the
                                                      same non-Kafka error 3 commits in a row);
                                                      the worker stops
=========================================  =========  ===============================================

Also ``stream_dp_build_info{version,python}`` (gauge, always 1: the running build). The ticks
counter counts shard-ticks: one per (tick, shard) released, so a tick of an 8-shard deployment
counts 8. With ``schedule = markers`` (replays of old logs, whose ticks ended long ago) the tick
latency runs from when the release stage had all of the tick's partials (wall clock).
"""

from __future__ import annotations

from typing import Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.process_collector import ProcessCollector

#: Metrics that move with raw counts (operator only): exported only with
#: ``Metrics(event_counts=True)``, i.e. ``metrics_event_counts = 1``.
EVENT_COUNT_METRICS: Final = (
    "stream_dp_events_total",
    "stream_dp_dead_letters_total",
    "stream_dp_consumer_lag_messages",
    "stream_dp_clipped_total",
    "stream_dp_ingest_checkpoint_seconds",
    "stream_dp_user_bounded_events_total",
)

#: The ``result`` label's values of ``stream_dp_events_total``.
EVENT_RESULTS: Final = ("accepted", "dead_lettered", "late")

#: Buckets (seconds) for tick latency: a tick closes after the allowed lateness, so latencies
#: range from milliseconds to minutes.
LATENCY_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)
#: Buckets (seconds) for solver and checkpoint durations.
DURATION_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)

#: Longest accepted dead-letter reason label; longer or unexpected text becomes ``other``.
_MAX_REASON_LEN: Final = 40

# No ``*_created`` series: they double every counter's series and carry nothing an operator uses
# (process start time is ``process_start_time_seconds``). Process-wide, set before any metric.
disable_created_metrics()  # type: ignore[no-untyped-call]


def _reason_label(reason: str) -> str:
    """A bounded label value: reasons are short snake_case identifiers chosen by the code."""
    ok = (
        0 < len(reason) <= _MAX_REASON_LEN
        and reason.replace("_", "").isalnum()
        and reason.isascii()
        and reason == reason.lower()
    )
    return reason if ok else "other"


class Metrics:
    """All metrics of one worker, on a private registry.

    Methods take counts of events/messages (non-negative integers) and durations in seconds.
    ``process=True`` adds the standard ``process_*`` collectors (CPU seconds, resident memory).
    ``event_counts=False`` keeps the raw event counters (:data:`EVENT_COUNT_METRICS`) off the
    exported :attr:`registry`: they still count (on :attr:`private_registry`), but
    :meth:`exposition` never shows them. The worker passes its ``metrics_event_counts`` setting
    (off by default).
    """

    def __init__(self, *, process: bool = True, event_counts: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        #: Collectors of raw event counts when they are not exported (never rendered).
        self.private_registry = CollectorRegistry(auto_describe=True)
        self.event_counts_exported = bool(event_counts)
        r = self.registry
        raw = r if event_counts else self.private_registry
        if process:
            ProcessCollector(registry=r)
        self.events = Counter(
            "stream_dp_events", "Events consumed, by result.", ["result"], registry=raw
        )
        for result in EVENT_RESULTS:
            self.events.labels(result=result)
        self.dead_letters = Counter(
            "stream_dp_dead_letters",
            "Messages written to the dead-letter topic, by reason.",
            ["reason"],
            registry=raw,
        )
        self.ticks_released = Counter(
            "stream_dp_ticks_released",
            "Shard-ticks released by this worker: one per (tick, shard) it released.",
            registry=r,
        )
        Info("stream_dp_build", "The running build (value always 1).", registry=r).info(
            build_labels()
        )
        self.releases = Counter(
            "stream_dp_releases", "(stream, tick) values published by this worker.", registry=r
        )
        self.tick_latency = Histogram(
            "stream_dp_tick_latency_seconds",
            "Seconds from a tick's end (event time; with schedule=markers from when all its "
            "partials were received, wall clock) to its release being published.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.checkpoint_seconds = Histogram(
            "stream_dp_checkpoint_seconds",
            "Seconds to write one release checkpoint (state and input offsets).",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        # ingest commits happen when records arrive: their number is an arrival count
        self.ingest_checkpoint_seconds = Histogram(
            "stream_dp_ingest_checkpoint_seconds",
            "Seconds to write one ingest checkpoint (operator only: one per commit of arrived "
            "records).",
            buckets=DURATION_BUCKETS,
            registry=raw,
        )
        self.consumer_lag = Gauge(
            "stream_dp_consumer_lag_messages",
            "Input messages behind the log end, summed over assigned partitions.",
            registry=raw,
        )
        self.ready = Gauge(
            "stream_dp_ready", "1 when state is restored and not rebalancing.", registry=r
        )
        self.reconcile_seconds = Histogram(
            "stream_dp_reconcile_seconds",
            "Seconds spent in the consistency solver per published histogram.",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.histograms_published = Counter(
            "stream_dp_histograms_published",
            "Consistent histograms published by this worker as reconcile leader.",
            registry=r,
        )
        self.reconcile_iterations = Gauge(
            "stream_dp_reconcile_iterations", "Iterations of the last consistency solve.",
            registry=r,
        )
        self.reconcile_residual = Gauge(
            "stream_dp_reconcile_residual",
            "Largest constraint residual of the last consistent histogram.",
            registry=r,
        )
        self.reconcile_leader = Gauge(
            "stream_dp_reconcile_leader", "1 while this worker is the reconcile leader.",
            registry=r,
        )
        self.release_conflicts = Counter(
            "stream_dp_release_conflicts",
            "(stream, tick) pairs seen with two different released values (must stay 0).",
            registry=r,
        )
        self.reconcile_skipped_ticks = Counter(
            "stream_dp_reconcile_skipped_ticks",
            "Ticks without a consistent histogram (incomplete or unsolvable releases).",
            registry=r,
        )
        self.reconcile_errors = Counter(
            "stream_dp_reconcile_errors",
            "Ticks the reconcile agent could not publish, by reason (too_large, unsolvable).",
            ["reason"],
            registry=r,
        )
        self.clipped = Counter(
            "stream_dp_clipped",
            "(stream, tick)s whose count reached the clip cap × max_events_per_tick (operator "
            "only: a raw threshold bit; the release goes on with the clipped count).",
            registry=raw,
        )
        self.user_bounded_events = Counter(
            "stream_dp_user_bounded_events",
            "Events over their person's bounds (privacy_unit = user), dropped before any noise "
            "(operator only: a raw count).",
            registry=raw,
        )
        self.release_errors = Counter(
            "stream_dp_release_errors",
            "Fatal release errors by reason (overflow, checkpoint_refused); the worker stops.",
            ["reason"],
            registry=r,
        )
        self.reconcile_last_tick = Gauge(
            "stream_dp_reconcile_last_tick", "Last tick with a published consistent histogram.",
            registry=r,
        )

    # -- ingest -------------------------------------------------------------------------------
    def event_accepted(self, n: int = 1) -> None:
        """``n`` events accepted into their tick."""
        self.events.labels(result="accepted").inc(_nonneg(n, "n"))

    def event_dead_lettered(self, reason: str, n: int = 1) -> None:
        """``n`` messages rejected to the dead-letter topic for ``reason`` (snake_case)."""
        n = _nonneg(n, "n")
        self.events.labels(result="dead_lettered").inc(n)
        self.dead_letters.labels(reason=_reason_label(reason)).inc(n)

    def event_late(self, n: int = 1) -> None:
        """``n`` events arrived after their tick closed (they also go to the dead-letter topic)."""
        n = _nonneg(n, "n")
        self.events.labels(result="late").inc(n)
        self.dead_letters.labels(reason="late").inc(n)

    # -- release ------------------------------------------------------------------------------
    def tick_released(self, latency_seconds: float, n_streams: int = 0) -> None:
        """One tick released for ``n_streams`` streams, ``latency_seconds`` after its end."""
        self.ticks_released.inc()
        if n_streams:
            self.releases.inc(_nonneg(n_streams, "n_streams"))
        self.tick_latency.observe(max(0.0, float(latency_seconds)))

    def checkpoint_written(self, seconds: float) -> None:
        """One release checkpoint written in ``seconds``."""
        self.checkpoint_seconds.observe(max(0.0, float(seconds)))

    def ingest_checkpoint_written(self, seconds: float) -> None:
        """One ingest checkpoint written in ``seconds`` (operator only, see the module note)."""
        self.ingest_checkpoint_seconds.observe(max(0.0, float(seconds)))

    def stream_clipped(self, n: int = 1) -> None:
        """``n`` (stream, tick)s clipped to ``cap × max_events_per_tick``."""
        self.clipped.inc(_nonneg(n, "n"))

    def user_bounded(self, n: int = 1) -> None:
        """``n`` events over their person's bounds, dropped (operator only)."""
        self.user_bounded_events.inc(_nonneg(n, "n"))

    def release_error(self, reason: str) -> None:
        """One fatal release error (``overflow``, ``checkpoint_refused``)."""
        self.release_errors.labels(reason=_reason_label(reason)).inc()

    def set_consumer_lag(self, messages: int) -> None:
        """Total input lag in messages over the assigned partitions."""
        self.consumer_lag.set(max(0, int(messages)))

    def set_ready(self, ready: bool) -> None:
        """Readiness as reported by ``/readyz``."""
        self.ready.set(1 if ready else 0)

    # -- reconcile ----------------------------------------------------------------------------
    def histogram_published(
        self, tick: int, seconds: float, iterations: int, residual: float
    ) -> None:
        """One consistent histogram for ``tick`` published; solver ran ``seconds``."""
        self.histograms_published.inc()
        self.reconcile_seconds.observe(max(0.0, float(seconds)))
        self.reconcile_iterations.set(int(iterations))
        self.reconcile_residual.set(float(residual))
        self.reconcile_last_tick.set(int(tick))

    def set_leader(self, leader: bool) -> None:
        """Whether this worker currently runs the reconcile side agent."""
        self.reconcile_leader.set(1 if leader else 0)

    def release_conflict(self, n: int = 1) -> None:
        """``n`` (stream, tick) pairs were seen with two different released values."""
        self.release_conflicts.inc(_nonneg(n, "n"))

    def reconcile_error(self, reason: str) -> None:
        """A tick the reconcile agent skipped because of ``reason`` (also counted as skipped)."""
        self.reconcile_errors.labels(reason=reason).inc()
        self.reconcile_skipped_ticks.inc()

    def reconcile_skipped(self, n: int = 1) -> None:
        """``n`` ticks got no histogram (incomplete releases, or the solver refused them)."""
        self.reconcile_skipped_ticks.inc(_nonneg(n, "n"))

    # -- exposition ---------------------------------------------------------------------------
    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)

    #: Content type of :meth:`exposition`.
    CONTENT_TYPE: Final = CONTENT_TYPE_LATEST


def build_labels() -> dict[str, str]:
    """The ``stream_dp_build_info`` labels: package version and Python ``major.minor.micro``."""
    import platform

    from stream_dp.cli import installed_version

    return {"version": installed_version(), "python": platform.python_version()}


def _nonneg(n: int, name: str) -> int:
    value = int(n)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {n!r}")
    return value
