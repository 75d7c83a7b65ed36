"""Shared fixtures: a real Kafka-protocol broker (noida-db) started by the tests themselves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

# Property tests check behaviour, not speed: on a shared 2-core CI machine a single example can
# take longer than hypothesis' default 200 ms deadline while a broker test runs beside it.
settings.register_profile("stream-dp", deadline=None)
settings.load_profile("stream-dp")


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[str]:
    """Bootstrap address of an embedded broker shared by the whole test session.

    Tests must use their own uniquely named topics / consumer groups (see ``unique_name``).
    """
    from agents.embedded_broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.bootstrap


@pytest.fixture()
def unique_name(request: pytest.FixtureRequest) -> str:
    """A topic/group-safe name unique to this test."""
    import re
    import uuid

    base = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name)[:40]
    return f"t-{base}-{uuid.uuid4().hex[:8]}"
