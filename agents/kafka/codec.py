"""Wire formats: decode and validate events, encode counts and dead letters, JSON Schemas.

The JSON Schemas in ``agents/schemas/`` (shipped with the package) are the published contract;
:func:`schema` loads one and :func:`validate` checks a message against it with ``jsonschema``.
The hot path (:func:`decode_event`) is a hand-written check equivalent to
``dp.events.v1.json`` (a unit test runs both on the same inputs), because ``jsonschema`` costs
tens of microseconds per message.

Rejection reasons (the ``reason`` of ``dp.events.dlq``):

| reason | cause |
|---|---|
| ``oversize`` | message larger than ``max_message_bytes`` |
| ``malformed_json`` | not UTF-8 JSON |
| ``invalid_schema`` | not an object, ``key`` not a non-empty string, ``ts``/``value`` not numbers |
| ``ts_not_finite`` | ``ts`` NaN or infinite |
| ``value_not_finite`` | ``value`` NaN or infinite |
| ``negative_value`` | ``value`` < 0 |
| ``value_out_of_range`` | ``value`` > ``max_event_value`` |
| ``unknown_key`` | key not declared in the domain (never creates a stream) |
| ``before_origin`` | ``ts`` before the start of tick 1 |
| ``future`` | ``ts`` more than ``max_future_skew_s`` ahead of the record's Kafka timestamp |
| ``too_old`` | record timestamp more than ``max_event_age_s`` after ``ts`` (if enabled) |
| ``no_timestamp`` | the record has no Kafka timestamp (-1, or none in message format v0; clock schedule) |
| ``late`` | the record's timestamp is at or after its tick's deadline (tick end + lateness) |
| ``tick_closed`` | the event's tick closed before the record's offset (its release is out) |
| ``value_not_integer`` | a fractional ``value`` with the ``naive-int`` strategy (whole numbers only) |
| ``invalid_attributes`` | binary-attribute domain: ``attrs`` missing, not ``m`` characters 0/1, or a list with an undeclared name |
| ``value_not_one`` | binary-attribute domain: a ``value`` other than 1 (every event counts once) |
| ``forged_marker`` | markers schedule: a record with the close header whose MAC does not verify |
| ``marker_ahead`` | markers schedule: an authentic close marker for ticks whose deadline + grace has not passed on the worker's clock |
| ``unexpected_marker`` | clock schedule: a record with the close header (markers are not schedule input there) |
| ``invalid_user`` | ``privacy_unit = user``: the ``user_field`` identifier missing, null, not a string, empty or over 256 UTF-8 bytes |
| ``wrong_partition`` | ``privacy_unit = user``: Kafka's default partitioner puts the identifier on another events partition than the record's |

``late`` and ``tick_closed`` are decided from the record itself and from the partition's public
closing points (:mod:`agents.ingest.ticks`), never from other events.

**Close markers** (``schedule = "markers"``, written by ``stream-dp replay``): a record with the
header ``stream-dp-close`` and the value
``{"schema": "dp.close.v2", "time": T, "final": bool, "mac": hex}`` closes every tick whose
deadline (end + allowed lateness) is ``≤ T`` (final: every tick up to the one containing ``T``).
The MAC (HMAC-SHA256 under a key derived from the noise key, bound to the events topic and
partition) is checked: anything else with the header is dead-lettered (``forged_marker``). Markers
are not events; on a clock-schedule deployment they are dead-lettered (``unexpected_marker``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, NamedTuple

__all__ = [
    "CLOSE_HEADER",
    "DLQ_KEY_LIMIT",
    "MARKER_PURPOSE",
    "REASONS",
    "Event",
    "Rejection",
    "close_marker",
    "count_message",
    "decode_attribute_event",
    "decode_event",
    "dlq_key",
    "dlq_message",
    "encode",
    "marker_key",
    "parse_close_marker",
    "schema",
    "validate",
]

REASONS = (
    "oversize",
    "malformed_json",
    "invalid_schema",
    "ts_not_finite",
    "value_not_finite",
    "negative_value",
    "value_out_of_range",
    "unknown_key",
    "before_origin",
    "future",
    "too_old",
    "no_timestamp",
    "late",
    "tick_closed",
    "value_not_integer",
    "invalid_attributes",
    "value_not_one",
    "forged_marker",
    "marker_ahead",
    "unexpected_marker",
    "invalid_user",
    "wrong_partition",
)

#: Kafka header that marks a close marker record (see the module docstring)
CLOSE_HEADER = "stream-dp-close"
CLOSE_SCHEMA = "dp.close.v2"
#: the purpose under which the close markers' MAC key is derived from the noise key
MARKER_PURPOSE = "close marker"


def marker_key(secret: bytes) -> bytes:
    """The 32-byte MAC key of close markers, derived from the noise ``secret``
    (:func:`stream_dp.integrity.derive_key`; the noise key itself never signs anything)."""
    from stream_dp.integrity import derive_key

    return derive_key(secret, MARKER_PURPOSE)


def _marker_mac(mac_key: bytes, topic: str, partition: int, time: float, final: bool) -> str:
    import hashlib
    import hmac

    msg = b"%s|%s|%d|%s|%d" % (CLOSE_SCHEMA.encode(), topic.encode("utf-8"), partition,
                               float(time).hex().encode(), int(final))
    return hmac.new(mac_key, msg, hashlib.sha256).hexdigest()


def close_marker(time: float, final: bool, *, mac_key: bytes, topic: str, partition: int
                 ) -> tuple[list[tuple[str, bytes]], bytes]:
    """``(headers, value)`` of a close marker at event time ``time`` (Unix seconds) for
    ``partition`` of the events topic ``topic``, authenticated with ``mac_key``
    (:func:`marker_key` of the deployment's noise key). The MAC binds the marker to the topic
    and the partition, so a marker copied to another partition or topic is refused."""
    if not math.isfinite(time):
        raise ValueError(f"close marker time must be finite, got {time!r}")
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise ValueError(f"partition must be an integer >= 0, got {partition!r}")
    mac = _marker_mac(mac_key, topic, partition, float(time), bool(final))
    value = json.dumps({"schema": CLOSE_SCHEMA, "time": float(time), "final": bool(final),
                        "mac": mac}, separators=(",", ":")).encode()
    return [(CLOSE_HEADER, b"1")], value


def parse_close_marker(raw: bytes | None, *, mac_key: bytes, topic: str, partition: int
                       ) -> tuple[float, bool] | Rejection:
    """``(time, final)`` of an authentic close marker for ``partition`` of ``topic``, else a
    :class:`Rejection` (``forged_marker``: not a marker of this schema, or its MAC does not
    verify under ``mac_key`` for this topic and partition)."""
    import hmac

    def forged(why: str) -> Rejection:
        return Rejection("forged_marker", why)

    if raw is None or len(raw) > 1024:
        return forged("a close header on a record that is not a close marker")
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return forged("a close header on a record that is not JSON")
    if not isinstance(d, dict) or d.get("schema") != CLOSE_SCHEMA:
        return forged(f"a close header on a record that is not a {CLOSE_SCHEMA} marker")
    t, final, mac = d.get("time"), d.get("final", False), d.get("mac")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
        return forged("a close marker without a finite time")
    if not isinstance(final, bool) or not isinstance(mac, str):
        return forged("a close marker without final flag or MAC")
    want = _marker_mac(mac_key, topic, partition, float(t), final)
    if not hmac.compare_digest(want, mac):
        return forged("the close marker's MAC does not verify (not written by stream-dp replay "
                      "with this deployment's key for this topic and partition)")
    return float(t), final

_RAW_LIMIT = 4096
_raw_decode = json.JSONDecoder().raw_decode
_WS = " \t\n\r"


def _loads(raw: bytes) -> Any:
    """``json.loads`` for UTF-8 bytes without its per-call encoding detection (hot path)."""
    text = raw.decode("utf-8")
    start = 0
    n = len(text)
    while start < n and text[start] in _WS:
        start += 1
    obj, end = _raw_decode(text, start)
    if end != n and text[end:].strip(_WS):
        raise ValueError(f"extra data after the JSON value at char {end}")
    return obj


class Event(NamedTuple):
    """A decoded, validated event: ``key``, event time ``ts`` (Unix s), ``value`` (≥ 0, finite)."""

    key: str
    ts: float
    value: float


_new_event = tuple.__new__


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a message was rejected: one of :data:`REASONS`, plus a human-readable detail."""

    reason: str
    detail: str


def _json_object(raw: bytes | None, max_bytes: int) -> Any:
    """The message as a JSON object, or the :class:`Rejection` saying why it is not one."""
    if raw is None:
        return Rejection("malformed_json", "empty message value")
    if len(raw) > max_bytes:
        return Rejection("oversize", f"{len(raw)} bytes > max_message_bytes={max_bytes}")
    try:
        obj = _loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return Rejection("malformed_json", str(exc)[:200])
    except RecursionError:
        return Rejection("malformed_json", "nesting too deep")
    if type(obj) is not dict:
        return Rejection("invalid_schema", f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _event_time(obj: dict[str, Any]) -> Any:
    """The finite event time ``ts`` (float seconds), or a :class:`Rejection`."""
    ts = obj.get("ts")
    tt = type(ts)
    if tt is not float and tt is not int:
        return Rejection("invalid_schema", "ts must be a number (Unix seconds)")
    try:
        ts = float(ts)  # type: ignore[arg-type]
    except OverflowError:
        return Rejection("ts_not_finite", "ts does not fit a float")
    if not math.isfinite(ts):
        return Rejection("ts_not_finite", f"ts={ts!r}")
    return ts


def decode_event(raw: bytes | None, max_bytes: int, max_value: float) -> Event | Rejection:
    """Decode one ``dp.events.v1`` message value; never raises on bad input.

    ``value`` defaults to 1; it must be finite, ≥ 0 and ≤ ``max_value`` (clamping to the cap is
    the ingest stage's job, so that the clamped amount can be counted in a metric).
    """
    obj = _json_object(raw, max_bytes)
    if type(obj) is Rejection:
        return obj
    key = obj.get("key")
    if type(key) is not str or not key or len(key) > 1024:
        return Rejection("invalid_schema", "key must be a non-empty string of at most 1024 chars")
    ts = _event_time(obj)
    if type(ts) is Rejection:
        return ts
    value = obj.get("value", 1.0)
    tv = type(value)
    if tv is not float and tv is not int:
        return Rejection("invalid_schema", "value must be a number")
    try:
        value = float(value)
    except OverflowError:
        return Rejection("value_out_of_range", "value does not fit a float")
    if not math.isfinite(value):
        return Rejection("value_not_finite", f"value={value!r}")
    if value < 0.0:
        return Rejection("negative_value", f"value={value!r} < 0")
    if value > max_value:
        return Rejection("value_out_of_range", f"value={value!r} > max_event_value={max_value!r}")
    return _new_event(Event, (key, ts, value))


def decode_attribute_event(raw: bytes | None, max_bytes: int, domain: Any) -> Any:
    """Decode one event of a binary-attribute domain (``dp.events.v1`` with ``attrs``);
    never raises on bad input.

    Returns ``(pattern, ts)`` — ``pattern`` with bit ``i`` set when attribute ``i`` is 1 — or a
    :class:`Rejection`. ``attrs`` is a string of ``m`` characters ``0``/``1`` or the list of the
    names of the event's 1-attributes; ``key`` is optional (any string); ``value`` must be absent
    or 1.
    """
    obj = _json_object(raw, max_bytes)
    if type(obj) is Rejection:
        return obj
    key = obj.get("key")
    if key is not None and (type(key) is not str or len(key) > 1024):
        return Rejection("invalid_schema", "key, when given, must be a string of at most 1024 chars")
    ts = _event_time(obj)
    if type(ts) is Rejection:
        return ts
    if "value" in obj:
        value = obj["value"]
        if type(value) not in (int, float) or value != 1:
            return Rejection("value_not_one", f"value={value!r}: a binary-attribute event counts "
                             "once (omit value or give 1)")
    attrs = obj.get("attrs")
    if type(attrs) is list and not all(type(a) is str for a in attrs):
        return Rejection("invalid_attributes", "attrs as a list holds attribute names (strings)")
    if type(attrs) is not str and type(attrs) is not list:
        return Rejection("invalid_attributes",
                         f"attrs must be a string of {domain.m} characters 0/1 or a list of "
                         "attribute names")
    try:
        pattern = domain.pattern(attrs)
    except ValueError as exc:
        return Rejection("invalid_attributes", str(exc)[:200])
    return (pattern, ts)


def encode(obj: Any) -> bytes:
    """Compact UTF-8 JSON; floats use ``repr`` (shortest round-trip), so re-encoding the same
    value gives the same bytes. NaN/inf are refused (``ValueError``)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


def count_message(
    *,
    stream: str,
    tick: int,
    tick_start: float,
    tick_end: float,
    value: float,
    stderr: float,
    strategy: str,
    p: float,
    privacy: dict[str, Any],
    cap: float,
    horizon: int,
) -> dict[str, Any]:
    """One ``dp.counts.v1`` value (a subscriber needs nothing else to interpret it)."""
    return {
        "stream": stream,
        "tick": int(tick),
        "tick_start": float(tick_start),
        "tick_end": float(tick_end),
        "value": float(value),
        "stderr": float(stderr),
        "strategy": strategy,
        "p": float(p),
        "privacy": privacy,
        "cap": float(cap),
        "horizon": int(horizon),
        "schema": "dp.counts.v1",
    }


#: the most bytes of a rejected record's Kafka key a dead letter keeps (its start): a key of
#: nearly the events topic's ``max.message.bytes`` copied whole, plus the dead letter's JSON
#: value, would exceed the dead-letter topic's limit, and the broker would refuse the ingest
#: transaction for good (one writer's record stopping every release, DESIGN.md §2 rule 7)
DLQ_KEY_LIMIT = 1024


def dlq_key(key: bytes | None) -> bytes | None:
    """The Kafka key of a dead letter: the rejected record's key, cut to its first
    :data:`DLQ_KEY_LIMIT` bytes (``None`` stays ``None``)."""
    return key if key is None or len(key) <= DLQ_KEY_LIMIT else bytes(key[:DLQ_KEY_LIMIT])


def dlq_message(
    rejection: Rejection, raw: bytes | None, topic: str, partition: int, offset: int
) -> dict[str, Any]:
    """One ``dp.events.dlq`` value: reason, detail, origin and the (truncated) raw bytes."""
    text = (raw or b"")[:_RAW_LIMIT].decode("utf-8", errors="replace")
    return {
        "reason": rejection.reason,
        "detail": rejection.detail[:1000],
        "topic": topic,
        "partition": int(partition),
        "offset": int(offset),
        "raw": text[:_RAW_LIMIT],
        "schema": "dp.events.dlq",
    }


@cache
def schema(name: str) -> dict[str, Any]:
    """The JSON Schema ``agents/schemas/<name>.json`` (e.g. ``"dp.counts.v1"``)."""
    text = resources.files("agents").joinpath("schemas", f"{name}.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def validate(name: str, obj: Any) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``obj`` matches schema ``name``."""
    import jsonschema  # type: ignore[import-untyped]

    jsonschema.validate(obj, schema(name), cls=jsonschema.Draft202012Validator)
