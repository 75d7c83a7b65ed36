"""What a release says about the person as unit of privacy (agents.release.person): the
``privacy`` object of every record, the start-up lines, the tail row and ``auto``'s pick.
The figures are checked against closed forms (pure DP and zCDP at b = 0: a node's factor is
``n`` and ``n²`` for the most events ``n`` one person can put into it), not the accountant."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from agents.commands._tail_format import format_count_row, privacy_text
from agents.config.domain import load_domain
from agents.config.settings import Settings
from agents.kafka.codec import schema
from agents.release.person import person_summary, privacy_block
from agents.release.state import build_mechanism
from stream_dp.accounting import Accountant
from stream_dp.budget import ZCDP

# two roots' worth of a 3-level hierarchy: root, 2, 6 and 24 leaves (h = 4 nodes per event)
PATHS = [f"r{i}/s{j}/l{k}" for i in range(2) for j in range(3) for k in range(4)]


def _settings(tmp_path: Path, **kw: Any) -> Settings:
    domain = tmp_path / "domain.toml"
    domain.write_text('name = "t"\nkind = "hierarchy"\nroot = "all"\npaths = ['
                      + ", ".join(json.dumps(p) for p in PATHS) + "]\n")
    return Settings(origin=1000.0, domain_file=str(domain), strategy="naive", p=0.9,
                    horizon=63, **kw)


USER = {"privacy_unit": "user", "user_period_ticks": 10, "user_max_events": 4,
        "user_max_streams": 3, "user_max_events_per_stream": 2}


def test_an_event_level_record_says_what_it_always_said(tmp_path: Path) -> None:
    s = _settings(tmp_path, epsilon=2.0)
    domain = load_domain(s.domain_file)
    assert privacy_block(s, domain, build_mechanism(s)) == {"model": "pure", "epsilon": 2.0}
    assert person_summary(s, domain) == []


def test_pure_dp_per_person_figures_are_the_closed_form(tmp_path: Path) -> None:
    s = _settings(tmp_path, epsilon=2.0, **USER)
    domain = load_domain(s.domain_file)
    h = Accountant.for_domain(domain, s.privacy).nodes_touched
    assert h == 4
    block = privacy_block(s, domain, build_mechanism(s))
    # a leaf takes min(K, k) = 2 of a person's events, any node above min(K, L·k) = 4; every
    # layer can take all K = 4 of a period
    assert block == {"model": "pure", "epsilon": 2.0, "unit": "person", "period_ticks": 10,
                     "per_person": {"stream": 8.0, "total": 4 * 4 * 2.0, "exact": True}}
    msg = {"stream": "all", "tick": 1, "tick_start": 0.0, "tick_end": 1.0, "value": 1.0,
           "stderr": 1.0, "strategy": "naive", "p": 0.9, "privacy": block, "cap": 1.0,
           "horizon": 63, "schema": "dp.counts.v1"}
    jsonschema.validate(msg, schema("dp.counts.v1"))
    assert privacy_text(block) == "ε=2 · ε=8 per person per period"
    assert format_count_row(msg).endswith("ε=2 · ε=8 per person per period")
    lines = person_summary(s, domain)
    assert "unit of privacy:         one person" in lines
    assert any(line.startswith("per released stream:     ε = 4 per person per period")
               for line in lines), lines  # the summary's per-stream line is a leaf's (2 × 2)
    assert any(line.startswith("per stream above leaves: ε = 8 per person per period")
               and line.endswith("exact)") for line in lines), lines
    assert any(line.startswith("total per person:        ε = 32 per period") for line in lines)


def test_zcdp_per_person_figures_are_the_closed_form(tmp_path: Path) -> None:
    s = dataclasses.replace(_settings(tmp_path, privacy_model="zcdp", rho=0.5, **USER),
                            strategy="tree")
    assert s.privacy == ZCDP(0.5)
    domain = load_domain(s.domain_file)
    block = privacy_block(s, domain, build_mechanism(s))
    # b = 0: all of a node's events in one tick, n² per-event budgets; the leaf layer splits
    # K = 4 over leaves of at most 2 (2² + 2² = 8), each of the 3 layers above takes 4 (16)
    assert block["per_person"] == {"stream": 16 * 0.5, "total": (8 + 3 * 16) * 0.5,
                                   "exact": True}
    jsonschema.validate({"stream": "all", "tick": 1, "tick_start": 0.0, "tick_end": 1.0,
                         "value": 1.0, "stderr": 1.0, "strategy": "naive", "p": 0.9,
                         "privacy": block, "cap": 1.0, "horizon": 63, "schema": "dp.counts.v1"},
                        schema("dp.counts.v1"))


@pytest.mark.parametrize("broken", [
    {"unit": "person"},  # the period and the figures must come with the unit
    {"unit": "event", "period_ticks": 10, "per_person": {"stream": 1, "total": 1, "exact": True}},
    {"unit": "person", "period_ticks": 10, "per_person": {"stream": 1, "total": 1}},
])
def test_the_schema_refuses_a_half_said_unit(broken: dict[str, Any]) -> None:
    msg = {"stream": "all", "tick": 1, "tick_start": 0.0, "tick_end": 1.0, "value": 1.0,
           "stderr": 1.0, "strategy": "naive", "p": 0.9,
           "privacy": {"model": "pure", "epsilon": 1.0, **broken}, "cap": 1.0, "horizon": 63,
           "schema": "dp.counts.v1"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(msg, schema("dp.counts.v1"))


def test_auto_ranks_by_the_user_level_error(tmp_path: Path) -> None:
    """The same deployment settings pick another strategy at user level: with events one tick
    apart a tree's per-person factor is far below blt's n² bound (stream_dp.planner)."""
    base = dataclasses.replace(_settings(tmp_path, privacy_model="zcdp", rho=0.5),
                               strategy="auto", p=0.9, horizon=63)
    user = dataclasses.replace(base, privacy_unit="user", user_period_ticks=64,
                               user_max_events=8, user_min_separation_ticks=1)
    assert build_mechanism(base).name == "blt"
    assert build_mechanism(user).name == "tree"
