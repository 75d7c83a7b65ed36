"""Moved: this code now lives in :mod:`stream_dp.strategies.fenwick.base`.

Thin re-export kept so that old imports keep working; the old module name is the same module
object as the new one. New code imports from ``stream_dp.strategies.fenwick.base``.
"""

import sys

from stream_dp.strategies.fenwick.base import *  # noqa: F403
from stream_dp.strategies.fenwick.base import FenwickMechanism as FenwickMechanism

sys.modules[__name__] = sys.modules["stream_dp.strategies.fenwick.base"]
