"""`stream-dp broker` failure paths from the outside (issue #32, failure path 5): a start that
fails half-way leaves no broker running; a port held by the broker of another data directory is
named (pid, folder) by `start` and `status`; `stop` finds a broker whose pid file is missing.
Every broker here runs on a free port of this test (the command's --port), never 9092."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.kafka.embedded_broker import free_port
from agents.kafka.processes import dying_with_parent
from tests.integration.test_commands_service import CLI, cli, noida_processes

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


def _wait_no_broker(data: Path, port: int, within_s: float = 20.0) -> list[str]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and (noida_processes(data) or _listening(port)):
        time.sleep(0.1)
    return noida_processes(data)


_HOLDER = """
import sys, time
from agents.kafka.embedded_broker import EmbeddedBroker
broker = EmbeddedBroker(data_dir=sys.argv[1]).start()
print(broker.port, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_the_embedded_broker_dies_with_a_parent_killed_by_sigkill(tmp_path: Path) -> None:
    """kill -9 runs no clean-up in the parent: the broker (a test's, the demo's) must still
    not be left running, holding its port and its RAM."""
    data = tmp_path / "broker"
    holder = subprocess.Popen(dying_with_parent([sys.executable, "-c", _HOLDER, str(data)]),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        assert _listening(port) and noida_processes(data)
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert _wait_no_broker(data, port) == [], "the broker outlived its parent"
        assert not _listening(port)
    finally:
        holder.kill()
        for pid in noida_processes(data):
            os.kill(int(pid), signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_broker_start_foreground_killed_with_sigkill_leaves_no_broker(tmp_path: Path) -> None:
    """The foreground broker belongs to its command; the background one outlives its command
    (the other tests here run it so) and is stopped by 'broker stop'."""
    data = tmp_path / "broker"
    port = free_port()
    fg = subprocess.Popen(dying_with_parent([*CLI, "broker", "start", "--foreground",
                                             "--data-dir", str(data), "--port", str(port)]),
                          stdout=subprocess.PIPE, text=True)
    try:
        assert fg.stdout is not None
        assert fg.stdout.readline().startswith("broker running on"), "no start line"
        assert _listening(port) and noida_processes(data)
        fg.send_signal(signal.SIGKILL)
        fg.wait(10)
        assert _wait_no_broker(data, port) == [], "the foreground broker outlived its command"
    finally:
        fg.kill()
        cli("broker", "stop", "--data-dir", str(data))


def test_a_background_broker_outlives_its_command(tmp_path: Path) -> None:
    data = tmp_path / "broker"
    port = free_port()
    started = cli("broker", "start", "--data-dir", str(data), "--port", str(port), timeout=90)
    try:
        assert started.returncode == 0, started.stderr
        time.sleep(1.0)  # a parent-death signal would have arrived by now
        assert _listening(port) and noida_processes(data)
        assert cli("broker", "status", "--data-dir", str(data),
                   "--port", str(port)).returncode == 0
    finally:
        assert cli("broker", "stop", "--data-dir", str(data)).returncode == 0
    assert _wait_no_broker(data, port) == []
