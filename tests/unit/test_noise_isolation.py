"""Noise isolation: two mechanisms that differ in anything get unrelated noise under one key.

For every registered strategy, a base configuration and variants that each change one field
(ε 1 → 1.99998 or ρ 0.5 → 1.99995, the grid via the cap, p, horizon, one weight × 1.1 or a plan
parameter, the stream names, the domain, the epoch) run on all-zero counts under one key. The
releases divided by their analytic standard error are the normalised noise; their Pearson
correlation over ``S`` streams × ``T`` ticks must be near 0 (|r| < 0.15; under independence r has
a standard deviation of about 1/√S ≈ 0.03 even if the ticks of one stream were fully
correlated, so the bound is ≈ 5σ). Identical configurations must give identical noise.

Before the canonical mechanism description keyed the noise, tree/binary-tree/sqrt drew the same
noise for ε = 1 and ε = 1.99998 when the noise landed on the same grid units, fenwick-opt ignored
its weights and the domain was not part of the key: these tests fail on that code.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from stream_dp.budget import ZCDP, Privacy, PureDP
from stream_dp.counters import CounterBank
from stream_dp.mechanism import Mechanism
from stream_dp.planner import make_mechanism
from stream_dp.strategies.fenwick.base import FenwickMechanism
from stream_dp.strategies.registry import available
from stream_dp.strategies.sqrt.mechanism import SqrtMechanism
from stream_dp.strategies.tree.mechanism import TreeMechanism
from stream_dp.strategies.tree.plan import TreePlan

KEY = bytes(range(32))
S = 1000
T = 4
BOUND = 0.15
P, HORIZON = 0.9, 63


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))


def _all_strategies() -> list[tuple[str, str]]:
    out = [(s, "pure") for s in available("pure", integer_counts=True)]
    out += [(s, "zcdp") for s in available("zcdp")]
    return out


def _privacy(model: str, changed: bool = False) -> Privacy:
    if model == "pure":
        return PureDP(1.99998 if changed else 1.0)
    return ZCDP(1.99995 if changed else 0.5)


def _bump_weight(mech: Mechanism) -> Mechanism | None:
    """The same strategy with one weight (or plan parameter) changed, or None if it has none."""
    if isinstance(mech, FenwickMechanism):
        base = type(mech)

        class Bumped(base):  # type: ignore[valid-type,misc]
            def _compute_weights(self, n: int) -> np.ndarray:
                w = np.array(super()._compute_weights(n), dtype=np.float64)
                w[0] *= 1.1
                return w

        return Bumped(mech.p, mech.horizon, mech.privacy, mech.cap)
    if isinstance(mech, TreeMechanism):
        w = list(mech.plan.weights)
        if len(w) < 2:
            return None
        w[0] *= 1.1
        return type(mech)(
            mech.p, mech.horizon, mech.privacy, mech.cap, plan=TreePlan(mech.plan.levels, tuple(w))
        )
    if isinstance(mech, SqrtMechanism):
        return SqrtMechanism(mech.p, mech.horizon, mech.privacy, mech.cap, taps=mech.taps * 2)
    return None


def _noise(
    mech: Mechanism, names: list[str] | None = None, domain_id: str = "", epoch: int = 0
) -> np.ndarray:
    """Normalised noise (release / analytic stderr) of ``S`` streams × ``T`` ticks."""
    bank = CounterBank(
        mech, names or [f"s{i}" for i in range(S)], KEY, domain_id=domain_id, epoch=epoch
    )
    out = np.empty((T, S))
    for t in range(T):
        out[t] = bank.step(np.zeros(S)) / np.sqrt(mech.variance(t + 1))
    return out


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


def _variants(strategy: str, model: str) -> dict[str, Callable[[], np.ndarray]]:
    def mk(**kw: object) -> Mechanism:
        args: dict[str, object] = {"p": P, "horizon": HORIZON, "privacy": _privacy(model), "cap": 1.0}
        args.update(kw)
        return make_mechanism(
            strategy, args["p"], args["horizon"], args["privacy"], args["cap"]  # type: ignore[arg-type]
        )

    out: dict[str, Callable[[], np.ndarray]] = {
        "budget": lambda: _noise(mk(privacy=_privacy(model, changed=True))),
        "grid (cap 1 → 2)": lambda: _noise(mk(cap=2.0)),
        "p": lambda: _noise(mk(p=0.91)),
        "horizon": lambda: _noise(mk(horizon=127)),
        "stream names": lambda: _noise(mk(), names=[f"t{i}" for i in range(S)]),
        "domain": lambda: _noise(mk(), domain_id="another-domain"),
        "epoch": lambda: _noise(mk(), epoch=1),
    }
    bumped = _bump_weight(mk())
    if bumped is not None:
        out["weight ×1.1"] = lambda: _noise(bumped)
    return out


@pytest.mark.parametrize(("strategy", "model"), _all_strategies())
def test_every_field_of_the_mechanism_separates_the_noise(strategy: str, model: str) -> None:
    base = make_mechanism(strategy, P, HORIZON, _privacy(model))
    ref = _noise(base)
    # identical configuration (built again from scratch): identical noise
    again = _noise(make_mechanism(strategy, P, HORIZON, _privacy(model)))
    assert again.tobytes() == ref.tobytes()
    assert _corr(ref, again) > 1 - 1e-9  # the statistic flags shared noise (the test can fail)
    bad = {}
    for field, run in _variants(strategy, model).items():
        other = run()
        r = _corr(ref, other)
        equal = float(np.mean(ref == other))
        if not (abs(r) < BOUND and equal < 0.2):
            bad[field] = (round(r, 3), round(equal, 3))
    assert not bad, f"{strategy}/{model}: correlated noise for {bad}"


@pytest.mark.parametrize(("strategy", "model"), _all_strategies())
def test_description_names_every_field(strategy: str, model: str) -> None:
    """The canonical description changes with each field, and is stable for equal inputs."""
    base = make_mechanism(strategy, P, HORIZON, _privacy(model))
    assert base.canonical_bytes() == make_mechanism(
        strategy, P, HORIZON, _privacy(model)
    ).canonical_bytes()
    others = [
        make_mechanism(strategy, P, HORIZON, _privacy(model, changed=True)),
        make_mechanism(strategy, 0.91, HORIZON, _privacy(model)),
        make_mechanism(strategy, P, 127, _privacy(model)),
        make_mechanism(strategy, P, HORIZON, _privacy(model), 2.0),
    ]
    bumped = _bump_weight(base)
    if bumped is not None:
        others.append(bumped)
    fps = {m.fingerprint() for m in others}
    assert base.fingerprint() not in fps and len(fps) == len(others)
    assert base.tag.startswith(f"{strategy}/")
