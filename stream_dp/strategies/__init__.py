"""Registry of release strategies and the factory :func:`make_mechanism`.

Each strategy module registers a factory ``f(p, horizon, privacy, cap) -> Mechanism`` under its
name with the privacy models it supports (``"pure"`` for ε-DP with Laplace noise, ``"zcdp"`` for
ρ-zCDP with Gaussian noise). ``"auto"`` is not a strategy: it resolves through
:func:`stream_dp.planner.pick`, which chooses the registered strategy with the lowest exact
expected error for ``(p, horizon, privacy)``.

>>> from stream_dp.budget import PureDP
>>> "dmfda" in available("pure")
True
>>> make_mechanism("dm", 0.3, 7, PureDP(1.0)).name
'dm'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from stream_dp.budget import Privacy
from stream_dp.mechanism import Mechanism
from stream_dp.strategies._common import check_cap, check_horizon, check_p

__all__ = ["Factory", "StrategyInfo", "available", "get", "make_mechanism", "register"]

Factory = Callable[[float, int, Privacy, float], Mechanism]

#: Modules imported on first use of the registry; each calls :func:`register` (or the registry
#: registers its ``make`` factory). Another area adds its strategy module's name here.
_BUILTIN: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "naive": ("stream_dp.strategies.naive", ("pure",), False),
    "dm": ("stream_dp.strategies.dm", ("pure",), False),
    "dmfda": ("stream_dp.strategies.dmfda", ("pure",), False),
    "fenwick-opt": ("stream_dp.strategies.fenwick_opt", ("pure",), False),
    "naive-int": ("stream_dp.strategies.naive_int", ("pure",), True),
}
#: Further modules that register themselves on import (tree, sqrt). Missing ones are skipped.
_PLUGINS: tuple[str, ...] = ("stream_dp.strategies.tree", "stream_dp.strategies.sqrt")


@dataclass(frozen=True)
class StrategyInfo:
    """A registered strategy: its name, factory, supported privacy models, and whether it is
    only valid for whole-number counts (then ``auto`` considers it only when told so)."""

    name: str
    factory: Factory
    models: tuple[str, ...]
    integer_only: bool = False


_REGISTRY: dict[str, StrategyInfo] = {}
_loaded = False


def register(
    name: str, factory: Factory, models: tuple[str, ...] = ("pure",), integer_only: bool = False
) -> None:
    """Register ``factory`` under ``name`` (re-registering the same name replaces it)."""
    if not isinstance(name, str) or not name or name == "auto":
        raise ValueError(f"name must be a non-empty string other than 'auto', got {name!r}")
    bad = [m for m in models if m not in ("pure", "zcdp")]
    if not models or bad:
        raise ValueError(f"models must be a non-empty subset of ('pure', 'zcdp'), got {models!r}")
    _REGISTRY[name] = StrategyInfo(name, factory, tuple(models), bool(integer_only))


def _ensure_loaded() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name, (module_name, models, integer_only) in _BUILTIN.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        if name not in _REGISTRY:
            register(name, module.make, models, integer_only)
    for module_name in _PLUGINS:
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise


def available(model: str | None = None, *, integer_counts: bool = False) -> tuple[str, ...]:
    """Registered strategy names (registration order), optionally only those supporting ``model``.

    Strategies valid only for whole-number counts are listed only with ``integer_counts=True``.
    """
    _ensure_loaded()
    if model is not None and model not in ("pure", "zcdp"):
        raise ValueError(f"model must be 'pure' or 'zcdp', got {model!r}")
    return tuple(
        n
        for n, i in _REGISTRY.items()
        if (model is None or model in i.models) and (integer_counts or not i.integer_only)
    )


def get(name: str) -> StrategyInfo:
    """The registered strategy ``name`` (``ValueError`` listing the names if unknown)."""
    _ensure_loaded()
    info = _REGISTRY.get(name)
    if info is None:
        raise ValueError(f"strategy must be one of {', '.join(('auto', *_REGISTRY))}, got {name!r}")
    return info


def make_mechanism(
    strategy: str,
    p: float,
    horizon: int,
    privacy: Privacy,
    cap: float = 1.0,
    *,
    integer_counts: bool = False,
) -> Mechanism:
    """A configured :class:`~stream_dp.mechanism.Mechanism`; ``"auto"`` asks the planner.

    ``p`` ∈ (0, 1] decay per tick; ``horizon`` ticks per epoch (≥ 1); ``privacy`` per event and
    stream; ``cap`` (> 0) bounds one event's contribution to a tick's count. ``integer_counts``
    declares that every count will be a whole number (whole-number event values and cap), which
    lets ``auto`` consider the integer-grid strategies.
    """
    p = check_p(p)
    horizon = check_horizon(horizon)
    cap = check_cap(cap)
    model = getattr(privacy, "model", None)
    if model not in ("pure", "zcdp"):
        raise ValueError(f"privacy must be PureDP(epsilon) or ZCDP(rho), got {privacy!r}")
    from stream_dp.limits import check_parameters

    # the documented ranges (stream_dp.limits): one-line errors instead of overflows later
    check_parameters(
        p=p, horizon=horizon, cap=cap,
        epsilon=getattr(privacy, "epsilon", None), rho=getattr(privacy, "rho", None),
    )
    if strategy == "auto":
        from stream_dp.planner import pick

        strategy = pick(p, horizon, privacy, cap=cap, integer_counts=integer_counts)
    info = get(strategy)
    if model not in info.models:
        raise ValueError(
            f"strategy {strategy!r} supports privacy models {info.models}, got {model!r}; "
            f"strategies for {model!r}: {', '.join(available(model))}"
        )
    return info.factory(p, horizon, privacy, cap)
