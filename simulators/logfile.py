"""Event log files: the formats ``stream-dp simulate`` writes and ``stream-dp replay`` reads.

Two formats, one event per line, in event-time order (replay does not require order, but a log
out of order by more than the allowed lateness makes paced replays drop the stragglers as
late):

* **CSV** with a header line naming the columns ``ts``, ``key`` and optionally ``value`` (any
  order; other columns are ignored). ``ts`` is the event time, either Unix seconds (``1704067200.25``)
  or ISO 8601 (``2024-01-01T00:00:00.250Z``; a time without offset is read as UTC). ``key`` is the
  declared event key (a leaf stream or grid cell). ``value`` is the event's contribution (default 1;
  the worker clamps it to the contribution cap).
* **JSON lines** (``.jsonl`` / ``.ndjson``): ``{"key": str, "ts": number | ISO 8601 string,
  "value": number}`` with ``value`` optional (default 1). Blank lines are skipped. For a
  binary-attribute domain a line is ``{"ts": …, "attrs": "0110…"}`` (``attrs``: a string of
  ``0``/``1``, or the list of the names of the 1-attributes; ``key`` optional; no ``value``):
  what ``stream-dp simulate attributes`` writes.

Everything here is pure Python (no Kafka), so the simulators and tests can use it directly.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Literal

LogFormat = Literal["csv", "jsonl"]

_FORMATS_BY_SUFFIX: dict[str, LogFormat] = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
}


@dataclass(frozen=True, slots=True)
class Event:
    """One input event: ``key`` (declared event key), ``ts`` (event time, Unix seconds),
    ``value`` (contribution before clamping; counts use 1)."""

    key: str
    ts: float
    value: float = 1.0
    #: binary-attribute events: their attributes (``"0110…"`` or a list of names), else None
    attrs: str | tuple[str, ...] | None = None
    #: the person who caused the event (user-level privacy), else None: written as the field
    #: ``user_field`` of the message and used as the record key (:mod:`simulators.people`)
    user: str | None = None
    user_field: str = "user"

    def to_message(self) -> dict[str, object]:
        """The ``dp.events.v1`` message value (see docs/CONTRACTS.md)."""
        if self.attrs is not None:
            out: dict[str, object] = {"ts": self.ts, "attrs": (
                self.attrs if isinstance(self.attrs, str) else list(self.attrs))}
            if self.key:
                out["key"] = self.key
        else:
            out = {"key": self.key, "ts": self.ts, "value": self.value}
        if self.user is not None:
            out[self.user_field] = self.user
        return out

    @property
    def partition_key(self) -> str:
        """The Kafka record key: the person's identifier when the event has one (all of one
        person's records on one partition: docs/guide.md), else the event key, or (attribute
        events without one) the attributes, so that a replay puts every event in the same
        partition again."""
        if self.user is not None:
            return self.user
        if self.key or self.attrs is None:
            return self.key
        return self.attrs if isinstance(self.attrs, str) else ",".join(self.attrs)


@dataclass(frozen=True, slots=True)
class LogRecord:
    """An event read from a log with its position: ``number`` counts data records from 1,
    ``end_offset`` is the byte offset just after its line (where a resumed read continues)."""

    number: int
    end_offset: int
    event: Event


class LogFormatError(ValueError):
    """A malformed log line; the message names the file, line number and problem."""


#: longest person identifier, in UTF-8 bytes (the worker's limit: ``agents.ingest.users``)
MAX_USER_BYTES = 256


def user_problem(raw: object, field: str) -> str | None:
    """Why ``raw`` (the value of the event's field ``field``) is not a valid person identifier
    — the rule a user-level worker applies before dead-lettering ``invalid_user``: a string of
    1 to :data:`MAX_USER_BYTES` UTF-8 bytes, taken as it is (nothing normalised) — or ``None``.
    The text never repeats the identifier."""
    if raw is None:
        return f"the person's identifier (field {field!r}) is missing"
    if not isinstance(raw, str):
        return (f"the person's identifier (field {field!r}) must be a string, got "
                f"{type(raw).__name__}")
    try:
        size = len(raw.encode("utf-8"))
    except UnicodeEncodeError:
        return f"the person's identifier (field {field!r}) is not valid Unicode"
    if size == 0:
        return f"the person's identifier (field {field!r}) is empty"
    if size > MAX_USER_BYTES:
        return (f"the person's identifier (field {field!r}) is {size} bytes long, more than "
                f"{MAX_USER_BYTES}")
    return None


def detect_format(path: str | Path, explicit: str | None = None) -> LogFormat:
    """The log format from ``explicit`` (``"csv"``/``"jsonl"``) or the file suffix."""
    if explicit is not None:
        if explicit not in ("csv", "jsonl"):
            raise ValueError(f"format must be 'csv' or 'jsonl', got {explicit!r}")
        return explicit  # type: ignore[return-value]
    suffix = Path(path).suffix.lower()
    if suffix not in _FORMATS_BY_SUFFIX:
        raise ValueError(
            f"cannot tell the format of {str(path)!r} from its suffix; "
            "use .csv, .jsonl or .ndjson, or pass --format csv|jsonl"
        )
    return _FORMATS_BY_SUFFIX[suffix]


def parse_ts(raw: object) -> float:
    """Event time in Unix seconds from a number, a numeric string or an ISO 8601 string."""
    if isinstance(raw, bool):
        raise ValueError(f"ts must be Unix seconds or ISO 8601, got {raw!r}")
    if isinstance(raw, int | float):
        ts = float(raw)
    elif isinstance(raw, str):
        text = raw.strip()
        try:
            ts = float(text)
        except ValueError:
            try:
                parsed = datetime.fromisoformat(text)
            except ValueError:
                raise ValueError(f"ts must be Unix seconds or ISO 8601, got {raw!r}") from None
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=UTC)
            ts = parsed.timestamp()
    else:
        raise ValueError(f"ts must be Unix seconds or ISO 8601, got {raw!r}")
    if not math.isfinite(ts):
        raise ValueError(f"ts must be finite, got {raw!r}")
    return ts


def _parse_value(raw: object) -> float:
    if raw is None or raw == "":
        return 1.0
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError(f"value must be a number, got {raw!r}")
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(f"value must be finite, got {raw!r}")
    return value


def _parse_key(raw: object) -> str:
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"key must be a non-empty string, got {raw!r}")
    return raw


def read_log(
    path: str | Path,
    fmt: LogFormat | None = None,
    *,
    start_offset: int = 0,
    start_number: int = 0,
    user_field: str | None = None,
    on_bad_user: Callable[[str], None] | None = None,
) -> Iterator[LogRecord]:
    """Yield the log's events with their record numbers and byte offsets.

    ``start_offset``/``start_number`` resume after an earlier read (values from the last
    :class:`LogRecord` consumed); the CSV header is always read from the start of the file.
    Raises :class:`LogFormatError` naming the line for a malformed record.

    ``user_field`` (user-level privacy): every event carries the person's identifier in this
    JSON field (CSV column), read into :attr:`Event.user` (its record key then). A record
    without a valid one (:func:`user_problem`) raises :class:`LogFormatError`, or, with
    ``on_bad_user``, is passed over after ``on_bad_user(message naming the line)`` (to count
    them all). Without ``user_field`` any such field is ignored, as before.
    """
    path = Path(path)
    fmt = fmt or detect_format(path)
    with open(path, "rb") as fh:
        columns: dict[str, int] = {}
        line_no = 0
        if fmt == "csv":
            header = fh.readline()
            line_no = 1
            names = next(csv.reader([header.decode("utf-8-sig")]), [])
            columns = {name.strip().lower(): i for i, name in enumerate(names)}
            missing = {"ts", "key"} - columns.keys()
            if user_field is not None and user_field.lower() not in columns:
                raise LogFormatError(
                    f"{path}:1: CSV header must name the column {user_field} (the person's "
                    f"identifier, user_field of a user-level deployment); got {names!r}")
            if missing:
                raise LogFormatError(
                    f"{path}:1: CSV header must name columns ts and key (optional value); "
                    f"missing {sorted(missing)}, got {names!r}"
                )
        offset = fh.tell()
        if start_offset > offset:
            fh.seek(start_offset)
            offset = start_offset
            line_no = -1  # unknown after a seek; messages then cite the record number
        number = start_number
        for raw_line in fh:
            offset += len(raw_line)
            if line_no >= 0:
                line_no += 1
            text = raw_line.decode("utf-8").strip()
            if not text:
                continue
            number += 1
            where = f"{path}:{line_no}" if line_no >= 0 else f"{path}: record {number}"
            try:
                event = (
                    _parse_csv_line(text, columns, user_field) if fmt == "csv"
                    else _parse_json_line(text, user_field)
                )
            except _BadUser as exc:
                if on_bad_user is None:
                    raise LogFormatError(f"{where}: {exc}") from None
                on_bad_user(f"{where}: {exc}")
                continue
            except (ValueError, KeyError, TypeError) as exc:
                raise LogFormatError(f"{where}: {exc}") from None
            yield LogRecord(number=number, end_offset=offset, event=event)


class _BadUser(ValueError):
    """A record whose person identifier is missing or invalid (:func:`user_problem`)."""


def _with_user(event: Event, raw: object, user_field: str | None) -> Event:
    """``event`` with its person from ``raw`` (``user_field`` given), or as it is."""
    if user_field is None:
        return event
    problem = user_problem(raw, user_field)
    if problem is not None:
        raise _BadUser(problem)
    assert isinstance(raw, str)
    return Event(event.key, event.ts, event.value, event.attrs, raw, user_field)


def _parse_csv_line(text: str, columns: dict[str, int], user_field: str | None = None) -> Event:
    row = text.split(",") if '"' not in text else next(csv.reader([text]))

    def cell(name: str) -> str | None:
        i = columns.get(name)
        return row[i] if i is not None and i < len(row) else None

    ts_raw, key_raw = cell("ts"), cell("key")
    if ts_raw is None or key_raw is None:
        raise ValueError(f"expected columns ts and key, got {len(row)} cells")
    event = Event(key=_parse_key(key_raw), ts=parse_ts(ts_raw), value=_parse_value(cell("value")))
    if user_field is None:
        return event
    # an empty cell is a missing identifier (CSV has no null)
    return _with_user(event, cell(user_field.lower()) or None, user_field)


def _parse_attrs(raw: object) -> str | tuple[str, ...]:
    if isinstance(raw, str) and raw and not raw.strip("01") and len(raw) <= 64:
        return raw
    if isinstance(raw, list) and all(isinstance(a, str) and a for a in raw):
        return tuple(raw)
    raise ValueError(f"attrs must be a string of 0/1 (at most 64) or a list of names, got {raw!r}")


def _parse_json_line(text: str, user_field: str | None = None) -> Event:
    obj = json.loads(text)
    if not isinstance(obj, dict):
        raise ValueError("each JSON line must be an object with key, ts and optional value")
    event = _parse_json_event(obj)
    return _with_user(event, obj.get(user_field), user_field) if user_field else event


def _parse_json_event(obj: dict[str, object]) -> Event:
    if "attrs" in obj:
        key = obj.get("key")
        if key is not None and not isinstance(key, str):
            raise ValueError(f"key must be a string, got {key!r}")
        if obj.get("value", 1) != 1:
            raise ValueError("an event with attrs counts once: omit value or give 1")
        return Event(key=key or "", ts=parse_ts(obj.get("ts")), attrs=_parse_attrs(obj["attrs"]))
    return Event(
        key=_parse_key(obj.get("key")), ts=parse_ts(obj.get("ts")), value=_parse_value(obj.get("value"))
    )


def format_event(event: Event, fmt: LogFormat) -> str:
    """One log line (with newline). Times are written with millisecond precision."""
    if event.attrs is not None:
        if fmt != "jsonl":
            raise ValueError("events with attrs are written as JSON lines only")
        return json.dumps(event.to_message(), separators=(",", ":")) + "\n"
    value = f"{event.value:g}" if event.value != int(event.value) else str(int(event.value))
    if fmt == "csv":
        # the person (if any) is a fourth column, named by the header write_log writes
        person = "" if event.user is None else f",{_csv_cell(event.user)}"
        return f"{event.ts:.3f},{_csv_cell(event.key)},{value}{person}\n"
    person = "" if event.user is None else f",{json.dumps(event.user_field)}:{json.dumps(event.user)}"
    return f'{{"key":{json.dumps(event.key)},"ts":{event.ts:.3f},"value":{value}{person}}}\n'


def _csv_cell(text: str) -> str:
    if any(c in text for c in ',"\n\r'):
        buf = io.StringIO()
        csv.writer(buf, lineterminator="").writerow([text])
        return buf.getvalue()
    return text


def write_log(events: Iterable[Event], out: IO[str], fmt: LogFormat) -> int:
    """Write ``events`` (with a header for CSV) to ``out``; returns the number written.

    Events with a person (:attr:`Event.user`) get a column named by their ``user_field`` in
    CSV (the first event decides the header: all events or none must have one)."""
    if fmt == "csv":
        events = iter(events)
        first = next(events, None)
        person = "" if first is None or first.user is None else f",{_csv_cell(first.user_field)}"
        out.write(f"ts,key,value{person}\n")
        if first is not None:
            events = itertools.chain((first,), events)
    n = 0
    lines: list[str] = []
    for event in events:
        lines.append(format_event(event, fmt))
        if len(lines) >= 4096:
            out.write("".join(lines))
            n += len(lines)
            lines.clear()
    out.write("".join(lines))
    return n + len(lines)
