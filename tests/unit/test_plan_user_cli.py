"""``stream-dp plan --privacy-unit user`` from the outside (issue #34): a real ``stream-dp``
process, its exit status, its output; the figures against the library's accountant built
independently of the command, and the solved budget against exact rational arithmetic."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest

from stream_dp.accounting import Accountant
from stream_dp.budget import ZCDP, PureDP
from stream_dp.domain import Domain
from stream_dp.planner import make_mechanism, pick
from stream_dp.user_level.accounting import UserAccountant, layer_leaves, stream_factor
from stream_dp.user_level.bounds import UserBounds
from tests.unit.test_operations_cli import _env, assert_one_line, run_cli

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = str(ROOT / "examples" / "domain.toml")
BASE = ["plan", "--p", "1", "--privacy", "zcdp", "--rho", "0.01", "--horizon", "63"]
USER = ["--privacy-unit", "user", "--user-max-events", "4", "--user-period-ticks", "64",
        "--user-min-separation-ticks", "3"]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path) -> None:
    global ENV
    ENV = _env(STREAM_DP_CACHE_DIR=str(tmp_path))


ENV: dict[str, str] = {}


def _json(*argv: str) -> dict[str, object]:
    proc = run_cli(*argv, "--format", "json", env=ENV)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_user_level_figures_match_the_accountant() -> None:
    doc = _json(*BASE, *USER, "--domain", DOMAIN, "--tick-seconds", "60")
    user = doc["user_level"]
    assert isinstance(user, dict)
    bounds = UserBounds(max_events=4, period_ticks=64, min_separation_ticks=3)
    chosen = pick(1.0, 63, ZCDP(0.01), user_bounds=bounds)
    assert user["pick"] == chosen
    domain = Domain.from_file(DOMAIN)
    acc = UserAccountant(Accountant.for_domain(domain, ZCDP(0.01)), bounds, layer_leaves(domain),
                         make_mechanism(chosen, 1.0, 63, ZCDP(0.01)), 60.0)
    figs = user["accounting"]
    stream = stream_factor(acc.mech, 4, 3, 64)
    assert figs["stream"]["factor"] == pytest.approx(stream.value, rel=1e-12)
    assert figs["stream"]["exact"] is stream.exact
    assert figs["stream"]["privacy"] == {"model": "zcdp", "rho": pytest.approx(0.01 * stream.value)}
    total, exact = acc.period_factor()
    assert figs["period"]["factor"] == pytest.approx(total, rel=1e-12)
    assert figs["period"]["exact"] is exact
    year, year_exact = acc.year_factor()
    assert figs["year"]["factor"] == pytest.approx(year, rel=1e-12)
    assert figs["year"]["exact"] is year_exact and figs["year"]["periods"] == math.ceil(
        365 * 86_400 / (64 * 60))
    # one row per zCDP strategy, each with its factor
    assert {r["strategy"] for r in user["strategies"]} == {  # type: ignore[index]
        "tree", "binary-tree", "sqrt", "tree-ls", "blt"}


def test_text_says_which_figures_are_exact() -> None:
    proc = run_cli(*BASE, *USER, env=ENV)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    person = lines[lines.index("unit of privacy:         one person"):]
    for head in ("per released stream:", "total per person:", "over a year:"):
        line = next(ln for ln in person if ln.startswith(head))
        assert line.rstrip(")").endswith(("exact", "an upper bound")), line
        assert "ρ = " in line and "ε = " in line and "δ = 1e-06" in line  # zCDP and its (ε, δ)
    assert any(ln.startswith("pick (user level): ") for ln in lines)
    assert "bounds per period:       K = 4 events, b = 3 ticks apart" in lines


def test_event_level_output_is_unchanged_without_the_option() -> None:
    plain = run_cli(*BASE, env=ENV)
    user = run_cli(*BASE, *USER, env=ENV)
    assert plain.returncode == user.returncode == 0
    assert user.stdout.startswith(plain.stdout.rstrip("\n"))
    assert "user level" not in plain.stdout


def test_solved_budget_is_the_largest_float_under_the_target() -> None:
    doc = _json("plan", "--p", "0.9", "--epsilon", "0.1", "--horizon", "63", *USER,
                "--user-target-epsilon", "1")
    solved = doc["user_level"]["solved"]  # type: ignore[index]
    per = solved["per_event"]["epsilon"]
    factor = solved["factor"]
    # independently: the pick at that ε, its total factor, the exact product under the target
    bounds = UserBounds(max_events=4, period_ticks=64, min_separation_ticks=3)
    mech = make_mechanism(doc["user_level"]["pick"], 0.9, 63, PureDP(per))  # type: ignore[index]
    acc = UserAccountant(Accountant(PureDP(per), 1), bounds, (1,), mech, 60.0)
    assert acc.period_factor()[0] == factor
    assert Fraction(per) * Fraction(factor) <= 1
    assert Fraction(math.nextafter(per, math.inf)) * Fraction(factor) > 1


@pytest.mark.parametrize(("extra", "needles"), [
    (["--privacy-unit", "user", "--user-period-ticks", "64"], ["--user-max-events"]),
    (["--privacy-unit", "user", "--user-max-events", "4"], ["--user-period-ticks"]),
    (["--privacy-unit", "user", "--user-max-events", "4", "--user-period-ticks", "-1"],
     ["--user-period-ticks", "got -1"]),
    (["--privacy-unit", "user", "--user-max-events", "0", "--user-period-ticks", "64"],
     ["--user-max-events", "got 0"]),
    ([*USER, "--user-min-separation-ticks", "-1"], ["--user-min-separation-ticks", "got -1"]),
    ([*USER, "--user-max-streams", "-2"], ["--user-max-streams", "got -2"]),
    (["--user-max-events", "4"], ["--user-max-events belongs to --privacy-unit user"]),
    ([*USER, "--tick-seconds", "0"], ["--tick-seconds", "> 0"]),
    ([*USER, "--user-target-epsilon", "1"], ["--user-target-epsilon belongs to --privacy pure"]),
    ([*USER, "--user-target-rho", "-1"], ["--user-target-rho", "> 0"]),
])
def test_bad_user_values_exit_2_with_one_line(extra: list[str], needles: list[str]) -> None:
    assert_one_line(run_cli(*BASE, *extra, env=ENV), 2, "stream-dp plan: error:", *needles)


def test_help_lists_the_user_options() -> None:
    proc = run_cli("plan", "--help", env=ENV)
    assert proc.returncode == 0
    for flag in ("--privacy-unit", "--user-max-events", "--user-period-ticks",
                 "--user-max-streams", "--user-max-events-per-stream",
                 "--user-min-separation-ticks", "--tick-seconds", "--user-target-epsilon",
                 "--user-target-rho"):
        assert flag in proc.stdout
