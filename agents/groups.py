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
