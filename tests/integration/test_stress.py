"""Stress mode (``pytest --stress N``): scenarios that once failed now and then, repeated.

Not in the default run (marked ``stress``). Each round is one test item, so a failure names its
round; with ``--basetemp DIR`` the logs of every round stay in DIR (the worker's log is
``worker.log`` in the round's folder). The crash tests (marked ``crash``, e.g.
``tests/integration/test_pipeline_crashes.py``) are repeated the same way with ``--stress N``.

    .venv/bin/python -m pytest tests/integration/test_stress.py --stress 20 --basetemp /tmp/stress
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from agents.kafka.embedded_broker import free_port
from tests.integration.test_commands_service import CLI, _http, _worker_env, cli

pytestmark = [pytest.mark.integration, pytest.mark.stress]


def test_two_pipeline_processes_become_ready(tmp_path: Path, kafka_broker: str,
                                              unique_name: str, stress_round: int) -> None:
    """pipeline_processes = 2: the second child's join once stranded it for the rebalance
    timeout, then the group flipped for minutes and /readyz never turned 200 (issue #24; the
    cause and the fix: agents.kafka.groups.install_static_commit_rejoin)."""
    web_port = free_port()
    env = _worker_env(tmp_path, kafka_broker, unique_name, web_port)
    env["STREAM_DP_PIPELINE_PROCESSES"] = "2"
    assert cli("topics", "create", env=env).returncode == 0
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*CLI, "worker"], env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 90  # a generous bound; a healthy start takes seconds
        while _http(f"http://127.0.0.1:{web_port}/readyz")[0] != 200:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"never ready; log: {log_path}"
            time.sleep(0.5)
        text = log_path.read_text()
        assert "empty assignment" not in text, f"a child was stranded; log: {log_path}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_worker_with_two_pipeline_processes_serves_and_stops(
        tmp_path: Path, kafka_broker: str, unique_name: str, stress_round: int) -> None:
    """The whole scenario of the pipeline_processes = 2 liveness bug (issue #24), repeated:
    ready, releases, histograms, metrics relayed, every child gone after SIGTERM (the test of
    test_commands_service.py with two pipeline processes)."""
    from tests.integration.test_commands_service import (
        test_worker_serves_releases_histograms_health_and_stops_on_sigterm as scenario,
    )

    scenario(tmp_path, kafka_broker, unique_name, "2")
