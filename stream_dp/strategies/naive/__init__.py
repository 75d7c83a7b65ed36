"""Naive family: input perturbation, ``naive`` (float grid) and ``naive-int`` (integer grid).

:mod:`.mechanism` holds ``naive`` (moved from ``stream_dp/strategies/naive.py``),
:mod:`.integer` holds ``naive-int`` (moved from ``stream_dp/strategies/naive_int.py``) and
:mod:`._oracle` the dense-matrix oracle used by the tests.
"""

from __future__ import annotations

from stream_dp.strategies.naive.mechanism import NaiveMechanism, make

__all__ = ["NaiveMechanism", "make"]
