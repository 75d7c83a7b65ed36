"""`stream-dp demo` as a user runs it: shows live releases, exits 0, leaves no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "agents.cli"]


def processes_mentioning(text: str) -> list[str]:
    """Live processes whose command line or environment mentions ``text`` (a unique path)."""
    found = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            status = (entry / "status").read_text()
            if re.search(r"^State:\s+Z", status, re.M):
                continue  # a zombie is already dead
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in blob:
            found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()!r}")
    return found


def worker_problems(data: Path, limit: int = 6000) -> str:
    """The worker log's warning and error lines (with their tracebacks, the ``exc`` field),
    for a failure message: the demo's stdout only says how many ticks were released."""
    log_path = data / "worker.log"
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"\n(no worker log at {log_path}: {exc})"
    bad = [ln for ln in lines if '"level": "warning"' in ln or '"level": "error"' in ln
           or '"level": "critical"' in ln]
    with_exc = [ln for ln in bad if '"exc":' in ln]
    # the first traceback is the root cause; later lines are usually its repetitions
    picked = (with_exc[:1] + bad[:5] + bad[-5:]) if bad else lines[-10:]
    text = "\n".join(dict.fromkeys(picked))
    return f"\n--- {log_path} ({len(bad)} warning/error lines of {len(lines)}):\n{text[-limit:]}"


def check_output(out: str) -> None:
    assert re.search(r"dashboard\s+http://127\.0\.0\.1:\d+/dashboard/", out)
    ticks = [int(t) for t in re.findall(r"^tick (\d+)", out, re.M)]
    assert len(ticks) >= 2, out[-3000:]
    assert ticks == sorted(ticks)
    # A table row: stream, released value ± stderr, consistent value.
    rows = re.findall(r"^\s*(\S+)\s+(-?\d+\.\d)\s+±\s+(\d+\.\d)\s+(-?\d+\.\d)$", out, re.M)
    assert {r[0] for r in rows} >= {"all"}
    assert "reconciled in" in out


@pytest.mark.integration
@pytest.mark.slow
def test_demo_with_duration_shows_releases_and_exits_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    proc = subprocess.run(
        [*CLI, "demo", "--duration", "15", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:] + proc.stderr[-3000:]
                                  + worker_problems(data))
    try:
        check_output(proc.stdout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}{worker_problems(data)}") from None
    assert processes_mentioning(str(data)) == []
    # the headline is the guarantee per event: h × the per-stream ε (issue 32 item 7)
    from stream_dp.domain import Domain

    h = Domain.from_file(data / "domain.toml").touches
    assert h > 1
    headline = f"ε = {h:g} per event (ε = 1 per stream × {h} streams each event feeds)"
    assert headline in proc.stdout, proc.stdout[:2000]
    worker_pid = int(re.search(r"worker\s+pid (\d+)", proc.stdout).group(1))  # type: ignore[union-attr]
    assert not Path(f"/proc/{worker_pid}").exists() or "Z" in Path(
        f"/proc/{worker_pid}/status").read_text().split("State:")[1][:5]
    # The worker logged JSON lines and never the noise key.
    key = (data / "noise.key").read_text().strip()
    log_text = (data / "worker.log").read_text()
    assert key not in log_text
    assert '"msg": "worker stopped"' in log_text
    # the same folder again (guide §1's --data-dir /tmp/demo, run twice): the earlier run's
    # deployment is bound to its start time, so the demo starts afresh, says so, and releases
    # (it exited 1, its worker 4: "origin: … (stored) vs … (configured)")
    again = subprocess.run(
        [*CLI, "demo", "--duration", "15", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=180,
    )
    assert again.returncode == 0, (again.stdout[-3000:] + again.stderr[-3000:]
                                   + worker_problems(data))
    assert "starting afresh: removed the earlier demo's broker data" in again.stdout
    check_output(again.stdout)
    assert (data / "noise.key").read_text().strip() == key  # the folder's key is kept


@pytest.mark.integration
@pytest.mark.slow
def test_demo_stops_on_ctrl_c(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    out_path = tmp_path / "out.txt"
    with open(out_path, "w") as out:
        proc = subprocess.Popen([*CLI, "demo", "--data-dir", str(data)], stdout=out,
                                stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(re.findall(r"^tick \d+", out_path.read_text(), re.M)) < 2:
            assert proc.poll() is None, out_path.read_text()[-3000:]
            assert time.monotonic() < deadline, out_path.read_text()[-3000:]
            time.sleep(0.5)
        url = re.search(r"dashboard\s+(http://\S+)", out_path.read_text()).group(1)  # type: ignore[union-attr]
        with urllib.request.urlopen(url, timeout=10) as page:  # the worker serves the dashboard
            assert page.status == 200
        with urllib.request.urlopen(url.replace("/dashboard/", "/readyz"), timeout=10) as ready:
            assert ready.status == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0, out_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    check_output(out_path.read_text())
    assert processes_mentioning(str(data)) == []


@pytest.mark.integration
@pytest.mark.slow
def test_demo_temporary_data_removed_on_sigterm(tmp_path: Path) -> None:
    out_path = tmp_path / "out.txt"
    with open(out_path, "w") as out:
        proc = subprocess.Popen([*CLI, "demo"], stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while "dashboard" not in out_path.read_text():
            assert proc.poll() is None, out_path.read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.3)
        data = re.search(r"data in (\S+)\)", out_path.read_text()).group(1)  # type: ignore[union-attr]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, out_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not Path(data).exists()
    assert processes_mentioning(data) == []


@pytest.mark.integration
@pytest.mark.slow
def test_demo_attributes_scenario_shows_clusters_and_tables(tmp_path: Path) -> None:
    """`stream-dp demo --scenario attributes`: live events with yes/no attributes, the tables
    re-decided every few ticks, the consistent tables and clusters shown, a clean exit."""
    data = tmp_path / "demo"
    proc = subprocess.run(
        [*CLI, "demo", "--scenario", "attributes", "--attributes", "10", "--epoch-ticks", "5",
         "--duration", "18", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:] + proc.stderr[-3000:]
                                  + worker_problems(data))
    out = proc.stdout
    epochs = [int(e) for e in re.findall(r"^tick \d+ .*, epoch (\d+): \d+ clusters", out, re.M)]
    assert len(epochs) >= 5 and epochs == sorted(epochs) and max(epochs) >= 1, (
        out[-3000:] + worker_problems(data))
    tables = re.findall(r"^  (cluster|bridge)\s+\[([a-z0-9,]+)\]", out, re.M)
    assert tables and {a for _, names in tables for a in names.split(",")} == {
        f"a{i}" for i in range(10)}
    assert 'kind = "binary"' in (data / "domain.toml").read_text()
    assert processes_mentioning(str(data)) == []


def test_demo_rejects_bad_options() -> None:
    proc = subprocess.run([*CLI, "demo", "--p", "1.5"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "--p must be in (0, 1]" in proc.stderr
    bad = subprocess.run([*CLI, "demo", "--scenario", "attributes", "--attributes", "65"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--attributes must be an integer in [2, 64]" in bad.stderr


def test_demo_offline_runs_without_a_broker() -> None:
    proc = subprocess.run([*CLI, "demo", "--offline", "--seed", "3"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "offline demo" in proc.stdout
    assert "released" in proc.stdout
