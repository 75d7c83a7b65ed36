"""Rough edges a new user hit (issue 32, items 7-11 and 13), run the way a user runs them: a
``stream-dp`` subprocess, its exit status and its output."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from agents.cli import COMMANDS
from tests.unit.test_operations_cli import (
    CLOSED,
    GOOD_DOMAIN,
    _env,
    _worker_env,
    assert_one_line,
    run_cli,
)


def test_version_prints_the_installed_version() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"stream-dp {version('stream-dp')}"
    assert not proc.stderr


# -- item 11: error texts name the problem and the fix, not the internals --------------------

@pytest.mark.parametrize("argv", [
    ["tail", "counts", "--bootstrap", "127.0.0.1:9092x"],
    ["replay", "events.csv", "--bootstrap", "127.0.0.1:9092x"],
    ["topics", "list", "--bootstrap", "127.0.0.1:9092x"],
    ["worker", "--bootstrap", "127.0.0.1:9092x"],
])
def test_a_malformed_bootstrap_port_is_named(argv: list[str]) -> None:
    line = assert_one_line(run_cli(*argv), 2, "--bootstrap", "'9092x'", "127.0.0.1:9092")
    assert "invalid literal" not in line


@pytest.mark.parametrize("argv", [
    ["tail", "counts"],
    ["simulate", "restaurant", "--to-topic", "--ticks", "2"],
])
def test_a_malformed_bootstrap_variable_is_named(argv: list[str]) -> None:
    proc = run_cli(*argv, env=_env(STREAM_DP_BOOTSTRAP="127.0.0.1:9092x"))
    line = assert_one_line(proc, 2, "STREAM_DP_BOOTSTRAP", "'9092x'", "127.0.0.1:9092")
    assert "invalid literal" not in line


def test_worker_with_a_malformed_bootstrap_variable(tmp_path: Path) -> None:
    proc = run_cli("worker", env=_worker_env(tmp_path, GOOD_DOMAIN,
                                             STREAM_DP_BOOTSTRAP="127.0.0.1:9092x"))
    assert_one_line(proc, 2, "bootstrap", "'9092x'", "127.0.0.1:9092")


@pytest.mark.parametrize(("content", "needles"), [
    ("", ['no kind', '"binary"', "docs/configuration.md"]),
    ('name = "x"\nkind = "list"\nstreams = ["a"]\n', ["flat, hierarchy, grid, binary", "'list'"]),
    ('name = "x"\nkind = "hierarchy"\nstreams = ["r", "a", "b"]\nparents = ["", "b", "a"]\n',
     ["cycle (a -> b -> a)", "parent ''"]),
])
def test_domain_file_mistakes_are_explained(content: str, needles: list[str],
                                            tmp_path: Path) -> None:
    proc = run_cli("worker", env=_worker_env(tmp_path, content), cwd=tmp_path)
    line = assert_one_line(proc, 2, "domain.toml", *needles)
    assert "got None" not in line and "equal to -1" not in line
    (tmp_path / "d.toml").write_text(content)
    proc = run_cli("plan", "--p", "0.9", "--epsilon", "1", "--horizon", "15", "--domain",
                   str(tmp_path / "d.toml"))
    assert_one_line(proc, 2, "d.toml", *needles)


def test_simulate_to_topic_without_a_broker_says_so() -> None:
    proc = run_cli("simulate", "restaurant", "--to-topic", "--ticks", "2")
    line = assert_one_line(proc, 1, f"cannot connect to the broker at {CLOSED}",
                           "stream-dp broker start")
    assert "AddressFamily" not in line and "Unable to bootstrap" not in line


# -- item 13: help within 100 columns ----------------------------------------------------------

@pytest.mark.parametrize("command", ["", *sorted(COMMANDS)])
def test_help_lines_fit_100_columns(command: str) -> None:
    env = {k: v for k, v in _env().items() if k != "COLUMNS"}
    proc = run_cli(*([command] if command else []), "--help", env=env)
    assert proc.returncode == 0, proc.stderr
    wide = [line for line in proc.stdout.splitlines() if len(line) > 100]
    assert wide == [], wide
