"""What a release says about the person as unit of privacy (``privacy_unit = "user"``).

Every release record carries a ``privacy`` object, the budget per event per released stream
(:meth:`stream_dp.budget.Privacy.as_dict`). A user-level deployment adds what that budget means
for one person (docs/design/user-level.md §4): ``"unit": "person"``, the bounding period in
ticks, and ``"per_person"`` — the budget one person's bounded events spend per period on any
one released stream (the largest over the layers of the hierarchy: a node with more leaves
below it may receive more of a person's events) and in total over every stream a person can
reach, in the same model as the block (ε for pure DP, ρ for zCDP), and whether both figures are
exact or upper bounds. An event-level deployment's object is unchanged, byte for byte.

The figures are the library's (:class:`stream_dp.user_level.UserAccountant`); this module only
names the settings it reads and the wire form; the worker computes it once at start-up.
"""

from __future__ import annotations

from typing import Any

from agents.config.settings import Settings

__all__ = ["person_accountant", "person_summary", "privacy_block"]


def person_accountant(settings: Settings, domain: Any, mech: Any) -> Any:
    """The :class:`~stream_dp.user_level.UserAccountant` of a user-level deployment (``None`` at
    event level): per-node budget and ``h`` from the domain, the person's bounds from the
    ``user_*`` settings, ``mech`` the deployment's per-stream mechanism."""
    if settings.privacy_unit != "user":
        return None
    from agents.ingest.users import user_bounds
    from stream_dp.accounting import Accountant
    from stream_dp.user_level import UserAccountant, layer_leaves

    event = Accountant.for_domain(domain, settings.privacy, cap=settings.cap)
    return UserAccountant(event, user_bounds(settings), layer_leaves(domain), mech,
                          float(settings.tick_seconds))


def _figures(settings: Settings, domain: Any, mech: Any) -> dict[str, Any]:
    acc = person_accountant(settings, domain, mech)
    stream = acc.per_node_max
    total, total_exact = acc.period_factor()
    per = settings.privacy.as_dict()
    value = float(per["epsilon"] if per["model"] == "pure" else per["rho"])
    return {"unit": "person", "period_ticks": int(settings.user_period_ticks),
            "per_person": {"stream": value * stream.value, "total": value * total,
                           "exact": bool(stream.exact and total_exact)}}


def privacy_block(settings: Settings, domain: Any, mech: Any) -> dict[str, Any]:
    """The ``privacy`` object every release record of this deployment carries: the per-event
    budget per stream, and at user level the person's figures (module doc)."""
    block = dict(settings.privacy.as_dict())
    if settings.privacy_unit == "user":
        block.update(_figures(settings, domain, mech))
    return block


def person_summary(settings: Settings, domain: Any) -> list[str]:
    """The person's guarantee per stream, per period in total and over a year, each exact or
    an upper bound, as ``stream-dp plan --privacy-unit user`` prints it (the worker's start-up
    log); no lines at event level."""
    if settings.privacy_unit != "user":
        return []
    from agents.release.state import build_mechanism

    lines: list[str] = person_accountant(settings, domain, build_mechanism(settings)).summary()
    return lines
