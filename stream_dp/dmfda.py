"""Moved: this code now lives in :mod:`stream_dp.strategies.fenwick.dmfda_weights`.

Thin re-export kept so that old imports keep working; the old module name is the same module
object as the new one (private names and monkeypatching included). New code imports from
``stream_dp.strategies.fenwick.dmfda_weights``.
"""

import sys

from stream_dp.strategies.fenwick.dmfda_weights import *  # noqa: F403
from stream_dp.strategies.fenwick.dmfda_weights import __all__ as __all__

sys.modules[__name__] = sys.modules["stream_dp.strategies.fenwick.dmfda_weights"]
