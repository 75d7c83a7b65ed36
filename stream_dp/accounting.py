"""Explicit, exact event-level privacy accounting (DESIGN.md §2, rules 2–3).

Unit of privacy: **one event** (one record on the events topic), whose value is clamped to
``cap``. An event adds at most ``cap`` to the count of one tick of every released node it feeds:
``h`` nodes (``Domain.touches``: 1 for a flat domain, the depth for a hierarchy, ``k + 2`` for a
``k``-attribute grid: total, one category per attribute, one micro cell).

Each released stream (node) runs its mechanism with a *per-node* budget — ε under pure DP or ρ
under zCDP — calibrated to one event of size ``cap`` changing one tick's count (the mechanism's
own sensitivity covers every release of that node, at every tick). One event therefore spends
``h × per-node`` in total (sequential composition: ε adds under pure DP, ρ adds under zCDP).
Equivalently, the per-tick vector of node counts has L1 sensitivity ``cap × h`` (L2:
``cap × √h``).

The accountant never mixes models: composing budgets or accountants of different models raises
``TypeError``; convert explicitly (``PureDP.to_zcdp()``) if that is what you mean.

>>> acc = Accountant.from_total(PureDP(1.0), nodes_touched=4, cap=2.0)
>>> acc.per_node
PureDP(epsilon=0.25)
>>> acc.sensitivity
8.0
>>> print("\\n".join(acc.summary()))
privacy model:           pure ε-DP, event level
per released stream:     ε = 0.25 per event
streams one event feeds: h = 4
total per event:         ε = 1 (= 4 × 0.25, sequential composition)
contribution cap:        2 per event (values are clamped to [0, 2])
count sensitivity:       L1 = 8 per tick (cap × h)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Protocol

from stream_dp.budget import ZCDP, Privacy, PureDP

__all__ = ["Accountant"]

DEFAULT_DELTA = 1e-6


class _Touches(Protocol):
    """Anything that knows how many released nodes one event feeds (``Domain``)."""

    @property
    def touches(self) -> int: ...


def _fmt(x: float) -> str:
    return f"{x:.6g}"


@dataclass(frozen=True)
class Accountant:
    """Event-level budget of one release: per node, nodes one event touches, cap.

    ``per_node``: budget each released stream spends per event (:class:`PureDP` or
    :class:`ZCDP`); ``nodes_touched``: ``h ≥ 1``; ``cap``: finite > 0, the largest contribution of
    one event (values are clamped to it).
    """

    per_node: Privacy
    nodes_touched: int = 1
    cap: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.per_node, (PureDP, ZCDP)):
            raise ValueError(
                f"per_node must be a PureDP or ZCDP budget, got {type(self.per_node).__name__}"
            )
        h = self.nodes_touched
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            raise ValueError(f"nodes_touched must be an integer >= 1, got {h!r}")
        c = self.cap
        if isinstance(c, bool) or not isinstance(c, Real) or not math.isfinite(c) or c <= 0:
            raise ValueError(f"cap must be a finite number > 0, got {c!r}")
        object.__setattr__(self, "cap", float(c))

    @classmethod
    def from_total(cls, total: Privacy, nodes_touched: int = 1, cap: float = 1.0) -> Accountant:
        """Split a total per-event budget evenly over the ``nodes_touched`` nodes.

        >>> Accountant.from_total(ZCDP(0.5), nodes_touched=2).per_node
        ZCDP(rho=0.25)
        """
        if not isinstance(total, (PureDP, ZCDP)):
            raise ValueError(f"total must be a PureDP or ZCDP budget, got {type(total).__name__}")
        h = nodes_touched
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            raise ValueError(f"nodes_touched must be an integer >= 1, got {h!r}")
        per_node = total if h == 1 else total.scaled(1.0 / h)
        return cls(per_node=per_node, nodes_touched=h, cap=cap)

    @classmethod
    def for_domain(cls, domain: _Touches, per_node: Privacy, cap: float = 1.0) -> Accountant:
        """The accountant of a :class:`~stream_dp.domain.Domain` (``h = domain.touches``)."""
        return cls(per_node=per_node, nodes_touched=int(domain.touches), cap=cap)

    @property
    def model(self) -> str:
        """``"pure"`` or ``"zcdp"``."""
        return self.per_node.model

    @property
    def total(self) -> Privacy:
        """Budget one event spends over all the nodes it feeds: ``h × per_node``."""
        return (
            self.per_node if self.nodes_touched == 1 else self.per_node.scaled(self.nodes_touched)
        )

    @property
    def sensitivity(self) -> float:
        """L1 sensitivity of one tick's vector of node counts: ``cap × h``."""
        return self.cap * self.nodes_touched

    @property
    def l2_sensitivity(self) -> float:
        """L2 sensitivity of one tick's vector of node counts: ``cap × √h``."""
        return self.cap * math.sqrt(self.nodes_touched)

    def check_model(self, privacy: Privacy) -> None:
        """Raise ``TypeError`` if ``privacy`` is not of this accountant's model."""
        if type(privacy) is not type(self.per_node):
            raise TypeError(
                f"privacy model mismatch: accountant is {self.model!r}, got "
                f"{type(privacy).__name__}; convert explicitly (e.g. PureDP.to_zcdp())"
            )

    def compose(self, *others: Accountant) -> Privacy:
        """Total per-event budget of several releases fed by the same events (they add)."""
        total = self.total
        for other in others:
            if not isinstance(other, Accountant):
                raise ValueError(f"others must be Accountant objects, got {type(other).__name__}")
            self.check_model(other.per_node)
            total = total + other.total
        return total

    def budget_units(self) -> tuple[tuple[str, int], ...]:
        """How many per-stream budgets each unit spends, as ``(unit, multiplier)`` pairs:
        ``(("stream", 1), ("event", h))``. A reader of ``dp.counts.v1`` (whose ``privacy`` is
        the per-stream budget) multiplies by these to show the guarantee next to it; a coarser
        unit (all of one person's events) would append a pair.

        >>> Accountant(PureDP(1.0), nodes_touched=3).budget_units()
        (('stream', 1), ('event', 3))
        """
        return (("stream", 1), ("event", self.nodes_touched))

    def headline(self) -> str:
        """The guarantee in one line, total first (the number to quote), then how it is made.

        >>> Accountant(PureDP(1.0), nodes_touched=3).headline()
        'ε = 3 per event (ε = 1 per stream × 3 streams each event feeds)'
        """
        sym, per, total = (("ε", self.per_node.epsilon, self.total.value)
                           if isinstance(self.per_node, PureDP)
                           else ("ρ", self.per_node.rho, self.total.value))
        h = self.nodes_touched
        feeds = "1 stream each event feeds" if h == 1 else f"{h} streams each event feeds"
        return (f"{sym} = {_fmt(total)} per event ({sym} = {_fmt(per)} per stream × {feeds})")

    def summary(self, delta: float = DEFAULT_DELTA) -> list[str]:
        """Human-readable lines for ``stream-dp plan`` (``delta`` for the zCDP → (ε, δ) line)."""
        h = self.nodes_touched
        lines: list[str] = []
        if isinstance(self.per_node, PureDP):
            e = self.per_node.epsilon
            lines.append("privacy model:           pure ε-DP, event level")
            lines.append(f"per released stream:     ε = {_fmt(e)} per event")
            lines.append(f"streams one event feeds: h = {h}")
            lines.append(
                f"total per event:         ε = {_fmt(self.total.value)} "
                f"(= {h} × {_fmt(e)}, sequential composition)"
            )
        else:
            r = self.per_node.rho
            total = self.total
            assert isinstance(total, ZCDP)
            lines.append("privacy model:           ρ-zCDP, event level")
            lines.append(f"per released stream:     ρ = {_fmt(r)} per event")
            lines.append(f"streams one event feeds: h = {h}")
            lines.append(
                f"total per event:         ρ = {_fmt(total.rho)} (= {h} × {_fmt(r)}, composition)"
            )
            lines.append(
                f"implied (ε, δ)-DP:       ε = {_fmt(total.to_approx_dp(delta))} at δ = {delta:g}"
                " (Canonne–Kamath–Steinke conversion)"
            )
        lines.append(
            f"contribution cap:        {_fmt(self.cap)} per event "
            f"(values are clamped to [0, {_fmt(self.cap)}])"
        )
        if isinstance(self.per_node, PureDP):
            lines.append(
                f"count sensitivity:       L1 = {_fmt(self.sensitivity)} per tick (cap × h)"
            )
        else:
            lines.append(
                f"count sensitivity:       L1 = {_fmt(self.sensitivity)}, "
                f"L2 = {_fmt(self.l2_sensitivity)} per tick (cap × h, cap × √h)"
            )
        return lines
