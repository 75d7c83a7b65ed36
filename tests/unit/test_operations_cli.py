"""Failure paths of the console script that need no broker, run the way a user runs them: a
subprocess, its exit status and the lines it writes on stderr (issue #24).

Each path: the right exit status, a short stderr that says what to do, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "agents.cli"]
KEY = "5f3c9a17e2b84d06c1f3a95e7b20d48c9e61f7a3052bd8c4e19f6a7302d5b8e1"  # 32 random bytes
CLOSED = "127.0.0.1:1"  # nothing listens there


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    env["STREAM_DP_BOOTSTRAP"] = CLOSED
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else _env(), cwd=cwd)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def assert_one_line(proc: subprocess.CompletedProcess[str], status: int, *needles: str) -> str:
    lines = _lines(proc.stderr)
    assert proc.returncode == status, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["plan", "--p", "0.9", "--epsilon", "1", "--horizon", "4095"],
    ["demo", "--offline"],
])
def test_output_into_a_closed_pipe_ends_quietly(argv: list[str], tmp_path: Path) -> None:
    """``stream-dp plan ... | head`` / ``demo --offline | head``: the reader went away."""
    proc = subprocess.Popen([*CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(), cwd=tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `head` exiting before the command writes
    err = proc.stderr.read().decode()
    assert proc.wait(120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert _lines(err) == []


def _without_kafka_client(tmp_path: Path) -> dict[str, str]:
    """The base install (no ``service`` extra): aiokafka cannot be imported."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys

        class _NoServiceExtra:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("aiokafka", "aiohttp", "noida_db"):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, _NoServiceExtra())
    """), encoding="utf-8")
    return _env(PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.parametrize("argv", [
    ["tail", "counts"],
    ["topics", "list"],
    ["topics", "create"],
    ["replay", "log.csv", "--no-close-markers"],
])
def test_base_install_names_the_extra(argv: list[str], tmp_path: Path) -> None:
    (tmp_path / "log.csv").write_text("key,ts,value\na,1704067200,1\n", encoding="utf-8")
    env = _without_kafka_client(tmp_path)
    env["STREAM_DP_REPLAY_HISTORY"] = str(tmp_path / "history.json")
    # replay checks its (broker-free) arguments first: a key, and no markers without --until
    env["STREAM_DP_KEY"] = "8d3a61f0c47e25b9a1e6d0937f4c28b5e0a9173dc62f8b4e5d17a0c39b6e2f84"
    proc = run_cli(*argv, env=env, cwd=tmp_path)
    assert_one_line(proc, 1, "stream-dp[service]", "aiokafka")


def test_plan_runs_on_the_base_install(tmp_path: Path) -> None:
    proc = run_cli("plan", "--p", "0.9", "--epsilon", "1", "--horizon", "15",
                   env=_without_kafka_client(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "strategy" in proc.stdout


@pytest.mark.parametrize("argv", [
    ["tail", "counts"],
    ["tail", "histograms", "--from-beginning"],
    ["topics", "list"],
    ["topics", "create"],
])
def test_clients_without_a_broker_say_so_in_one_line(argv: list[str], tmp_path: Path) -> None:
    line = assert_one_line(run_cli(*argv, "--bootstrap", CLOSED, cwd=tmp_path), 1,
                           f"cannot connect to the broker at {CLOSED}", "stream-dp broker start")
    assert "Unclosed" not in line and "AddressFamily" not in line


def test_replay_without_a_broker_says_so_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "log.csv").write_text("key,ts,value\na,1704067200,1\n", encoding="utf-8")
    proc = run_cli("replay", "log.csv", "--bootstrap", CLOSED, "--until", "1704067260",
                   cwd=tmp_path, env=_env(STREAM_DP_KEY=KEY, STREAM_DP_REPLAY_HISTORY=str(
                       tmp_path / "history.json")))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Unclosed" not in proc.stderr
    errors = [line for line in _lines(proc.stderr) if "cannot connect" in line]
    assert len(errors) == 1 and "stream-dp broker start" in errors[0], proc.stderr
    assert len(_lines(proc.stderr)) <= 2, proc.stderr  # (+ the first-replay note)


def _worker_env(tmp_path: Path, domain: str, **extra: str) -> dict[str, str]:
    (tmp_path / "domain.toml").write_bytes(domain.encode("utf-8", "surrogateescape"))
    return _env(STREAM_DP_KEY=KEY, STREAM_DP_ORIGIN="0", STREAM_DP_SCHEDULE="markers",
                STREAM_DP_DOMAIN_FILE=str(tmp_path / "domain.toml"), **extra)


GOOD_DOMAIN = 'name = "shop"\nkind = "hierarchy"\nroot = "all"\npaths = ["eu/fr", "us/ny"]\n'


def test_worker_without_a_broker_one_line_exit_1(tmp_path: Path) -> None:
    proc = run_cli("worker", env=_worker_env(tmp_path, GOOD_DOMAIN), cwd=tmp_path)
    assert_one_line(proc, 1, f"cannot connect to the broker at {CLOSED}",
                    "stream-dp broker start")


@pytest.mark.parametrize(("content", "needle"), [
    ('name = "shop"\nkind = "hierarchy"\nroot = "all"\npaths = ["a/b", "a/b"]\n',
     "duplicate path: 'a/b'"),
    ('name = "sh\udcedop"\nkind = "list"\nstreams = ["a"]\n', "not valid UTF-8 text (byte 0xed"),
    ('name = "shop"\nkind = \n', "not valid TOML"),
])
def test_worker_domain_file_problems_name_the_file(content: str, needle: str,
                                                    tmp_path: Path) -> None:
    proc = run_cli("worker", env=_worker_env(tmp_path, content), cwd=tmp_path)
    assert_one_line(proc, 2, "domain.toml", needle)


@pytest.mark.parametrize(("content", "needle"), [
    ('name = "shop"\nkind = "hierarchy"\nroot = "all"\npaths = ["a/b", "a/b"]\n',
     "duplicate path: 'a/b'"),
    ('name = "sh\udcedop"\nkind = "list"\nstreams = ["a"]\n', "not valid UTF-8 text (byte 0xed"),
])
def test_plan_domain_file_problems_name_the_file(content: str, needle: str,
                                                  tmp_path: Path) -> None:
    (tmp_path / "d.toml").write_bytes(content.encode("utf-8", "surrogateescape"))
    proc = run_cli("plan", "--p", "0.9", "--epsilon", "1", "--horizon", "15", "--domain",
                   str(tmp_path / "d.toml"))
    assert_one_line(proc, 2, "d.toml", needle)


@pytest.mark.parametrize("command", [["worker"], ["topics", "create"]])
def test_missing_settings_file_is_named(command: list[str], tmp_path: Path) -> None:
    proc = run_cli(*command, "--config", str(tmp_path / "nope.toml"), cwd=tmp_path)
    assert_one_line(proc, 2, "settings file", "nope.toml", "No such file")


def test_worker_bad_settings_one_line_exit_2(tmp_path: Path) -> None:
    proc = run_cli("worker", env=_worker_env(tmp_path, GOOD_DOMAIN, STREAM_DP_P="1.5"))
    assert_one_line(proc, 2, "p must be in (0, 1]")


def test_plan_explains_its_columns() -> None:
    proc = run_cli("plan", "--p", "0.9", "--epsilon", "1", "--horizon", "255")
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in proc.stdout.splitlines() if line.startswith("strategy"))
    legend = proc.stdout.split("columns:", 1)[1]
    for column in ("sensitivity", "RMSE/release", "MSE/release", "ratio", "x bound",
                   "range/tick"):
        assert column in header
        assert f"\n  {column} " in legend, column
    assert "rounding slack" in legend  # why a sensitivity reads 1.000008


def test_progress_lines_in_a_log_come_at_least_every_5_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """A paced replay into a log file (not a terminal): a line per 10 % *and* at least one
    every 5 s while it moves (at --speed 1 the first line used to come after 12 s)."""
    import io

    from agents.commands import _progress

    clock = [100.0]
    monkeypatch.setattr(_progress.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    bar = _progress.ProgressBar(1000, stream=out)
    for second in range(30):  # 30 s for the first 3 % of the log
        clock[0] += 1.0
        bar.advance_to(second, second)
    lines = out.getvalue().splitlines()
    assert 6 <= len(lines) <= 8, lines  # every 5 s (+ the first), not one per 10 % only


def test_binary_attribute_tables_are_printed_with_labelled_cells() -> None:
    """`tail marginals` / `tail tables` (and the demo, which uses the same formatting) printed
    rows of unlabelled numbers; each cell now carries its yes/no pattern, and a legend says how
    to read it."""
    from agents.commands._tail_format import CELLS_LEGEND, format_marginals, format_table_row

    table = {"names": ["milk", "bread"], "kind": "cluster", "cells": [12.0, 4.0, 3.0, 0.5],
             "stderr": 1.0}
    block = format_marginals({"tick": 3, "tables": [table], "clusters": [[0, 1]]})
    assert CELLS_LEGEND in block
    assert "[milk,bread]  00:12.0 01:4.0 10:3.0 11:0.5" in block
    row = format_table_row({**table, "tick": 3, "table": 0, "tables": 1, "epoch": 1})
    assert "00:12.0 01:4.0 10:3.0 11:0.5" in row
