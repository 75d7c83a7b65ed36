"""BLT family: ``blt``, correlated discrete Gaussian noise from a buffered-linear-Toeplitz filter
(zCDP, ``d + 1`` floats of state per stream, error bounded forever for ``p < 1``).

:mod:`.plan` holds the maths (closed forms, fit), :mod:`.mechanism` the mechanism (importing it
registers ``blt``) and :mod:`._oracle` the dense-matrix oracle used by the tests.
"""

from __future__ import annotations

from stream_dp.strategies.blt.mechanism import MAX_TICKS, UNIT_BITS, BltMechanism, make

__all__ = ["MAX_TICKS", "UNIT_BITS", "BltMechanism", "make"]
