"""Rounding a per-person figure for show without going below it: :func:`float_up` (the float at
or above an exact rational) and :func:`format_up` (6 significant digits, rounded up)."""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Context
from fractions import Fraction

__all__ = ["float_up", "format_up"]


def float_up(value: Fraction) -> float:
    """The smallest float ≥ ``value`` (so a bound printed as a float still bounds)."""
    out = float(value)
    if Fraction(out) < value:
        out = math.nextafter(out, math.inf)
    return out


def format_up(x: float) -> str:
    """``x`` with 6 significant digits, rounded *up* (a per-person figure shown is an upper
    bound: rounding to the nearest would show 0.37037 for 0.3703701) — except a float's own
    noise (below 10^-12 of ``x``: the figure of ε = 0.1 times 10 is 1.0000000000000002) is
    shown as the decimal it stands for, as the configured budget itself is (``ε = 0.1``)."""
    text = f"{x:.6g}"
    if math.isfinite(x) and x - float(text) > 1e-12 * abs(x):
        text = f"{float(Context(prec=6, rounding=ROUND_CEILING).create_decimal(x)):.6g}"
    return text
