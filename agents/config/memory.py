"""The memory limit a worker checks its strategy, streams and people against (bytes).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from agents.config.settings import Settings
from agents.config.values import env_var

#: bytes a worker reserves per expected active person (``user_expected_people``) with the
#: compiled compact table and with the pure path's table. Measured through a commit that
#: changes every person (a period's close): a ``stream-dp worker`` grew by 573 bytes of RSS a
#: person over the event-level worker on the same 8·10^6 events of 10^6 people
#: (``benchmarks/user_level.py --events 8000000``); of that, one
#: ``agents.ingest.users.UserState`` in changelog form peaks at 296 bytes traced (the table
#: 105, the records built the rest) and the producer's record batches hold the remaining 277.
#: The pure path's table peaks at 934 traced, so ≈ 1211 in a worker. Both plus a tenth.
COMPACT_PERSON_BYTES = 640
PURE_PERSON_BYTES = 1344


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


def people_bytes(settings: Settings, compact: bool = True) -> int:
    """The memory reserved for ``user_expected_people`` (0 at event level); ``compact``: the
    compiled compact table holds them (``agents.ingest.users.person_table``), else the pure
    path's."""
    if settings.privacy_unit != "user":
        return 0
    per = COMPACT_PERSON_BYTES if compact else PURE_PERSON_BYTES
    return int(settings.user_expected_people) * per


def check_memory(settings: Settings, n_streams: int, *, compact_people: bool = True) -> None:
    """Refuse (``ValueError``, one line) a strategy and horizon whose tables and ``n_streams``
    streams, with the people a user-level worker expects (:func:`people_bytes`), cannot fit
    :func:`memory_limit_bytes`; run before connecting to the broker."""
    from stream_dp.limits import check_memory as _check
    from stream_dp.limits import estimate_memory

    setting = (f"max_memory_mb setting ({env_var('max_memory_mb')})" if settings.max_memory_mb
               else "memory available to this process (set max_memory_mb to change it)")
    limit = memory_limit_bytes(settings)
    people = people_bytes(settings, compact_people)
    if people:
        est = estimate_memory(settings.strategy, settings.horizon, n_streams,
                              settings.privacy_model)
        if est.total_bytes + people > limit:
            mib = 1 << 20
            per = COMPACT_PERSON_BYTES if compact_people else PURE_PERSON_BYTES
            raise ValueError(
                f"{settings.user_expected_people} expected people (user_expected_people, "
                f"{env_var('user_expected_people')}) need about {people / mib:.0f} MiB ({per} "
                f"bytes a person) and {n_streams} streams up to {est.total_bytes / mib:.0f} MiB "
                f"(strategy {settings.strategy}, horizon {settings.horizon}): together above the "
                f"{setting} of {limit / mib:.0f} MiB: raise the limit, or spread the events "
                "partitions (and their people) over more workers"
            )
    _check(settings.strategy, settings.horizon, n_streams, limit,
           model=settings.privacy_model, setting=setting)
