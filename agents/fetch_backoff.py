"""Client-side backoff on empty fetches for every aiokafka consumer of the process.

aiokafka's background fetcher sends the next fetch to a broker as soon as the previous one
returns. A broker that honours ``fetch.max.wait.ms`` holds an empty fetch for up to that long;
one that answers empty fetches at once (the embedded development broker does) turns an idle
consumer into a busy loop — measured: about 1 300 empty fetches per second and a whole core for
an idle worker. :func:`install` makes a fetch that brought no records wait ``seconds`` before the
fetcher may send the next one to that broker, so an idle consumer costs almost nothing; records
that arrive meanwhile are delayed by at most ``seconds``. Setting ``empty_fetch_backoff_ms``.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["BACKGROUND_FACTOR", "empty_fetches", "fetch_requests", "install",
           "install_from_env", "installed_seconds", "slow_down"]

#: the pause factor of consumers whose records may wait a little longer (the reconcile side
#: agent, the dashboard): 5 × the 50 ms default = 250 ms. At 20 empty fetches per second an idle
#: consumer costs ~0.01 CPU-second per second in aiokafka's Python (measured at 10^6 streams:
#: each of the worker's consumers is idle for most of a tick); at 4 per second a fifth of it.
BACKGROUND_FACTOR = 5.0

_state: dict[str, Any] = {"seconds": 0.0, "patched": False, "empty": 0, "by_client": {}}


def empty_fetches() -> int:
    """Fetches that returned no records since :func:`install` (all consumers of the process)."""
    return int(_state["empty"])


def fetch_requests() -> dict[str, tuple[int, int]]:
    """Per consumer ``client_id``: ``(fetch requests answered, of them empty)`` since
    :func:`install` (diagnostics: which consumer's round trips cost the worker CPU)."""
    return {cid: (int(n[0]), int(n[1])) for cid, n in _state["by_client"].items()}


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
        got = await proc(self, assignment, node_id, request)
        counts = _state["by_client"].get(self._client._client_id)
        if counts is None:
            counts = _state["by_client"][self._client._client_id] = [0, 0]
        counts[0] += 1
        if not got:
            counts[1] += 1
            _state["empty"] += 1
            delay = _state["seconds"] * self.__dict__.get("_stream_dp_backoff_factor", 1.0)
            if delay > 0:
                until = self.__dict__.setdefault("_stream_dp_not_before", {})
                until[node_id] = asyncio.get_running_loop().time() + delay
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
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None:
        raise ValueError("slow_down needs a started consumer (its fetcher exists after start())")
    fetcher.__dict__["_stream_dp_backoff_factor"] = float(factor)


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
