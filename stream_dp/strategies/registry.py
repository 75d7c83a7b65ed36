"""The strategy registry: names → factories, for concrete strategy names only.

Each strategy family (a subpackage of :mod:`stream_dp.strategies`) registers a factory
``f(p, horizon, privacy, cap) -> Mechanism`` under its name with the privacy models it supports
(``"pure"`` for ε-DP with Laplace noise, ``"zcdp"`` for ρ-zCDP with Gaussian noise).

This module sits on :mod:`stream_dp.limits` (the parameter ranges, which imports nothing of
``stream_dp``) and below everything else of strategy selection: it imports neither the planner
nor the analysis, at any level (``tests/unit/test_layering.py`` checks it). ``"auto"`` is not a strategy; it resolves
through :func:`stream_dp.planner.make_mechanism`, a layer above. The list of modules to load is
kept in :mod:`stream_dp.strategies` (``_BUILTIN``, ``_PLUGINS``), which hands it over on import.

>>> from stream_dp.budget import PureDP
>>> "dmfda" in available("pure")
True
>>> make("dm", 0.3, 7, PureDP(1.0)).name
'dm'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from stream_dp.budget import Privacy
from stream_dp.limits import check_parameters
from stream_dp.mechanism import Mechanism
from stream_dp.strategies._common import check_cap, check_horizon, check_p

__all__ = ["Factory", "StrategyInfo", "available", "configure", "get", "make", "register"]

Factory = Callable[[float, int, Privacy, float], Mechanism]


@dataclass(frozen=True)
class StrategyInfo:
    """A registered strategy: its name, factory, supported privacy models, and whether it is
    only valid for whole-number counts (then ``auto`` considers it only when told so)."""

    name: str
    factory: Factory
    models: tuple[str, ...]
    integer_only: bool = False
    #: the factory a user-level deployment uses, when it differs (``blt``: without the start
    #: rows, so that a person's events keep the exact Toeplitz factor); ``None``: ``factory``
    user_level_factory: Factory | None = None
    #: whether ``auto`` may pick it; ``False`` (``blt-horizon``: it trades later horizons'
    #: error for this one's): built by name only, and listed only with ``by_name=True``
    auto: bool = True


_REGISTRY: dict[str, StrategyInfo] = {}
_loaded = False
#: Set by :func:`configure` (from ``stream_dp.strategies``): builtin name → (module, models,
#: integer_only), whose ``make`` is registered; and modules that register themselves on import.
_builtin: Mapping[str, tuple[str, tuple[str, ...], bool]] = {}
_plugins: tuple[str, ...] = ()


def configure(
    builtin: Mapping[str, tuple[str, tuple[str, ...], bool]], plugins: tuple[str, ...]
) -> None:
    """Declare the modules loaded on first use of the registry (called by the package)."""
    global _builtin, _plugins, _loaded
    _builtin, _plugins, _loaded = builtin, tuple(plugins), False


def register(
    name: str, factory: Factory, models: tuple[str, ...] = ("pure",), integer_only: bool = False,
    user_level_factory: Factory | None = None, auto: bool = True,
) -> None:
    """Register ``factory`` under ``name`` (re-registering the same name replaces it);
    ``user_level_factory``: the mechanism of a user-level deployment, if another one;
    ``auto=False``: ``auto`` never picks it and :func:`available` lists it only with
    ``by_name=True`` (it is built by name)."""
    if not isinstance(name, str) or not name or name == "auto":
        raise ValueError(f"name must be a non-empty string other than 'auto', got {name!r}")
    bad = [m for m in models if m not in ("pure", "zcdp")]
    if not models or bad:
        raise ValueError(f"models must be a non-empty subset of ('pure', 'zcdp'), got {models!r}")
    _REGISTRY[name] = StrategyInfo(name, factory, tuple(models), bool(integer_only),
                                   user_level_factory, bool(auto))


def _import_optional(module_name: str) -> object | None:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # a missing plugin is skipped; a missing dependency inside one is an error
        if exc.name != module_name:
            raise
        return None


def _ensure_loaded() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name, (module_name, models, integer_only) in _builtin.items():
        module = _import_optional(module_name)
        if module is not None and name not in _REGISTRY:
            register(name, module.make, models, integer_only,  # type: ignore[attr-defined]
                     getattr(module, "make_user_level", None))
    for module_name in _plugins:
        _import_optional(module_name)


def _order(name: str) -> tuple[int, int, int]:
    """Listing order, independent of import order: the builtins in ``_BUILTIN`` order, then
    each plugin module's strategies in ``_PLUGINS`` order, then the rest as registered (a family
    package registers when any of its modules is first imported; ties in ``auto`` go to the
    earlier-listed, simpler strategy, so the order must not depend on who imported what first)."""
    names = list(_REGISTRY)
    if name in _builtin:
        return (0, list(_builtin).index(name), 0)
    module = getattr(_REGISTRY[name].factory, "__module__", "") or ""
    for i, plugin in enumerate(_plugins):
        if module == plugin or module.startswith(plugin + "."):
            return (1, i, names.index(name))
    return (2, 0, names.index(name))


def available(model: str | None = None, *, integer_counts: bool = False,
              by_name: bool = False) -> tuple[str, ...]:
    """Registered strategy names (registration order), optionally only those supporting ``model``.

    Strategies valid only for whole-number counts are listed only with ``integer_counts=True``;
    those ``auto`` does not pick (``blt-horizon``) only with ``by_name=True``.
    """
    _ensure_loaded()
    if model is not None and model not in ("pure", "zcdp"):
        raise ValueError(f"model must be 'pure' or 'zcdp', got {model!r}")
    return tuple(
        n
        for n in sorted(_REGISTRY, key=_order)
        if (model is None or model in _REGISTRY[n].models)
        and (integer_counts or not _REGISTRY[n].integer_only)
        and (by_name or _REGISTRY[n].auto)
    )


def get(name: str) -> StrategyInfo:
    """The registered strategy ``name`` (``ValueError`` listing the names if unknown)."""
    _ensure_loaded()
    info = _REGISTRY.get(name)
    if info is None:
        raise ValueError(f"strategy must be one of {', '.join(('auto', *sorted(_REGISTRY, key=_order)))}, got {name!r}")
    return info


def check_arguments(
    p: float, horizon: int, privacy: Privacy, cap: float
) -> tuple[float, int, float, str]:
    """Validated ``(p, horizon, cap, model)``: the documented ranges (:mod:`stream_dp.limits`)
    as one-line errors instead of overflows later."""
    p = check_p(p)
    horizon = check_horizon(horizon)
    cap = check_cap(cap)
    model = getattr(privacy, "model", None)
    if model not in ("pure", "zcdp"):
        raise ValueError(f"privacy must be PureDP(epsilon) or ZCDP(rho), got {privacy!r}")
    check_parameters(
        p=p, horizon=horizon, cap=cap,
        epsilon=getattr(privacy, "epsilon", None), rho=getattr(privacy, "rho", None),
    )
    return p, horizon, cap, str(model)


def make(strategy: str, p: float, horizon: int, privacy: Privacy, cap: float = 1.0, *,
         user_level: bool = False) -> Mechanism:
    """The registered strategy ``strategy`` (a concrete name, not ``"auto"``) configured for
    decay ``p`` ∈ (0, 1] per tick, ``horizon`` ticks per epoch, ``privacy`` per event and
    stream, contribution cap ``cap`` (> 0, value units). ``user_level``: the mechanism of a
    user-level deployment (:attr:`StrategyInfo.user_level_factory`; ``blt`` without its start
    rows at p < 1)."""
    p, horizon, cap, model = check_arguments(p, horizon, privacy, cap)
    if strategy == "auto":
        raise ValueError("'auto' is resolved by stream_dp.planner.make_mechanism, not the registry")
    info = get(strategy)
    if model not in info.models:
        raise ValueError(
            f"strategy {strategy!r} supports privacy models {info.models}, got {model!r}; "
            f"strategies for {model!r}: {', '.join(available(model))}"
        )
    factory = info.user_level_factory if user_level and info.user_level_factory else info.factory
    return factory(p, horizon, privacy, cap)
