"""Budgets: validation, composition, conversions (against independent oracles)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy.stats import norm

from stream_dp.budget import ZCDP, PureDP, privacy_from_dict

BAD_VALUES = [0, 0.0, -1.0, -1e-300, math.nan, math.inf, -math.inf, "1", None, True, [1.0]]


@pytest.mark.parametrize("value", BAD_VALUES)
def test_pure_rejects_bad_epsilon(value: object) -> None:
    with pytest.raises(ValueError, match=r"epsilon must be a finite number > 0"):
        PureDP(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", BAD_VALUES)
def test_zcdp_rejects_bad_rho(value: object) -> None:
    with pytest.raises(ValueError, match=r"rho must be a finite number > 0"):
        ZCDP(value)  # type: ignore[arg-type]


def test_values_are_floats_and_frozen() -> None:
    b = PureDP(1)
    assert b.epsilon == 1.0 and isinstance(b.epsilon, float)
    assert PureDP(np.float64(0.5)).epsilon == 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.epsilon = 2.0  # type: ignore[misc]
    z = ZCDP(0.25)
    with pytest.raises(dataclasses.FrozenInstanceError):
        z.rho = 1.0  # type: ignore[misc]
    assert hash(PureDP(0.5)) == hash(PureDP(0.5))
    assert PureDP(0.5) == PureDP(0.5) and PureDP(0.5) != ZCDP(0.5)


def test_composition_within_model_exact() -> None:
    assert PureDP(0.5) + PureDP(0.25) == PureDP(0.75)
    assert ZCDP(0.125) + ZCDP(0.375) == ZCDP(0.5)
    assert sum([PureDP(0.25)] * 4) == PureDP(1.0)
    assert sum([ZCDP(0.5), ZCDP(0.5)]) == ZCDP(1.0)


@pytest.mark.parametrize(("a", "b"), [(PureDP(1.0), ZCDP(0.5)), (ZCDP(0.5), PureDP(1.0))])
def test_mixing_models_raises_type_error(a: object, b: object) -> None:
    with pytest.raises(TypeError, match="cannot compose"):
        _ = a + b  # type: ignore[operator]
    with pytest.raises(TypeError):
        _ = a + 1.0  # type: ignore[operator]
    with pytest.raises(TypeError):
        sum([a, b])  # type: ignore[list-item]


def test_scaled_exact_and_validated() -> None:
    assert PureDP(1.0).scaled(0.25) == PureDP(0.25)
    assert PureDP(0.5).scaled(4) == PureDP(2.0)
    assert ZCDP(0.5).scaled(0.5) == ZCDP(0.25)
    for bad in (0, -1, math.nan, math.inf, "2"):
        with pytest.raises(ValueError, match=r"^k must be"):
            PureDP(1.0).scaled(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"^k must be"):
            ZCDP(1.0).scaled(bad)  # type: ignore[arg-type]


def test_pure_to_zcdp() -> None:
    assert PureDP(1.0).to_zcdp() == ZCDP(0.5)
    assert PureDP(2.0).to_zcdp() == ZCDP(2.0)
    assert PureDP(0.5).to_zcdp() == ZCDP(0.125)


def _cks_grid(rho: float, delta: float) -> float:
    """Independent oracle: minimise the CKS Cor. 13 bound on a dense log-grid of α."""
    a = 1.0 + np.logspace(-8, 8, 400_001)
    f = a * rho + (math.log(1 / delta) + (a - 1) * np.log1p(-1 / a) - np.log(a)) / (a - 1)
    return float(f.min())


def _gaussian_delta(eps: float, mu: float) -> float:
    """Exact δ(ε) of the Gaussian mechanism with sensitivity/σ = μ (Balle & Wang 2018)."""
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


@pytest.mark.parametrize("rho", [1e-4, 0.01, 0.1, 0.5, 1.0, 10.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_to_approx_dp_matches_cks_and_is_valid(rho: float, delta: float) -> None:
    eps = ZCDP(rho).to_approx_dp(delta)
    oracle = _cks_grid(rho, delta)
    assert eps <= oracle * (1 + 1e-9) + 1e-12  # never looser than the dense-grid optimum
    assert eps >= oracle * (1 - 1e-6)  # and not tighter than the bound allows
    assert eps < rho + 2 * math.sqrt(rho * math.log(1 / delta))  # beats the classic bound
    # Validity: the Gaussian mechanism is exactly ρ-zCDP with μ = sqrt(2ρ); its true δ at our ε
    # must not exceed δ.
    assert _gaussian_delta(eps, math.sqrt(2 * rho)) <= delta * (1 + 1e-9)


def test_to_approx_dp_known_constant_and_monotone() -> None:
    assert ZCDP(0.5).to_approx_dp(1e-6) == pytest.approx(5.2215344447, abs=1e-8)
    values = [ZCDP(0.5).to_approx_dp(d) for d in (1e-2, 1e-4, 1e-8, 1e-12)]
    assert values == sorted(values)


@pytest.mark.parametrize("delta", [0, 1, 1.5, -0.1, math.nan, "0.1", None])
def test_to_approx_dp_rejects_bad_delta(delta: object) -> None:
    with pytest.raises(ValueError, match=r"delta must be a number in \(0, 1\)"):
        ZCDP(1.0).to_approx_dp(delta)  # type: ignore[arg-type]


def test_wire_form_round_trip() -> None:
    for b in (PureDP(0.75), ZCDP(0.125)):
        assert privacy_from_dict(b.as_dict()) == b
    assert PureDP(0.75).as_dict() == {"model": "pure", "epsilon": 0.75}
    assert ZCDP(0.125).as_dict() == {"model": "zcdp", "rho": 0.125}
    with pytest.raises(ValueError, match="model must be"):
        privacy_from_dict({"model": "approx", "epsilon": 1.0})
    with pytest.raises(ValueError, match="epsilon"):
        privacy_from_dict({"model": "pure"})


def test_str_names_the_model() -> None:
    assert str(PureDP(0.5)) == "ε = 0.5 (pure DP)"
    assert str(ZCDP(0.25)) == "ρ = 0.25 (zCDP)"
