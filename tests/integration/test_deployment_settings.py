"""A changed bound setting on a running deployment (issue #32, failure path 2), from the outside:
the worker is refused with exit status 4 **before it starts anything** (no "worker started", no
reconcile leadership), in one line that names each changed setting with both values, e.g.
``epsilon: 1 (stored) vs 2 (configured)`` — not the domain and two hashes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.test_commands_service import CLI, _worker_env, cli

pytestmark = pytest.mark.integration


def _first_run(env: dict[str, str], log_path: Path, *, settle: float = 2.0,
               start_within: float = 120.0) -> str:
    """A worker of the deployment runs until it has started and released for ``settle``
    seconds (a tick or two: checkpoints exist, as on any running deployment), then stops with
    exit status 0; its log."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*CLI, "worker"], env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + start_within
        while '"worker started"' not in log_path.read_text():
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(settle)
        assert proc.poll() is None, log_path.read_text()[-3000:]
    finally:
        proc.terminate()
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]
    return log_path.read_text()


def _refused(env: dict[str, str]) -> str:
    proc = cli("worker", env=env, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "worker started" not in proc.stderr and "leader" not in proc.stderr, proc.stderr
    assert lines[0].startswith("stream-dp worker: refusing to start: deployment "), lines[0]
    assert "stream-dp deployment new" in lines[0], lines[0]
    return lines[0]


def test_a_changed_epsilon_or_p_is_refused_before_anything_starts(
    kafka_broker: str, tmp_path: Path
) -> None:
    env = _worker_env(tmp_path, kafka_broker, f"settings{time.monotonic_ns()}", 0)
    env["STREAM_DP_EPSILON"] = "1"
    assert cli("topics", "create", env=env).returncode == 0
    _first_run(env, tmp_path / "first.log")

    line = _refused({**env, "STREAM_DP_EPSILON": "2"})
    assert "epsilon: 1 (stored) vs 2 (configured)" in line, line
    assert "domain" not in line.split("settings:", 1)[1], line  # the domain did not change

    line = _refused({**env, "STREAM_DP_EPSILON": "2", "STREAM_DP_P": "0.95"})
    assert "p: 0.9 (stored) vs 0.95 (configured); epsilon: 1 (stored) vs 2 (configured)" in line

    line = _refused({**env, "STREAM_DP_EPOCH": "1"})
    assert "epoch: 0 (stored) vs 1 (configured)" in line, line

    domain = Path(env["STREAM_DP_DOMAIN_FILE"])
    domain.write_text(domain.read_text().replace('"us/ny"]', '"us/ny", "us/ca"]'))
    line = _refused(env)
    assert "the domain file's content: digest " in line, line

    # the unchanged deployment still starts (the record does not refuse its own settings)
    domain.write_text(domain.read_text().replace(', "us/ca"]', "]"))
    _first_run(env, tmp_path / "again.log")


def test_a_changed_unit_of_privacy_or_person_bound_is_refused(
    kafka_broker: str, tmp_path: Path
) -> None:
    """privacy_unit = user (issue #34): the unit and every bound are bound into the deployment;
    a change either way is refused before anything starts, naming the setting."""
    env = _worker_env(tmp_path, kafka_broker, f"usersettings{time.monotonic_ns()}", 0)
    user = {"STREAM_DP_PRIVACY_UNIT": "user", "STREAM_DP_USER_PERIOD_TICKS": "60",
            "STREAM_DP_USER_MAX_EVENTS": "5"}
    assert cli("topics", "create", env=env).returncode == 0
    # without its changelog topic a user-level worker is refused in one line (exit 2)
    proc = cli("worker", env={**env, **user}, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "ingest-users.v1' does not exist" in lines[0] and "stream-dp topics create" in lines[0]
    assert cli("topics", "create", env={**env, **user}).returncode == 0  # + its changelog
    _first_run({**env, **user}, tmp_path / "first.log")
    # no leaf bound: the compiled scanner bounds persons (agents.ingest.users.table_status)
    assert "privacy_unit = user: the compiled scanner bounds persons in its own pass" in (
        tmp_path / "first.log").read_text()

    line = _refused({**env, **user, "STREAM_DP_USER_MAX_EVENTS": "6"})
    assert "user_max_events: 5 (stored) vs 6 (configured)" in line, line
    line = _refused({**env, **user, "STREAM_DP_USER_MAX_STREAMS": "2"})
    assert "user_max_streams: 0 (stored) vs 2 (configured)" in line, line
    line = _refused(env)  # back to event level
    assert "privacy_unit: 'user' (stored) vs 'event' (configured)" in line, line

    # an event-level deployment switched to the person as unit is refused too
    ev = _worker_env(tmp_path, kafka_broker, f"eventsettings{time.monotonic_ns()}", 0)
    assert cli("topics", "create", env=ev).returncode == 0
    _first_run(ev, tmp_path / "event.log")
    assert cli("topics", "create", env={**ev, **user}).returncode == 0  # the changelog topic
    line = _refused({**ev, **user})
    assert "privacy_unit: 'event' (stored) vs 'user' (configured)" in line, line
