"""A step-down during the reconcile leader's start-up lets the start-up finish (bounded) before the
cancellation takes effect: aiokafka leaves a connection whose handshake is cancelled half way
unclosed ('Unclosed AIOKafkaConnection' at error level on a clean stop)."""

from __future__ import annotations

import asyncio

import pytest

from agents.kafka.reading import finish_before_cancel


async def test_a_cancelled_caller_waits_for_the_start_up_then_is_cancelled() -> None:
    steps: list[str] = []

    async def start_up() -> int:
        steps.append("begin")
        await asyncio.sleep(0.2)  # a handshake in flight
        steps.append("end")
        return 7

    caller = asyncio.ensure_future(finish_before_cancel(start_up(), 5.0))
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert steps == ["begin", "end"]  # finished although its caller was cancelled


async def test_a_start_up_that_hangs_is_cancelled_after_the_grace() -> None:
    cancelled = asyncio.Event()

    async def hangs() -> int:
        try:
            await asyncio.sleep(3600)  # broker unreachable
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 0

    caller = asyncio.ensure_future(finish_before_cancel(hangs(), 0.1))
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(caller, 5.0)
    assert cancelled.is_set()


async def test_without_a_cancellation_the_result_is_returned() -> None:
    async def quick() -> str:
        return "tps"

    assert await finish_before_cancel(quick(), 1.0) == "tps"
