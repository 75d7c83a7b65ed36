"""`stream-dp tail` against the real broker, with contract-shaped messages (docs/CONTRACTS.md)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import pytest

from tests.integration._users import ROOT, create_topic, produce_json, stream_dp

pytestmark = pytest.mark.integration

STREAMS = ["all", "www", "www/news", "api", "api/v1"]


def _count(stream: str, tick: int, value: float) -> dict[str, Any]:
    return {
        "stream": stream, "tick": tick, "tick_start": 1_704_067_140.0 + 60 * tick,
        "tick_end": 1_704_067_200.0 + 60 * tick, "value": value, "stderr": 2.294,
        "strategy": "naive", "p": 0.9, "privacy": {"model": "pure", "epsilon": 0.5},
        "cap": 1.0, "horizon": 4095, "schema": "dp.counts.v1",
    }


def _histogram(tick: int) -> dict[str, Any]:
    return {
        "tick": tick, "tick_end": 1_704_067_200.0 + 60 * tick, "consistent": True,
        "nodes": [{"stream": s, "value": 10.0 * i, "noisy": 10.0 * i + 0.5, "stderr": 2.0}
                  for i, s in enumerate(STREAMS)],
        "diagnostics": {"iterations": 3, "residual": 1e-12, "seconds": 0.0002},
        "schema": "dp.histograms.v1",
    }


def _fill_counts(bootstrap: str, topic: str, ticks: range) -> None:
    produce_json(bootstrap, topic, [(s, _count(s, t, 100.0 * t + i))
                                    for t in ticks for i, s in enumerate(STREAMS)])


def test_tail_counts_from_beginning_json_prefix_and_limits(kafka_broker: str, unique_name: str) -> None:
    create_topic(kafka_broker, unique_name)
    _fill_counts(kafka_broker, unique_name, range(1, 6))
    base = ("tail", "counts", "--bootstrap", kafka_broker, "--topic", unique_name)

    everything = stream_dp(*base, "--from-beginning", "--json", "--timeout", "2", check=True)
    msgs = [json.loads(line) for line in everything.stdout.splitlines()]
    assert sorted((m["stream"], m["tick"]) for m in msgs) == sorted(
        (s, t) for s in STREAMS for t in range(1, 6))

    www = stream_dp(*base, "--from-beginning", "--json", "--prefix", "www", "--timeout", "2",
                    check=True)
    assert {json.loads(x)["stream"] for x in www.stdout.splitlines()} == {"www", "www/news"}

    late = stream_dp(*base, "--from-tick", "4", "--json", "--timeout", "2", check=True)
    assert sorted({json.loads(x)["tick"] for x in late.stdout.splitlines()}) == [4, 5]

    three = stream_dp(*base, "--from-beginning", "--json", "--max-messages", "3", check=True)
    assert len(three.stdout.splitlines()) == 3

    table = stream_dp(*base, "--from-tick", "5", "--prefix", "api/", "--timeout", "2", check=True)
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["TICK", "TICK", "END"]
    assert len(lines) == 2 and "api/v1" in lines[1] and "504.000" in lines[1]
    assert "ε=0.5" in lines[1] and "2.294" in lines[1] and "naive" in lines[1]


def test_tail_live_sees_only_new_messages(kafka_broker: str, unique_name: str) -> None:
    create_topic(kafka_broker, unique_name)
    _fill_counts(kafka_broker, unique_name, range(1, 3))  # old: must not be shown
    child = subprocess.Popen(
        [sys.executable, "-m", "agents.cli", "tail", "--bootstrap", kafka_broker, "--topic",
         unique_name, "--json", "--max-messages", str(len(STREAMS))],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert child.stderr is not None
        assert "live" in child.stderr.readline()  # positioned at the end offsets
        _fill_counts(kafka_broker, unique_name, range(3, 4))
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert {json.loads(x)["tick"] for x in out.splitlines()} == {3}


def test_tail_stops_cleanly_on_sigint(kafka_broker: str, unique_name: str) -> None:
    create_topic(kafka_broker, unique_name)
    child = subprocess.Popen(
        [sys.executable, "-m", "agents.cli", "tail", "--bootstrap", kafka_broker, "--topic",
         unique_name], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert child.stderr is not None
    assert "following" in child.stderr.readline()
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert "Traceback" not in err


def test_tail_histograms_tree_and_json(kafka_broker: str, unique_name: str) -> None:
    create_topic(kafka_broker, unique_name, partitions=1)
    produce_json(kafka_broker, unique_name, [("web", _histogram(t)) for t in (1, 2)])
    base = ("tail", "histograms", "--bootstrap", kafka_broker, "--topic", unique_name,
            "--from-beginning", "--timeout", "2")
    table = stream_dp(*base, check=True).stdout
    assert table.count("consistent, 3 iterations") == 2
    assert "    www/news" in table and "(noisy 20.500 ± 2.000)" in table
    js = stream_dp(*base, "--json", "--prefix", "api", check=True).stdout.splitlines()
    assert [json.loads(x)["tick"] for x in js] == [1, 2]
    assert {n["stream"] for n in json.loads(js[0])["nodes"]} == {"api", "api/v1"}


def test_tail_missing_topic_fails_with_a_clear_message(kafka_broker: str, unique_name: str) -> None:
    proc = stream_dp("tail", "--bootstrap", kafka_broker, "--topic", unique_name, "--timeout", "1")
    assert proc.returncode == 1
    assert "does not exist" in proc.stderr and "stream-dp topics" in proc.stderr
