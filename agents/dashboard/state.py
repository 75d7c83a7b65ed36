"""What the dashboard holds between two browser requests: a bounded series per followed stream
(:class:`StreamSeries`) and the latest counts, histogram and tables (:class:`DashboardState`),
with the server-sent-event queues of the connected browsers. No I/O.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

#: ticks kept per stream
DEFAULT_HISTORY: Final = 600
DEFAULT_MAX_POINTS: Final = 300_000


@dataclass
class StreamSeries:
    """The recent releases of one stream: rows ``[tick, tick_end, value, stderr]`` by tick."""

    meta: dict[str, Any]
    points: deque[list[float]]

    def add(self, tick: int, row: list[float]) -> None:
        """Insert or replace ``tick``'s row, keeping ticks sorted; when full, drop the oldest."""
        pts = self.points
        if not pts or tick > pts[-1][0]:
            pts.append(row)
            return
        # a re-published (bit-identical) tick, or out of order across partitions
        i = len(pts) - 1
        while i >= 0 and pts[i][0] > tick:
            i -= 1
        if i >= 0 and pts[i][0] == tick:
            pts[i] = row
            return
        if pts.maxlen is not None and len(pts) >= pts.maxlen:
            if i < 0:
                return  # older than everything kept
            pts.popleft()
            i -= 1
        pts.insert(i + 1, row)


@dataclass
class DashboardState:
    """What the dashboard holds: series per stream, the latest histogram, the subscribers."""

    history: int = DEFAULT_HISTORY
    #: bound on the points held over all streams (each point is 4 floats)
    max_points: int = DEFAULT_MAX_POINTS
    series: dict[str, StreamSeries] = field(default_factory=dict)
    histogram: dict[str, Any] | None = None
    #: the latest dp.marginals.v1 message (binary-attribute domains)
    marginals: dict[str, Any] | None = None
    subscribers: set[asyncio.Queue[tuple[str, Any] | None]] = field(default_factory=set)
    connected: bool = False
    error: str = ""
    messages: int = 0
    started: float = field(default_factory=time.time)
    #: ``[unit, multiplier]`` pairs: a record's budget × multiplier = the budget per unit
    #: (:meth:`stream_dp.accounting.Accountant.budget_units`; per stream only when unknown)
    budget_units: list[list[Any]] = field(default_factory=lambda: [["stream", 1]])
    #: the newest series' meta (:meth:`_note_meta`); changed since the last ``meta`` event
    meta: dict[str, Any] = field(default_factory=dict)
    meta_changed: bool = False

    def add_counts(self, messages: list[dict[str, Any]]) -> list[list[Any]]:
        """Store ``dp.counts.v1`` messages (and ``dp.tables.v1`` records, one series per table
        cell); return the rows to broadcast."""
        rows: list[list[Any]] = []
        expanded: list[dict[str, Any]] = []
        for msg in messages:
            expanded.extend(_table_cells(msg) if msg.get("schema") == "dp.tables.v1" else [msg])
        for msg in expanded:
            try:
                stream = str(msg["stream"])
                tick = int(msg["tick"])
                row = [tick, float(msg["tick_end"]), float(msg["value"]), float(msg["stderr"])]
            except (KeyError, TypeError, ValueError):
                continue
            s = self.series.get(stream)
            if s is None:
                meta = {k: msg.get(k) for k in ("strategy", "p", "privacy", "cap", "horizon")}
                self._note_meta(meta)
                s = self.series[stream] = StreamSeries(meta, deque(maxlen=self._new_stream_cap()))
            s.add(tick, row)
            rows.append([stream, *row])
        self.messages += len(messages)
        return rows

    def _note_meta(self, meta: dict[str, Any]) -> None:
        """Keep the newest series' ``meta`` (strategy, p, privacy, …): live rows carry none, so
        browsers label new charts with it (sent as a ``meta`` event when it changes)."""
        if meta != self.meta:
            self.meta = dict(meta)
            self.meta_changed = True

    def add_columns(self, streams: Sequence[str], tick: int, tick_end: float,
                    values: list[float], stderr: list[float], meta: dict[str, Any],
                    rows: list[list[Any]] | None) -> None:
        """Store one compact record's followed streams (``values`` and ``stderr`` as Python
        floats, in ``streams`` order): the same series and points as :meth:`add_counts` of
        the record's ``dp.counts.v1`` view (``meta``: its strategy, p, privacy, cap, horizon),
        without building a message per stream; the rows to broadcast are appended to ``rows``
        (``None``: nobody is subscribed, none built)."""
        series = self.series
        tick, tick_end = int(tick), float(tick_end)
        for stream, value, err in zip(streams, values, stderr, strict=True):
            row = [tick, tick_end, value, err]
            s = series.get(stream)
            if s is None:
                self._note_meta(meta)
                s = series[stream] = StreamSeries(dict(meta),
                                                  deque(maxlen=self._new_stream_cap()))
            s.add(tick, row)
            if rows is not None:
                rows.append([stream, *row])
        self.messages += len(streams)

    def per_stream_cap(self) -> int:
        """Points kept per stream: ``history``, or less so that the total stays ≤ max_points."""
        return max(2, min(self.history, self.max_points // max(1, len(self.series))))

    def _new_stream_cap(self) -> int:
        n = len(self.series) + 1
        cap = max(2, min(self.history, self.max_points // n))
        # shrink the existing series when the count crosses a power of two (O(n log n) overall)
        if n & (n - 1) == 0:
            for s in self.series.values():
                if s.points.maxlen is not None and s.points.maxlen > cap:
                    s.points = deque(list(s.points)[-cap:], maxlen=cap)
        return cap

    def snapshot(self, prefix: str = "", limit: int | None = None, after: str = ""
                 ) -> dict[str, Any]:
        """Everything held for streams starting with ``prefix`` (histogram nodes too); with
        ``limit``, at most that many streams in name order after the stream ``after`` and
        ``next`` = the cursor of the following page (``None`` on the last page)."""
        names = sorted(n for n in self.series if n.startswith(prefix) and n > after)
        page = names if limit is None else names[:limit]
        hist = self.histogram
        if hist is not None and prefix:
            hist = {**hist, "nodes": [n for n in hist.get("nodes") or ()
                                      if str(n.get("stream", "")).startswith(prefix)]}
        out: dict[str, Any] = {
            "streams": {name: {"meta": self.series[name].meta,
                               "points": list(self.series[name].points)} for name in page},
            "histogram": hist,
            "marginals": self.marginals,
            "status": self.status(),
            "budget_units": self.budget_units,
            "meta": self.meta,
        }
        if limit is not None:
            out["next"] = page[-1] if len(names) > len(page) else None
        return out

    def status(self) -> dict[str, Any]:
        return {"connected": self.connected, "error": self.error, "messages": self.messages}

    def broadcast(self, kind: str, payload: Any) -> None:
        for q in list(self.subscribers):
            if q.qsize() > 1000:  # a stalled browser: drop it rather than grow without bound
                self.subscribers.discard(q)
                q.put_nowait(None)
                continue
            q.put_nowait((kind, payload))


def _table_cells(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``dp.tables.v1`` record as ``dp.counts.v1``-shaped messages, one per cell, named by
    the cell's attribute values (``milk=1,bread=0``)."""
    try:
        names = [str(n) for n in rec["names"]]
        cells = list(rec["cells"])
        k = len(names)
        out = []
        for i, v in enumerate(cells):
            bits = format(i, f"0{k}b")
            label = ",".join(f"{n}={b}" for n, b in zip(names, bits, strict=True))
            out.append({"stream": label, "tick": rec["tick"], "tick_end": rec["tick_end"],
                        "value": v, "stderr": rec["stderr"], "strategy": rec.get("strategy"),
                        "p": rec.get("p"), "privacy": rec.get("privacy")})
        return out
    except (KeyError, TypeError, ValueError):
        return []
