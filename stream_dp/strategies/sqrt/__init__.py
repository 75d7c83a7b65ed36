"""Square-root family: the truncated Toeplitz square-root factorisation ``sqrt`` (zCDP).

:mod:`.toeplitz` holds the maths (moved from ``stream_dp/toeplitz.py``), :mod:`.mechanism` the
mechanism (moved from ``stream_dp/strategies/sqrt.py``; importing it registers ``sqrt``) and
:mod:`._oracle` the dense-matrix oracle used by the tests.
"""

from __future__ import annotations

from stream_dp.strategies.sqrt.mechanism import MAX_MEASURED_UNITS, SLACK_UNITS, SqrtMechanism, make

__all__ = [
    "MAX_MEASURED_UNITS",
    "SLACK_UNITS",
    "SqrtMechanism", "make"]
