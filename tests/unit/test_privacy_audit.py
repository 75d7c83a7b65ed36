"""Empirical privacy audit of every strategy (machinery and method: :mod:`tests.unit._audit`).

For each configuration, worst-case neighbouring inputs (one event of size ``cap`` at the tick
that maximises the sensitivity, and at the first tick after the horizon — a Fenwick epoch
rollover), 200 000 keyed trials per input through :class:`~stream_dp.counters.CounterBank`, the
optimal linear test (releases projected on ``Σ⁻¹Δμ``) and a Clopper–Pearson lower bound on ε at
95 % confidence. The bound must not exceed the declared ε (ε at δ = 1e-2 for ρ-zCDP), and a
deliberately halved noise scale must push it above (the audit can fail). Numbers:
docs/privacy.md ("Empirical privacy audit"); regenerate with ``python -m tests.unit._audit``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit._audit import CASES, Case, audit

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
@pytest.mark.parametrize("where", ["worst", "rollover"])
def test_audited_epsilon_stays_within_the_declared_one(case: Case, where: str) -> None:
    res = audit(case, where)
    assert res.epsilon_lb <= case.declared, (case.label, where, res.epsilon_lb)
    # the audit is sharp enough to see a good part of ε (a broken audit would see nothing)
    assert res.epsilon_lb >= 0.25 * case.declared, (case.label, where, res.epsilon_lb)


@pytest.mark.parametrize("case", [c for c in CASES if c.control], ids=lambda c: c.label)
def test_audit_catches_a_halved_noise_scale(case: Case) -> None:
    res = audit(case, "worst", weaken=True)
    assert res.epsilon_lb > case.declared, (case.label, res.epsilon_lb)
