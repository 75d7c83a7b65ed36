"""A failed commit's log line (``Stage._recover``) without Kafka: a broker-side failure is one
line; any other exception (a bug in a step or an encoder) carries its message and traceback.

The attributes demo once failed intermittently with only 'commit failed (UFuncTypeError)' in the
worker log, which named neither the line nor the cause."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from agents.stage import _Stage as Stage


def _stage() -> tuple[Any, list[int]]:
    """A Stage (no Kafka) whose partition 3 is no longer assigned: _recover drops it and stops."""
    dropped: list[int] = []

    async def drop(p: int) -> None:
        dropped.append(p)

    stage = object.__new__(Stage)
    stage.topic = "partials"
    stage.consumer = SimpleNamespace(assignment=lambda: set())
    stage._drop = drop
    return stage, dropped


def _step_bug() -> None:
    raise TypeError("cells are int64")  # stands for a release step's bug


def test_a_non_kafka_failure_logs_its_message_and_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    stage, dropped = _stage()
    try:
        _step_bug()
    except TypeError as exc:
        err = exc
    with caplog.at_level(logging.WARNING, logger="stream_dp.pipeline"):
        asyncio.run(stage._recover(3, err))
    assert dropped == [3]
    (rec,) = caplog.records
    assert rec.getMessage() == ("stage partition 3: commit failed (TypeError: cells are int64); "
                                "restoring from checkpoint")
    assert rec.exc_info is not None and rec.exc_info[1] is err
    assert "_step_bug" in caplog.text  # the traceback names the failing function


def test_a_kafka_failure_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    from aiokafka.errors import KafkaTimeoutError

    stage, dropped = _stage()
    with caplog.at_level(logging.WARNING, logger="stream_dp.pipeline"):
        asyncio.run(stage._recover(3, KafkaTimeoutError("no answer")))
    assert dropped == [3]
    (rec,) = caplog.records
    assert rec.getMessage() == ("stage partition 3: commit failed (KafkaTimeoutError: no answer); "
                                "restoring from checkpoint")
    assert rec.exc_info is None
