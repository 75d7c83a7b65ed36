"""Release strategies: one subpackage per family, a registry, and :func:`make_mechanism`.

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
resolved by :func:`stream_dp.planner.make_mechanism`, the one implementation;
``stream_dp.strategies.make_mechanism`` is the same function, a lazy alias (module
``__getattr__``: this package's import does not load the planner).

>>> from stream_dp.budget import PureDP
>>> "dmfda" in available("pure")
True
>>> from stream_dp.strategies import make_mechanism
>>> make_mechanism("dm", 0.3, 7, PureDP(1.0)).name
'dm'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stream_dp.strategies import registry as _registry
from stream_dp.strategies.registry import (
    Factory,
    StrategyInfo,
    available,
    get,
    make,
    register,
)

if TYPE_CHECKING:  # the alias's type for mypy (no import at run time)
    from stream_dp.planner import make_mechanism

__all__ = ["Factory", "StrategyInfo", "available", "get", "make", "make_mechanism", "register"]

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


def __getattr__(name: str) -> object:
    """Lazy alias: ``make_mechanism`` is :func:`stream_dp.planner.make_mechanism`, the one
    implementation (the planner sits above the registry, so this package cannot import it at
    import time; the alias resolves on first use)."""
    if name == "make_mechanism":
        from stream_dp.planner import make_mechanism

        return make_mechanism
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
