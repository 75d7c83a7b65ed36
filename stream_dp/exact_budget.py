"""Privacy budgets computed in floating point, checked in exact rational arithmetic.

A noise scale ``Δ/ε`` rounded to nearest can lie half an ulp *below* ``Δ/ε`` (one event then
spends ``ε·(1 + 1e-16)``), and a split ``ε₀ + K·ε_t`` checked in floats can exceed ``ε`` in the
rationals while its float sum rounds to ``ε``. The samplers use the float scales *exactly*
(:mod:`stream_dp.noise`), so the privacy one event spends is a rational function of those
floats: these helpers compute it with :class:`fractions.Fraction` and move a float ulp by ulp
(:func:`math.nextafter`) until the exact check holds. A value that already passes is returned
unchanged, so parameters that were within the budget keep their noise (and their keys).

``tree-ls`` (:func:`stream_dp.strategies.ls_tree.plan.noise_scales`), ``naive-int`` and the
binary-attribute path (:mod:`stream_dp.attributes.release`) use them.

>>> from fractions import Fraction
>>> s = scale_at_least(1.0, 0.3)
>>> Fraction(1.0) / Fraction(s) <= Fraction(0.3)
True
>>> exact_decimal(Fraction(0.1) + Fraction(0.2))
'0.3000000000000000166533453693773481063544750213623046875'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

__all__ = ["exact_decimal", "lower_until", "raise_until", "scale_at_least"]


def raise_until(x: float, fits: Callable[[float], bool]) -> float:
    """``x`` moved up ulp by ulp until ``fits(x)`` (``x`` itself if it fits; stops at +inf)."""
    while x < math.inf and not fits(x):
        x = math.nextafter(x, math.inf)
    return x


def lower_until(x: float, fits: Callable[[float], bool]) -> float:
    """``x`` moved down ulp by ulp until ``fits(x)`` (``x`` itself if it fits; stops at 0)."""
    while x > 0.0 and not fits(x):
        x = math.nextafter(x, 0.0)
    return x


def scale_at_least(change: float, budget: float) -> float:
    """A Laplace-type noise scale (same units as ``change``) for which one change of
    ``change`` spends at most ``budget`` exactly: ``fl(change/budget)``, raised by an ulp only
    when the rounded quotient lies below ``change/budget`` in the rationals."""
    limit = Fraction(change) / Fraction(budget)
    return raise_until(change / budget, lambda s: Fraction(s) >= limit)


def exact_decimal(q: Fraction) -> str:
    """The exact decimal expansion of ``q`` when it has one (a sum of floats always does:
    its denominator is a power of two), else 40 significant digits followed by ``…``."""
    sign = "-" if q < 0 else ""
    q = abs(q)
    den = q.denominator
    twos = (den & -den).bit_length() - 1
    fives = 0
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den >> twos != 1:
        return f"{sign}{float(q):.40g}…"
    digits = max(twos, fives)
    scaled = q.numerator * 10**digits // q.denominator
    whole, frac = divmod(scaled, 10**digits)
    if digits == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{frac:0{digits}d}".rstrip("0").rstrip(".")
