"""The broker goes away under a running `stream-dp worker` and comes back (issue #24,
"Operations you can trust"): the worker logs about one line a second during the outage,
releases every stream again afterwards with no gap and no conflicting re-release, and a SIGTERM
during an outage ends it within 10 s with exit status 0 and no traceback.

The broker is a real noida-db process, stopped (SIGTERM: it writes its data file completely)
and started again on the same port and data directory. A kill -9 of noida-db can lose records
it had acknowledged (docs/operations.md, "durability limits"); what the worker does then is
tested in test_operations_worker.py (state ahead of the log)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from agents.kafka.embedded_broker import EmbeddedBroker
from tests.integration import pipeline_support as ps
from tests.integration.test_commands_service import CLI, _worker_env, cli

pytestmark = pytest.mark.integration

STREAMS = {"all", "eu", "us", "eu/fr", "eu/de", "us/ny"}
OUTAGE_S = 15.0


async def _releases(bootstrap: str, topic: str,
                    committed: bool = True) -> dict[tuple[str, int], set[bytes]]:
    out: dict[tuple[str, int], set[bytes]] = {}
    for r in await ps.read_topic(bootstrap, topic, committed=committed):
        m = json.loads(r.value)
        out.setdefault((m["stream"], m["tick"]), set()).add(r.value)
    return out


def _conflicting(bootstrap: str, topic: str) -> dict[tuple[str, int], set[float]]:
    """(stream, tick) -> its different released values, where there is more than one: every
    copy counts, also those of aborted transactions that a read_uncommitted subscriber sees."""
    values: dict[tuple[str, int], set[float]] = {}
    for committed in (True, False):
        for key, copies in asyncio.run(_releases(bootstrap, topic, committed)).items():
            values.setdefault(key, set()).update(json.loads(c)["value"] for c in copies)
    return {k: v for k, v in values.items() if len(v) > 1}


def _complete_through(rel: dict[tuple[str, int], set[bytes]]) -> int:
    """The last tick n such that every stream has a release for every tick 1..n."""
    n = 0
    while all((s, n + 1) in rel for s in STREAMS):
        n += 1
    return n


def _wait_complete(bootstrap: str, topic: str, through: int, proc: subprocess.Popen[bytes],
                   log_path: Path, timeout: float = 120) -> dict[tuple[str, int], set[bytes]]:
    deadline = time.monotonic() + timeout
    while True:
        rel = asyncio.run(_releases(bootstrap, topic))
        if _complete_through(rel) >= through:
            return rel
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, (_complete_through(rel), log_path.read_text()[-3000:])
        time.sleep(1.0)


def _log_lines(log_path: Path) -> list[str]:
    return [line for line in log_path.read_text().splitlines() if line.strip()]


def test_worker_survives_a_broker_outage_and_stops_promptly_during_one(tmp_path: Path) -> None:
    broker = EmbeddedBroker(data_dir=tmp_path / "broker")
    broker.start()
    proc: subprocess.Popen[bytes] | None = None
    log_path = tmp_path / "worker.log"
    try:
        env = _worker_env(tmp_path, broker.bootstrap, "outage", 0)
        env["STREAM_DP_WEB_PORT"] = "0"
        assert cli("topics", "create", env=env).returncode == 0
        counts = env["STREAM_DP_COUNTS_TOPIC"]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([*CLI, "worker"], env=env, stdout=subprocess.DEVNULL,
                                    stderr=log)
        before = _complete_through(_wait_complete(broker.bootstrap, counts, 3, proc, log_path))

        # 1. the broker goes away for 15 s
        broker.stop()
        lines_before = len(_log_lines(log_path))
        time.sleep(OUTAGE_S)  # the outage itself (no assertion on how long anything takes)
        during = _log_lines(log_path)[lines_before:]
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert len(during) <= OUTAGE_S + 10, "\n".join(during)  # about one line a second

        # 2. it comes back: every stream is released again, no gap, no conflicting copy
        broker.start()
        rel = _wait_complete(broker.bootstrap, counts, before + int(OUTAGE_S) + 3, proc,
                             log_path)
        last = _complete_through(rel)
        assert last > before + OUTAGE_S
        conflicting = {k: v for k, v in rel.items() if len(v) > 1}
        assert not conflicting, sorted(conflicting)[:5]
        conflicting_values = _conflicting(broker.bootstrap, counts)
        assert not conflicting_values, sorted(conflicting_values.items())[:5]
        assert {s for s, _ in rel} == STREAMS

        # 3. SIGTERM during another outage: stops within 10 s, exit 0, no traceback
        broker.stop()
        time.sleep(3.0)  # the worker notices the broker is gone
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # the worker bounds its own stop (agents.worker.pipeline.SHUTDOWN_S = 8 s); the wait here is
        # a generous bound for a busy machine, not a timing assertion
        rc = proc.wait(20)
        print(f"outage: {len(during)} log lines in {OUTAGE_S:g} s; ticks 1..{last} released; "
              f"SIGTERM during an outage: stopped in {time.monotonic() - t0:.1f} s")
        assert rc == 0, log_path.read_text()[-3000:]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        broker.stop()
    text = log_path.read_text()
    assert "Traceback" not in text and "Unclosed" not in text, text[-3000:]
    records = [json.loads(line) for line in _log_lines(log_path)]
    assert not [r for r in records if "exc" in r], [r for r in records if "exc" in r][:2]
    # The promise, "SIGTERM during the outage ends the worker within 10 s", read from
    # the worker's own log (its clock, from the signal to its last line), not from this test's
    # scheduling on a busy machine.
    signalled = next(r["ts"] for r in records if r["msg"] == "stop signal received; stopping "
                     "gracefully")
    stopped = next((r["ts"] for r in records if r["msg"] == "worker stopped"), None)
    assert stopped is not None, records[-3:]  # not the forced exit after STOP_GRACE_S
    took = (datetime.fromisoformat(stopped.replace("Z", "+00:00"))
            - datetime.fromisoformat(signalled.replace("Z", "+00:00"))).total_seconds()
    print(f"outage: stop signal to 'worker stopped' in {took:.1f} s (worker's log)")
    assert took <= 10.0, (signalled, stopped)


@pytest.mark.stress
def test_worker_after_a_kill9_of_the_broker_resumes_or_says_why(
    tmp_path: Path, stress_round: int
) -> None:
    """kill -9 of noida-db under a running worker, then a restart on the same data: the broker
    may have lost records it had acknowledged (docs/operations.md, durability limits). The worker
    either resumes (every stream released again, no conflicting copy) or stops with exit status
    4 and one line saying its state is ahead of the log — never a silent stall. Stress-only:
    whether records are lost depends on timing."""
    import os

    broker = EmbeddedBroker(data_dir=tmp_path / "broker")
    broker.start()
    proc: subprocess.Popen[bytes] | None = None
    log_path = tmp_path / "worker.log"
    try:
        env = _worker_env(tmp_path, broker.bootstrap, "kill9", 0)
        env["STREAM_DP_WEB_PORT"] = "0"
        assert cli("topics", "create", env=env).returncode == 0
        counts = env["STREAM_DP_COUNTS_TOPIC"]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([*CLI, "worker"], env=env, stdout=subprocess.DEVNULL,
                                    stderr=log)
        before = _complete_through(_wait_complete(broker.bootstrap, counts, 3, proc, log_path))
        assert broker.proc is not None
        os.killpg(broker.proc.pid, signal.SIGKILL)
        broker.proc.wait()
        broker.proc = None
        time.sleep(5.0)
        broker.start()
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:  # it stopped: only for the documented reason
                assert proc.returncode == 4, log_path.read_text()[-3000:]
                assert "is ahead of the log" in log_path.read_text()
                break
            rel = asyncio.run(_releases(broker.bootstrap, counts))
            if _complete_through(rel) >= before + 8:
                conflicting = {k: v for k, v in rel.items() if len(v) > 1}
                assert not conflicting, sorted(conflicting)[:5]
                break
            assert time.monotonic() < deadline, ("neither resumed nor stopped",
                                                 log_path.read_text()[-3000:])
            time.sleep(1.0)
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        broker.stop()
    assert "Traceback" not in log_path.read_text()
