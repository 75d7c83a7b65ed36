"""Client-side backoff on empty fetches for every aiokafka consumer of the process.

aiokafka's background fetcher sends the next fetch to a broker as soon as the previous one
returns. A broker that honours ``fetch.max.wait.ms`` holds an empty fetch for up to that long;
one that answers empty fetches at once (the embedded development broker does) turns an idle
consumer into a busy loop — measured: about 1 300 empty fetches per second and a whole core for
an idle worker. :func:`install` makes a fetch that brought no records wait ``seconds`` before the
fetcher may send the next one to that broker, so an idle consumer costs almost nothing; records
that arrive meanwhile are delayed by at most ``seconds``. Setting ``empty_fetch_backoff_ms``.

Two refinements for the worker's own consumers, whose round trips are most of an idle
worker's CPU (each empty fetch costs ~0.3 ms of socket write alone on these VMs):

* :func:`pace` lets a consumer's pause grow: it doubles after each empty fetch in a row, up to
  ``growth`` times the first, and falls back to the first at the next fetch that brings
  records. A consumer that is idle between bursts then polls a few times per second, not 20.
* :func:`wake` ends a consumer's pause at once (and makes the fetch in flight, if any, not
  start one): for records whose arrival the process itself knows of — the in-process ingest's
  partials commit wakes the release stage, a tick's clock close wakes the events consumer
  when the closing point lies ahead of it — so a long pause costs them no latency.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["BACKGROUND_FACTOR", "FETCHER_IDLE_MS", "empty_fetches", "fetch_requests", "install",
           "install_from_env", "installed_seconds", "longest_pauses", "pace", "slow_down",
           "wake"]

#: the pause factor of consumers whose records may wait a little longer (the reconcile side
#: agent, the dashboard): 5 × the 50 ms default = 250 ms. At 20 empty fetches per second an idle
#: consumer costs ~0.01 CPU-second per second in aiokafka's Python (measured at 10^6 streams:
#: each of the worker's consumers is idle for most of a tick); at 4 per second a fifth of it.
BACKGROUND_FACTOR = 5.0

#: ``consumer_timeout_ms`` for the long-running consumers of a worker: how often aiokafka's
#: background fetch routine plans its requests again when nothing told it to (a fetch done,
#: records taken, a seek, an assignment, a pause ending, :func:`wake`). aiokafka's 200 ms default
#: woke every idle consumer's routine 5 times a second — 23 of the 126 event-loop callbacks per
#: second of an idle worker (issue #35); every event that needs a new fetch completes a future
#: the routine waits on, so this is only its safety net
FETCHER_IDLE_MS = 1000

_state: dict[str, Any] = {"seconds": 0.0, "patched": False, "empty": 0, "by_client": {},
                          "longest": {}}


def empty_fetches() -> int:
    """Fetches that returned no records since :func:`install` (all consumers of the process)."""
    return int(_state["empty"])


def fetch_requests() -> dict[str, tuple[int, int]]:
    """Per consumer ``client_id``: ``(fetch requests answered, of them empty)`` since
    :func:`install` (diagnostics: which consumer's round trips cost the worker CPU)."""
    return {cid: (int(n[0]), int(n[1])) for cid, n in _state["by_client"].items()}


def longest_pauses() -> dict[str, float]:
    """Per consumer ``client_id``: the longest pause after an empty fetch started since
    :func:`install` (seconds; diagnostics and tests: a record arriving during an idle spell
    waits at most the pause in force, so this bounds its wait)."""
    return {cid: float(x) for cid, x in _state["longest"].items()}


def installed_seconds() -> float:
    """The backoff in force (seconds; 0 = none)."""
    return float(_state["seconds"])


def install(seconds: float) -> None:
    """Wait ``seconds`` after every empty fetch (0 disables it). Idempotent; the last call's
    value applies to every consumer of the process."""
    if not (seconds >= 0.0):
        raise ValueError(f"backoff must be >= 0 seconds, got {seconds!r}")
    _state["seconds"] = float(seconds)
    if _state["patched"]:
        return
    from aiokafka.consumer.fetcher import Fetcher

    proc = getattr(Fetcher, "_proc_fetch_request", None)
    actions = getattr(Fetcher, "_get_actions_per_node", None)
    if proc is None or actions is None:  # pragma: no cover - another aiokafka layout
        return

    # The pause is a "not before" time per broker, honoured when the fetcher plans its next
    # requests: nothing sleeps inside aiokafka's tasks, so cancelling and closing a consumer
    # behave exactly as without it.
    async def _proc_fetch_request(self: Any, assignment: Any, node_id: Any, request: Any) -> Any:
        d = self.__dict__
        wakes = d.get("_stream_dp_wakes", 0)
        got = await proc(self, assignment, node_id, request)
        counts = _state["by_client"].get(self._client._client_id)
        if counts is None:
            counts = _state["by_client"][self._client._client_id] = [0, 0]
        counts[0] += 1
        if not got:
            counts[1] += 1
            _state["empty"] += 1
            if d.get("_stream_dp_wakes", 0) != wakes:
                return got  # woken while in flight: the records may be there now, ask again
            run = d.get("_stream_dp_empty_run", 0)
            d["_stream_dp_empty_run"] = run + 1
            delay = (_state["seconds"] * d.get("_stream_dp_backoff_factor", 1.0)
                     * min(float(1 << min(run, 30)), d.get("_stream_dp_growth", 1.0)))
            if delay > 0:
                cid = self._client._client_id
                _state["longest"][cid] = max(_state["longest"].get(cid, 0.0), delay)
                until = d.setdefault("_stream_dp_not_before", {})
                until[node_id] = asyncio.get_running_loop().time() + delay
        else:
            d["_stream_dp_empty_run"] = 0
        return got

    def _get_actions_per_node(self: Any, assignment: Any) -> Any:
        requests, resets, timeout, invalid, resumes = actions(self, assignment)
        until = self.__dict__.get("_stream_dp_not_before")
        if until and requests:
            now = asyncio.get_running_loop().time()
            keep, wait = [], None
            for node_id, req in requests:
                t = until.get(node_id, 0.0)
                if t > now:
                    wait = t - now if wait is None else min(wait, t - now)
                else:
                    keep.append((node_id, req))
            if wait is not None:
                requests = keep
                timeout = wait if timeout is None else min(timeout, wait)
        return requests, resets, timeout, invalid, resumes

    Fetcher._proc_fetch_request = _proc_fetch_request
    Fetcher._get_actions_per_node = _get_actions_per_node
    _state["patched"] = True


def slow_down(consumer: Any, factor: float = BACKGROUND_FACTOR) -> None:
    """Pause ``factor`` × the process's backoff after ``consumer``'s empty fetches (a started
    ``AIOKafkaConsumer``; before :func:`install` or with the backoff at 0 it has no effect).

    For consumers whose records may wait a little longer — the reconcile side agent's and the
    dashboard's: their output is seconds behind a release anyway — so that being idle for most
    of a tick costs them ``factor`` times fewer fetch round trips."""
    if not (factor >= 1.0):
        raise ValueError(f"factor must be >= 1, got {factor!r}")
    _fetcher(consumer).__dict__["_stream_dp_backoff_factor"] = float(factor)


def _fetcher(consumer: Any) -> Any:
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None:
        raise ValueError("needs a started consumer (its fetcher exists after start())")
    return fetcher


def pace(consumer: Any, growth: float) -> None:
    """Let ``consumer``'s pause double after each empty fetch in a row, up to ``growth`` × its
    first pause (``growth`` ≥ 1; 1 = a constant pause, the default). Its first record after an
    idle spell then waits up to ``growth`` × the pause, unless :func:`wake` ends it."""
    if not (1.0 <= growth <= 1e6):
        raise ValueError(f"growth must be between 1 and 1e6, got {growth!r}")
    _fetcher(consumer).__dict__["_stream_dp_growth"] = float(growth)


def wake(consumer: Any) -> None:
    """End ``consumer``'s pause now: its fetcher sends its next fetch at once, and the empty
    answer to a fetch in flight starts no pause (it was sent before what woke it). For an
    event loop's own consumers, called from that loop; a consumer not started (or stopped)
    is left alone."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None:
        return
    d = fetcher.__dict__
    d["_stream_dp_wakes"] = d.get("_stream_dp_wakes", 0) + 1
    d["_stream_dp_empty_run"] = 0
    until = d.get("_stream_dp_not_before")
    if until:
        until.clear()
    fut = getattr(fetcher, "_wait_consume_future", None)
    if fut is not None and not fut.done():
        # the fetch loop waits on this future (among others) to plan its next requests
        fut.set_result(None)


def install_from_env() -> None:
    """:func:`install` with ``$STREAM_DP_EMPTY_FETCH_BACKOFF_MS`` (default 50 ms, the setting's
    default): for the command-line readers (``stream-dp tail``, the standalone dashboard)."""
    import os

    raw = os.environ.get("STREAM_DP_EMPTY_FETCH_BACKOFF_MS", "50")
    try:
        ms = float(raw)
    except ValueError:
        raise ValueError(f"STREAM_DP_EMPTY_FETCH_BACKOFF_MS must be a number of milliseconds, "
                         f"got {raw!r}") from None
    install(ms / 1000.0)
