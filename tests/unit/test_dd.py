"""Double-double helpers (:mod:`stream_dp.strategies._dd`) against exact rational arithmetic."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from stream_dp.strategies import _dd


def _exact(hi: np.ndarray, lo: np.ndarray) -> list[Fraction]:
    return [Fraction(float(h)) + Fraction(float(low)) for h, low in zip(hi, lo, strict=True)]


@pytest.fixture
def values() -> np.ndarray:
    rng = np.random.default_rng(26)
    mant = rng.uniform(0.5, 1.0, 400)
    exps = rng.integers(-60, 200, 400)
    out = np.ldexp(mant, exps)
    out[:3] = [0.0, 1.0, 2.0**53 + 2.0]
    return out


def test_two_sum_and_two_prod_are_exact(values: np.ndarray) -> None:
    other = values[::-1].copy()
    s, e = _dd.two_sum(values, other)
    p, f = _dd.two_prod(values, 0.999)
    for i in range(values.size):
        a, b = Fraction(float(values[i])), Fraction(float(other[i]))
        assert Fraction(float(s[i])) + Fraction(float(e[i])) == a + b
        assert Fraction(float(p[i])) + Fraction(float(f[i])) == a * Fraction(0.999)


def test_mul_add_chain_within_the_stated_relative_error(values: np.ndarray) -> None:
    """A decayed-sum recursion R ← p·R + D over 300 steps, in double-double: relative error
    ≤ 2·300·REL_ERR against the exact rational recursion."""
    p = 0.9990000000000001
    hi = np.zeros(4)
    lo = np.zeros(4)
    exact = [Fraction(0)] * 4
    rng = np.random.default_rng(1)
    for _ in range(300):
        d = rng.choice(values, 4)
        hi, lo = _dd.mul(hi, lo, p)
        hi, lo = _dd.add(hi, lo, d)
        exact = [Fraction(p) * x + Fraction(float(v)) for x, v in zip(exact, d, strict=True)]
    got = _exact(hi, lo)
    for g, x in zip(got, exact, strict=True):
        assert abs(g - x) <= x * Fraction(2 * 300) * Fraction(_dd.REL_ERR)


def test_round_split_is_within_half_a_unit(values: np.ndarray) -> None:
    hi, lo = _dd.mul(values, np.zeros_like(values), 1.0 / 3.0)
    m_hi, m_lo = _dd.round_split(hi, lo)
    for i in range(values.size):
        x = Fraction(float(hi[i])) + Fraction(float(lo[i]))
        m = Fraction(float(m_hi[i])) + Fraction(float(m_lo[i]))
        assert m.denominator == 1
        assert abs(m - x) <= Fraction(1, 2) + Fraction(1, 2**50)
        # and the double-double product itself is the exact one to 2**-102 relative
        exact = Fraction(float(values[i])) * Fraction(1.0 / 3.0)
        assert abs(x - exact) <= exact * Fraction(_dd.REL_ERR)


@pytest.mark.parametrize("p", [0.999, 0.5, 0.9999999, 1.0])
@pytest.mark.parametrize("n", [1, 2, 3, 8, 4096, 524288])
def test_power_is_the_exact_power_to_the_stated_error(p: float, n: int) -> None:
    import math

    if n * math.log2(p) < -960:
        pytest.skip("the power underflows (absolute error below 2**-960, see the module doc)")
    hi, lo = _dd.power(p, n)
    got = Fraction(hi) + Fraction(lo)
    if n <= 4096:
        exact = Fraction(p) ** n
        bound = exact * Fraction(2 * max(1, math.ceil(math.log2(n)))) * Fraction(_dd.REL_ERR)
        assert abs(got - exact) <= bound
    else:  # the exact power has millions of bits: compare with mpmath-free log bounds
        assert abs(math.log(hi) - n * math.log(p)) <= 1e-12 * max(1.0, abs(n * math.log(p)))
    if p == 1.0:
        assert (hi, lo) == (1.0, 0.0)


def test_mul_dd_against_rational(values: np.ndarray) -> None:
    b_hi, b_lo = _dd.power(0.999, 37)
    hi, lo = _dd.mul_dd(values, np.zeros_like(values), b_hi, b_lo)
    b = Fraction(b_hi) + Fraction(b_lo)
    for i in range(values.size):
        exact = Fraction(float(values[i])) * b
        got = Fraction(float(hi[i])) + Fraction(float(lo[i]))
        assert abs(got - exact) <= exact * Fraction(_dd.REL_ERR)
