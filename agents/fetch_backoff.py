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

__all__ = ["empty_fetches", "install", "installed_seconds"]

_state: dict[str, Any] = {"seconds": 0.0, "patched": False, "empty": 0}


def empty_fetches() -> int:
    """Fetches that returned no records since :func:`install` (all consumers of the process)."""
    return int(_state["empty"])


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

    original = getattr(Fetcher, "_proc_fetch_request", None)
    if original is None:  # pragma: no cover - another aiokafka layout: leave it alone
        return

    async def _proc_fetch_request(self: Any, assignment: Any, node_id: Any, request: Any) -> Any:
        got = await original(self, assignment, node_id, request)
        if not got:
            _state["empty"] += 1
            delay = _state["seconds"]
            if delay > 0:
                try:
                    await asyncio.sleep(delay)
                except asyncio.CancelledError:  # the consumer stops: end quietly, as aiokafka's own
                    return got
        return got

    Fetcher._proc_fetch_request = _proc_fetch_request
    _state["patched"] = True
