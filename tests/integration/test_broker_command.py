"""`stream-dp broker` failure paths from the outside (issue #32, failure path 5): a start that
fails half-way leaves no broker running; a port held by the broker of another data directory is
named (pid, folder) by `start` and `status`; `stop` finds a broker whose pid file is missing.
Every broker here runs on a free port of this test (the command's --port), never 9092."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from agents.kafka.embedded_broker import free_port
from tests.integration.test_commands_service import cli, noida_processes

pytestmark = pytest.mark.integration


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


def test_a_start_that_fails_half_way_leaves_no_broker(tmp_path: Path) -> None:
    """The pid file cannot be written (a folder of that name): the broker it started is
    stopped again, one line, exit status 1, the port free."""
    data = tmp_path / "broker"
    (data / "broker.pid").mkdir(parents=True)
    port = free_port()
    proc = cli("broker", "start", "--data-dir", str(data), "--port", str(port), timeout=90)
    try:
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        assert "broker.pid" in _one_line(proc)
        assert not _listening(port)
        assert noida_processes(data) == []
    finally:
        cli("broker", "stop", "--data-dir", str(data))


def test_another_data_dirs_broker_on_the_port_is_named(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    port = free_port()
    started = cli("broker", "start", "--data-dir", str(first), "--port", str(port), timeout=90)
    assert started.returncode == 0, started.stderr
    try:
        pid = json.loads((first / "broker.pid").read_text())["pid"]
        status = cli("broker", "status", "--data-dir", str(second), "--port", str(port))
        assert status.returncode == 3, status.stdout
        assert f"pid {pid}, data {first.resolve()}" in status.stdout, status.stdout
        start = cli("broker", "start", "--data-dir", str(second), "--port", str(port))
        assert start.returncode == 1, (start.stdout, start.stderr)
        line = _one_line(start)
        assert f"pid {pid}, data {first.resolve()}" in line and "already in use" in line, line
        assert noida_processes(second) == []

        # the pid file lost: stop still finds the broker of this data directory
        (first / "broker.pid").unlink()
        stopped = cli("broker", "stop", "--data-dir", str(first), timeout=90)
        assert stopped.returncode == 0 and "broker stopped" in stopped.stdout, stopped.stdout
        assert not _listening(port)
        assert noida_processes(first) == []
    finally:
        cli("broker", "stop", "--data-dir", str(first), timeout=90)
