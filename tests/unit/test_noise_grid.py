"""Power-of-two grids: choice, rounding rule, range limits, exact round trips."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from stream_dp.noise.grid import (
    MAX_GRID_UNITS,
    choose_grid,
    from_grid,
    round_to_grid,
    validate_grid,
)


@pytest.mark.parametrize("scale", [1e-9, 0.1, 1.0, 3.0, 1000.0, 2.0**40, 1e15])
@pytest.mark.parametrize("bits", [0, 10, 20, 45])
def test_choose_grid_is_largest_power_of_two_below(scale: float, bits: int) -> None:
    g = choose_grid(scale, resolution_bits=bits)
    mantissa, _ = math.frexp(g)
    assert mantissa == 0.5  # a power of two
    assert Fraction(g) <= Fraction(scale) / 2**bits < 2 * Fraction(g)
    # the scale in grid units lies in [2^bits, 2^(bits+1))
    assert 2**bits <= scale / g < 2 ** (bits + 1)


def test_choose_grid_default_resolution() -> None:
    assert choose_grid(1.0) == 2.0**-20
    assert choose_grid(1.5) == 2.0**-20
    assert choose_grid(2.0) == 2.0**-19


@pytest.mark.parametrize("scale", [0, -1.0, math.nan, math.inf, "1", None, True])
def test_choose_grid_rejects_bad_scale(scale: object) -> None:
    with pytest.raises(ValueError, match="noise_scale must be a finite number > 0"):
        choose_grid(scale)  # type: ignore[arg-type]


@pytest.mark.parametrize("bits", [-1, 61, 1.5, True])
def test_choose_grid_rejects_bad_bits(bits: object) -> None:
    with pytest.raises(ValueError, match=r"resolution_bits must be an integer in \[0, 60\]"):
        choose_grid(1.0, resolution_bits=bits)  # type: ignore[arg-type]


def test_round_half_to_even_and_exact_quotients() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 0.49999999999999994, 3.25, -7.75])
    assert round_to_grid(x, 1.0).tolist() == [0, 2, 2, 0, -2, 0, 3, -8]
    g = 2.0**-3
    assert round_to_grid([0.0625, 0.1875, 1.0], g).tolist() == [0, 2, 8]  # halves to even
    r = round_to_grid(np.array([[1.0, 2.0], [3.0, 4.0]]), 0.5)
    assert r.dtype == np.int64 and r.shape == (2, 2) and r.tolist() == [[2, 4], [6, 8]]


def test_rounding_error_at_most_half_a_unit() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1e6, size=10_000)
    g = 2.0**-20
    k = round_to_grid(x, g)
    err = np.array([Fraction(float(a)) / Fraction(g) - int(b) for a, b in zip(x, k, strict=True)])
    assert max(abs(e) for e in err) <= Fraction(1, 2)


def test_round_trip_is_exact_on_the_grid() -> None:
    g = 2.0**-17
    k = np.array([0, 1, -1, 2**52, -(2**52) + 3, 123456789], dtype=np.int64)
    assert np.array_equal(round_to_grid(from_grid(k, g), g), k)
    assert from_grid([3], 0.25).tolist() == [0.75]


def test_range_limit_2_pow_53() -> None:
    g = 2.0**-10
    ok = (MAX_GRID_UNITS - 1) * g
    assert round_to_grid([ok], g).tolist() == [MAX_GRID_UNITS - 1]
    for bad in (MAX_GRID_UNITS * g, -MAX_GRID_UNITS * g, 1e300):
        with pytest.raises(ValueError, match=r"\|x / grid\| must be < 2\*\*53"):
            round_to_grid([1.0, bad], g)


@pytest.mark.parametrize("x", [math.nan, math.inf, -math.inf])
def test_non_finite_values_rejected(x: float) -> None:
    with pytest.raises(ValueError, match="x must be finite"):
        round_to_grid([0.0, x], 1.0)


@pytest.mark.parametrize("grid", [0, -1.0, 3.0, 0.3, math.nan, math.inf, 2.0**-1074, "1", None])
def test_grid_must_be_a_power_of_two(grid: object) -> None:
    with pytest.raises(ValueError, match="grid must be a positive power of two"):
        round_to_grid([1.0], grid)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="grid must be a positive power of two"):
        validate_grid(grid)  # type: ignore[arg-type]


def test_empty_input() -> None:
    assert round_to_grid([], 1.0).shape == (0,)
