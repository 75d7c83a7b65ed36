"""`stream-dp simulate` end to end: to a log file and straight into the events topic."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from simulators.logfile import read_log
from tests.integration._users import create_topic, read_all, stream_dp

pytestmark = pytest.mark.integration


def test_simulate_to_topic_sends_exactly_the_logged_events(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    create_topic(kafka_broker, unique_name)
    args = ("simulate", "census", "--seed", "8", "--ticks", "12", "--attributes", "3")
    stream_dp(*args, "--out", str(tmp_path / "c.jsonl"), check=True)
    proc = stream_dp(*args, "--to-topic", "--bootstrap", kafka_broker, "--topic", unique_name,
                     check=True)
    expected = Counter((r.event.key, r.event.ts, r.event.value)
                       for r in read_log(tmp_path / "c.jsonl"))
    got = Counter()
    for m in read_all(kafka_broker, unique_name):
        v = m.json()
        assert m.key == v["key"].encode()
        got[(v["key"], v["ts"], v["value"])] += 1
    assert got == expected and sum(got.values()) > 300
    assert f"{sum(got.values())} events produced to {unique_name}" in proc.stderr


def test_simulate_live_pacing_with_start_now(kafka_broker: str, unique_name: str) -> None:
    create_topic(kafka_broker, unique_name, partitions=1)
    # 3 ticks of 1 s at speed 3: about one second of wall time, event times around now
    stream_dp("simulate", "nettrace", "--start", "now", "--ticks", "3", "--rate", "5",
              "--to-topic", "--speed", "3", "--bootstrap", kafka_broker, "--topic", unique_name,
              check=True)
    msgs = read_all(kafka_broker, unique_name)
    assert msgs
    ts = [m.json()["ts"] for m in sorted(msgs, key=lambda m: m.offset)]
    assert ts == sorted(ts)
    assert all(abs(m.json()["ts"] * 1000 - m.timestamp) < 120_000 for m in msgs)  # "now"


def test_simulate_needs_an_output(tmp_path: Path) -> None:
    proc = stream_dp("simulate", "restaurant")
    assert proc.returncode == 2 and "nothing to do" in proc.stderr


def test_simulate_to_topic_stops_cleanly_on_sigint(kafka_broker: str, unique_name: str) -> None:
    import signal
    import subprocess
    import sys

    from tests.integration._users import ROOT

    create_topic(kafka_broker, unique_name, partitions=1)
    child = subprocess.Popen(
        [sys.executable, "-m", "agents.cli", "simulate", "nettrace", "--ticks", "3600",
         "--to-topic", "--speed", "1", "--bootstrap", kafka_broker, "--topic", unique_name],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = 200
        while not read_all(kafka_broker, unique_name) and deadline:  # wait for the first events
            deadline -= 1
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, err
    assert "stopped after" in err and "Traceback" not in err
    sent = int(err.split("seed 0: ")[1].split(" events")[0])
    assert sent == len(read_all(kafka_broker, unique_name))  # every acknowledged event is there
