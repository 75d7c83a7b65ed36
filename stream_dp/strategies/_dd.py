"""Double-double arithmetic on NumPy arrays (private): wide, *bounded-error* evaluation of the
measured linear functionals of the Fenwick and tree strategies.

A value is a pair ``(hi, lo)`` of float64 arrays with ``|lo| ≤ ulp(hi)/2``; it represents
``hi + lo`` (about 106 significant bits). Every operation below is built from the error-free
transformations ``two_sum`` (Knuth) and ``two_prod`` (Dekker's split, no FMA needed), which are
*exact* in IEEE binary64 round-to-nearest barring overflow and underflow.

**Error bounds** (non-negative operands, which is all the strategies use: counts ≥ 0, decays
and weights > 0): :func:`mul` and :func:`add` each return ``x·(1 + δ)`` of the exact result with
``|δ| ≤ 2**-102`` (Joldes, Muller, Popescu 2017 give ``≤ 2·2**-106`` and ``3·2**-106`` for
these "sloppy" variants with non-negative operands; we use the weaker ``2**-102`` throughout).
Underflow (values below ``2**-969``) can add an *absolute* error below ``2**-1000`` per
operation, which is far below every grid the strategies use (``≥ 2**-80`` value units).

:func:`round_split` turns ``x = hi + lo`` into two float64 integers ``(m_hi, m_lo)`` with
``|m_hi + m_lo − x| ≤ 1/2 + 2**-50`` and ``|m_lo| ≤ 1``: the strategies add their integer noise to
``m_lo`` (exact) and the noisy measurement ``m_hi + m_lo + z`` is an exact integer of up to
~2**1000, whatever the size of the data. Anything computed from ``(m_hi, m_lo + z)`` by float
arithmetic (``fl(m_hi + (m_lo + z))`` is the correctly rounded exact integer) depends on the
noisy measurement only.

>>> import numpy as np
>>> hi, lo = mul(np.array([3.0]), np.array([0.0]), 0.1)
>>> from fractions import Fraction
>>> Fraction(float(hi[0])) + Fraction(float(lo[0])) == 3 * Fraction(0.1)
True
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Float64Array = NDArray[np.float64]

__all__ = ["REL_ERR", "add", "mul", "mul_dd", "power", "round_split", "split", "two_prod", "two_sum"]

#: Relative error bound of one :func:`add` or :func:`mul` (non-negative operands).
REL_ERR = 2.0**-102

_SPLITTER = 134217729.0  # 2**27 + 1


def two_sum(a: Float64Array, b: Float64Array) -> tuple[Float64Array, Float64Array]:
    """``(s, e)`` with ``s = fl(a + b)`` and ``s + e = a + b`` exactly (Knuth's TwoSum)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def _fast_two_sum(a: Float64Array, b: Float64Array) -> tuple[Float64Array, Float64Array]:
    """``(s, e)`` with ``s + e = a + b`` exactly, for ``|a| ≥ |b|`` (or ``a`` = 0)."""
    s = a + b
    e = b - (s - a)
    return s, e


def split(a: Float64Array | float) -> tuple[Float64Array, Float64Array]:
    """Dekker's split: ``a = a_hi + a_lo`` exactly, each half with at most 26 significant bits."""
    c = _SPLITTER * np.asarray(a, dtype=np.float64)
    a_hi = c - (c - a)
    return a_hi, np.asarray(a - a_hi, dtype=np.float64)


def two_prod(a: Float64Array, b: float) -> tuple[Float64Array, Float64Array]:
    """``(p, e)`` with ``p = fl(a·b)`` and ``p + e = a·b`` exactly (Dekker's TwoProduct)."""
    p = a * b
    a_hi, a_lo = split(a)
    b_hi, b_lo = split(b)
    e = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    return p, e


def mul(hi: Float64Array, lo: Float64Array, b: float) -> tuple[Float64Array, Float64Array]:
    """``(hi + lo)·b`` as a double-double (relative error ≤ :data:`REL_ERR`)."""
    p, e = two_prod(hi, b)
    e = e + lo * b
    return _fast_two_sum(p, e)


def add(
    hi: Float64Array, lo: Float64Array, b_hi: Float64Array, b_lo: Float64Array | float = 0.0
) -> tuple[Float64Array, Float64Array]:
    """``(hi + lo) + (b_hi + b_lo)`` as a double-double (relative error ≤ :data:`REL_ERR` for
    operands of one sign)."""
    s, e = two_sum(hi, b_hi)
    e = e + (lo + b_lo)
    return _fast_two_sum(s, e)


def round_split(hi: Float64Array, lo: Float64Array) -> tuple[Float64Array, Float64Array]:
    """Two float64 integers ``(m_hi, m_lo)``, ``|m_lo| ≤ 1``, with ``m_hi + m_lo`` within
    ``1/2 + 2**-50`` of ``hi + lo`` (``|lo| ≤ ulp(hi)/2``).

    ``m_hi = rint(hi)`` and ``hi − m_hi`` are exact (Sterbenz), ``r = (hi − m_hi) + lo`` has
    ``|r| ≤ 1/2 + |lo|`` and is rounded once, so ``m_lo = rint(r)`` is within ``1/2`` of it.
    """
    m_hi = np.rint(hi)
    r = (hi - m_hi) + lo
    return m_hi, np.rint(r)


def mul_dd(
    hi: Float64Array, lo: Float64Array, b_hi: float, b_lo: float
) -> tuple[Float64Array, Float64Array]:
    """``(hi + lo)·(b_hi + b_lo)`` for a double-double constant ``b`` (relative error
    ≤ :data:`REL_ERR`, non-negative operands; the ``lo·b_lo`` term, below ``2**-104``
    relative, is left out)."""
    p, e = two_prod(hi, b_hi)
    e = e + (hi * b_lo + lo * b_hi)
    return _fast_two_sum(p, e)


def power(b: float, n: int) -> tuple[float, float]:
    """``b**n`` (``b > 0``, ``n ≥ 1``) as a double-double ``(hi, lo)`` by repeated squaring:
    relative error ≤ ``2·log2(n)·``:data:`REL_ERR` (each step one :func:`mul_dd`)."""
    if n < 1:
        raise ValueError(f"n must be an integer ≥ 1, got {n!r}")
    base = (np.array([float(b)]), np.array([0.0]))
    acc: tuple[Float64Array, Float64Array] | None = None
    while True:
        if n & 1:
            acc = base if acc is None else mul_dd(acc[0], acc[1], float(base[0][0]),
                                                  float(base[1][0]))
        n >>= 1
        if not n:
            break
        base = mul_dd(base[0], base[1], float(base[0][0]), float(base[1][0]))
    assert acc is not None
    return float(acc[0][0]), float(acc[1][0])
