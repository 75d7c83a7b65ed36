"""What the pipeline's stages report: the :class:`PipelineMetrics` protocol and
:class:`NullMetrics`, which records nothing (embedders and tests without ``/metrics``).

Counts are non-negative integers, durations seconds; never a per-stream value.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["NullMetrics", "PipelineMetrics"]


class PipelineMetrics(Protocol):
    """What the pipeline's stages report (implemented by :class:`agents.telemetry.metrics.Metrics`).

    Counts are non-negative integers, durations seconds. Never per-stream values.
    """

    def event_accepted(self, n: int = 1) -> None: ...
    def event_dead_lettered(self, reason: str, n: int = 1) -> None: ...
    def event_late(self, n: int = 1) -> None: ...
    def stream_clipped(self, n: int = 1) -> None: ...
    def user_bounded(self, n: int = 1) -> None: ...
    def tick_released(self, latency_seconds: float, n_streams: int = 0) -> None: ...
    def checkpoint_written(self, seconds: float) -> None: ...
    def ingest_checkpoint_written(self, seconds: float) -> None: ...
    def release_error(self, reason: str) -> None: ...
    def set_consumer_lag(self, messages: int) -> None: ...
    def set_ready(self, ready: bool) -> None: ...


class NullMetrics:
    """Metrics that record nothing."""

    def event_accepted(self, n: int = 1) -> None:
        pass

    def event_dead_lettered(self, reason: str, n: int = 1) -> None:
        pass

    def event_late(self, n: int = 1) -> None:
        pass

    def stream_clipped(self, n: int = 1) -> None:
        pass

    def user_bounded(self, n: int = 1) -> None:
        pass

    def tick_released(self, latency_seconds: float, n_streams: int = 0) -> None:
        pass

    def checkpoint_written(self, seconds: float) -> None:
        pass

    def ingest_checkpoint_written(self, seconds: float) -> None:
        pass

    def release_error(self, reason: str) -> None:
        pass

    def set_consumer_lag(self, messages: int) -> None:
        pass

    def set_ready(self, ready: bool) -> None:
        pass
