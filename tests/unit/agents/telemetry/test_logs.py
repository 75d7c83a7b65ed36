"""JSON logs: one object per line with the documented fields; the noise key and raw counts never
appear in any output, whatever a caller passes."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import numpy as np
import pytest

from agents.telemetry.logs import (
    REDACTED,
    JsonFormatter,
    PrivacyFilter,
    clear_secrets,
    configure_logging,
    make_handler,
    parse_level,
    register_secret,
)

SECRET = bytes(range(100, 132))  # a 32-byte key


@pytest.fixture()
def capture() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    buf = io.StringIO()
    handler = make_handler(buf)
    logger = logging.getLogger("test.agents.logs")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    clear_secrets()
    try:
        yield logger, buf
    finally:
        logger.removeHandler(handler)
        clear_secrets()


def _lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_one_json_object_per_line_with_fields(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buf = capture
    logger.info("tick %d released", 7, extra={"tick": 7, "streams": 120, "latency_s": 0.25})
    logger.warning("multi\nline message")
    rows = _lines(buf)
    assert len(rows) == 2
    first = rows[0]
    assert first["msg"] == "tick 7 released"
    assert first["level"] == "info"
    assert first["logger"] == "test.agents.logs"
    assert isinstance(first["ts"], str) and first["ts"].endswith("Z")
    assert (first["tick"], first["streams"], first["latency_s"]) == (7, 120, 0.25)
    assert rows[1]["msg"] == "multi\nline message"


def test_exception_is_a_field(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buf = capture
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("failed")
    (row,) = _lines(buf)
    assert "RuntimeError: boom" in str(row["exc"])


def test_registered_key_never_logged_in_any_form(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, buf = capture
    register_secret(SECRET)
    logger.info("key is %s", SECRET.hex())
    logger.info("key bytes %r", SECRET)
    logger.info("plain", extra={"config": {"nested": SECRET.hex().upper()}, "note": [SECRET.hex()]})
    try:
        raise ValueError(f"bad key {SECRET.hex()}")
    except ValueError:
        logger.exception("oops")
    out = buf.getvalue()
    assert SECRET.hex() not in out
    assert SECRET.hex().upper() not in out
    assert repr(SECRET)[2:-1] not in out
    assert out.count(REDACTED) >= 5
    assert len(_lines(buf)) == 4


def test_raw_count_fields_and_arrays_redacted(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buf = capture
    raw = np.array([31415926.0, 27182818.0])
    logger.info(
        "tick",
        extra={"counts": [31415926], "true_value": 27182818, "values": raw, "noise_key": b"k" * 16,
               "tick": 3},
    )
    out = buf.getvalue()
    (row,) = _lines(buf)
    assert "31415926" not in out and "27182818" not in out
    assert row["counts"] == row["true_value"] == row["values"] == row["noise_key"] == REDACTED
    assert row["tick"] == 3


def test_filter_keeps_unrelated_text(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buf = capture
    register_secret(SECRET)
    logger.info("released", extra={"stream": "eu/fr/paris", "value": 12.5, "stderr": 3.1})
    (row,) = _lines(buf)
    assert (row["stream"], row["value"], row["stderr"]) == ("eu/fr/paris", 12.5, 3.1)


def test_configure_logging_routes_root_through_the_filter() -> None:
    buf = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        handler = configure_logging("warn", buf)
        assert any(isinstance(f, PrivacyFilter) for f in handler.filters)
        assert isinstance(handler.formatter, JsonFormatter)
        register_secret("correct horse battery staple")
        logging.getLogger("some.library").warning("secret=correct horse battery staple")
        logging.getLogger("some.library").info("not shown")
        (row,) = _lines(buf)
        assert row["msg"] == f"secret={REDACTED}"
    finally:
        clear_secrets()
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])


def test_parse_level() -> None:
    assert parse_level("WARN") == logging.WARNING
    assert parse_level(10) == 10
    with pytest.raises(ValueError, match="log level must be one of"):
        parse_level("loud")


def test_plain_logs_show_the_extra_fields_like_json_logs() -> None:
    import io

    from agents.telemetry.logs import make_handler

    out = io.StringIO()
    logger = logging.getLogger("test.plain.extras")
    logger.propagate = False
    handler = make_handler(out, json_lines=False)
    logger.addHandler(handler)
    try:
        logger.warning("worker started", extra={"privacy": {"total_epsilon": 3.0}, "streams": 7})
    finally:
        logger.removeHandler(handler)
    line = out.getvalue()
    assert "worker started" in line and "streams=7" in line and "total_epsilon" in line


async def test_orphaned_producer_fenced_futures_print_nothing() -> None:
    """A second worker with the same worker_id (or a partition that moved) fences this one's
    transactional producers; aiokafka fails internal futures nobody awaits and asyncio printed
    each with a traceback. Those lines are dropped; any other such error is still printed."""
    import asyncio
    import gc
    import io
    import logging

    from agents.telemetry.logs import make_handler

    class ProducerFenced(Exception):  # aiokafka.errors.ProducerFenced, by name
        pass

    out = io.StringIO()
    logger = logging.getLogger("asyncio")
    handler = make_handler(out, rate_limit=False)
    logger.addHandler(handler)
    try:
        loop = asyncio.get_running_loop()
        for exc in (ProducerFenced("newer producer"), ValueError("something else")):
            fut = loop.create_future()
            fut.set_exception(exc)
            del fut
            gc.collect()
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert "ProducerFenced" not in text and "ValueError" in text, text
