"""Structured JSON logs: one JSON object per line, with a privacy filter.

Each line holds ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``msg`` and the
record's extra fields (``log.info("tick released", extra={"tick": 7})``), plus ``exc`` with the
traceback when there is one.

:class:`PrivacyFilter` enforces DESIGN.md §2.6 on every record that reaches the handler:

* the noise key never appears: any registered secret (:func:`register_secret`; the worker
  registers its key at start-up) is replaced by ``[redacted]`` wherever it occurs in the message
  or a string field, in raw, hex or ``repr`` form;
* (:class:`RateLimitFilter`) repeated warnings and errors are printed at most every few seconds,
  with the count of the lines left out;
* raw counts are never logged: extra fields named like raw data or secrets (:data:`FORBIDDEN_FIELDS`)
  and any NumPy array or ``bytes`` value are replaced by ``[redacted]``. Log stream names, ticks,
  offsets, released (noisy) values and aggregate rates instead.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
import threading
from typing import Any, Final, TextIO

#: Extra-field names that are always redacted (case-insensitive).
FORBIDDEN_FIELDS: Final = frozenset(
    {
        "key_bytes", "noise_key", "secret", "secret_key", "stream_dp_key", "password", "token",
        "count", "counts", "raw", "raw_count", "raw_counts", "true_count", "true_counts",
        "true_value", "true_values", "exact", "state", "bank_state",
    }
)

REDACTED: Final = "[redacted]"

#: Attributes every :class:`logging.LogRecord` has; anything else came from ``extra=``.
_STANDARD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName"}

_secrets_lock = threading.Lock()
_secrets: set[str] = set()


def register_secret(secret: bytes | str) -> None:
    """Never log ``secret``: it and its hex / ``repr`` forms are redacted from every record."""
    forms: set[str] = set()
    if isinstance(secret, bytes):
        if not secret:
            return
        forms.add(secret.hex())
        forms.add(secret.hex().upper())
        forms.add(repr(secret)[2:-1])
        forms.add(secret.decode("utf-8", errors="replace"))
    else:
        if not secret:
            return
        forms.add(secret)
        forms.add(secret.encode().hex())
    with _secrets_lock:
        # Very short fragments would redact innocent text; keys are >= 32 bytes by contract.
        _secrets.update(f for f in forms if len(f) >= 8)


def clear_secrets() -> None:
    """Forget registered secrets (tests)."""
    with _secrets_lock:
        _secrets.clear()


def _scrub_text(text: str) -> str:
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for s in secrets:
        if s in text:
            text = text.replace(s, REDACTED)
    return text


def _is_raw_data(value: object) -> bool:
    if isinstance(value, bytes | bytearray | memoryview):
        return True
    module = type(value).__module__
    return module.startswith("numpy") and hasattr(value, "shape") and getattr(value, "ndim", 0) > 0


def _scrub_value(value: object) -> object:
    if _is_raw_data(value):
        return REDACTED
    if isinstance(value, str):
        return _scrub_text(value)
    if isinstance(value, dict):
        return {
            k: (REDACTED if str(k).lower() in FORBIDDEN_FIELDS else _scrub_value(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_scrub_value(v) for v in value]
    return value


class PrivacyFilter(logging.Filter):
    """Redacts secrets and raw-count fields in place; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        # Render the message once, then scrub the rendered text (args may carry the secret).
        try:
            message = record.getMessage()
        except Exception:  # malformed %-args: keep the template
            message = str(record.msg)
        record.msg = _scrub_text(message)
        record.args = None
        for name in list(vars(record)):
            if name in _STANDARD_ATTRS or name.startswith("_"):
                continue
            value = getattr(record, name)
            if name.lower() in FORBIDDEN_FIELDS:
                setattr(record, name, REDACTED)
            else:
                setattr(record, name, _scrub_value(value))
        return True


def _json_default(value: object) -> object:
    item = getattr(value, "item", None)  # NumPy scalars
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, extra fields, ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = _dt.datetime.fromtimestamp(record.created, tz=_dt.UTC)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name in _STANDARD_ATTRS or name.startswith("_") or name in out:
                continue
            out[name] = value
        if record.exc_info:
            out["exc"] = _scrub_text(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exc"] = _scrub_text(record.exc_text)
        if record.stack_info:
            out["stack"] = _scrub_text(self.formatStack(record.stack_info))
        return json.dumps(out, default=_json_default, ensure_ascii=False, allow_nan=True)


_LEVELS: Final = {
    "crit": logging.CRITICAL, "critical": logging.CRITICAL, "error": logging.ERROR,
    "warn": logging.WARNING, "warning": logging.WARNING, "info": logging.INFO,
    "debug": logging.DEBUG,
}


def parse_level(level: str | int) -> int:
    """``"info"``/``"warn"``/... or a numeric level; ``ValueError`` naming the allowed values."""
    if isinstance(level, int):
        return level
    try:
        return _LEVELS[level.strip().lower()]
    except KeyError:
        raise ValueError(
            f"log level must be one of {sorted(_LEVELS)}, got {level!r}"
        ) from None


class PlainFormatter(logging.Formatter):
    """Human-readable lines; the record's ``extra=`` fields follow the message as key=value, so
    plain logs show what JSON logs show (e.g. the start-up privacy accounting)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extras = {k: v for k, v in record.__dict__.items()
                  if k not in _STANDARD_ATTRS and not k.startswith("_")}
        lines = [(k, v) for k, v in extras.items() if _is_lines(v)]
        if extras:
            text += " " + " ".join(f"{k}={_plain_value(v)}" for k, v in extras.items()
                                   if not _is_lines(v))
            text = text.rstrip()
        # a list of text lines (the privacy summary): one indented line each, not a Python list
        for k, v in lines:
            text += f"\n  {k}:" + "".join(f"\n    {line}" for line in v)
        return text


def _is_lines(value: Any) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(
        isinstance(x, str) for x in value)


def _plain_value(value: Any) -> str:
    """``a=1,b=2`` for a mapping (no Python braces and quotes); ``str`` otherwise."""
    if isinstance(value, dict):
        return ",".join(f"{k}={_plain_value(v)}" for k, v in value.items())
    return str(value)


class RateLimitFilter(logging.Filter):
    """Repeated warnings and errors at most every few seconds, with a count of what was left out.

    A broker outage makes the Kafka client log the same failure tens of times a second, a
    backlog of ticks can make a side agent warn once per tick: thousands of lines that bury the
    one that matters. Records at ``WARNING`` and above are grouped by (logger, level, message
    template — the text before ``%`` arguments are filled in): each group may print ``burst``
    lines, then one line per ``interval_s``; the next line printed carries
    ``suppressed = N`` (lines of its group left out since the previous one). On top of that the
    records of client libraries (any logger outside ``agents`` and ``stream_dp``) share a budget
    of ``library_rate`` lines per second. ``INFO`` and below are never limited (start-up and
    progress lines are distinct and few).
    """

    def __init__(self, *, burst: int = 3, interval_s: float = 10.0,
                 library_rate: float = 1.0, library_burst: int = 5,
                 clock: Any = None) -> None:
        super().__init__()
        import time

        self.burst = burst
        self.interval_s = interval_s
        self.library_rate = library_rate
        self.library_burst = library_burst
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        #: group -> [tokens, last refill time, suppressed since the last line printed]
        self._groups: dict[tuple[str, int, str], list[float]] = {}
        self._library = [float(library_burst), self._clock(), 0.0]

    @staticmethod
    def _own(name: str) -> bool:
        return name.split(".")[0] in ("agents", "stream_dp", "simulators", "__main__")

    def _take(self, bucket: list[float], capacity: float, per_s: float, now: float) -> bool:
        bucket[0] = min(capacity, bucket[0] + (now - bucket[1]) * per_s)
        bucket[1] = now
        if bucket[0] >= 1.0:
            bucket[0] -= 1.0
            return True
        bucket[2] += 1
        return False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.levelno, str(record.msg)[:200])
        now = self._clock()
        with self._lock:
            group = self._groups.get(key)
            if group is None:
                if len(self._groups) > 10_000:  # many distinct templates: forget the old ones
                    self._groups.clear()
                group = self._groups[key] = [float(self.burst), now, 0.0]
            if not self._take(group, float(self.burst), 1.0 / self.interval_s, now):
                return False
            if not self._own(record.name) and not self._take(
                    self._library, float(self.library_burst), self.library_rate, now):
                group[2] += 1
                return False
            if group[2]:
                record.suppressed = int(group[2])
                group[2] = 0.0
        return True


class OrphanedFencingFilter(logging.Filter):
    """Drops asyncio's 'Future exception was never retrieved' records for aiokafka's
    ``ProducerFenced``: when another producer takes a transactional id over (a partition that
    moved to another worker, or a second worker with the same worker_id), aiokafka's sender
    fails its internal batch futures that nobody awaits, and asyncio prints each with a
    traceback. The stage already logs the failed commit in one line and recovers or stops."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "asyncio" or not record.exc_info:
            return True
        exc = record.exc_info[1]
        return not (type(exc).__name__ == "ProducerFenced"
                    and "exception was never retrieved" in str(record.msg))


def make_handler(stream: TextIO | None = None, *, json_lines: bool = True,
                 rate_limit: bool = True) -> logging.Handler:
    """A stream handler with :class:`RateLimitFilter` (unless ``rate_limit`` is false),
    :class:`PrivacyFilter` and the JSON (or plain text) formatter."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    if rate_limit:
        handler.addFilter(RateLimitFilter())  # first: it groups by the unformatted template
    handler.addFilter(OrphanedFencingFilter())
    handler.addFilter(PrivacyFilter())
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(PlainFormatter())
    return handler


def configure_logging(
    level: str | int = "info", stream: TextIO | None = None, *, json_lines: bool = True,
    rate_limit: bool = True,
) -> logging.Handler:
    """Route every logger (faust, aiokafka, ours) through one privacy-filtered, rate-limited
    handler (:class:`RateLimitFilter`).

    Replaces the root logger's handlers; returns the installed handler.
    """
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler = make_handler(stream, json_lines=json_lines, rate_limit=rate_limit)
    root.addHandler(handler)
    root.setLevel(parse_level(level))
    # Chatty client libraries: warnings and above unless we debug.
    quiet = logging.WARNING if root.level > logging.DEBUG else logging.DEBUG
    for name in ("aiokafka", "kafka", "faust", "mode", "aiohttp.access"):
        logging.getLogger(name).setLevel(max(quiet, root.level))
    return handler
