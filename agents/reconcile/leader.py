"""Leader election of the reconcile agent: a consumer group on a one-partition leader topic
(nothing is written to it); whoever holds partition 0 leads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

#: Default name of the one-partition leader-election topic (never written to).
LEADER_TOPIC: Final = "dp.reconcile.leader"
#: Default consumer group of the leader election.
LEADER_GROUP: Final = "stream-dp-reconcile"


class _LeaderListener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Calls ``step_up`` when this member is given partition 0 of the leader topic and
    ``step_down`` when its partitions are taken away (the agent's two transitions)."""

    def __init__(self, step_up: Callable[[], None],
                 step_down: Callable[[], Awaitable[None]]) -> None:
        self.step_up = step_up
        self.step_down = step_down

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.step_down()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        if any(tp.partition == 0 for tp in assigned):
            self.step_up()


def _security_of(settings: Any) -> Any:
    from agents.config.security import KafkaSecurity

    return KafkaSecurity.from_settings(settings)


async def ensure_leader_topic(bootstrap: str, topic: str = LEADER_TOPIC,
                              security: Any = None) -> None:
    """Create the one-partition leader topic if it does not exist (idempotent)."""
    from agents.config.security import client_kwargs

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_kwargs(security))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        if topic in existing:
            return
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
