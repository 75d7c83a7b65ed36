"""What a release says about the person as unit of privacy (``privacy_unit = "user"``).

Every release record carries a ``privacy`` object, the budget per event per released stream
(:meth:`stream_dp.budget.Privacy.as_dict`). A user-level deployment adds what that budget means
for one person (docs/design/user-level.md §4): ``"unit": "person"``, the bounding period in
ticks, and ``"per_person"`` — the budget one person's bounded events spend per period on any
one released stream (the largest over the layers of the hierarchy: a node with more leaves
below it may receive more of a person's events) and in total over every stream a person can
reach, in the same model as the block (ε for pure DP, ρ for zCDP), and whether both figures are
exact or upper bounds. An event-level deployment's object is unchanged, byte for byte.

A binary-attribute deployment (``dp.tables.v1``, and the ``dp.marginals.v1`` records built from
them) is pure ε-DP per event over *all* its tables, so its figures are the group bound
(:class:`stream_dp.user_level.GroupBudget`): ``stream`` and ``total`` are both ``K`` times the
exact ε one event spends (the largest ``ε₀ + n·ε_t`` over every table count, rounded up), and
``exact`` is false (an upper bound). Its bounding "stream" (for ``user_max_streams`` and
``user_max_events_per_stream``) is the event's attribute pattern: one cell of the full table.

The figures are the library's (:class:`stream_dp.user_level.UserAccountant`,
:class:`~stream_dp.user_level.GroupBudget`); this module only names the settings it reads and
the wire form; the worker computes it once at start-up.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from agents.config.settings import Settings

__all__ = ["attribute_person", "person_accountant", "person_summary", "privacy_block"]


def _binary(domain: Any) -> bool:
    return getattr(domain, "kind", "") == "binary"


def attribute_person(settings: Settings, domain: Any) -> Any:
    """The :class:`~stream_dp.user_level.GroupBudget` of a user-level binary-attribute
    deployment (``None`` at event level): ``K`` times the exact ε one event spends."""
    if settings.privacy_unit != "user":
        return None
    from agents.config.domain import attribute_config
    from agents.ingest.users import user_bounds
    from stream_dp.attributes.release import worst_spent
    from stream_dp.user_level import GroupBudget

    c = attribute_config(settings, domain)
    return GroupBudget(worst_spent(c.epsilon, c.m, c.bootstrap_epsilon), user_bounds(settings))


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
    if _binary(domain):
        from stream_dp.user_level import float_up

        bound = float_up(attribute_person(settings, domain).per_period)
        return {"unit": "person", "period_ticks": int(settings.user_period_ticks),
                "per_person": {"stream": bound, "total": bound, "exact": False}}
    from stream_dp.user_level import float_up

    acc = person_accountant(settings, domain, mech)
    stream = acc.per_node_max
    total, total_exact = acc.period_factor()
    per = settings.privacy.as_dict()
    value = Fraction(per["epsilon"] if per["model"] == "pure" else per["rho"])
    # the exact products of the floats, rounded up (a float product may round below them:
    # 0.7 × 3 = 2.0999999999999996), as every per-person figure is an upper bound
    return {"unit": "person", "period_ticks": int(settings.user_period_ticks),
            "per_person": {"stream": float_up(value * Fraction(stream.value)),
                           "total": float_up(value * Fraction(total)),
                           "exact": bool(stream.exact and total_exact)}}


def privacy_block(settings: Settings, domain: Any, mech: Any) -> dict[str, Any]:
    """The ``privacy`` object every release record of this deployment carries: the per-event
    budget per stream, and at user level the person's figures (module doc). ``mech`` is not
    read for a binary-attribute domain (its tables' banks are chosen per epoch)."""
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
    if _binary(domain):
        return attribute_summary(settings, domain)
    from agents.release.state import build_mechanism

    lines: list[str] = person_accountant(settings, domain, build_mechanism(settings)).summary()
    return lines


def attribute_summary(settings: Settings, domain: Any) -> list[str]:
    """:func:`person_summary` of a binary-attribute domain: ``K`` times the exact ε of one
    event, per period and over a year of periods, both upper bounds."""
    lines: list[str] = attribute_person(settings, domain).summary(float(settings.tick_seconds))
    return lines
