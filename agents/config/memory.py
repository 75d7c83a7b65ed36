"""The memory limit a worker checks its strategy and streams against (bytes).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from agents.config.settings import Settings
from agents.config.values import env_var


def memory_limit_bytes(settings: Settings) -> int:
    """``max_memory_mb`` in bytes, or the memory available to the process if it is 0."""
    if settings.max_memory_mb:
        return int(settings.max_memory_mb) << 20
    candidates: list[int] = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text(encoding="ascii").strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            candidates.append(int(text))
    with contextlib.suppress(ValueError, OSError, AttributeError):  # non-POSIX: no sysconf
        candidates.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return min(candidates) if candidates else 1 << 62


def check_memory(settings: Settings, n_streams: int) -> None:
    """Refuse (``ValueError``, one line) a strategy and horizon whose tables and ``n_streams``
    streams cannot fit :func:`memory_limit_bytes`; run before connecting to the broker."""
    from stream_dp.limits import check_memory as _check

    setting = (f"max_memory_mb setting ({env_var('max_memory_mb')})" if settings.max_memory_mb
               else "memory available to this process (set max_memory_mb to change it)")
    _check(settings.strategy, settings.horizon, n_streams, memory_limit_bytes(settings),
           model=settings.privacy_model, setting=setting)
