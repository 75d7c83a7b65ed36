"""Accountant: exact constants, validation, model mixing, summary lines."""

from __future__ import annotations

import dataclasses
import math

import pytest

from stream_dp.accounting import Accountant
from stream_dp.budget import ZCDP, PureDP


def test_pure_split_and_total_exact() -> None:
    acc = Accountant.from_total(PureDP(1.0), nodes_touched=4, cap=2.0)
    assert acc.per_node == PureDP(0.25)
    assert acc.total == PureDP(1.0)
    assert acc.sensitivity == 8.0
    assert acc.l2_sensitivity == 4.0
    assert acc.model == "pure"


def test_per_node_times_h_exact() -> None:
    acc = Accountant(PureDP(0.5), nodes_touched=3, cap=1.0)
    assert acc.total == PureDP(1.5)
    assert acc.sensitivity == 3.0
    assert acc.l2_sensitivity == math.sqrt(3.0)


def test_zcdp_split_and_total_exact() -> None:
    acc = Accountant.from_total(ZCDP(0.5), nodes_touched=2, cap=1.0)
    assert acc.per_node == ZCDP(0.25)
    assert acc.total == ZCDP(0.5)
    # equivalent calibration: L2 sensitivity cap·√h with the total ρ
    assert acc.l2_sensitivity == math.sqrt(2.0)
    assert acc.model == "zcdp"


def test_flat_domain_is_identity() -> None:
    b = PureDP(0.7)
    acc = Accountant.from_total(b, nodes_touched=1)
    assert acc.per_node is b and acc.total is b and acc.sensitivity == 1.0


def test_compose_same_model_and_refuse_mixing() -> None:
    a = Accountant(PureDP(0.25), nodes_touched=4)
    b = Accountant(PureDP(0.5), nodes_touched=1)
    assert a.compose(b) == PureDP(1.5)
    z = Accountant(ZCDP(0.25), nodes_touched=2)
    with pytest.raises(TypeError, match="model mismatch"):
        a.compose(z)
    with pytest.raises(TypeError, match="model mismatch"):
        z.check_model(PureDP(1.0))
    z.check_model(ZCDP(3.0))  # same model: fine


@pytest.mark.parametrize("h", [0, -1, 1.5, True, "2", None])
def test_rejects_bad_nodes_touched(h: object) -> None:
    with pytest.raises(ValueError, match=r"nodes_touched must be an integer >= 1"):
        Accountant(PureDP(1.0), nodes_touched=h)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"nodes_touched must be an integer >= 1"):
        Accountant.from_total(PureDP(1.0), nodes_touched=h)  # type: ignore[arg-type]


@pytest.mark.parametrize("cap", [0, -1.0, math.nan, math.inf, "1", True])
def test_rejects_bad_cap(cap: object) -> None:
    with pytest.raises(ValueError, match=r"cap must be a finite number > 0"):
        Accountant(PureDP(1.0), cap=cap)  # type: ignore[arg-type]


def test_rejects_non_budget() -> None:
    with pytest.raises(ValueError, match="per_node must be a PureDP or ZCDP"):
        Accountant(1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="total must be a PureDP or ZCDP"):
        Accountant.from_total(1.0, 2)  # type: ignore[arg-type]


def test_frozen() -> None:
    acc = Accountant(PureDP(1.0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        acc.cap = 2.0  # type: ignore[misc]


def test_summary_pure_exact_lines() -> None:
    acc = Accountant(PureDP(0.25), nodes_touched=4, cap=1.0)
    assert acc.summary() == [
        "privacy model:           pure ε-DP, event level",
        "per released stream:     ε = 0.25 per event",
        "streams one event feeds: h = 4",
        "total per event:         ε = 1 (= 4 × 0.25, sequential composition)",
        "contribution cap:        1 per event (values are clamped to [0, 1])",
        "count sensitivity:       L1 = 4 per tick (cap × h)",
    ]


def test_summary_zcdp_shows_implied_approx_dp() -> None:
    acc = Accountant(ZCDP(0.125), nodes_touched=4)
    lines = acc.summary(delta=1e-6)
    assert "total per event:         ρ = 0.5 (= 4 × 0.125, composition)" in lines
    eps = ZCDP(0.5).to_approx_dp(1e-6)
    assert any(
        line.startswith(f"implied (ε, δ)-DP:       ε = {eps:.6g} at δ = 1e-06") for line in lines
    )
    assert lines[-1] == "count sensitivity:       L1 = 4, L2 = 2 per tick (cap × h, cap × √h)"


def test_for_domain_uses_nodes_touched_of_real_domains() -> None:
    from stream_dp.domain import Domain

    flat = Domain.flat(["a", "b", "c"])
    tree = Domain.from_paths(["eu/de/berlin", "eu/fr/paris", "us/ny/nyc"], root="world")
    grid = Domain.grid({"sex": ["f", "m"], "age": ["young", "old"], "region": ["n", "s"]})
    for domain, h in ((flat, 1), (tree, 4), (grid, 5)):
        acc = Accountant.for_domain(domain, PureDP(0.5), cap=2.0)
        assert acc.nodes_touched == h == domain.touches
        assert acc.total == PureDP(0.5 * h)
        assert acc.sensitivity == 2.0 * h
        # one event really feeds h nodes
        key = {1: "a", 4: "eu/de/berlin", 5: "sex=f|age=old|region=s"}[h]
        assert len(domain.nodes_for_event(key)) == h
