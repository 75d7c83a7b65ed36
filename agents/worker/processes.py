"""The pipeline in child processes (setting ``pipeline_processes``): every core of a worker used.

One Python process runs one event loop under one GIL: ingest, release, the reconcile side agent
and the dashboard of a worker then share a core. With ``pipeline_processes = N`` (N ≥ 1)
``stream-dp worker`` starts N child processes that each run the pipeline (ingest and release
stages) as members ``<worker_id>.p<i>`` of the same consumer groups — Kafka spreads the events
partitions and release shards over them exactly as over separate workers, with the same
transactions and checkpoints — while the parent process keeps the web server (health,
readiness, metrics, dashboard) and the reconcile side agent.

The children report to the parent's :class:`~agents.telemetry.metrics.Metrics` through a queue
(:class:`RelayMetrics`): counters add up, the consumer lag is the sum over the children and the
worker is ready when every child is. A child that stops stops the worker, with the child's exit
status (the same statuses as ``stream-dp worker``: 3 refused log, 4 refused checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import queue
import signal
import time
from types import SimpleNamespace
from typing import Any

__all__ = ["PipelineGroup", "RelayMetrics", "child_exit_status"]

log = logging.getLogger("agents.pipeline_processes")

#: methods of :class:`agents.telemetry.metrics.Metrics` the pipeline calls (relayed to the parent)
_RELAYED = frozenset({"event_accepted", "stream_clipped", "user_bounded", "event_dead_lettered",
                      "event_late", "tick_released",
                      "checkpoint_written", "ingest_checkpoint_written",
                      "release_error", "set_consumer_lag", "set_ready"})


class RelayMetrics:
    """A child's metrics: each call is put on the parent's queue as ``(child, name, args)``."""

    def __init__(self, q: Any, child: int) -> None:
        self._q = q
        self._child = child

    def __getattr__(self, name: str) -> Any:
        if name not in _RELAYED:
            raise AttributeError(name)

        def relay(*args: Any) -> None:
            with contextlib.suppress(Exception):  # a full or closed queue never stops a release
                self._q.put_nowait((self._child, name, args))

        return relay


def child_exit_status(exc: BaseException | None) -> int:
    """``stream-dp worker``'s exit status for a pipeline that ended with ``exc``."""
    if exc is None:
        return 0
    from agents.ingest.schedule import ScheduleMismatch
    from agents.kafka.checkpoints import CheckpointRefused

    if isinstance(exc, CheckpointRefused):
        return 4
    if isinstance(exc, ScheduleMismatch):
        return 3
    from agents.kafka.groups import WorkerIdShared
    from agents.kafka.topics import TopicConfigMismatch

    # a topic setting changed under the running child (the ingest stage re-reads them)
    if isinstance(exc, WorkerIdShared | TopicConfigMismatch):
        return 2
    return 1


#: seconds a child may take to stop after SIGTERM (or its parent's death) before it exits hard
CHILD_STOP_S = 20.0


def die_with_parent(parent_pid: int, on_orphaned: Any) -> None:
    """Make this process end when ``parent_pid`` dies, however it dies (kill -9 included).

    On Linux the kernel sends SIGTERM at the parent's death (``prctl(PR_SET_PDEATHSIG)``); on
    every platform a watchdog thread checks once a second that the parent is still this
    process's parent and calls ``on_orphaned()`` when it is not (re-parented to init or a
    subreaper). Either way the child stops gracefully, and exits hard after
    :data:`CHILD_STOP_S` seconds if the graceful stop hangs."""
    import os
    import sys
    import threading

    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                log.warning("pipeline process: the worker (pid %d) is gone; stopping", parent_pid)
                on_orphaned()
                time.sleep(CHILD_STOP_S)
                os._exit(1)
            time.sleep(1.0)

    threading.Thread(target=watch, name="stream-dp-parent-watchdog", daemon=True).start()


def _exit_later(code: int, after_s: float) -> None:
    """Exit the process with ``code`` after ``after_s`` seconds unless it has ended by then."""
    import os
    import threading

    timer = threading.Timer(after_s, lambda: os._exit(code))
    timer.daemon = True
    timer.start()


def _child_main(settings: Any, child: int, q: Any, json_lines: bool,
                parent_pid: int | None = None) -> None:
    """Entry point of one child: the pipeline until SIGTERM (exit 0) or a failure. It ends
    with its parent (:func:`die_with_parent`) and never outlives a stop request by more than
    :data:`CHILD_STOP_S` seconds."""
    import os
    import sys

    from agents.kafka.groups import (
        WorkerIdShared,
        add_shared_worker_id_listener,
        install_shared_worker_id_detection,
    )
    from agents.telemetry.logs import configure_logging, register_secret
    from agents.worker.pipeline import run_worker

    configure_logging(settings.log_level, json_lines=json_lines)  # as the parent's
    register_secret(settings.noise_key())
    loop_ref: list[asyncio.AbstractEventLoop] = []
    stop_ref: list[asyncio.Event] = []

    def request_stop() -> None:
        """From any thread: stop the pipeline gracefully; exit hard if that hangs."""
        _exit_later(1, CHILD_STOP_S)
        if loop_ref and stop_ref:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop_ref[0].call_soon_threadsafe(stop_ref[0].set)
        else:
            os._exit(1)

    if parent_pid is not None:
        if os.getppid() != parent_pid:  # the parent died before we got here
            os._exit(1)
        die_with_parent(parent_pid, request_stop)

    def released(rel: Any) -> None:
        # the parent's on_release sees (tick, shard, closed_at, committed_at) of each release
        with contextlib.suppress(Exception):
            q.put_nowait((child, "__released__", (int(rel.tick), int(rel.shard),
                                                   float(rel.closed_at), time.time())))

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop_ref.append(loop)
        stop_ref.append(stop)

        def on_signal() -> None:
            if stop.is_set():  # a second SIGTERM / SIGINT: at once
                os._exit(1)
            _exit_later(1, CHILD_STOP_S)  # the graceful stop is bounded
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        shared: list[BaseException] = []

        def on_shared(exc: BaseException) -> None:
            # another worker holds this child's membership: one line, a graceful stop, exit 2
            if not shared:
                from agents.kafka.groups import SHARED_WORKER_ID_HINT

                worker_id = str(settings.worker_id).removesuffix(f".p{child}")
                log.error("pipeline process %d stopping: another worker runs with the same "
                          "worker_id %r (consumer group %r: %s). %s", child, worker_id,
                          getattr(exc, "group", "?"), getattr(exc, "how", exc),
                          SHARED_WORKER_ID_HINT)
            shared.append(exc)
            stop.set()

        install_shared_worker_id_detection(settings.worker_id)
        add_shared_worker_id_listener(on_shared)
        try:
            await run_worker(settings, stop_event=stop, metrics=RelayMetrics(q, child),
                             on_release=released)
        except WorkerIdShared as exc:
            on_shared(exc)
        except Exception as exc:
            log.error("pipeline process %d failed: %s", child, exc, exc_info=exc)
            return child_exit_status(exc)
        return child_exit_status(shared[0]) if shared else 0

    code = asyncio.run(main())
    sys.stdout.flush()
    os._exit(code)  # do not wait for the queue's feeder thread


class PipelineGroup:
    """N pipeline child processes of one worker and the relay of their metrics."""

    def __init__(self, settings: Any, n: int, metrics: Any, on_release: Any = None,
                 json_lines: bool = True) -> None:
        if n < 1:
            raise ValueError(f"pipeline_processes must be ≥ 1 here, got {n}")
        self.settings = settings
        self.n = n
        self.metrics = metrics
        #: called with ``SimpleNamespace(tick, shard, closed_at, committed_at)`` per release
        self.on_release = on_release
        self.json_lines = json_lines
        self._ctx = mp.get_context("spawn")  # no forked event loop, sockets or threads
        self._q: Any = self._ctx.Queue(maxsize=100_000)
        self.procs: list[Any] = []
        self._ready = [False] * n
        self._lag = [0] * n

    @property
    def ready(self) -> bool:
        """Every child alive and ready (state restored, not rebalancing)."""
        return (len(self.procs) == self.n and all(self._ready)
                and all(p.is_alive() for p in self.procs))

    def _start_one(self) -> None:
        i = len(self.procs)
        child = self.settings.replace(worker_id=f"{self.settings.worker_id}.p{i}")
        import os

        proc = self._ctx.Process(target=_child_main,
                                 args=(child, i, self._q, self.json_lines, os.getpid()),
                                 name=f"stream-dp-pipeline-{i}", daemon=False)
        proc.start()
        self.procs.append(proc)
        log.info("pipeline process started", extra={"child": i, "pid": proc.pid})

    def start(self) -> None:
        """Start the first child; :meth:`run` starts the others one by one, each once the
        previous one is ready (simultaneous group joins trip some brokers, and one join per
        member is a shorter rebalance anyway)."""
        self._start_one()

    def _drain(self) -> None:
        while True:
            try:
                child, name, args = self._q.get_nowait()
            except queue.Empty:
                return
            if name == "__released__":
                if self.on_release is not None:
                    tick, shard, closed_at, committed_at = args
                    try:
                        self.on_release(SimpleNamespace(tick=tick, shard=shard,
                                                        closed_at=closed_at,
                                                        committed_at=committed_at))
                    except Exception:
                        log.exception("on_release callback failed")
            elif name == "set_ready":
                self._ready[child] = bool(args[0])
                self.metrics.set_ready(self.ready)
            elif name == "set_consumer_lag":
                self._lag[child] = int(args[0])
                self.metrics.set_consumer_lag(sum(self._lag))
            else:
                getattr(self.metrics, name)(*args)

    async def run(self, stop: asyncio.Event) -> int:
        """Relay metrics until ``stop`` is set or a child exits; then stop every child (SIGTERM,
        30 s grace, SIGKILL). Returns 0, or the exit status of the first child that stopped on
        its own."""
        code = 0
        try:
            started = time.monotonic()
            while not stop.is_set():
                self._drain()
                if len(self.procs) < self.n and (self._ready[len(self.procs) - 1]
                                                 or time.monotonic() - started > 120.0):
                    self._start_one()
                    started = time.monotonic()
                dead = [p for p in self.procs if not p.is_alive()]
                if dead:
                    code = dead[0].exitcode or 0
                    log.error("a pipeline process stopped; stopping the worker",
                              extra={"pid": dead[0].pid, "exit_code": code})
                    code = code if code > 0 else 1
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)
        finally:
            await asyncio.to_thread(self.stop)
            self._drain()
            self.metrics.set_ready(False)
        return code

    def stop(self, grace_s: float = 30.0) -> None:
        for p in self.procs:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
        for p in self.procs:
            p.join(grace_s)
            if p.is_alive():
                p.kill()
                p.join(5.0)
