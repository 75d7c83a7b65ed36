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
