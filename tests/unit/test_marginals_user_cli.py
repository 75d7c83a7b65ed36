"""``stream-dp marginals --privacy-unit user`` from the outside (issue #34): a real process, its
exit status and its last line.

The neighbouring-person property on the output: two logs that differ by every line of one
nasty person (thousands of events over every cell and tick, duplicated lines, lines out of time
order, across period boundaries) give answers, at ε = 4000 (noise ~1e-3), that differ by that
person's bounded contribution only — an oracle that rescans the person's lines in file order
(independent of the library's Bounder). The last line says the guarantee per person per period,
``K`` times the exact ε per event, rounded up; a line without a valid identifier is one error
line naming the line, exit 2, never repeating an identifier.
"""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
KEY_HEX = "ab53e19c07f4d2a86b1e5c93a0f7d24e8c61b3f09a2e7d54c1b8f36a0e9d27c5"
TICKS = 8
DECAY = 0.9
NASTY = "nasty-person-7"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agents.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1",
                               "STREAM_DP_CACHE_DIR": str(cwd / ".cache")})


def _marginals(tmp: Path, log: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return _cli("marginals", "--events", str(tmp / log), "--attributes", "2",
                "--epsilon", "4000", "--bootstrap-fraction", "0.001", "--decay", repr(DECAY),
                "--tick-seconds", "10", "--origin", "0", "--last-tick", str(TICKS),
                "--queries", str(tmp / "q.json"), "--out", str(tmp / f"{log}.answers"),
                "--key-file", str(tmp / "key"), "--report", str(tmp / f"{log}.report"),
                "--privacy-unit", "user", *extra, cwd=tmp)


def _rows(seed: int, nasty: bool) -> list[dict[str, Any]]:
    """Others: 150 events of 20 people in time order, the same with or without the person.
    The person: 3000 lines over all four cells and every tick, a fifth of them duplicated,
    a tenth for a tick before the one the file has reached, interleaved with the others."""
    rng = random.Random(seed)
    others = [{"ts": rng.uniform(0, 10 * TICKS - 0.01), "attrs": rng.choice(["00", "01", "10", "11"]),
               "user": f"other-{rng.randrange(20)}"} for _ in range(150)]
    others.sort(key=lambda r: r["ts"])
    if not nasty:
        return others
    rng_n = random.Random(seed + 1000)
    mine: list[dict[str, Any]] = []
    for j in range(3000):
        cell = ["00", "01", "10", "11"][j % 4] if j < 8 else rng_n.choice(["00", "01", "10", "11"])
        ts = (j / 3000) * 10 * TICKS
        if rng_n.random() < 0.1:
            ts = max(0.0, ts - rng_n.uniform(10, 30))  # out of time order
        row = {"ts": ts, "attrs": cell, "user": NASTY}
        mine.append(row)
        if rng_n.random() < 0.2:
            mine.append(dict(row))  # a duplicate
    slots = set(rng_n.sample(range(len(others) + len(mine)), len(mine)))
    it_o, it_m = iter(others), iter(mine)
    return [next(it_m) if i in slots else next(it_o) for i in range(len(others) + len(mine))]


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _kept(rows: list[dict[str, Any]], k_max: int, period: int, streams: int = 0,
          per_stream: int = 0) -> list[tuple[int, int]]:
    """The oracle: ``(tick, cell)`` of the person's counted lines, rescanning those kept
    before each one (file order): fewer than K in its period, its cell among the first L
    (L > 0) and fewer than k on it."""
    kept: list[tuple[int, int]] = []
    for r in rows:
        if r["user"] != NASTY:
            continue
        tick = math.floor(r["ts"] / 10) + 1
        cell = int(r["attrs"], 2)
        same = [c for t, c in kept if period == 0 or (t - 1) // period == (tick - 1) // period]
        if len(same) >= k_max or same.count(cell) >= (per_stream or k_max):
            continue
        if streams and cell not in same and len(set(same)) >= streams:
            continue
        kept.append((tick, cell))
    return kept


def _decayed(kept: list[tuple[int, int]]) -> np.ndarray:
    out = np.zeros(4)
    for tick, cell in kept:
        out[cell] += DECAY ** (TICKS - tick)
    return out


@pytest.mark.parametrize("bounds", [("3", "3", "0", "0"), ("5", "2", "2", "2"), ("4", "0", "0", "0")],
                         ids=["K-T", "L-k", "whole-run"])
def test_removing_one_person_changes_the_answers_only_by_their_bounded_events(
        tmp_path: Path, bounds: tuple[str, str, str, str]) -> None:
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "q.json").write_text("[[0, 1]]")
    with_rows, without_rows = _rows(3, True), _rows(3, False)
    _write(tmp_path / "with.jsonl", with_rows)
    _write(tmp_path / "without.jsonl", without_rows)
    k_max, period, streams, per_stream = (int(x) for x in bounds)
    opts = ["--user-max-events", bounds[0], "--user-period-ticks", bounds[1],
            "--user-max-streams", bounds[2], "--user-max-events-per-stream", bounds[3]]
    got = [_marginals(tmp_path, name, *opts) for name in ("with.jsonl", "without.jsonl")]
    for proc in got:
        assert proc.returncode == 0, proc.stderr
        assert NASTY not in proc.stderr and "other-" not in proc.stderr
    answers = [np.array(json.loads((tmp_path / f"{n}.answers").read_text())["answers"][0])
               for n in ("with.jsonl", "without.jsonl")]
    kept = _kept(with_rows, k_max, period, streams, per_stream)
    periods = 1 if period == 0 else -(-TICKS // period)
    assert 0 < len(kept) <= periods * k_max
    np.testing.assert_allclose(answers[0] - answers[1], _decayed(kept), atol=0.05)
    # the last line: per person per period, K × the exact ε per event, rounded up
    report = json.loads((tmp_path / "with.jsonl.report").read_text())
    spent = Fraction(report["budget"]["spent_exact"])
    per = report["privacy"]["per_person"]
    assert Fraction(per["period"]) >= k_max * spent > Fraction(per["period"]) - Fraction(1, 10**9)
    assert per["periods"] == periods and per["exact"] is False
    last = got[0].stderr.strip().splitlines()[-1]
    assert re.search(rf"per person per period[^:]*: ε ≤ {re.escape(repr(per['period']))} ", last)
    assert "an upper bound" in last


def test_without_the_bound_the_person_would_show(tmp_path: Path) -> None:
    """The same logs at event level: the difference is thousands of events (what the bound
    removes), so the property above can fail."""
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "q.json").write_text("[[0, 1]]")
    _write(tmp_path / "with.jsonl", _rows(3, True))
    _write(tmp_path / "without.jsonl", _rows(3, False))
    runs = []
    for name in ("with.jsonl", "without.jsonl"):
        proc = _cli("marginals", "--events", str(tmp_path / name), "--attributes", "2",
                    "--epsilon", "4000", "--bootstrap-fraction", "0.001", "--decay", repr(DECAY),
                    "--tick-seconds", "10", "--origin", "0", "--last-tick", str(TICKS),
                    "--queries", str(tmp_path / "q.json"), "--out", str(tmp_path / "a.json"),
                    "--key-file", str(tmp_path / "key"), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "per person" not in proc.stderr
        runs.append(np.array(json.loads((tmp_path / "a.json").read_text())["answers"][0]))
    assert (runs[0] - runs[1]).sum() > 100


@pytest.mark.parametrize(("user", "why"), [
    (None, "is missing"), ("", "is empty"), (12, "must be a string, got int"),
    ("é" * 128 + "z", "257 bytes long"), ({"id": "x"}, "must be a string, got dict")])
def test_a_line_without_a_valid_identifier_is_one_error_line(
        tmp_path: Path, user: Any, why: str) -> None:
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "q.json").write_text("[[0, 1]]")
    bad: dict[str, Any] = {"ts": 5.0, "attrs": "01"}
    if user is not None:
        bad["user"] = user
    _write(tmp_path / "ev.jsonl", [{"ts": 1.0, "attrs": "10", "user": "someone"}, bad])
    proc = _marginals(tmp_path, "ev.jsonl", "--user-max-events", "3", "--user-period-ticks", "4")
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("stream-dp marginals: error: ") and "ev.jsonl:2: " in line
    assert why in line and "someone" not in proc.stderr and "é" not in proc.stderr


@pytest.mark.parametrize(("extra", "needle"), [
    (["--user-period-ticks", "4"], "--privacy-unit user needs --user-max-events"),
    (["--user-max-events", "0", "--user-period-ticks", "4"], "--user-max-events must be"),
    (["--user-max-events", "x", "--user-period-ticks", "4"], "--user-max-events must be an integer"),
])
def test_bad_bounds_are_one_error_line(tmp_path: Path, extra: list[str], needle: str) -> None:
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "q.json").write_text("[[0, 1]]")
    _write(tmp_path / "ev.jsonl", [{"ts": 1.0, "attrs": "10", "user": "someone"}])
    proc = _marginals(tmp_path, "ev.jsonl", *extra)
    assert proc.returncode == 2 and needle in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("stream-dp marginals: error: ")
    event = _cli("marginals", "--events", "ev.jsonl", "--attributes", "2", "--epsilon", "1",
                 "--decay", "0.9", "--tick-seconds", "10", "--origin", "0", "--last-tick", "2",
                 "--queries", "q.json", "--out", "a.json", "--user-max-events", "3", cwd=tmp_path)
    assert event.returncode == 2
    assert "--user-max-events belongs to --privacy-unit user" in event.stderr


def test_plan_prints_the_person_of_a_binary_domain(tmp_path: Path) -> None:
    """``plan --domain`` (binary) ``--privacy-unit user``: refused before; now K times the
    exact ε per event per period and over a year's periods (any 365 days of 60 s ticks and
    daily periods touch 366), rounded up, upper bounds."""
    (tmp_path / "d.toml").write_text('name = "basket"\nkind = "binary"\n'
                                     'attributes = ["a", "b", "c", "d", "e"]\n')
    common = ["plan", "--p", "0.95", "--epsilon", "1.1", "--horizon", "64", "--domain",
              str(tmp_path / "d.toml"), "--privacy-unit", "user", "--user-max-events", "7",
              "--user-period-ticks", "1440"]
    out = _cli(*common, "--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    spent = Fraction(doc["attributes"]["spent_exact"])
    per = doc["user_level"]["per_person"]
    assert Fraction(per["period_exact"]) == 7 * spent
    assert Fraction(per["period"]) >= 7 * spent > Fraction(per["period"]) - Fraction(1, 10**12)
    assert per["year_periods"] == 366 and Fraction(per["year"]) >= 366 * 7 * spent
    assert per["exact"] is False
    text = _cli(*common, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert (f"total per person:        ε = {per['period']!r} per period over every table"
            in text.stdout)
