"""``stream-dp demo --privacy-unit user`` without a broker (issue #34): the table's user-level
columns, the default table unchanged, the user-level deployment's settings, and the options'
one-line errors from a real ``stream-dp demo`` process."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from agents.commands import _demo_users
from agents.commands.demo import Board, render

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("all", "www", "www/home", "api")
#: the default table (no --privacy-unit) as the demo drew it before the option existed
BEFORE = """H

tick 3   (consistent histogram pending)
stream                     released  ± stderr   consistent
----------------------------------------------------------
all                            -1.2  ±    3.2            …
  www                           8.8  ±    3.2            …
    www/home                   18.8  ±    3.2            …
  api                          28.8  ±    3.2            …"""


def _board(stderr: float) -> Board:
    board = Board(names=NAMES)
    for i, name in enumerate(NAMES):
        board.add_count({"tick": 3, "stream": name, "value": 10.0 * i - 1.25, "stderr": stderr,
                         "strategy": "naive"})
    return board


def test_the_default_table_is_as_before() -> None:
    assert render(_board(3.17), 3, None, "H") == BEFORE


def test_user_level_columns_and_the_operators_drop_count() -> None:
    user = Board(names=NAMES)
    user.add_count({"tick": 3, "stream": "all", "value": 7.0, "stderr": 31.7})
    text = render(_board(3.17), 3, None, "H", user, 1234)
    lines = text.splitlines()
    assert lines[3].endswith("user level  ± stderr") and lines[4] == "-" * 81
    assert lines[5] == BEFORE.splitlines()[5] + "          7.0  ±   31.7"
    assert lines[6].endswith("…" + " " * 10)  # not released yet at user level
    assert lines[-1] == ("user level: the bound dropped 1,234 events so far (operator view: "
                         "stream_dp_user_bounded_events_total)")
    assert "waiting for the worker's /metrics" in render(_board(1.0), 3, None, "H", user, None)


def test_the_user_level_deployment_settings() -> None:
    args = argparse.Namespace(privacy_unit="user", people=None, user_max_events=4,
                              user_period_ticks=None, scenario="web", offline=False, epsilon=2.0)
    _demo_users.validate(args)
    assert (args.people, args.user_period_ticks) == (1000, 60)
    event = {"app_id": "stream-dp-demo", "epsilon": 2.0, "web_port": 1, "domain_file": "d.toml"}
    got = _demo_users.user_settings(event, args, 5)
    assert got["epsilon"] == 0.5 and got["privacy_unit"] == "user"
    assert (got["user_max_events"], got["user_period_ticks"], got["web_port"]) == (4, 60, 5)
    assert got["app_id"] != event["app_id"] and got["events_topic"].startswith(got["app_id"])
    assert got["metrics_event_counts"] == 1 and got["domain_file"] == "d.toml"
    assert event["epsilon"] == 2.0  # the event-level settings are untouched


@pytest.mark.parametrize(("args", "message"), [
    (["--people", "10"], "--people needs --privacy-unit user"),
    (["--user-max-events", "3"], "--user-max-events needs --privacy-unit user"),
    (["--privacy-unit", "user", "--offline"], "not --offline"),
    (["--privacy-unit", "user", "--people", "0"], "--people must be an integer in [1, "),
    (["--privacy-unit", "user", "--user-max-events", "0"], "--user-max-events must be"),
    (["--privacy-unit", "user", "--user-period-ticks", "0"], "--user-period-ticks must be"),
])
def test_bad_user_options_are_one_line_errors(args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "agents.cli", "demo", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
