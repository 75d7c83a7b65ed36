"""The test-deployment example of guide §6 ("stream-dp worker"), run as written from the
repository root against a real broker: it must start at the current tick, not release every
tick since examples/stream-dp.toml's origin first (478 000 ticks behind when issue 32 found it).

Only what cannot be copied into a shared test broker is replaced: the app id and topic names
(unique per test), the key file's folder and the web port."""

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

from agents.kafka.embedded_broker import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide.md"
KEY = "4e7a19c3b5d20f86e1c4a7d39b02f5e8c61a4d7f3b95e0c28d1f6a4b73e9c05d"  # hex, 32 random bytes


def _example() -> str:
    """The guide's test-deployment worker command (continuation lines joined)."""
    section = GUIDE.read_text(encoding="utf-8").split("### stream-dp worker", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = re.sub(r"\\\n\s*", " ", block).splitlines()
    found = [c for c in commands if "examples/stream-dp.toml" in c ]
    assert len(found) == 1, block
    return found[0]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def test_the_guide_worker_example_starts_at_the_current_tick(
    tmp_path: Path, kafka_broker: str, unique_name: str
) -> None:
    command = _example()
    port = free_port()
    assert "$PWD/noise.key" in command and "--web-port 6067" in command, command
    command = (command.replace("$PWD/noise.key", str(tmp_path / "noise.key"))
               .replace("STREAM_DP_APP_ID=my-test", f"STREAM_DP_APP_ID={unique_name}")
               .replace("--web-port 6067", f"--web-port {port}"))
    (tmp_path / "noise.key").write_text(KEY + "\n", encoding="utf-8")
    (tmp_path / "noise.key").chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    env["STREAM_DP_BOOTSTRAP"] = kafka_broker
    for kind in ("events", "counts", "histograms", "dlq"):
        env[f"STREAM_DP_{kind.upper()}_TOPIC"] = f"{unique_name}.{kind}"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    created = subprocess.run(
        [sys.executable, "-m", "agents.cli", "topics", "create", "--config",
         "examples/stream-dp.toml"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**env, "STREAM_DP_APP_ID": unique_name, "STREAM_DP_ORIGIN": str(int(time.time())),
             "STREAM_DP_KEY_FILE": str(tmp_path / "noise.key")})
    assert created.returncode == 0, created.stderr
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        # one simple command: bash execs it, so the signal below reaches the worker itself
        worker = subprocess.Popen(["bash", "-c", command], cwd=ROOT, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not _ready(port):
            assert worker.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.5)
        text = log_path.read_text()
        assert '"msg": "worker started"' in text, text[-3000:]
        assert "ticks are due" not in text, re.findall(r'"msg": "\d+ ticks are due[^"]*"', text)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    assert worker.returncode == 0, log_path.read_text()[-3000:]
