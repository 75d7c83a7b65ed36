"""`stream-dp demo --privacy-unit user` as a user runs it (issue #34): the same traffic with
people at user level next to event level — each stream's user-level release ± stderr beside
the event-level one, the per-person guarantee from the release records, the events the bound
dropped (the operator-only counter) — exit 0, no process left behind."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_demo import CLI, processes_mentioning, worker_problems

K = 5
_DROPPED = re.compile(r"^user level: the bound dropped ([\d,]+) events so far \(operator view: "
                      r"stream_dp_user_bounded_events_total\)$", re.M)


def _run_demo(data: Path, *options: str) -> str:
    """``stream-dp demo --duration 25`` with ``options`` in ``data``: its output, once it
    exited 0 and left no process behind."""
    proc = subprocess.run([*CLI, "demo", "--duration", "25", "--data-dir", str(data), *options],
                          capture_output=True, text=True, timeout=240)
    problems = worker_problems(data)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + problems
    assert processes_mentioning(str(data)) == []
    return proc.stdout


def _assert_dropped_grow_and_no_identifier_logged(out: str, data: Path) -> None:
    """The operator's dropped-events line: shown, never decreasing, some dropped; and no
    identifier in either worker's log."""
    dropped = [int(n.replace(",", "")) for n in _DROPPED.findall(out)]
    assert dropped and dropped == sorted(dropped) and dropped[-1] > 0, out[-3000:]
    for log in ("worker.log", "worker-user.log"):
        text = (data / log).read_text()
        assert not re.search(r'"u\d+"', text), log


@pytest.mark.integration
@pytest.mark.slow
def test_demo_user_level_next_to_event_level(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    out = _run_demo(data, "--strategy", "naive", "--privacy-unit", "user", "--people", "300",
                    "--user-max-events", str(K), "--user-period-ticks", "30")
    # rows: stream, event-level released ± stderr, consistent, user-level released ± stderr
    rows = re.findall(r"^\s*(\S+)\s+(-?\d+\.\d)\s+±\s+(\d+\.\d)\s+(-?\d+\.\d|…)\s+"
                      r"(-?\d+\.\d)\s+±\s+(\d+\.\d)$", out, re.M)
    assert {r[0] for r in rows} >= {"all", "www", "api", "cdn"}, out[-3000:]
    # the user-level deployment spends ε / K per event: the same strategy's error bar K times
    # the event-level one (one person's K events cost what one event costs at event level)
    for _stream, _v, event_err, _c, _u, user_err in rows:
        # (both printed to 0.1: a rounding error of at most 0.05·K + 0.05)
        assert abs(float(user_err) - K * float(event_err)) <= 0.05 * K + 0.05 + 1e-9, rows[:3]
    assert ("user level: ε = 1 per person per stream per period, 3 in total (K = 5 per person "
            "per 30 ticks, 300 people)") in out
    # the event-level figure is still there as before (its headline, its consistent values)
    assert "ε = 3 per event (ε = 1 per stream × 3 streams each event feeds)" in out
    assert "reconciled in" in out
    _assert_dropped_grow_and_no_identifier_logged(out, data)


@pytest.mark.integration
@pytest.mark.slow
def test_demo_attributes_at_user_level_next_to_event_level(tmp_path: Path) -> None:
    """``--scenario attributes --privacy-unit user``: the event-level marginals, then the
    user-level deployment's own consistent tables with its per-person guarantee and the
    events its bound dropped; exit 0, nothing left running, no identifier in a log."""
    data = tmp_path / "demo"
    out = _run_demo(data, "--scenario", "attributes", "--attributes", "6", "--epoch-ticks", "5",
                    "--privacy-unit", "user", "--people", "200", "--user-max-events", "3",
                    "--user-period-ticks", "30")
    blocks = re.findall(r"^user level \(K = 3 per person per 30 ticks, 200 people, ε / K per "
                        r"event\):\n(.*)\n", out, re.M)
    assert blocks, out[-3000:]
    # the user-level worker's own tables: a tick line whose guarantee is per person per period
    shown = [b for b in blocks if b.startswith("tick ")]
    assert shown and all(re.search(r"ε=[\d.e-]+ · ε=[\d.e+-]+ per person per period$", b)
                         for b in shown), shown[:3]
    _assert_dropped_grow_and_no_identifier_logged(out, data)
