"""Structured JSON logs: one JSON object per line, with a privacy filter.

Each line holds ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``msg`` and the
record's extra fields (``log.info("tick released", extra={"tick": 7})``), plus ``exc`` with the
traceback when there is one.

:class:`PrivacyFilter` enforces DESIGN.md §2.6 on every record that reaches the handler:

* the noise key never appears: any registered secret (:func:`register_secret`; the worker
  registers its key at start-up) is replaced by ``[redacted]`` wherever it occurs in the message
  or a string field, in raw, hex or ``repr`` form;
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
        # Very short fragments would redact innocent text; keys are >= 16 bytes by contract.
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
        if extras:
            text += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return text


def make_handler(stream: TextIO | None = None, *, json_lines: bool = True) -> logging.Handler:
    """A stream handler with :class:`PrivacyFilter` and the JSON (or plain text) formatter."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(PrivacyFilter())
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(PlainFormatter())
    return handler


def configure_logging(
    level: str | int = "info", stream: TextIO | None = None, *, json_lines: bool = True
) -> logging.Handler:
    """Route every logger (faust, aiokafka, ours) through one privacy-filtered handler.

    Replaces the root logger's handlers; returns the installed handler.
    """
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler = make_handler(stream, json_lines=json_lines)
    root.addHandler(handler)
    root.setLevel(parse_level(level))
    # Chatty client libraries: warnings and above unless we debug.
    quiet = logging.WARNING if root.level > logging.DEBUG else logging.DEBUG
    for name in ("aiokafka", "kafka", "faust", "mode", "aiohttp.access"):
        logging.getLogger(name).setLevel(max(quiet, root.level))
    return handler
