"""``stream-dp worker``: one production worker (pipeline + reconcile side agent + web server)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

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

Exit status: 0 stopped by a signal, 1 a part failed (also: a count beyond the strategy's numeric
range), 2 bad settings (also: origin more than max_backlog_ticks ticks in the past on the clock
schedule, or cap x max_events_per_tick beyond the strategy's numeric range), 3 refused: the
events differ from the ones already released under this deployment's closing points, 4 refused:
a checkpoint failed authentication or was written under another configuration (change the
configuration only with a new epoch, docs/operations.md).

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
    parser.add_argument("--bootstrap", default=None, help="overrides STREAM_DP_BOOTSTRAP")
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


def load_settings(args: argparse.Namespace) -> Any:
    """Settings from defaults < TOML < environment < command-line options."""
    from agents.config import Settings

    overrides: dict[str, Any] = {}
    for opt, name in (("bootstrap", "bootstrap"), ("worker_id", "worker_id"),
                      ("web_host", "web_host"), ("web_port", "web_port"),
                      ("log_level", "log_level")):
        value = getattr(args, opt, None)
        if value is not None:
            overrides[name] = value
    return Settings.load(args.config, **overrides)


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
) -> int:
    """Run the worker's parts until ``stop_event`` is set or one of them fails.

    Returns 0 after a requested stop, 1 if a part failed. ``started`` is called with the web
    server (or ``None``) once everything is up; ``worker_created`` with the in-process
    :class:`agents.pipeline.Worker` (``pipeline_processes = 0``).
    """
    from agents.config import load_domain
    from agents.metrics import Metrics
    from agents.reconcile import Reconciler, ReconcilerConfig

    # raw event counters (operator data) only when the setting asks for them
    metrics = Metrics(event_counts=bool(getattr(settings, "metrics_event_counts", 0)))
    domain = load_domain(settings.domain_file)
    worker: Any = None
    group: Any = None
    if pipeline and int(getattr(settings, "pipeline_processes", 0)) > 0:
        from agents.config import check_attribute_settings
        from agents.pipeline_processes import PipelineGroup
        from agents.release import build_mechanism

        # fail fast on bad settings here, not in every child
        build_mechanism(settings)
        check_attribute_settings(settings, domain)
        group = PipelineGroup(settings, int(settings.pipeline_processes), metrics, on_release,
                              json_lines=json_logs)
        group.start()
    elif pipeline:
        from agents.pipeline import Worker

        worker = Worker(settings, metrics=metrics, on_release=on_release, domain=domain)
        if worker_created is not None:  # benchmarks and diagnostics: the in-process pipeline
            worker_created(worker)

    def ready() -> bool:
        """/readyz: state restored for every assigned partition, not rebalancing, not stopping."""
        if stop_event.is_set():
            return False
        if group is not None:
            return bool(group.ready)
        return True if worker is None else bool(worker.ready)

    server = None
    if web:
        from agents.web import WebServer, make_app

        app = make_app(metrics, ready, settings=settings, dashboard=dashboard)
        server = await WebServer(app, settings.web_host, settings.web_port).start()

    tasks: dict[str, asyncio.Task[Any]] = {}
    if group is not None:
        async def run_group() -> None:
            code = await group.run(stop_event)
            if code:
                raise _ChildFailed(code)

        tasks["pipeline"] = asyncio.ensure_future(run_group())
    if worker is not None:
        from agents.pipeline import run_worker

        tasks["pipeline"] = asyncio.ensure_future(
            run_worker(settings, stop_event=stop_event, worker=worker)
        )
    if reconcile:
        reconciler = Reconciler(
            ReconcilerConfig.from_settings(settings, domain.name),
            domain, metrics=metrics, on_histogram=on_histogram,
        )
        tasks["reconcile"] = asyncio.ensure_future(reconciler.run(stop_event))
    from stream_dp.accounting import Accountant

    if getattr(domain, "kind", "") == "binary":
        accounting: Any = {
            "model": "pure", "epsilon_per_event": float(settings.epsilon),
            "bootstrap_per_event": float(settings.epsilon * settings.attribute_bootstrap_fraction),
            "attributes": domain.m, "structure_epoch_ticks": settings.attribute_epoch_ticks,
        }
    else:
        accounting = Accountant.for_domain(domain, settings.privacy, cap=settings.cap).summary()
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
            exc = task.exception()
            if exc is not None:
                from agents.ingest import ScheduleMismatch
                from agents.release import CheckpointRefused, ReleaseOverflow

                if isinstance(exc, _ChildFailed):
                    log.error("a pipeline process failed; stopping",
                              extra={"part": name, "exit_code": exc.code})
                    rc = exc.code
                elif isinstance(exc, CheckpointRefused):
                    # tampered, another key, or another configuration: never start with it
                    log.error("refusing to start: %s", exc, extra={"part": name})
                    rc = 4
                elif isinstance(exc, ReleaseOverflow):
                    log.error("stopping: %s", exc, extra={"part": name})
                    rc = 1
                elif isinstance(exc, ScheduleMismatch):
                    # the log differs from the one released under this key: refused, like
                    # `stream-dp replay` (exit status 3)
                    log.error("refusing to release: %s", exc, extra={"part": name})
                    rc = 3
                else:
                    log.error("worker part failed; stopping", extra={"part": name},
                              exc_info=exc)
                    rc = 1
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
                raise
            except Exception:
                if name not in reported:
                    log.exception("worker part failed while stopping", extra={"part": name})
                rc = 1
        stopper.cancel()
        if server is not None:
            await server.stop()
    log.info("worker stopped", extra={"exit_code": rc})
    return rc


class _ChildFailed(RuntimeError):
    """A pipeline child process exited with ``code`` (``pipeline_processes`` ≥ 1)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"pipeline process exited with status {code}")
        self.code = code


async def _main(settings: Any, args: argparse.Namespace) -> int:
    stop_event = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop_event.is_set():  # a second Ctrl-C / SIGTERM: do not wait for the graceful stop
            log.warning("second stop signal: exiting at once")
            os._exit(130)
        log.info("stop signal received; stopping gracefully")
        stop_event.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

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
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def check_startup(args: argparse.Namespace) -> tuple[Any, bytes]:
    """Everything that can be checked before connecting to the broker: the settings and their
    ranges, the domain file, the memory the strategy and streams need, the noise key.
    Returns ``(settings, key)``; raises ``ValueError`` / ``OSError`` with a one-line message."""
    from agents.config import check_memory, load_domain
    from agents.pipeline import check_backlog

    settings = load_settings(args)
    check_backlog(settings)
    if not Path(settings.domain_file).is_file():
        raise ValueError(
            f"domain_file {settings.domain_file!r} not found (relative paths are resolved "
            "against the current folder, or against the settings file's folder when they "
            "come from one)"
        )
    try:
        domain = load_domain(settings.domain_file)
    except OSError as exc:
        raise ValueError(
            f"domain_file {settings.domain_file!r} cannot be read: {exc.strerror or exc}"
        ) from None
    check_memory(settings, len(domain.names))
    from agents.config import check_attribute_settings

    check_attribute_settings(settings, domain)
    from agents.release import build_mechanism

    build_mechanism(settings)  # refuses a numeric range that cap × max_events_per_tick exceeds
    key: bytes = settings.noise_key()
    return settings, key


def run(args: argparse.Namespace) -> int:
    from agents.logs import configure_logging, register_secret

    try:
        settings, key = check_startup(args)
    except (ValueError, OSError) as exc:
        print(f"stream-dp worker: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, json_lines=not args.plain_logs)
    register_secret(key)
    del key
    try:
        return asyncio.run(_main(settings, args))
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        return 130
