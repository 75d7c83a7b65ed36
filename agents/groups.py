"""Consumer-group helpers that aiokafka lacks."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


async def leave_group(bootstrap: str, group: str, member_id: str, security: Any = None) -> None:
    """Send LeaveGroup for a static member, so the group rebalances at once (best effort).

    aiokafka never sends LeaveGroup for static members (``group_instance_id``): without it a
    gracefully stopped worker's partitions wait for its session timeout, and on noida-db 0.2.3
    forever. If it fails, the session timeout still moves the partitions eventually.
    """
    if not member_id:
        return
    from aiokafka.client import AIOKafkaClient, CoordinationType
    from aiokafka.protocol.group import LeaveGroupRequest

    from agents.security import client_kwargs

    client = AIOKafkaClient(bootstrap_servers=bootstrap, **client_kwargs(security))
    try:
        await client.bootstrap()
        node = await client.coordinator_lookup(CoordinationType.GROUP, group)
        await client.send(node, LeaveGroupRequest(group, member_id))
    except Exception as exc:
        log.warning("LeaveGroup failed", extra={"group": group, "error": type(exc).__name__})
    finally:
        await client.close()


def install_empty_assignment_rejoin() -> None:
    """Make every aiokafka group consumer of the process join again when the coordinator answers
    SyncGroup with an empty assignment, instead of dying. Idempotent.

    noida-db 0.2.3 sends zero assignment bytes when members join at once or the group leader
    is killed mid-rebalance (Kafka's coordinator does the same when a leader's SyncGroup did not
    cover a member). aiokafka fails to decode them and its coordination task ends with a
    ``KafkaError``: the consumer never fetches again and the worker exits (seen in the kill -9
    of the group leader test). Treated as a failed join: back off, join again.
    """
    from aiokafka.consumer import group_coordinator

    cls = group_coordinator.CoordinatorGroupRebalance
    if getattr(cls, "_stream_dp_empty_assignment", False):
        return
    join = cls.perform_group_join

    async def perform_group_join(self: Any) -> Any:
        got = await join(self)
        if got is not None and not got[1]:
            log.warning("group %s: the coordinator sent an empty assignment; joining again",
                        self.group_id)
            return None
        return got

    cls.perform_group_join = perform_group_join
    cls._stream_dp_empty_assignment = True


_in_offset_commit: Any = None  # a ContextVar, created on first install


def install_static_commit_rejoin() -> None:
    """An OffsetCommit of a static member (``group_instance_id``) refused with
    ``IllegalGeneration``, ``UnknownMemberId`` or ``RebalanceInProgress`` no longer makes it
    join the group again: the heartbeat finds out about a rebalance (or a member id that is
    really unknown) within a heartbeat interval and rejoins then, once. Idempotent.

    The cause of the ``pipeline_processes = 2`` readiness stall (issue #24): the workers commit
    the group's offsets in the background, about once a second per partition. When the second
    child joins, a commit in flight with the old generation is refused; aiokafka then requests a
    rejoin (and for ``IllegalGeneration`` resets the member id) — but the response often arrives
    after the member has already rejoined for the new generation, so it starts yet another
    rebalance while the new child is between JoinGroup and SyncGroup. noida-db 0.2.3 then holds
    that child's SyncGroup until the rebalance timeout (30 s) and answers it with an empty
    assignment (Kafka answers ``RebalanceInProgress`` at once); the child's rejoin starts another
    rebalance whose commits fail the same way: the group flips for minutes, every commit fails
    and readiness never comes. Heartbeat and join errors are handled as before.
    """
    import contextvars

    from aiokafka.consumer import group_coordinator

    global _in_offset_commit
    cls = group_coordinator.GroupCoordinator
    if getattr(cls, "_stream_dp_static_commit", False):
        return
    if _in_offset_commit is None:
        _in_offset_commit = contextvars.ContextVar("stream_dp_in_offset_commit", default=False)
    flag = _in_offset_commit
    commit = cls._do_commit_offsets
    reset = cls.reset_generation
    rejoin = cls.request_rejoin

    async def _do_commit_offsets(self: Any, assignment: Any, offsets: Any) -> Any:
        token = flag.set(bool(getattr(self, "_group_instance_id", None)))
        try:
            return await commit(self, assignment, offsets)
        finally:
            flag.reset(token)

    def reset_generation(self: Any) -> None:
        if flag.get():
            log.debug("group %s: offset commit refused; the heartbeat will rejoin if needed",
                      self.group_id)
            return
        reset(self)

    def request_rejoin(self: Any) -> None:
        if flag.get():
            return
        rejoin(self)

    cls._do_commit_offsets = _do_commit_offsets
    cls.reset_generation = reset_generation
    cls.request_rejoin = request_rejoin
    cls._stream_dp_static_commit = True


class _FencingDetector(logging.Handler):
    """Counts the client library's 'member id not recognized' records: a static member whose
    membership is taken over again and again shares its ``worker_id`` with another process."""

    def __init__(self, window_s: float = 60.0, threshold: int = 5) -> None:
        super().__init__(logging.WARNING)
        self.window_s = window_s
        self.threshold = threshold
        self.seen: list[float] = []
        self.warned_at = -1e18
        self.worker_id = ""

    def emit(self, record: logging.LogRecord) -> None:
        import time

        try:
            message = record.getMessage()
        except Exception:
            return
        if "member_id was not recognized" not in message and "FencedInstanceId" not in message:
            return
        now = time.monotonic()
        self.seen = [t for t in self.seen if now - t < self.window_s] + [now]
        if len(self.seen) >= self.threshold and now - self.warned_at >= 300.0:
            self.warned_at = now
            log.warning(
                "this worker's group membership was taken over %d times in %.0f s: another "
                "worker probably runs with the same worker_id %r (on another host); give each "
                "worker its own stable --worker-id / STREAM_DP_WORKER_ID", len(self.seen),
                self.window_s, self.worker_id)


_fencing = _FencingDetector()


def install_fencing_detector(worker_id: str) -> None:
    """Warn (once per 5 min) when this process's static memberships keep being taken over:
    two workers with one ``worker_id`` fence each other for ever (on one host the second worker
    is refused at start-up; across hosts this is how it shows). Idempotent."""
    _fencing.worker_id = worker_id
    logger = logging.getLogger("aiokafka.consumer.group_coordinator")
    if _fencing not in logger.handlers:
        logger.addHandler(_fencing)
