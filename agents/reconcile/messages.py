"""The ``dp.histograms.v1`` message of one solved tick (:func:`histogram_message`) and the
helpers that cut a tick or a solve result to its first nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from agents.reconcile.ticks import CompleteTick

HISTOGRAM_SCHEMA: Final = "dp.histograms.v1"


def _diagnostics(result: Any) -> dict[str, Any]:
    return {"iterations": int(result.iterations), "residual": float(result.residual),
            "seconds": float(result.seconds)}


def _head(tick: CompleteTick, keep: int) -> CompleteTick:
    return CompleteTick(tick=tick.tick, tick_end=tick.tick_end, noisy=tick.noisy[:keep],
                        stderr=tick.stderr[:keep])


class _Head:
    """A solve result cut to its first ``keep`` nodes (for :func:`histogram_message`)."""

    def __init__(self, result: Any, keep: int) -> None:
        self.values = result.values[:keep]
        self.consistent = getattr(result, "consistent", True)
        self.iterations, self.residual, self.seconds = (result.iterations, result.residual,
                                                        result.seconds)


def histogram_message(
    names: Sequence[str], tick: CompleteTick, result: Any, domain_name: str | None = None
) -> dict[str, Any]:
    """The ``dp.histograms.v1`` value for one solved tick (docs/CONTRACTS.md).

    ``result`` is a :class:`stream_dp.consistency.ReconcileResult`. Each node's ``stderr`` is the
    analytic standard error of its *noisy* release; the consistent value's error is no larger
    (a variance-weighted projection is the best linear unbiased estimate).
    """
    values = [float(v) for v in result.values]
    if len(values) != len(names):
        raise ValueError(f"solver returned {len(values)} values for {len(names)} nodes")
    message: dict[str, Any] = {
        "tick": tick.tick,
        "tick_end": tick.tick_end,
        "nodes": [
            {"stream": name, "value": v, "noisy": x, "stderr": s}
            for name, v, x, s in zip(names, values, tick.noisy, tick.stderr, strict=True)
        ],
        "consistent": bool(getattr(result, "consistent", True)),
        "diagnostics": {
            "iterations": int(result.iterations),
            "residual": float(result.residual),
            "seconds": float(result.seconds),
        },
        "schema": HISTOGRAM_SCHEMA,
    }
    if domain_name is not None:
        message["domain"] = domain_name
    return message
