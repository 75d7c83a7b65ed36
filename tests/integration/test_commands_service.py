"""`stream-dp broker`, `topics` and `worker` as subprocesses against real brokers."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from agents.kafka.embedded_broker import free_port

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "agents.cli"]
KEY = "5f3c9a17e2b84d06c1f3a95e7b20d48c9e61f7a3052bd8c4e19f6a7302d5b8e1"  # 32 random bytes


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def noida_processes(data_dir: Path) -> list[str]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"noida-db" in cmd and str(data_dir).encode() in cmd:
                out.append(entry.name)
    return out


@pytest.mark.parametrize("command", ["worker", "broker", "topics", "demo"])
def test_help_has_examples(command: str) -> None:
    proc = cli(command, "--help")
    assert proc.returncode == 0
    assert "examples:" in proc.stdout
    assert f"stream-dp {command}" in proc.stdout


def test_broker_lifecycle_and_topics(tmp_path: Path) -> None:
    data = tmp_path / "broker"
    port = free_port()
    try:
        started = cli("broker", "start", "--port", str(port), "--data-dir", str(data))
        assert started.returncode == 0, started.stderr
        assert f"127.0.0.1:{port}" in started.stdout
        assert json.loads((data / "broker.pid").read_text())["port"] == port
        status = cli("broker", "status", "--data-dir", str(data))
        assert status.returncode == 0 and "running" in status.stdout
        again = cli("broker", "start", "--port", str(port), "--data-dir", str(data))
        assert again.returncode == 0 and "already running" in again.stdout

        bootstrap = f"127.0.0.1:{port}"
        created = cli("topics", "create", "--bootstrap", bootstrap, "--partitions", "3")
        assert created.returncode == 0, created.stderr
        for name in ("dp.events.v1", "dp.counts.v1", "dp.histograms.v1", "dp.events.dlq",
                     "dp.reconcile.leader"):
            assert f"created {name}" in created.stdout
        assert cli("topics", "create", "--bootstrap", bootstrap, "--partitions", "3"
                   ).stdout.strip() == "all topics exist"
        listed = dict(line.split("\t") for line in
                      cli("topics", "list", "--bootstrap", bootstrap).stdout.splitlines())
        assert listed["dp.events.v1"] == "3" and listed["dp.reconcile.leader"] == "1"
        mismatch = cli("topics", "create", "--bootstrap", bootstrap, "--partitions", "5")
        assert mismatch.returncode == 1 and "partitions" in mismatch.stderr
    finally:
        stopped = cli("broker", "stop", "--data-dir", str(data))
    assert stopped.returncode == 0 and "broker stopped" in stopped.stdout
    assert cli("broker", "status", "--data-dir", str(data)).returncode == 3
    assert not (data / "broker.pid").exists()
    deadline = time.monotonic() + 10
    while noida_processes(data) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert noida_processes(data) == []


def test_broker_foreground_stops_on_sigterm(tmp_path: Path) -> None:
    data = tmp_path / "broker"
    proc = subprocess.Popen([*CLI, "broker", "start", "--foreground", "--port", str(free_port()),
                             "--data-dir", str(data)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert "broker running" in proc.stdout.readline()
        assert cli("broker", "status", "--data-dir", str(data)).returncode == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert noida_processes(data) == []
    assert not (data / "broker.pid").exists()


def test_topics_reports_unreachable_broker() -> None:
    proc = cli("topics", "create", "--bootstrap", f"127.0.0.1:{free_port()}", timeout=180)
    assert proc.returncode == 1
    assert "cannot connect to the broker at" in proc.stderr
    assert "stream-dp broker start" in proc.stderr


def _worker_env(tmp_path: Path, bootstrap: str, name: str, web_port: int) -> dict[str, str]:
    domain = tmp_path / "domain.toml"
    domain.write_text(
        'name = "shop"\nkind = "hierarchy"\nroot = "all"\n'
        'paths = ["eu/fr", "eu/de", "us/ny"]\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    prefix = f"{name}."
    env.update({
        "STREAM_DP_BOOTSTRAP": bootstrap,
        "STREAM_DP_APP_ID": name,
        "STREAM_DP_WORKER_ID": "w1",
        "STREAM_DP_DOMAIN_FILE": str(domain),
        "STREAM_DP_KEY": KEY,
        "STREAM_DP_ORIGIN": str(float(int(time.time()) - 2)),
        "STREAM_DP_TICK_SECONDS": "1",
        "STREAM_DP_ALLOWED_LATENESS_S": "0.2",
        "STREAM_DP_EVENTS_PARTITIONS": "2",
        "STREAM_DP_SHARDS": "2",
        "STREAM_DP_COUNTS_PARTITIONS": "2",
        "STREAM_DP_SESSION_TIMEOUT_S": "6",
        "STREAM_DP_WEB_PORT": str(web_port),
        "STREAM_DP_METRICS_EVENT_COUNTS": "1",  # raw event counters are opt-in operator data
        "STREAM_DP_STRATEGY": "naive",
        "STREAM_DP_P": "0.9",
    })
    for setting in ("events", "counts", "histograms", "dlq", "partials"):
        env[f"STREAM_DP_{setting.upper()}_TOPIC"] = prefix + setting
    env["STREAM_DP_INGEST_CHECKPOINTS_TOPIC"] = prefix + "ckpt-ingest"
    env["STREAM_DP_RELEASE_CHECKPOINTS_TOPIC"] = prefix + "ckpt-release"
    env["STREAM_DP_SCHEDULE_TOPIC"] = prefix + "schedule"
    env["STREAM_DP_LEADER_TOPIC"] = prefix + "leader"
    return env


def _http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


async def _send_events(bootstrap: str, topic: str, n: int) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await p.start()
    try:
        for i in range(n):
            key = ("eu/fr", "eu/de", "us/ny")[i % 3]
            msg = {"key": key, "ts": time.time(), "value": 1.0}
            await p.send(topic, json.dumps(msg).encode(), key=key.encode())
        await p.send(topic, b"{not json", key=b"eu/fr")
        await p.flush()
    finally:
        await p.stop()


async def _read(bootstrap: str, topic: str, want: int, timeout: float = 90) -> list[dict[str, object]]:
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                         auto_offset_reset="earliest", isolation_level="read_committed")
    await c.start()
    out: list[dict[str, object]] = []
    try:
        deadline = time.monotonic() + timeout
        while len(out) < want and time.monotonic() < deadline:
            for records in (await c.getmany(timeout_ms=500)).values():
                out.extend(json.loads(r.value) for r in records)
        return out
    finally:
        await c.stop()


@pytest.mark.parametrize("processes", ["0", "2"])
def test_worker_serves_releases_histograms_health_and_stops_on_sigterm(
    tmp_path: Path, kafka_broker: str, unique_name: str, processes: str
) -> None:
    """Also with the pipeline in two child processes (pipeline_processes = 2): the same
    releases, readiness from the children, their metrics relayed, all stop on SIGTERM."""
    web_port = free_port()
    env = _worker_env(tmp_path, kafka_broker, unique_name, web_port)
    env["STREAM_DP_PIPELINE_PROCESSES"] = processes
    created = cli("topics", "create", env=env)
    assert created.returncode == 0, created.stderr
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*CLI, "worker"], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{web_port}"
    try:
        deadline = time.monotonic() + 90
        while _http(base + "/readyz")[0] != 200:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.3)
        assert _http(base + "/healthz") == (200, '{"status": "ok"}')
        asyncio.run(_send_events(kafka_broker, env["STREAM_DP_EVENTS_TOPIC"], 30))
        streams = {"all", "eu", "us", "eu/fr", "eu/de", "us/ny"}
        # the first records read may all come from one counts partition (a burst of ticks
        # released at once after start-up): read more until every stream has shown up
        for want in (5 * 6, 20 * 6, 80 * 6):
            counts = asyncio.run(_read(kafka_broker, env["STREAM_DP_COUNTS_TOPIC"], want))
            if {c["stream"] for c in counts} == streams:
                break
        assert {c["stream"] for c in counts} == streams
        hists = asyncio.run(_read(kafka_broker, env["STREAM_DP_HISTOGRAMS_TOPIC"], 2))
        assert len(hists) >= 2 and all(h["domain"] == "shop" for h in hists)
        accepted = 'stream_dp_events_total{result="accepted"} 30.0'
        deadline = time.monotonic() + 30  # counted once their tick closes (deadline + grace)
        status, metrics = _http(base + "/metrics")
        while accepted not in metrics and time.monotonic() < deadline:
            time.sleep(0.3)
            status, metrics = _http(base + "/metrics")
        assert status == 200
        assert accepted in metrics
        assert 'stream_dp_dead_letters_total{reason="malformed_json"} 1.0' in metrics
        assert "stream_dp_ready 1.0" in metrics
        assert "stream_dp_reconcile_leader 1.0" in metrics
        # issue 32 item 10: the build is named, counters have no ``_created`` twins, and the
        # ticks counter says what it counts
        version = cli("--version", env=env).stdout.split()[-1]
        assert re.search(rf'^stream_dp_build_info\{{.*version="{re.escape(version)}".*\}} 1\.0$',
                         metrics, re.M), metrics
        assert "_created" not in metrics
        assert "# HELP stream_dp_ticks_released_total Shard-ticks" in metrics
        if processes != "0":
            children = _children(proc.pid)
            assert len(children) == int(processes), children
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]
        if processes != "0":
            assert not [p for p in children if _alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    assert lines and all({"ts", "level", "logger", "msg"} <= set(r) for r in lines)
    assert any(r["msg"] == "worker stopped" and r["exit_code"] == 0 for r in lines)
    started = next(r for r in lines if r["msg"] == "worker started")
    assert any(line.startswith("total per event:") for line in started["privacy"])
    assert KEY not in log_path.read_text()


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            cmd = (entry / "cmdline").read_bytes() if (entry / "cmdline").exists() else b""
            if int(stat[stat.rfind(")") + 2:].split()[1]) == pid and b"spawn_main" in cmd:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def test_worker_bad_settings_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    env["STREAM_DP_P"] = "1.5"
    env["STREAM_DP_ORIGIN"] = "0"
    proc = cli("worker", env=env)
    assert proc.returncode == 2
    assert "p must be in (0, 1]" in proc.stderr


def test_plain_logs_print_the_privacy_summary_as_lines(
    tmp_path: Path, kafka_broker: str, unique_name: str
) -> None:
    """`stream-dp worker --plain-logs` printed the start-up privacy accounting as a Python
    list (``privacy=['privacy model: …', …]``); one indented line each (issue 32 item 13)."""
    env = _worker_env(tmp_path, kafka_broker, unique_name, free_port())
    assert cli("topics", "create", env=env).returncode == 0
    log_path = tmp_path / "plain.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*CLI, "worker", "--plain-logs"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while "worker started" not in log_path.read_text():
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = log_path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "worker started" in line)
    assert "privacy=" not in lines[at] and "['" not in lines[at], lines[at]
    assert lines[at + 1] == "  privacy:", lines[at:at + 3]
    summary = [line.strip() for line in lines[at + 2:] if line.startswith("    ")]
    assert summary[0] == "privacy model:           pure ε-DP, event level", summary
    assert any(line.startswith("total per event:") for line in summary), summary
