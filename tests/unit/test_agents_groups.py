"""A SyncGroup answer with an empty assignment makes the consumer join again (it used to end
aiokafka's coordination task: the consumer never fetched again and the worker exited)."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.consumer import group_coordinator

from agents.groups import install_empty_assignment_rejoin


async def test_an_empty_assignment_is_a_failed_join_and_others_pass_through(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cls = group_coordinator.CoordinatorGroupRebalance
    answers: list[Any] = [("roundrobin", b""), ("roundrobin", b"\x00\x00\x00\x00"), None]

    async def join(self: Any) -> Any:
        return answers.pop(0)

    monkeypatch.setattr(cls, "perform_group_join", join)
    monkeypatch.setattr(cls, "_stream_dp_empty_assignment", False, raising=False)
    install_empty_assignment_rejoin()
    install_empty_assignment_rejoin()  # idempotent: wrapped once
    rebalance = object.__new__(cls)
    rebalance.group_id = "g"
    assert await cls.perform_group_join(rebalance) is None  # back off, join again
    assert await cls.perform_group_join(rebalance) == ("roundrobin", b"\x00\x00\x00\x00")
    assert await cls.perform_group_join(rebalance) is None  # aiokafka's own failed join
    assert answers == []
