"""A SyncGroup answer with an empty assignment makes the consumer join again (it used to end
aiokafka's coordination task: the consumer never fetched again and the worker exited)."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.consumer import group_coordinator

from agents.kafka.groups import install_empty_assignment_rejoin


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


async def test_a_refused_offset_commit_of_a_static_member_does_not_rejoin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline_processes = 2 stall (issue #24): a commit refused with IllegalGeneration
    after the member had already rejoined started another rebalance. Inside an offset commit a
    static member neither resets its member id nor requests a rejoin (the heartbeat does);
    outside it, and for dynamic members, aiokafka's behaviour is unchanged."""
    import asyncio

    cls = group_coordinator.GroupCoordinator
    for name in ("_do_commit_offsets", "reset_generation", "request_rejoin"):
        monkeypatch.setattr(cls, name, getattr(cls, name))
    monkeypatch.setattr(cls, "_stream_dp_static_commit", False, raising=False)

    async def refused_commit(self: Any, assignment: Any, offsets: Any) -> None:
        self.reset_generation()  # what aiokafka does on IllegalGeneration / UnknownMemberId
        self.request_rejoin()    # ... and on RebalanceInProgress

    monkeypatch.setattr(cls, "_do_commit_offsets", refused_commit)
    from agents.kafka.groups import install_static_commit_rejoin

    install_static_commit_rejoin()
    install_static_commit_rejoin()  # idempotent

    def member(instance_id: str | None) -> Any:
        coord = object.__new__(cls)
        coord.group_id = "g"
        coord._group_instance_id = instance_id
        coord.generation = 7
        coord.member_id = "m-1"
        coord._rejoin_needed_fut = asyncio.get_running_loop().create_future()
        return coord

    static = member("w1.p0")
    await cls._do_commit_offsets(static, None, {})
    assert (static.generation, static.member_id) == (7, "m-1")
    assert not static._rejoin_needed_fut.done()
    static.reset_generation()  # a heartbeat's UnknownMemberId: as before
    assert static.member_id == "" and static._rejoin_needed_fut.done()

    dynamic = member(None)
    await cls._do_commit_offsets(dynamic, None, {})
    assert dynamic.member_id == "" and dynamic._rejoin_needed_fut.done()


async def test_a_member_of_another_process_with_our_client_id_means_a_shared_worker_id() -> None:
    """After UNKNOWN_MEMBER_ID a static member describes its group: a member with its own
    client id (``<app_id>-<stage>-<worker_id>``) that this process never was belongs to another
    worker with the same worker_id; its own (old) member, members of other workers and a group
    without such a member (an expired session) are not."""
    from types import SimpleNamespace

    from agents.kafka import groups

    def described(*members: tuple[str, str]) -> Any:
        rows = [(m, c, "/10.0.0.1", b"", b"") for m, c in members]
        return SimpleNamespace(groups=[(0, "g", "Stable", "consumer", "roundrobin", rows)])

    class Client:
        _client_id = "app-ingest-w1"

        def __init__(self, answer: Any) -> None:
            self.answer = answer

        async def send(self, node: int, request: Any) -> Any:
            assert type(request).__name__ == "DescribeGroupsRequest"
            return self.answer

    def coordinator(answer: Any) -> Any:
        return SimpleNamespace(_client=Client(answer), coordinator_id=1, group_id="g")

    groups._own_member_ids.add("app-ingest-w1-ours")
    other = ("app-ingest-w1-theirs", "app-ingest-w1")
    assert await groups._held_by_another_process(coordinator(described(other)))
    assert not await groups._held_by_another_process(coordinator(described(
        ("app-ingest-w1-ours", "app-ingest-w1"), ("app-ingest-w2-x", "app-ingest-w2"))))
    assert not await groups._held_by_another_process(coordinator(described()))


def test_worker_id_shared_survives_aiokafkas_copy_and_is_a_kafka_error() -> None:
    """aiokafka copies the error it hands to the consumer's caller, and its fetcher ignores
    only KafkaErrors quietly (anything else: 'Unexpected error in fetcher routine' with a
    traceback)."""
    import copy

    from aiokafka.errors import KafkaError

    from agents.kafka.groups import WorkerIdShared

    exc = WorkerIdShared("app.ingest", "w1", "the broker answered JoinGroupRequest with "
                         "FENCED_INSTANCE_ID")
    again = copy.copy(exc)
    assert isinstance(again, KafkaError) and str(again) == str(exc)
    assert "same worker_id 'w1'" in str(again) and again.group == "app.ingest"



def test_a_pipeline_child_that_finds_its_worker_id_shared_exits_2() -> None:
    """With pipeline_processes = N the worker's status is its child's (docs/operations.md):
    a shared worker_id is exit status 2 there too, not 1."""
    from agents.kafka.groups import WorkerIdShared
    from agents.worker.processes import child_exit_status

    assert child_exit_status(WorkerIdShared("app.ingest", "w1.p0", "FENCED_INSTANCE_ID")) == 2
    assert child_exit_status(RuntimeError("anything else")) == 1
    assert child_exit_status(None) == 0
