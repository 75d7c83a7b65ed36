"""The worker pipeline: events → ticks → noisy releases, with an exactly-once effect.

Two stages run in every worker; each is a consumer group, so partitions (and with them state)
spread over the workers of a deployment:

1. **Ingest** (group ``<app_id>.ingest``, one state per events partition,
   :class:`agents.ingest.state.IngestState`): decode, validate, clamp, bucket by the tick of each
   event's own time; lateness from each record's own Kafka timestamp. Ticks close at public
   closing points (:mod:`agents.ingest.ticks`): on the ``clock`` schedule, once the clock has passed a
   tick's deadline + grace, at the partition's end offset read then (or earlier at a broker
   timestamp past the deadline); on the ``markers`` schedule at replay close markers. At every
   tick close it emits to **every** release shard one *partial* (the partition's raw per-node
   sums for that tick, possibly empty) on the internal topic ``dp.partials.v1``, partition =
   shard, and persists the closing point with a digest of the records it covers on the schedule
   topic. Rejected records go to ``dp.events.dlq``.
2. **Release** (group ``<app_id>.release``, one state per shard, :class:`agents.release.state.ReleaseState`):
   when tick ``n``'s partials from all events partitions are in, sum them in partition order,
   step the shard's :class:`~stream_dp.counters.CounterBank` over **every** declared stream
   of the shard (zeros included) and publish one ``dp.counts.v1`` message per stream.

Why a re-partition stage: an event feeds several released nodes (leaf and ancestors, or total,
marginals and cell) that live in different shards; the root is fed by every event. The partials
topic carries raw per-tick counts: it is internal, read only by the release stage inside
transactions, short-lived (``partials_retention_s``), and documented as the single exception in
``docs/configuration.md`` ("Internal topics and raw counts").

**Exactly-once effect.** Every stage partition has its own transactional producer
(``transactional.id = <app_id>.<stage>.<partition>``). One Kafka transaction holds, atomically,
the outputs (partials and dead letters, or counts), the stage partition's checkpoint (in a
compacted checkpoint topic, partition = stage partition, :mod:`agents.kafka.checkpoints`) and the
offset to resume from (inside the checkpoint: what a restarted worker seeks to). The consumer
group's committed offsets (lag monitoring, the ownership check) are committed after the
transaction, in the background, at most once per second per partition — inside the transaction
they would add two broker round trips to every tick's latency. A new owner of a partition first
initialises that partition's transactional id — which fences the previous owner (a ``kill -9``'d
zombie or a worker that lost the partition in a rebalance) and aborts its open transaction —
then reads the newest committed checkpoint (``read_committed``) and seeks to its offsets. So
each tick's partial and each release is committed exactly once; everything downstream reads
``read_committed``. Even a ``read_uncommitted`` reader only ever sees bit-identical copies of a
``(stream, tick)``: partials are summed in a fixed order and the noise is keyed by
``(secret, stream, node)``.

**Why aiokafka directly and not faust agents.** faust's own exactly-once mode has open bugs
around rebalances (see NOTES) and does not give control over seeks, per-partition transactions
and checkpoint restore order; both stages therefore run as plain asyncio tasks on aiokafka
consumers/producers, which the ``stream-dp worker`` command hosts next to the web server and the
reconcile agent (:mod:`agents.reconcile.agent`). Workers use static membership
(``group.instance.id = worker_id``) so a restarted worker takes its own place at once, and send
an explicit LeaveGroup on graceful shutdown (aiokafka skips it for static members) so the others
take over its partitions.

Entry points: :func:`run_worker` (used by ``stream-dp worker``), :class:`Worker` (readiness
flags), and ``python -m agents.worker.pipeline`` (settings from the environment; used by the tests).

Where the code lives: the shared stage machinery in :mod:`agents.kafka.stage`, the two stages in
:mod:`agents.ingest.stage` and :mod:`agents.release.stage`, the transactional producer wrapper in
:mod:`agents.kafka.checked_producer`; this module keeps the :class:`Worker` that hosts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections import deque
from typing import Any

from agents.config.deployment import deployment_id
from agents.config.domain import load_domain
from agents.config.settings import Settings
from agents.ingest.routing import Router
from agents.ingest.stage import IngestStage
from agents.kafka.groups import install_empty_assignment_rejoin, install_static_commit_rejoin
from agents.release.stage import OnCompact, OnRelease, ReleaseStage
from agents.telemetry.pipeline_metrics import NullMetrics, PipelineMetrics

__all__ = ["Worker", "check_backlog", "run_worker"]

log = logging.getLogger("stream_dp.pipeline")


#: a worker more than this many ticks behind the clock schedule says so and reports progress
BACKLOG_TICKS = 100
#: seconds between two progress lines while a worker catches up
PROGRESS_EVERY_S = 10.0
#: seconds a stopping worker waits for its stages to commit, leave their groups and close
#: (the broker gone: they are cancelled and closed after that)
SHUTDOWN_S = 8.0


class Worker:
    """One worker process: the ingest and release stages, readiness and counters.

    ``ready`` is True once both stages have restored the state of every partition assigned to
    them, and False while a rebalance is in progress. ``stats`` holds operational totals (never
    raw counts). ``on_release`` is called after each committed shard-tick release.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        metrics: PipelineMetrics | None = None,
        on_release: OnRelease | None = None,
        key: bytes | None = None,
        domain: Any = None,
    ) -> None:
        self.settings = settings
        self.metrics: PipelineMetrics = metrics if metrics is not None else NullMetrics()
        self.on_release = on_release
        #: awaited with ``(topic, partition, offset, value)`` of each compact record after its
        #: transaction committed: the in-process reconcile agent's hand-over
        #: (:meth:`agents.reconcile.agent.Reconciler.hand_over`); ``None``: nobody takes them
        self.on_compact: OnCompact | None = None
        self.key = key if key is not None else settings.noise_key()
        self.domain = domain if domain is not None else load_domain(settings.domain_file)
        from agents.config.domain import check_attribute_settings
        from agents.kafka.aborted_transactions import install as install_aborted_transactions
        from agents.kafka.fetch_backoff import install as install_fetch_backoff
        from agents.kafka.produce_encoding import install as install_produce_encoding

        check_attribute_settings(settings, self.domain)
        install_fetch_backoff(settings.empty_fetch_backoff_ms / 1000.0)
        install_aborted_transactions()
        install_produce_encoding()
        install_empty_assignment_rejoin()
        install_static_commit_rejoin()
        self.router = Router(self.domain, settings.shards)
        from agents.kafka.topics import check_shard_size

        check_shard_size(self.router)
        if settings.compact_topic:
            from agents.kafka.topics import check_compact_size

            check_compact_size(self.domain, self.router)
        from agents.config.security import KafkaSecurity

        #: TLS / SASL of every Kafka client this worker creates
        self.security = KafkaSecurity.from_settings(settings)
        self.security.validate()

        #: the deployment's identity (domain digest, every setting that decides what a tick
        #: contains, app id, events topic): noise and checkpoints are bound to it
        self.domain_id: str = deployment_id(settings, self.router.domain_id)
        #: the privacy object every release record carries (per event per stream; at user
        #: level also what it means for one person: agents.release.person)
        self.privacy: dict[str, Any] = dict(settings.privacy.as_dict())
        self.ingest = IngestStage(
            self, settings.events_topic, settings.ingest_group, settings.ingest_checkpoints_topic
        )
        self.release = ReleaseStage(
            self, settings.partials_topic, settings.release_group,
            settings.release_checkpoints_topic,
        )
        self.stats: dict[str, int] = {
            "accepted": 0, "clamped": 0, "dead_letters": 0, "partition_ticks_closed": 0,
            "tick_closed": 0,
            "shard_ticks_released": 0, "ownership_recoveries": 0, "ticks_restepped": 0,
            "stalled_partitions": 0,
        }
        #: seconds from the last source partition closing a tick to its release being committed
        #: (the most recent ones; for benchmarks and diagnostics)
        self.latencies: deque[float] = deque(maxlen=10_000)
        #: where each of the most recent shard-tick releases spent its time (seconds): from the
        #: tick's close to the release stage starting on it (ingest close, partials transaction,
        #: fetch), counter step, begin_transaction, output records, checkpoint, commit
        self.release_timings: deque[dict[str, float]] = deque(maxlen=10_000)
        #: the ingest side of a tick's close, per events partition: from the close decision to
        #: the partials transaction starting, its outputs, checkpoint and commit (seconds)
        self.ingest_timings: deque[dict[str, float]] = deque(maxlen=10_000)
        #: records handed to the ingest stage so far (committed or not; for benchmarks)
        self.processed = 0
        self._ready = False
        self._mechanism: Any = None
        if settings.privacy_unit == "user":
            from agents.release.person import privacy_block

            binary = getattr(self.domain, "kind", "") == "binary"  # its banks: per epoch
            self.privacy = privacy_block(settings, self.domain,
                                         None if binary else self.mechanism())
        #: an error that must stop the worker (e.g. a log that differs from the released one)
        self.fatal: BaseException | None = None
        from agents.ingest.ticks import Schedule

        self.schedule = Schedule(
            origin=settings.origin, tick_seconds=settings.tick_seconds,
            lateness=settings.allowed_lateness_s, grace=settings.close_grace_s,
        )

    def kafka_kwargs(self) -> dict[str, Any]:
        """Security keyword arguments for an aiokafka client of this worker."""
        return self.security.client_kwargs()

    def release_error(self, reason: str) -> None:
        """Count a fatal release error (metric ``stream_dp_release_errors_total{reason}``)."""
        record = getattr(self.metrics, "release_error", None)
        if record is not None:
            record(reason)

    def fail(self, exc: BaseException) -> None:
        """Stop the worker with ``exc`` (logged once; the stages raise it from their loops)."""
        if self.fatal is None:
            # the one error line is the caller's (``stream-dp worker`` names the cause and its
            # exit status); here only that the pipeline stops, and why, for embedders' logs
            log.info("pipeline stopping: %s", type(exc).__name__)
            self.fatal = exc
            for stage in (getattr(self, "ingest", None), getattr(self, "release", None)):
                if stage is not None:  # their loops raise it now
                    stage.wake_loop()

    def check_schedule(self, now: float | None = None) -> None:
        """Refuse a clock schedule whose origin lies too many ticks in the past."""
        check_backlog(self.settings, now)

    @property
    def ready(self) -> bool:
        """State restored for all assigned partitions of both stages, not rebalancing."""
        return self._ready and not self.ingest.missing() and not self.release.missing()

    def partials_committed(self) -> None:
        """The ingest stage committed partials: the in-process release stage fetches them now,
        not after its fetch pause."""
        self.release.partials_committed()

    def update_ready(self) -> None:
        """A stage started or finished restoring: set the readiness metric if it changed."""
        ready = not self.ingest.restoring and not self.release.restoring
        if ready != self._ready:
            self._ready = ready
            self.metrics.set_ready(ready)

    def mechanism(self) -> Any:
        if self._mechanism is None:
            from agents.release.state import build_mechanism

            self._mechanism = build_mechanism(self.settings)
        return self._mechanism

    def new_bank(self, shard: int) -> Any:
        from stream_dp.counters import CounterBank

        names = self.router.shard_names(shard)
        if not names:
            return None
        return CounterBank(
            self.mechanism(), names, self.key, domain_id=self.domain_id, epoch=self.settings.epoch
        )

    async def adopt_nonce(self) -> None:
        """Read (or create) the deployment's nonce (:mod:`agents.kafka.nonce`) and bind the noise
        and every checkpoint to it, before any state is built; pin the fits its record holds
        (the first worker's), so that this worker builds the same mechanism on any CPU."""
        from agents.kafka.nonce import adopt_deployment_record
        from agents.release.state import forget_picks
        from stream_dp.strategies.blt import plan as blt_plan

        nonce, fits = await adopt_deployment_record(
            self.settings, self.router.domain_id, self.key, self.kafka_kwargs(),
            fits=blt_plan.fits_used())
        if fits and blt_plan.pin_fits(fits):
            log.warning("this host's blt fit differs from the one the deployment recorded "
                        "(another CPU's arithmetic); the worker uses the recorded one")
            forget_picks()
            self._mechanism = None
            self.mechanism()
        self.router.deployment_nonce = nonce
        self.domain_id = deployment_id(self.settings, self.router.domain_id, nonce)

    async def run(self, stop_event: asyncio.Event | None = None) -> None:
        stop = stop_event if stop_event is not None else asyncio.Event()
        self.mechanism()  # fail fast on bad strategy settings
        self.check_schedule()
        tasks: list[asyncio.Task[None]] = []
        tasks_progress: list[asyncio.Task[None]] = []
        stopper = asyncio.create_task(stop.wait())
        if self.settings.schedule == "clock":
            due = self.schedule.due_through(time.time())
            if due > BACKLOG_TICKS:
                # said before the first (possibly long) step: a deployment without checkpoints
                # releases every due tick before the live ones
                log.info("%d ticks are due on the clock schedule (origin %s, %s of event time); "
                         "partitions without a checkpoint release all of them first",
                         due, time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                            time.gmtime(self.settings.origin)),
                         _duration(due * self.settings.tick_seconds))
        try:
            await self.adopt_nonce()
            await self.ingest.start()
            await self.release.start()
            tasks = [
                asyncio.create_task(self.ingest.run(stop), name="stream-dp-ingest"),
                asyncio.create_task(self.release.run(stop), name="stream-dp-release"),
            ]
            # diagnostics only: not one of the tasks whose end stops the worker
            progress = asyncio.create_task(self._report_progress(stop),
                                           name="stream-dp-progress")
            tasks_progress.append(progress)
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stopper and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            stop.set()
            stopper.cancel()
            for t in tasks_progress:
                t.cancel()
            self._ready = False
            self.metrics.set_ready(False)
            await self._shut_down(tasks)

    def released_through(self) -> int | None:
        """The last tick every release shard of this worker has released (None: no shard)."""
        states = list(self.release.states.values())
        if not states:
            return None
        return min(int(st.next_tick) for st in states) - 1

    async def _report_progress(self, stop: asyncio.Event) -> None:
        """Say how far behind the clock schedule the worker starts, then, while it catches up,
        one progress line every :data:`PROGRESS_EVERY_S` seconds (ticks released, rate, ETA).
        Quiet when the worker is up to date: a live worker is one tick behind at most."""
        if self.settings.schedule != "clock":
            return
        try:
            await self._progress_loop(stop)
        except Exception as exc:  # diagnostics only: never stop the worker for them
            log.debug("progress report failed: %s", exc)

    async def _progress_loop(self, stop: asyncio.Event) -> None:
        t0 = time.monotonic()
        due0 = self.schedule.due_through(time.time())
        announced = False
        first: tuple[float, int] | None = None
        while not stop.is_set():
            due = self.schedule.due_through(time.time())
            done = self.released_through()
            if done is not None:
                behind = due - done
                if not announced:
                    announced = True
                    if behind > BACKLOG_TICKS:
                        log.warning(
                            "starting %d ticks behind the clock schedule (ticks %d..%d, %s of "
                            "event time): every one is released before the live ticks; "
                            "progress every %.0f s", behind, done + 1, due,
                            _duration(behind * self.settings.tick_seconds), PROGRESS_EVERY_S)
                        # from here the rate is known at the first progress line, and a backlog
                        # cleared before it still ends with "caught up"
                        first = (time.monotonic(), done)
                elif behind > BACKLOG_TICKS:
                    if first is None:
                        first = (time.monotonic(), done)
                    rate = (done - first[1]) / max(time.monotonic() - first[0], 1e-9)
                    speed = f"{rate:.0f} ticks/s, ETA {_duration(behind / rate)}" if rate > 0 \
                        else "rate and ETA at the next line"
                    log.info("catching up: released through tick %d of %d (%d behind, %s)",
                             done, due, behind, speed)
                elif first is not None:
                    log.info("caught up: released through tick %d (%.0f s after start; %d "
                             "ticks were due then)", done, time.monotonic() - t0, due0)
                    first = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PROGRESS_EVERY_S if announced else 1.0)

    async def _shut_down(self, tasks: list[asyncio.Task[None]]) -> None:
        """Finish the stages' current batches and transactions, leave the groups, close every
        client — within :data:`SHUTDOWN_S` seconds in all. With the broker reachable that is a
        graceful stop; without it (an outage) nothing can be committed anyway, so the stages are
        cancelled and their clients closed without waiting for the broker: a SIGTERM during an
        outage ends the worker in seconds, never with a traceback."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SHUTDOWN_S
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=SHUTDOWN_S / 2)
            for t in late:
                t.cancel()
            for t in tasks:  # their errors were reported from the loop above
                with contextlib.suppress(BaseException):
                    await t
        stops = asyncio.gather(self.ingest.stop(), self.release.stop(), return_exceptions=True)
        try:
            for stage, res in zip((self.ingest, self.release), await asyncio.wait_for(
                    stops, timeout=max(0.5, deadline - loop.time())), strict=True):
                if isinstance(res, BaseException):  # e.g. a client's stop cut short
                    log.debug("%s: stop: %s", stage.name, type(res).__name__)
                    await stage.close_clients()
        except TimeoutError:
            log.warning("stopped without a graceful leave: the broker did not answer within "
                        "%.0f s (partitions move to other workers after the session timeout)",
                        SHUTDOWN_S)
            for stage in (self.ingest, self.release):
                await stage.close_clients()


def _duration(seconds: float) -> str:
    """``1 d 03:04:05`` / ``03:04:05`` for progress lines."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(seconds)
    days, rest = divmod(s, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days} d {clock}" if days else clock


def check_backlog(settings: Settings, now: float | None = None) -> None:
    """Raise ``ValueError`` if a clock schedule's origin lies more than ``max_backlog_ticks``
    ticks in the past (every tick from 1 on is released: almost always a mistake)."""
    if settings.schedule != "clock":
        return
    from agents.ingest.ticks import Schedule

    sch = Schedule(settings.origin, settings.tick_seconds, settings.allowed_lateness_s,
                   settings.close_grace_s)
    behind = sch.due_through(time.time() if now is None else now)
    if behind > settings.max_backlog_ticks:
        raise ValueError(
            f"origin {settings.origin!r} lies {behind} ticks in the past (max_backlog_ticks = "
            f"{settings.max_backlog_ticks}): every tick from 1 on would be released. Set origin "
            "to the deployment's start, or raise max_backlog_ticks"
        )


async def run_worker(
    settings: Settings,
    *,
    on_release: OnRelease | None = None,
    stop_event: asyncio.Event | None = None,
    metrics: PipelineMetrics | None = None,
    worker: Worker | None = None,
) -> Worker:
    """Run a worker until ``stop_event`` is set (or a stage fails); returns the worker.

    Pass a pre-built ``worker`` to read its ``ready`` flag from elsewhere (web server).
    """
    w = worker or Worker(settings, metrics=metrics, on_release=on_release)
    await w.run(stop_event)
    return w


def main() -> int:  # pragma: no cover - exercised by the integration tests as a subprocess
    """``python -m agents.worker.pipeline``: settings from the environment; SIGTERM/SIGINT stop."""
    settings = Settings.load()
    level = {"warn": "WARNING"}.get(settings.log_level.lower(), settings.log_level.upper())
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_worker(settings, stop_event=stop)

    asyncio.run(_main())
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
