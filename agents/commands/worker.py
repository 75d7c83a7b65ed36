"""``stream-dp worker``: one production worker (pipeline + reconcile side agent + web server)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents.commands._worker_checks import (
    StartupProblem,
    WorkerIdTaken,
    check_broker,
    check_startup,
    claim_worker_id,
)
from agents.kafka.clients import bootstrap_argument

HELP = "run a production worker (broker and settings from env)"

DESCRIPTION = """\
Run one worker of the service: it consumes the events topic, releases the noisy decayed counts of
its share of the declared streams at every tick (exactly-once effect through checkpoints), takes
part in the reconcile leader election (one worker per cluster publishes the consistent
histograms), and serves /healthz, /readyz, /metrics and the live dashboard (/dashboard/) on
STREAM_DP_WEB_HOST:STREAM_DP_WEB_PORT (127.0.0.1:6066 by default).

Settings come from built-in defaults < the TOML file (--config or STREAM_DP_CONFIG) <
STREAM_DP_* environment variables < the options below; every setting is listed in
docs/configuration.md. The noise key comes from STREAM_DP_KEY_FILE or STREAM_DP_KEY and is never
logged. Logs are JSON lines on stderr.

With pipeline_processes = N (STREAM_DP_PIPELINE_PROCESSES) the ingest and release stages run
in N child processes (members <worker_id>.p<i> of the same consumer groups), so a worker uses
N + 1 cores; their metrics and readiness are served by this process. With
release_checkpoint_every = K (STREAM_DP_RELEASE_CHECKPOINT_EVERY) a release shard writes its full
counter state every K-th tick and a small progress record in between; after a restart it
re-steps those ticks silently from the retained partials (never publishing them twice).

Start as many workers as you like with the same STREAM_DP_APP_ID and a distinct, stable
STREAM_DP_WORKER_ID each (e.g. the StatefulSet pod name); Kafka partitions spread the streams
over them. SIGTERM or SIGINT stops the worker gracefully: it finishes the current batch, leaves
the consumer groups (partitions move to the other workers at once) and exits 0.

Schedule (docs/privacy.md, "The release schedule"): with schedule = "clock" (default) tick n
closes once the clock passes its end + allowed_lateness_s + close_grace_s, at the end offset of
every events partition read then; each event's tick and lateness come from its own record (event
time, Kafka record timestamp). With schedule = "markers" ticks close at the close markers of
`stream-dp replay`. Closing points are persisted on schedule_topic; a restarted worker, or a
fresh one of the same deployment, follows them and refuses a log that differs from the one
released (exit status 3).

Exit status: 0 stopped by a signal (also while still starting: one line), 1 a part failed (also:
no broker at the bootstrap address, a count beyond the strategy's numeric range), 2 bad settings
(also: origin more than max_backlog_ticks ticks in the past on the clock schedule, cap x
max_events_per_tick beyond the strategy's numeric range, topics missing or with other partition
counts, a schedule or checkpoint topic with a retention that would lose its records, the web
port in use, another worker with the same app_id and worker_id: on this host at start-up, on
another host once the broker gives this worker's group membership to it), 3 refused: the events
differ from the ones already released under this deployment's closing points, 4 refused: a
setting bound into the deployment differs from the one it was created with (checked before
anything starts; the line names each, e.g. "epsilon: 1 (stored) vs 2 (configured)"), or a
checkpoint failed authentication or was written under another configuration. Bound settings
never change on a deployment: start a new one (stream-dp deployment new; docs/runbooks.md).

examples:
  STREAM_DP_BOOTSTRAP=kafka-0:9092 STREAM_DP_KEY_FILE=/run/secrets/dp-key \\
      STREAM_DP_ORIGIN=1767225600 stream-dp worker --config /etc/stream-dp/stream-dp.toml
  stream-dp worker --config examples/stream-dp.toml --web-port 6067 --worker-id w2
  stream-dp worker --config examples/stream-dp.toml --no-reconcile   # never lead reconciliation
"""

log = logging.getLogger("agents.worker")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None,
                        help="settings TOML file (default: $STREAM_DP_CONFIG)")
    parser.add_argument("--bootstrap", default=None, type=bootstrap_argument,
                        help="overrides STREAM_DP_BOOTSTRAP")
    parser.add_argument("--worker-id", default=None, help="overrides STREAM_DP_WORKER_ID")
    parser.add_argument("--web-host", default=None, help="overrides STREAM_DP_WEB_HOST")
    parser.add_argument("--web-port", type=int, default=None,
                        help="overrides STREAM_DP_WEB_PORT (0 picks a free port)")
    parser.add_argument("--log-level", default=None,
                        help="overrides STREAM_DP_LOG_LEVEL (debug, info, warning, error)")
    parser.add_argument("--plain-logs", action="store_true",
                        help="human-readable log lines instead of JSON (development)")
    parser.add_argument("--no-web", action="store_true", help="do not start the web server")
    parser.add_argument("--no-reconcile", action="store_true",
                        help="do not take part in the reconcile leader election")
    parser.add_argument("--no-dashboard", action="store_true",
                        help="serve health and metrics only, without the dashboard")


async def serve(
    settings: Any,
    *,
    stop_event: asyncio.Event,
    web: bool = True,
    reconcile: bool = True,
    dashboard: bool = True,
    pipeline: bool = True,
    on_release: Callable[[Any], Any] | None = None,
    on_histogram: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    started: Callable[[Any], None] | None = None,
    json_logs: bool = True,
    worker_created: Callable[[Any], None] | None = None,
    metrics_created: Callable[[Any], None] | None = None,
) -> int:
    """Run the worker's parts until ``stop_event`` is set or one of them fails.

    Returns 0 after a requested stop, 1 if a part failed. ``started`` is called with the web
    server (or ``None``) once everything is up; ``worker_created`` with the in-process
    :class:`agents.worker.pipeline.Worker` (``pipeline_processes = 0``); ``metrics_created``
    with this process's :class:`agents.telemetry.metrics.Metrics` (with pipeline processes the
    children's counts are relayed to it).
    """
    from agents.config.domain import load_domain
    from agents.reconcile.agent import Reconciler
    from agents.reconcile.config import ReconcilerConfig
    from agents.telemetry.metrics import Metrics

    # raw event counters (operator data) only when the setting asks for them
    metrics = Metrics(event_counts=bool(getattr(settings, "metrics_event_counts", 0)))
    if metrics_created is not None:  # benchmarks and diagnostics
        metrics_created(metrics)
    domain = load_domain(settings.domain_file)
    # every consumer of this process (the reconcile side agent's, the dashboard's) waits after
    # an empty fetch, also when the pipeline runs in child processes (each installs its own):
    # without it they fetched in a busy loop from a broker that answers at once (8 CPU-s per
    # 10 s tick at 10^6 streams with pipeline_processes = 1)
    from agents.kafka.fetch_backoff import install as install_fetch_backoff

    install_fetch_backoff(float(getattr(settings, "empty_fetch_backoff_ms", 50)) / 1000.0)
    worker: Any = None
    group: Any = None

    def ready() -> bool:
        """/readyz: state restored for every assigned partition, not rebalancing, not stopping."""
        if stop_event.is_set():
            return False
        if group is not None:
            return bool(group.ready)
        return True if worker is None else bool(worker.ready)

    server = None
    if web:
        # first: a port in use stops the worker before any pipeline process or client starts
        from agents.worker.web import WebServer, make_app

        app = make_app(metrics, ready, settings=settings, dashboard=dashboard, domain=domain)
        try:
            server = await WebServer(app, settings.web_host, settings.web_port).start()
        except OSError as exc:
            raise StartupProblem(
                f"cannot serve on {settings.web_host}:{settings.web_port}: "
                f"{exc.strerror or exc} (another worker or program uses the port: pass "
                "--web-port / STREAM_DP_WEB_PORT, 0 picks a free one, or --no-web)"
            ) from None
    if pipeline and int(getattr(settings, "pipeline_processes", 0)) > 0:
        from agents.config.domain import check_attribute_settings
        from agents.release.state import build_mechanism
        from agents.worker.processes import PipelineGroup

        # fail fast on bad settings here, not in every child; a binary-attribute domain runs
        # its table banks only, whose range check_attribute_settings checks
        if getattr(domain, "kind", "") != "binary":
            build_mechanism(settings)
        check_attribute_settings(settings, domain)
        group = PipelineGroup(settings, int(settings.pipeline_processes), metrics, on_release,
                              json_lines=json_logs)
        group.start()
    elif pipeline:
        from agents.worker.pipeline import Worker

        worker = Worker(settings, metrics=metrics, on_release=on_release, domain=domain)
        if worker_created is not None:  # benchmarks and diagnostics: the in-process pipeline
            worker_created(worker)

    from agents.kafka.groups import (
        SHARED_WORKER_ID_HINT,
        WorkerIdShared,
        add_shared_worker_id_listener,
        remove_shared_worker_id_listener,
    )

    shared: list[WorkerIdShared] = []

    def on_shared(exc: WorkerIdShared) -> None:
        # the first consumer that finds its membership held by another process says it, once;
        # the graceful stop leaves the other groups, so the other worker takes them over
        if not shared:
            log.error("stopping: another worker runs with the same worker_id %r (consumer group "
                      "%r: %s). %s", settings.worker_id, exc.group, exc.how,
                      SHARED_WORKER_ID_HINT, extra={"exit_code": 2})
        shared.append(exc)
        stop_event.set()

    add_shared_worker_id_listener(on_shared)
    tasks: dict[str, asyncio.Task[Any]] = {}
    if group is not None:
        async def run_group() -> None:
            code = await group.run(stop_event)
            if code:
                raise _ChildFailed(code)

        tasks["pipeline"] = asyncio.ensure_future(run_group())
    if worker is not None:
        from agents.worker.pipeline import run_worker

        tasks["pipeline"] = asyncio.ensure_future(
            run_worker(settings, stop_event=stop_event, worker=worker)
        )
    if reconcile:
        reconciler = Reconciler(
            ReconcilerConfig.from_settings(settings, domain.name),
            domain, metrics=metrics, on_histogram=on_histogram,
        )
        if worker is not None:
            # the in-process pipeline hands its committed compact records to the reconcile
            # agent, which then need not fetch them back (16 bytes per stream and tick)
            worker.on_compact = reconciler.hand_over
        tasks["reconcile"] = asyncio.ensure_future(reconciler.run(stop_event))
    from stream_dp.accounting import Accountant

    if getattr(domain, "kind", "") == "binary":
        from agents.release.attributes import attribute_accounting

        accounting: Any = attribute_accounting(settings, domain)
    else:
        accounting = Accountant.for_domain(domain, settings.privacy, cap=settings.cap).summary()
        from agents.release.person import person_summary

        accounting += person_summary(settings, domain)
    log.info("worker started", extra={"worker_id": settings.worker_id, "domain": domain.name,
                                      "streams": len(domain.names), "privacy": accounting})
    if started is not None:
        started(server)
    stopper = asyncio.ensure_future(stop_event.wait())
    rc = 0
    reported: set[str] = set()
    try:
        pending: set[asyncio.Future[Any]] = {stopper, *tasks.values()}
        done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for name, task in tasks.items():
            if task not in done:
                continue
            failure = task.exception()
            if isinstance(failure, WorkerIdShared):
                on_shared(failure)  # logged once, by whichever part saw it first
            elif failure is not None:
                rc = _report_failure(name, failure)
            elif stopper not in done and not stop_event.is_set():
                log.error("worker part ended unexpectedly; stopping", extra={"part": name})
                rc = 1
            reported.add(name)
    finally:
        stop_event.set()
        metrics.set_ready(False)
        for name, task in tasks.items():
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=30.0)
            except TimeoutError:
                log.error("worker part did not stop in 30 s; cancelling", extra={"part": name})
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # this coroutine is cancelled: not the part's outcome
                # the part ended cancelled (a client library cancelled it while stopping)
            except WorkerIdShared as exc:
                on_shared(exc)
            except Exception as exc:
                # a part that failed after the stop was requested (e.g. the pipeline, whose
                # failure also sets the stop event): the same statuses as a failure before it
                code = _report_failure(name, exc) if name not in reported else 1
                reported.add(name)
                rc = rc or code
        stopper.cancel()
        remove_shared_worker_id_listener(on_shared)
        if server is not None:
            await server.stop()
    if shared:
        rc = 2  # documented: two workers with one worker_id is a settings problem
    log.info("worker stopped", extra={"exit_code": rc})
    return rc


#: a part's failure -> one log line (no traceback) and the exit status, for the documented ones
def _report_failure(name: str, exc: BaseException) -> int:
    """Log why part ``name`` failed, in one line for every known cause; return the exit status
    (1 failed, 3 refused log, 4 refused checkpoint; docs/operations.md)."""
    from agents.ingest.schedule import ScheduleMismatch
    from agents.kafka.checkpoints import CheckpointRefused
    from agents.release.state import ReleaseOverflow

    if isinstance(exc, _ChildFailed):
        log.error("a pipeline process failed; stopping",
                  extra={"part": name, "exit_code": exc.code})
        return exc.code
    if isinstance(exc, CheckpointRefused):
        # tampered, another key, or another configuration: never start with it
        text = str(exc)
        hint = (f" {_REFUSED_HINT}" if "failed authentication" in text
                or "another configuration" in text else "")
        verb = "stopping" if "state is ahead of the log" in text else "refusing to start"
        log.error("%s: %s.%s", verb, text.rstrip("."), hint, extra={"part": name})
        return 4
    from agents.kafka.stage import CommitBug

    if isinstance(exc, ReleaseOverflow | CommitBug):
        log.error("stopping: %s", exc, extra={"part": name})
        return 1
    if isinstance(exc, ScheduleMismatch):
        # the log differs from the one released under this key: refused, like
        # `stream-dp replay` (exit status 3)
        log.error("refusing to release: %s", exc, extra={"part": name})
        return 3
    if isinstance(exc, StartupProblem | ValueError):
        log.error("cannot start: %s", exc, extra={"part": name})
        return 2
    from agents.kafka.clients import connection_problem, is_kafka_error

    if is_kafka_error(exc):
        log.error("stopping: %s", connection_problem(exc), extra={"part": name})
        return 1
    log.error("worker part failed; stopping", extra={"part": name}, exc_info=exc)
    return 1


_REFUSED_HINT = (
    "The broker holds checkpoints of another deployment under these topic names (another noise "
    "key or setting). A development broker keeps its data between runs: start a fresh "
    "one (stream-dp broker stop; stream-dp broker start --data-dir NEW_DIR) or use a new "
    "app_id and topics; in production change settings or keys only with a new deployment "
    "(stream-dp deployment new; docs/runbooks.md)"
)


class _ChildFailed(RuntimeError):
    """A pipeline child process exited with ``code`` (``pipeline_processes`` ≥ 1)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"pipeline process exited with status {code}")
        self.code = code


async def _main(settings: Any, args: argparse.Namespace) -> int:
    stop_event = asyncio.Event()
    loop = asyncio.get_running_loop()

    signalled: list[float] = []

    def on_signal(signum: int, frame: object) -> None:
        # A Python-level handler (not loop.add_signal_handler): it runs at the next bytecode
        # even while a long synchronous step holds the event loop (a large backlog's tick
        # closes), so the stop is noticed at once and bounded by STOP_GRACE_S.
        if signalled:  # a second Ctrl-C / SIGTERM: do not wait for the graceful stop
            log.warning("second stop signal: exiting at once")
            os._exit(130)
        signalled.append(time.monotonic())
        log.info("stop signal received; stopping gracefully")
        _exit_if_still_running(STOP_GRACE_S)
        with contextlib.suppress(RuntimeError):  # the loop has closed already
            loop.call_soon_threadsafe(stop_event.set)

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def started(server: Any) -> None:
        if server is not None:
            log.info("serving", extra={"url": server.url, "metrics": server.url + "/metrics"})

    try:
        return await serve(
            settings, stop_event=stop_event, web=not args.no_web,
            reconcile=not args.no_reconcile, dashboard=not args.no_dashboard, started=started,
            json_logs=not args.plain_logs,
        )
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


#: seconds from the first stop signal to a forced exit if the graceful stop has not ended
#: (the stages bound their own stop to agents.worker.pipeline.SHUTDOWN_S = 8 s; this covers a step
#: that holds the event loop). Safe: every release is committed with its checkpoint, so a forced
#: exit is a kill -9 the next start recovers from exactly.
STOP_GRACE_S = 15.0


def _exit_if_still_running(after_s: float) -> None:
    import threading

    def force() -> None:
        log.error("the worker did not stop within %.0f s of the stop signal (the event loop is "
                  "held by a long step, e.g. closing a large backlog of ticks); exiting now: "
                  "the next start resumes from the last committed checkpoints", after_s)
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(0)

    timer = threading.Timer(after_s, force)
    timer.daemon = True
    timer.start()


def run(args: argparse.Namespace) -> int:
    # SIGTERM / SIGINT before _main installs the graceful handler (start-up checks, connecting):
    # a stop like any other, exit 0, never the default action's silent death (status 143)
    previous = {sig: signal.signal(sig, _stop_during_startup)
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _run(args)
    except _StoppedDuringStartup:
        print("stream-dp worker: stopped by a signal before it started", file=sys.stderr)
        return 0
    except KeyboardInterrupt:  # pragma: no cover - a second Ctrl-C during shutdown
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _StoppedDuringStartup(BaseException):
    """SIGTERM or SIGINT before the worker's own handler is installed."""


def _stop_during_startup(signum: int, frame: object) -> None:
    raise _StoppedDuringStartup


def _run(args: argparse.Namespace) -> int:
    from agents.telemetry.logs import configure_logging, register_secret

    try:
        settings, key = check_startup(args)
    except (ValueError, OSError) as exc:
        print(f"stream-dp worker: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    try:
        claim = claim_worker_id(settings)
    except WorkerIdTaken as exc:
        print(f"stream-dp worker: {exc}", file=sys.stderr)
        return 2
    from agents.kafka.deployment_settings import SettingsChanged

    try:
        asyncio.run(check_broker(settings, key))
    except StartupProblem as exc:
        print(f"stream-dp worker: {exc}", file=sys.stderr)
        return 2
    except SettingsChanged as exc:  # before anything starts or is announced
        print(f"stream-dp worker: {exc}", file=sys.stderr)
        return 4
    except Exception as exc:
        from agents.kafka.clients import connection_problem, is_kafka_error

        if not is_kafka_error(exc):
            raise
        print(f"stream-dp worker: {connection_problem(exc, settings.bootstrap)}",
              file=sys.stderr)
        return 1
    configure_logging(settings.log_level, json_lines=not args.plain_logs)
    from agents.kafka.groups import install_fencing_detector, install_shared_worker_id_detection

    install_fencing_detector(settings.worker_id)
    # the pipeline's first group gates the others when it runs in this process (children
    # gate their own groups)
    in_process = int(getattr(settings, "pipeline_processes", 0)) == 0
    install_shared_worker_id_detection(settings.worker_id if in_process else None)
    register_secret(key)
    del key
    try:
        return asyncio.run(_main(settings, args))
    except StartupProblem as exc:  # e.g. the web port is taken
        log.error("cannot start: %s", exc)
        return 2
    finally:
        claim.close()
