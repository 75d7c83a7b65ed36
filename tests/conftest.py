"""Shared fixtures: a real Kafka-protocol broker (noida-db) started by the tests themselves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


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
