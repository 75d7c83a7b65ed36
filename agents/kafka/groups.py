"""Consumer-group helpers that aiokafka lacks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from typing import Any

log = logging.getLogger("agents.groups")


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

    from agents.config.security import client_kwargs

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
        # aiokafka runs this under asyncio.shield: when the committing caller is cancelled (a
        # stop) and the commit then fails (the connection closed), nobody reads the error and
        # asyncio logs 'Task exception was never retrieved' with a traceback. Read it here; the
        # caller, when still waiting, gets it through the shield as before.
        task = asyncio.current_task()
        coro = task.get_coro() if task is not None else None
        if task is not None and getattr(coro, "cr_code", None) is _do_commit_offsets.__code__:
            task.add_done_callback(_retrieve)  # only the shield's own task, not a caller's
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


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a finished task's exception as read (see ``install_static_commit_rejoin``)."""
    if not task.cancelled():
        task.exception()


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


#: Kafka's FENCED_INSTANCE_ID: another member joined with this member's ``group.instance.id``.
#: aiokafka 0.14 has no class for it and reports it as ``UnknownError`` (error -1).
FENCED_INSTANCE_ID = 82
#: Kafka's UNKNOWN_MEMBER_ID
UNKNOWN_MEMBER_ID = 25


try:  # the service extra; without it nothing here is used
    from aiokafka.errors import KafkaError as _KafkaError
except ImportError:  # pragma: no cover - base install
    _KafkaError = RuntimeError


class _Fenced(Exception):
    """Raised from the coordinator's request path (not a KafkaError, which aiokafka retries);
    turned into :class:`WorkerIdShared` where aiokafka hands errors to the consumer's caller."""

    def __init__(self, shared: WorkerIdShared) -> None:
        super().__init__(shared)
        self.shared = shared


#: what to do when another worker runs with this worker's worker_id (the same text on one host,
#: at start-up, and across hosts, when the broker's group membership shows it)
SHARED_WORKER_ID_HINT = (
    "Give each worker its own stable --worker-id / STREAM_DP_WORKER_ID (the default is the "
    "host name; e.g. the StatefulSet pod name); the other worker keeps running"
)


class WorkerIdShared(_KafkaError):  # type: ignore[misc]
    """Another process holds this worker's static group membership (``group.instance.id``,
    i.e. its ``worker_id``): two workers run with one ``worker_id``.

    Handed to the consumer's caller by the client library's group coordination (a
    ``KafkaError``, so aiokafka's fetcher ignores it quietly); the worker stops with exit status
    2 (docs/operations.md). ``how`` says what showed it: the broker's FENCED_INSTANCE_ID, or a
    member of another process found in the group.
    """

    def __init__(self, group: str, instance_id: str, how: str) -> None:
        super().__init__(group, instance_id, how)  # args only: aiokafka copies the exception
        self.group = group
        self.instance_id = instance_id
        self.how = how

    def __str__(self) -> str:
        return (f"another worker runs with the same worker_id {self.instance_id!r} "
                f"(consumer group {self.group!r}: {self.how})")


_shared_listeners: list[Any] = []
#: member ids the coordinator gave this process's consumers (JoinGroup answers): a member of
#: the group with one of our client ids but none of these ids belongs to another process
_own_member_ids: set[str] = set()


def add_shared_worker_id_listener(callback: Any) -> None:
    """Call ``callback(exc: WorkerIdShared)`` (in the event loop's thread) when a consumer of
    this process finds its static membership held by another process."""
    _shared_listeners.append(callback)


def remove_shared_worker_id_listener(callback: Any) -> None:
    """Undo :func:`add_shared_worker_id_listener` (absent callbacks are ignored)."""
    with contextlib.suppress(ValueError):
        _shared_listeners.remove(callback)


def _error_codes(response: Any) -> list[int]:
    """Every error code of a group response: the top-level one, or OffsetCommit's
    per-partition codes."""
    code = getattr(response, "error_code", None)
    if code is not None:
        return [int(code)]
    codes: list[int] = []
    with contextlib.suppress(Exception):
        for _topic, partitions in response.topics:
            codes.extend(int(p[1]) for p in partitions)
    return codes


async def _held_by_another_process(coordinator: Any) -> bool:
    """After UNKNOWN_MEMBER_ID: does the group hold a member with this consumer's client id
    (``<app_id>-<stage>-<worker_id>``) that this process never was? Then another process with
    the same worker_id took the static membership over. A member that merely expired (a long
    step held the event loop past the session timeout; a restarted broker forgot the group)
    leaves no such member, and the consumer joins again as before."""
    from aiokafka.protocol.admin import DescribeGroupsRequest

    client = coordinator._client
    client_id = getattr(client, "_client_id", None)
    node = coordinator.coordinator_id
    if not client_id or node is None:
        return False
    try:
        resp = await client.send(node, DescribeGroupsRequest([coordinator.group_id]))
    except Exception:  # cannot tell: behave as before (join again)
        return False
    for group in resp.groups:
        # (error_code, group, state, protocol_type, protocol, members[, authorized_operations])
        if group[0] != 0:
            continue
        for member in group[5]:
            member_id, member_client = member[0], member[1]
            if member_client == client_id and member_id not in _own_member_ids:
                return True
    return False


class _StartGate:
    """The first static join of a process (one event loop) that the other static groups wait
    for: see :func:`install_shared_worker_id_detection`."""

    def __init__(self) -> None:
        self.owner: Any = None
        self.beats = 0
        self.opened = asyncio.Event()


#: the process's shared-worker_id state: the first detection (after it, no static member of
#: the process joins anything again), the instance id whose first group gates the others, and
#: one start gate per event loop
_detection: dict[str, Any] = {"shared": None, "gate_instance": None}
_gates: weakref.WeakKeyDictionary[Any, _StartGate] = weakref.WeakKeyDictionary()

#: successful heartbeats of the gating membership before the other groups join: a worker
#: that took the gating group's membership over from another is found by that other within
#: one heartbeat interval (its next heartbeat), so the newcomer waits two
GATE_HEARTBEATS = 2


def _gate() -> _StartGate:
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = _StartGate()
    return gate


def install_shared_worker_id_detection(gate_instance: str | None = None) -> None:
    """Make every static group member of this process (``group_instance_id`` = worker_id)
    recognise a second process with the same worker_id, and stop instead of fighting it for
    ever. Idempotent; ``gate_instance`` (the pipeline's instance id, when this process runs the
    pipeline) is the latest one given.

    What shows a shared ``group.instance.id``: on Kafka the newest member takes it over and
    the broker answers the older one's requests that carry the instance id (JoinGroup,
    SyncGroup, OffsetCommit v7+) with FENCED_INSTANCE_ID; noida-db 0.2.3 answers a JoinGroup
    that a later join of the same instance id overtook with it too. aiokafka has no class for
    that code (it says ``UnknownError``) and stopped the consumer as if the broker were broken.
    A heartbeat carries no instance id in aiokafka, so its answer is UNKNOWN_MEMBER_ID — the
    same as for a member whose session expired; aiokafka then joins again with the instance
    id, takes the membership back, and the two workers fence each other for ever ('local
    member_id was not recognized' several times a second). Here: FENCED_INSTANCE_ID is the
    answer, and after UNKNOWN_MEMBER_ID the group is described before anything else: a member
    with this consumer's client id that this process never was means another process. Either
    way the listeners are told (the worker stops, exit status 2) and from then on no static
    member of this process joins any group again, so the newer worker keeps every membership
    and runs on.

    Which one stops must be the same in every group: a worker has three (ingest, release,
    reconcile), and when two start at once each join can be overtaken by the other worker's
    in a different group — both would stop. So the first group of ``gate_instance`` (the
    pipeline's ingest group) gates the others: they join only after its membership has
    survived :data:`GATE_HEARTBEATS` heartbeats, by when an overtaken worker has found out.
    """
    _detection["gate_instance"] = gate_instance
    from aiokafka.consumer import group_coordinator
    from aiokafka.protocol.commit import OffsetCommitRequest
    from aiokafka.protocol.group import HeartbeatRequest, JoinGroupRequest

    coord_cls = group_coordinator.GroupCoordinator
    if getattr(coord_cls, "_stream_dp_shared_detection", False):
        return
    send = coord_cls._send_req

    async def _send_req(self: Any, request: Any) -> Any:
        instance = getattr(self, "_group_instance_id", None)
        shared = _detection["shared"]
        if instance and shared is not None:
            raise _Fenced(shared)  # found already: never join (take a membership back) again
        resp = await send(self, request)
        if not instance:
            return resp
        member_id = str(getattr(resp, "member_id", "") or "")
        if member_id and isinstance(request, JoinGroupRequest):
            _own_member_ids.add(member_id)
        codes = _error_codes(resp)
        how = ""
        if FENCED_INSTANCE_ID in codes:
            how = f"the broker answered {type(request).__name__} with FENCED_INSTANCE_ID"
        elif (UNKNOWN_MEMBER_ID in codes
              and isinstance(request, HeartbeatRequest | OffsetCommitRequest)
              and await _held_by_another_process(self)):
            how = "a member of another process holds this worker's static membership"
        if not how:
            return resp
        exc = WorkerIdShared(self.group_id, str(instance), how)
        if _detection["shared"] is None:
            _detection["shared"] = exc
            # members waiting for the gate go on: their join is refused at once (above), and
            # a consumer whose start() waits for its first assignment raises instead of hanging
            for gate in list(_gates.values()):
                gate.opened.set()
            for callback in list(_shared_listeners):
                with contextlib.suppress(Exception):
                    callback(exc)
        raise _Fenced(exc)

    coord_cls._send_req = _send_req
    heartbeat = coord_cls._do_heartbeat

    async def _do_heartbeat(self: Any) -> Any:
        # aiokafka retries a KafkaError from the request itself; one raised here ends the
        # heartbeat task, whose error the coordination loop hands to the consumer's caller
        try:
            ok = await heartbeat(self)
        except _Fenced as fenced:
            raise fenced.shared from None
        gate = _gate()
        if gate.owner is self and not gate.opened.is_set():
            gate.beats = gate.beats + 1 if ok else 0
            if gate.beats >= GATE_HEARTBEATS:
                gate.opened.set()
        return ok

    coord_cls._do_heartbeat = _do_heartbeat
    close = coord_cls.close

    async def close_coordinator(self: Any) -> Any:
        gate = _gate()
        if gate.owner is self:  # the gating member stops: never keep the others waiting
            gate.opened.set()
        return await close(self)

    coord_cls.close = close_coordinator

    rebalance_cls = group_coordinator.CoordinatorGroupRebalance
    join = rebalance_cls.perform_group_join

    async def perform_group_join(self: Any) -> Any:
        coord = self._coordinator
        instance = getattr(coord, "_group_instance_id", None)
        gate = _gate()
        if instance and _detection["gate_instance"] and not gate.opened.is_set():
            if gate.owner is None and instance == _detection["gate_instance"]:
                gate.owner = coord
            elif gate.owner is not coord:
                opened = asyncio.ensure_future(gate.opened.wait())
                try:
                    await asyncio.wait([opened, coord._closing],
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    opened.cancel()
                if coord._closing.done():
                    return None
        # JoinGroup/SyncGroup failures other than connection errors end aiokafka's coordination
        # task with a traceback; hand this one to the consumer's caller instead (the
        # coordination loop calls this again once the caller has seen it, and it is handed
        # over again: nothing is joined)
        try:
            return await join(self)
        except _Fenced as fenced:
            await coord._push_error_to_user(fenced.shared)
            return None

    rebalance_cls.perform_group_join = perform_group_join
    coord_cls._stream_dp_shared_detection = True
