"""Event decoding against the published JSON Schema; output messages validate."""

from __future__ import annotations

import json

import jsonschema
import pytest

from agents.kafka.codec import (
    REASONS,
    Event,
    Rejection,
    count_message,
    decode_event,
    dlq_message,
    encode,
    schema,
    validate,
)

CASES: list[tuple[bytes | None, str | None]] = [
    (b'{"key": "a/b", "ts": 12.5, "value": 2}', None),
    (b'{"key": "a/b", "ts": 12}', None),
    (b'{"key": "a/b", "ts": 12, "value": 0, "extra": [1]}', None),
    (b"not json", "malformed_json"),
    (b"\xff\xfe", "malformed_json"),
    (None, "malformed_json"),
    (b"[1, 2]", "invalid_schema"),
    (b'"text"', "invalid_schema"),
    (b'{"ts": 1}', "invalid_schema"),
    (b'{"key": "", "ts": 1}', "invalid_schema"),
    (b'{"key": 5, "ts": 1}', "invalid_schema"),
    (b'{"key": "a", "ts": "yesterday"}', "invalid_schema"),
    (b'{"key": "a", "ts": true}', "invalid_schema"),
    (b'{"key": "a", "ts": 1, "value": "1"}', "invalid_schema"),
    (b'{"key": "a", "ts": 1, "value": false}', "invalid_schema"),
    (b'{"key": "a", "ts": 1, "value": null}', "invalid_schema"),
    (b'{"key": "a", "ts": NaN}', "ts_not_finite"),
    (b'{"key": "a", "ts": 1e999}', "ts_not_finite"),
    (b'{"key": "a", "ts": 1, "value": NaN}', "value_not_finite"),
    (b'{"key": "a", "ts": 1, "value": Infinity}', "value_not_finite"),
    (b'{"key": "a", "ts": 1, "value": -1}', "negative_value"),
    (b'{"key": "a", "ts": 1, "value": 1e300}', "value_out_of_range"),
    (b'{"key": "a", "ts": 1, "value": ' + b"9" * 400 + b"}", "value_out_of_range"),
    (b'{"key": "a", "ts": ' + b"9" * 400 + b"}", "ts_not_finite"),
    (b'{"key": "a", "ts": 1, "pad": "' + b"x" * 5000 + b'"}', "oversize"),
    (b"[" * 100000 + b"]" * 100000, "oversize"),
]


@pytest.mark.parametrize(("raw", "reason"), CASES)
def test_decode_reasons(raw: bytes | None, reason: str | None) -> None:
    got = decode_event(raw, max_bytes=4096, max_value=1e6)
    if reason is None:
        assert isinstance(got, Event)
    else:
        assert isinstance(got, Rejection) and got.reason == reason
        assert got.reason in REASONS


@pytest.mark.parametrize(("raw", "reason"), CASES)
def test_fast_path_agrees_with_json_schema(raw: bytes | None, reason: str | None) -> None:
    """Whatever the schema rejects, the decoder rejects (the decoder adds range checks)."""
    if raw is None or len(raw) > 4096:
        return
    try:
        obj = json.loads(raw)
    except ValueError:
        return
    try:
        validate("dp.events.v1", obj)
        schema_ok = True
    except jsonschema.ValidationError:
        schema_ok = False
    decoded = decode_event(raw, max_bytes=4096, max_value=1e6)
    if not schema_ok:
        assert isinstance(decoded, Rejection)
    if isinstance(decoded, Event):
        assert schema_ok


def test_deep_nesting_never_raises() -> None:
    got = decode_event(b"[" * 3000 + b"]" * 3000, max_bytes=10**6, max_value=1e6)
    assert isinstance(got, Rejection)


def test_value_defaults_to_one() -> None:
    ev = decode_event(b'{"key": "k", "ts": 3}', max_bytes=100, max_value=10)
    assert ev == Event("k", 3.0, 1.0)


def test_count_and_dlq_messages_validate() -> None:
    msg = count_message(
        stream="all", tick=3, tick_start=20.0, tick_end=30.0, value=-1.25, stderr=2.0,
        strategy="dmfda", p=0.9, privacy={"model": "pure", "epsilon": 1.0}, cap=1.0, horizon=1023,
    )
    validate("dp.counts.v1", msg)
    assert json.loads(encode(msg)) == msg
    with pytest.raises(jsonschema.ValidationError):
        validate("dp.counts.v1", {**msg, "tick": 0})
    raw = b'{"key": "a", "ts": 1, "value": -1}' + b"\xff" * 5000
    d = dlq_message(Rejection("negative_value", "x"), raw, "dp.events.v1", 2, 17)
    validate("dp.events.dlq", d)
    assert len(d["raw"]) <= 4096
    with pytest.raises(ValueError):
        encode({"v": float("nan")})


def test_schemas_ship_with_the_package() -> None:
    for name in ("dp.events.v1", "dp.counts.v1", "dp.histograms.v1", "dp.events.dlq"):
        s = schema(name)
        jsonschema.Draft202012Validator.check_schema(s)
        assert name in s["$id"]
    assert set(schema("dp.events.dlq")["properties"]["reason"]["enum"]) == set(REASONS)
