"""The ``dp.histograms.v1`` message of one solved tick (:func:`histogram_message`) and the
helpers that cut a tick or a solve result to its first nodes; the encoding of one tick into
everything the reconcile agent publishes for it (:func:`solve_and_encode`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from agents.kafka.codec import encode
from agents.reconcile.tables import marginals_message
from agents.reconcile.ticks import CompleteTick

HISTOGRAM_SCHEMA: Final = "dp.histograms.v1"

#: nodes of the JSON view handed to ``on_histogram`` when only compact histograms are published
_CALLBACK_NODES: Final = 20_000


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


def solve_and_encode(
    tick: Any, *, names: Sequence[str], domain: Any,
    solver: Callable[[], Callable[[Any, Any, Any], Any]], domain_name: str, tables_mode: bool,
    histograms_json: bool, blocks: bool, chunk_nodes: int,
    node_manifest: Callable[[], tuple[list[tuple[str, bytes]], str]], view: bool,
) -> tuple[Any, dict[str, Any], bytes | None, list[bytes]]:
    """``(result, message, JSON value or None, chunk records)`` of one tick (the reconcile
    agent runs it in a thread): a binary-attribute table tick's marginals (``tables_mode``), or
    the tick solved for consistency (``solver()(domain, noisy, variances)``) as the JSON
    ``dp.histograms.v1`` message (``histograms_json``) and/or compact chunk records of at most
    ``chunk_nodes`` nodes each (``blocks``; ``node_manifest()`` gives the nodes' manifest and
    its SHA-256). Without the JSON message, a ``view`` (for a callback) holds the first
    :data:`_CALLBACK_NODES` nodes, never encoded."""
    if tables_mode:
        message, result = marginals_message(tick, names, domain_name)
        return result, message, encode(message), []
    import numpy as np

    noisy = np.asarray(tick.noisy, dtype=np.float64)
    stderr = np.asarray(tick.stderr, dtype=np.float64)
    result = solver()(domain, noisy, stderr * stderr)
    chunks: list[bytes] = []
    if blocks:
        from stream_dp.compact_histograms import encode_histogram

        chunks = encode_histogram(
            domain=domain_name, tick=int(tick.tick), tick_end=float(tick.tick_end),
            values=np.asarray(result.values, dtype=np.float64), noisy=noisy, stderr=stderr,
            manifest=node_manifest()[1], consistent=bool(getattr(result, "consistent", True)),
            diagnostics=_diagnostics(result), chunk_nodes=chunk_nodes)
    if histograms_json:
        message = histogram_message(names, tick, result, domain_name)
        return result, message, encode(message), chunks
    if not view:  # nobody reads the JSON view: not built (20 000 nodes)
        return result, {}, None, chunks
    # compact only: callbacks get the first nodes (the top of a hierarchy) as JSON
    keep = min(len(names), _CALLBACK_NODES)
    message = histogram_message(names[:keep], _head(tick, keep),
                                _Head(result, keep), domain_name)
    message["total_nodes"] = len(names)
    return result, message, None, chunks
