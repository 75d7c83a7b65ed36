"""What a pipeline stage sees of the process that runs it: :class:`StageHost`.

The worker (:class:`agents.worker.pipeline.Worker`) implements it, and each stage's own
extension of it (``IngestHost`` in :mod:`agents.ingest.stage`, ``ReleaseHost`` in
:mod:`agents.release.stage`); mypy checks that it does. A stage never imports the worker.
"""

from __future__ import annotations

from typing import Any, Protocol

from agents.config.security import KafkaSecurity
from agents.config.settings import Settings

__all__ = ["StageHost"]


class StageHost(Protocol):
    """What a stage sees of the process that runs it (:class:`agents.worker.pipeline.Worker`).

    A stage reads its settings and reports through these members, never through the process's
    other parts; each stage adds the few members it needs (``IngestHost``, ``ReleaseHost``).
    """

    settings: Settings
    #: TLS / SASL of every Kafka client the process creates
    security: KafkaSecurity
    #: operational totals (never raw counts)
    stats: dict[str, int]
    #: the error that stops the process, once one did (the stages raise it from their loops)
    fatal: BaseException | None

    def kafka_kwargs(self) -> dict[str, Any]:
        """Security keyword arguments for an aiokafka client."""
        ...

    def fail(self, exc: BaseException) -> None:
        """Stop the process with ``exc``."""
        ...

    def release_error(self, reason: str) -> None:
        """Count a fatal error (metric ``stream_dp_release_errors_total{reason}``)."""
        ...

    def update_ready(self) -> None:
        """A stage started or finished restoring its partitions: readiness may have changed."""
        ...
