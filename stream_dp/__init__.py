"""stream-dp: differentially private, exponentially decayed running counts.

The library holds all the mathematics (strategies, secure noise, accounting, consistency) and
never imports Kafka nor the service built on top of it (which depends on this library, never
the other way round).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["CounterBank", "DecayedCounter", "__version__"]


def __getattr__(name: str) -> object:
    # Lazy so that ``import stream_dp`` stays cheap and free of import cycles.
    if name in ("CounterBank", "DecayedCounter"):
        from stream_dp import counters

        return getattr(counters, name)
    raise AttributeError(f"module 'stream_dp' has no attribute {name!r}")
