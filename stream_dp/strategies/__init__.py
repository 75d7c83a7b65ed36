"""Release strategies: one subpackage per family and a registry.

Families (each subpackage holds its plan/weights, its mechanism and its dense oracle
``_oracle.py``):

* :mod:`stream_dp.strategies.naive` — input perturbation (``naive``, ``naive-int``);
* :mod:`stream_dp.strategies.fenwick` — weighted Fenwick trees (``dm``, ``dmfda``,
  ``fenwick-opt``);
* :mod:`stream_dp.strategies.tree` — sparse hierarchical trees (``tree``, ``binary-tree``);
* :mod:`stream_dp.strategies.sqrt` — truncated Toeplitz square root (``sqrt``, zCDP);
* :mod:`stream_dp.strategies.ls_tree` — least-squares nested tree (``tree-ls``);
* :mod:`stream_dp.strategies.blt` — BLT-correlated noise (``blt``, zCDP).

The registry (:mod:`stream_dp.strategies.registry`: ``register``, ``get``, ``available``,
``make`` for concrete names) does not depend on the planner. ``"auto"`` is not a strategy: it is
resolved by :func:`stream_dp.planner.make_mechanism`, the one way to build a mechanism by name
(the planner sits above this package, which never imports it).

>>> from stream_dp.budget import PureDP
>>> "dmfda" in available("pure")
True
>>> make("dm", 0.3, 7, PureDP(1.0)).name
'dm'
"""

from __future__ import annotations

from stream_dp.strategies import registry as _registry
from stream_dp.strategies.registry import (
    Factory,
    StrategyInfo,
    available,
    get,
    make,
    register,
)

__all__ = ["Factory", "StrategyInfo", "available", "get", "make", "register"]

#: Modules imported on first use of the registry; the registry registers each one's ``make``.
_BUILTIN: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "naive": ("stream_dp.strategies.naive", ("pure",), False),
    "dm": ("stream_dp.strategies.fenwick.dm", ("pure",), False),
    "dmfda": ("stream_dp.strategies.fenwick.dmfda", ("pure",), False),
    "fenwick-opt": ("stream_dp.strategies.fenwick.fenwick_opt", ("pure",), False),
    "naive-int": ("stream_dp.strategies.naive.integer", ("pure",), True),
}
#: Further modules that register themselves on import (tree, sqrt). Missing ones are skipped.
#: Another family adds its module's name here.
_PLUGINS: tuple[str, ...] = (
    "stream_dp.strategies.tree", "stream_dp.strategies.sqrt", "stream_dp.strategies.ls_tree",
    "stream_dp.strategies.blt",
)

_registry.configure(_BUILTIN, _PLUGINS)

