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

from agents.kafka.stage import _Stage as Stage


def _stage() -> tuple[Any, list[int]]:
    """A Stage (no Kafka) whose partition 3 is no longer assigned: _recover drops it and stops."""
    dropped: list[int] = []

    async def drop(p: int) -> None:
        dropped.append(p)

    stage = object.__new__(Stage)
    stage.topic = "partials"
    stage.consumer = SimpleNamespace(assignment=lambda: set())
    stage._drop = drop
    stage._bug_failures = {}
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


def test_the_same_bug_three_times_in_a_row_stops_the_worker_instead_of_looping() -> None:
    """A deterministic failure (the attributes demo's UFuncTypeError) used to restore and fail
    again for ever, releasing nothing; the third identical failure in a row stops the worker
    with one error naming it, a committed transaction in between resets the count."""
    stage, dropped = _stage()
    failed: list[BaseException] = []
    reasons: list[str] = []
    stage.name = "release"
    stage._bug_failures = {}
    stage._offsets_at = {}
    stage.w = SimpleNamespace(fail=failed.append, release_error=reasons.append)

    def bug() -> TypeError:
        return TypeError("cells are int64")

    asyncio.run(stage._recover(3, bug()))
    asyncio.run(stage._recover(3, bug()))
    assert not failed and dropped == [3, 3]
    stage._bug_failures.pop(3, None)  # what a committed transaction does (offsets_committed_later)
    asyncio.run(stage._recover(3, bug()))
    asyncio.run(stage._recover(3, bug()))
    asyncio.run(stage._recover(3, ValueError("another bug")))  # a different error: count anew
    asyncio.run(stage._recover(3, bug()))
    assert not failed
    asyncio.run(stage._recover(3, bug()))
    asyncio.run(stage._recover(3, bug()))
    from agents.kafka.stage import CommitBug

    assert len(failed) == 1 and reasons == ["commit_bug"] and isinstance(failed[0], CommitBug)
    msg = str(failed[0])
    assert "release partition 3: commit failed 3 times in a row with TypeError: cells are int64" \
        in msg and "bug" in msg


def test_kafka_failures_never_count_as_a_bug() -> None:
    from aiokafka.errors import KafkaTimeoutError

    stage, _ = _stage()
    failed: list[BaseException] = []
    stage._bug_failures = {}
    stage.w = SimpleNamespace(fail=failed.append, release_error=lambda r: None)
    for _ in range(10):
        asyncio.run(stage._recover(3, KafkaTimeoutError("no answer")))
    assert not failed


def test_the_worker_reports_a_commit_bug_in_one_line_exit_1(
        caplog: pytest.LogCaptureFixture) -> None:
    from agents.commands.worker import _report_failure
    from agents.kafka.stage import CommitBug

    with caplog.at_level(logging.ERROR):
        code = _report_failure("release", CommitBug("release partition 3: commit failed 3 times"))
    assert code == 1
    (rec,) = caplog.records
    assert rec.getMessage() == "stopping: release partition 3: commit failed 3 times"
    assert rec.exc_info is None


def test_network_errors_and_errors_raised_inside_aiokafka_never_count_as_a_bug() -> None:
    stage, _ = _stage()
    failed: list[BaseException] = []
    stage.w = SimpleNamespace(fail=failed.append, release_error=lambda r: None)
    for _ in range(5):
        asyncio.run(stage._recover(3, ConnectionResetError("reset by peer")))
        asyncio.run(stage._recover(3, TimeoutError()))
    import aiokafka.util

    def inside_aiokafka() -> None:  # an AssertionError whose last frame is aiokafka's code
        code = compile("assert False, 'internal'", aiokafka.util.__file__, "exec")
        exec(code, {})

    for _ in range(5):
        try:
            inside_aiokafka()
        except AssertionError as exc:
            asyncio.run(stage._recover(3, exc))
    assert not failed


def test_a_fenced_transaction_is_not_fenced_back_even_when_its_records_say_so() -> None:
    """A zombie's records fail with ProducerFenced inside TransactionRecordFailed (a checked
    transaction); restoring the partition would start a new transactional producer and fence
    the worker that owns it now (seen in CI: the surviving worker of a shared worker_id fenced
    by the stopping one)."""
    from aiokafka.errors import ProducerFenced

    from agents.kafka.checked_producer import TransactionRecordFailed

    stage, dropped = _stage()
    restored: list[Any] = []

    async def restore(tp: Any) -> None:
        restored.append(tp)

    stage._try_restore = restore
    stage.consumer = SimpleNamespace(assignment=lambda: {_tp("partials", 3)})
    asyncio.run(stage._recover(3, TransactionRecordFailed("4 of 4 records", [ProducerFenced()])))
    assert dropped == [3] and restored == []
    asyncio.run(stage._recover(3, TransactionRecordFailed("1 of 4 records", [ValueError("x")])))
    assert restored == [_tp("partials", 3)]


def _tp(topic: str, p: int) -> Any:
    from aiokafka.structs import TopicPartition

    return TopicPartition(topic, p)
