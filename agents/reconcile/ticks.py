"""Gathering one tick's releases for the whole domain (the reconcile agent's input):
:class:`Release` (one counts message), :class:`CompleteTick` and :class:`TickAssembler`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    pass


try:  # orjson parses counts messages several times faster; same results on valid JSON
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is part of the service extra
    from json import loads as _loads  # type: ignore[assignment]
log = logging.getLogger("agents.reconcile")  # the agent's logger, as before the split

class DomainLike(Protocol):
    """What the agent needs of :class:`stream_dp.domain.Domain`: the released nodes, in order."""

    @property
    def names(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Release:
    """The fields of one ``dp.counts.v1`` message the reconciler uses.

    ``tick`` is 1-based; ``tick_end`` in Unix seconds; ``value`` is the released (noisy) decayed
    count and ``stderr`` its analytic standard error, in counts.
    """

    stream: str
    tick: int
    tick_end: float
    value: float
    stderr: float

    @classmethod
    def from_json(cls, data: bytes | str) -> Release:
        """Decode a counts message; ``ValueError`` for anything that is not a valid release."""
        try:
            obj = _loads(data)
        except ValueError as exc:  # JSONDecodeError, orjson's, UnicodeDecodeError
            raise ValueError(f"counts message is not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError("counts message must be a JSON object")
        try:
            stream, tick = obj["stream"], obj["tick"]
            tick_end, value, stderr = obj["tick_end"], obj["value"], obj["stderr"]
        except KeyError as exc:
            raise ValueError(f"counts message lacks field {exc.args[0]!r}") from None
        if not isinstance(stream, str):
            raise ValueError("counts message field 'stream' must be a string")
        if isinstance(tick, bool) or not isinstance(tick, int) or tick < 1:
            raise ValueError(f"counts message field 'tick' must be an integer >= 1, got {tick!r}")
        nums = {"tick_end": tick_end, "value": value, "stderr": stderr}
        for name, v in nums.items():
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"counts message field {name!r} must be a number, got {v!r}")
        if not float(stderr) >= 0.0:
            raise ValueError(f"counts message field 'stderr' must be >= 0, got {stderr!r}")
        return cls(stream, tick, float(tick_end), float(value), float(stderr))


@dataclass(frozen=True)
class CompleteTick:
    """All of one tick's releases, in domain order (tuples, or float64 arrays from compact
    records)."""

    tick: int
    tick_end: float
    noisy: Any
    stderr: Any


@dataclass
class _Pending:
    tick_end: float = 0.0
    values: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: partition -> smallest offset of a message of this tick
    first_offset: dict[int, int] = field(default_factory=dict)


class TickAssembler:
    """Buffers releases per tick until every node of the domain has one.

    Ticks ``<= after_tick`` and ticks not divisible by ``every`` are ignored. Complete ticks come
    out in ascending order; an incomplete tick older than a complete one can never complete
    (each stream's releases are keyed by the stream, so they arrive in tick order: once tick
    ``t + 1`` is complete every release of tick ``t`` has been read) and is dropped with a
    warning. At most ``max_pending`` ticks are buffered (memory: about 150 bytes per node and
    tick); when a release shard lags further behind, the oldest pending tick is dropped.
    Plain bookkeeping, no I/O: the Kafka loop in :class:`Reconciler` drives it.
    """

    def __init__(
        self, names: Sequence[str], *, every: int = 1, after_tick: int = 0,
        max_pending: int = 256, index: Mapping[str, int] | None = None,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an integer >= 1 (ticks), got {every!r}")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an integer >= 1 (ticks), got {max_pending!r}")
        self.max_pending = max_pending
        if after_tick < 0:
            raise ValueError(f"after_tick must be >= 0, got {after_tick!r}")
        self.names = tuple(names)
        if index is None:
            index = dict(zip(self.names, range(len(self.names)), strict=True))
            if len(index) != len(self.names):
                raise ValueError("names must be distinct")
        elif len(index) != len(self.names):
            raise ValueError("index must give every name its position")
        #: name → position (given: the caller's, built once for every leadership; 10^7 names
        #: take seconds)
        self.index: Mapping[str, int] = index
        self.every = every
        self.after_tick = int(after_tick)
        self._pending: dict[int, _Pending] = {}
        self.unknown_streams = 0
        self.conflicts = 0
        #: ticks dropped without a histogram (total) and the most recent of them
        self.dropped = 0
        self.dropped_ticks: deque[int] = deque(maxlen=1000)

    def wanted(self, tick: int) -> bool:
        return tick > self.after_tick and tick % self.every == 0

    def add(self, partition: int, offset: int, release: Release) -> None:
        """Record one release read at ``(partition, offset)`` of the counts topic."""
        if not self.wanted(release.tick):
            return
        idx = self.index.get(release.stream)
        if idx is None:
            self.unknown_streams += 1
            return
        pending = self._open(release.tick)
        if pending is None:
            return
        pending.tick_end = max(pending.tick_end, release.tick_end)
        old = pending.values.get(idx)
        new = (release.value, release.stderr)
        if old is not None and old != new:
            # A re-published tick must be bit-identical (DESIGN.md §2.5); keep the first.
            self.conflicts += 1
            log.error(
                "conflicting re-publication of a release",
                extra={"stream": release.stream, "tick": release.tick},
            )
        elif old is None:
            pending.values[idx] = new
        prev = pending.first_offset.get(partition)
        if prev is None or offset < prev:
            pending.first_offset[partition] = offset

    def pop_complete(self) -> list[Any]:
        """Every tick that now has all its input, ascending (earlier incomplete ticks are
        dropped); afterwards ``after_tick`` is the last. Subclasses say what "complete" is and
        what a complete tick becomes (:meth:`_is_complete`, :meth:`_complete`)."""
        done = sorted(t for t, p in self._pending.items() if self._is_complete(t, p))
        out: list[Any] = []
        for t in done:
            for stale in sorted(s for s in self._pending if s < t):
                del self._pending[stale]
                self._drop(stale, f"incomplete while tick {t} is complete (releases lost)")
            made = self._complete(t, self._pending.pop(t))
            if made is not None:
                out.append(made)
            self.after_tick = t
        return out

    def _is_complete(self, tick: int, p: _Pending) -> bool:
        return len(p.values) == len(self.names)

    def _complete(self, tick: int, p: _Pending) -> Any:
        n = len(self.names)
        return CompleteTick(
            tick=tick,
            tick_end=p.tick_end,
            noisy=tuple(p.values[i][0] for i in range(n)),
            stderr=tuple(p.values[i][1] for i in range(n)),
        )

    def _open(self, tick: int) -> _Pending | None:
        """The buffer of ``tick``, created if new; ``None`` if it had to be dropped at once
        (more than ``max_pending`` ticks buffered and it is the oldest)."""
        pending = self._pending.get(tick)
        if pending is None:
            pending = self._pending[tick] = _Pending()
            if len(self._pending) > self.max_pending:
                oldest = min(self._pending)
                del self._pending[oldest]
                self._drop(oldest, "more than max_pending ticks buffered (a release shard lags)")
                if oldest == tick:
                    return None
        return pending

    def _drop(self, tick: int, why: str) -> None:
        self.dropped += 1
        self.dropped_ticks.append(tick)
        log.warning("dropping a tick without a histogram", extra={"tick": tick, "reason": why})

    def resume_offsets(self, positions: Mapping[int, int]) -> dict[int, int]:
        """Per partition, where a successor must start reading so that no pending tick is lost.

        ``positions`` are the consumer's next offsets; a partition holding messages of a pending
        tick resumes at the first of them.
        """
        out = dict(positions)
        for p in self._pending.values():
            for part, off in p.first_offset.items():
                if part in out:
                    out[part] = min(out[part], off)
        return out

    @property
    def pending_ticks(self) -> list[int]:
        return sorted(self._pending)
