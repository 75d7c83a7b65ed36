"""A small text progress bar for stderr (tqdm is not a dependency).

Redraws at most 5 times a second with a carriage return when the stream is a terminal; when it
is not (a log file, CI), prints one plain line per 10 % and at least one every 5 s while it
moves (a paced replay of a long log reaches 10 % only after minutes), so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _fmt_seconds(s: float) -> str:
    if s != s or s == float("inf"):
        return "?"
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class ProgressBar:
    """Progress over ``total`` units (bytes of a log), with a count of records alongside."""

    def __init__(
        self, total: int, *, enabled: bool = True, stream: TextIO | None = None, width: int = 30,
        every_s: float = 5.0,
    ) -> None:
        self.total = max(int(total), 1)
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.width = width
        #: not a terminal: a line per 10 % and at least one every this many seconds
        self.every_s = every_s
        self.done = 0
        self.records = 0
        self._t0 = time.monotonic()
        self._start_done = 0
        self._last_draw = 0.0
        self._last_decile = -1
        self._closed = False

    def advance_to(self, done: int, records: int) -> None:
        """Set the position (units done, records done) and redraw if it is time."""
        if self.done == 0 and self.records == 0 and done > 0:
            self._start_done = done  # resumed: rate counts this run only
        self.done, self.records = min(int(done), self.total), int(records)
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            if now - self._last_draw >= 0.2 or self.done >= self.total:
                self._last_draw = now
                self.stream.write("\r" + self.render(now))
                self.stream.flush()
        else:
            decile = self.done * 10 // self.total
            if decile != self._last_decile or now - self._last_draw >= self.every_s:
                self._last_decile = decile
                self._last_draw = now
                self.stream.write(self.render(now) + "\n")
                self.stream.flush()

    def render(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        frac = self.done / self.total
        filled = int(frac * self.width)
        elapsed = max(now - self._t0, 1e-9)
        rate = (self.done - self._start_done) / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        bar = "#" * filled + "." * (self.width - filled)
        return (
            f"[{bar}] {frac * 100:5.1f}% {self.records:,} records "
            f"{_fmt_seconds(elapsed)} elapsed, ETA {_fmt_seconds(eta)}"
        )

    def close(self) -> None:
        if self.enabled and self.tty and not self._closed:
            self.stream.write("\r" + self.render() + "\n")
            self.stream.flush()
        self._closed = True
