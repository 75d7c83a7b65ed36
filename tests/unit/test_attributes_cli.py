"""Binary attributes from the outside (issue 37): a real ``stream-dp`` process, its exit status
and its output — ``plan --domain`` on a binary domain, ``marginals`` clipping a burst, printing
the exact spend and no raw figure of the log unless ``--verbose``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
KEY_HEX = "ab53e19c07f4d2a86b1e5c93a0f7d24e8c61b3f09a2e7d54c1b8f36a0e9d27c5"


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agents.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1",
                               "STREAM_DP_CACHE_DIR": str(cwd / ".cache")})


def _domain(path: Path, m: int) -> Path:
    names = ", ".join(f'"a{i}"' for i in range(m))
    path.write_text(f'name = "basket"\nkind = "binary"\nattributes = [{names}]\n')
    return path


@pytest.mark.parametrize(("m", "eps", "fraction"), [(6, 1.1, 0.2), (1, 0.7, 0.2), (12, 0.3, 0.0)])
def test_plan_accepts_a_binary_domain_and_prints_the_exact_total(
        tmp_path: Path, m: int, eps: float, fraction: float) -> None:
    dom = _domain(tmp_path / "d.toml", m)
    common = ["plan", "--p", "0.95", "--epsilon", repr(eps), "--horizon", "64",
              "--domain", str(dom), "--attribute-bootstrap-fraction", repr(fraction)]
    out = _cli(*common, "--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    acc = json.loads(out.stdout)["attributes"]
    eps0 = fraction * eps if m > 1 else 0.0  # one attribute: no bootstrap is ever measured
    assert acc["bootstrap"] == eps0
    # oracle: the exact sum of the printed floats, largest over the table counts listed
    totals = [Fraction(eps0) + int(k) * Fraction(v) for k, v in acc["per_table"].items()]
    assert Fraction(acc["spent_exact"]) == max(totals) <= Fraction(eps)
    if eps0 > 0:
        assert sorted(int(k) for k in acc["per_table"]) == list(range(1, 2 * m))
    text = _cli(*common, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert f"total per event:         ε = {acc['spent_exact']} (exact" in text.stdout
    zcdp = _cli("plan", "--p", "0.95", "--privacy", "zcdp", "--rho", "1", "--horizon", "64",
                "--domain", str(dom), cwd=tmp_path)
    assert zcdp.returncode == 2 and zcdp.stderr.count("\n") == 1
    assert "binary-attribute domain runs pure" in zcdp.stderr


def _log(path: Path, rows: list[tuple[float, str]]) -> None:
    path.write_text("".join(json.dumps({"ts": ts, "attrs": a}) + "\n" for ts, a in rows))


def _marginals(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _cli("marginals", "--events", str(tmp / "ev.jsonl"), "--attributes", "2",
                "--epsilon", "4000", "--bootstrap-fraction", "0.001", "--decay", "0.9",
                "--tick-seconds", "10", "--origin", "0", "--last-tick", "8",
                "--queries", str(tmp / "q.json"), "--out", str(tmp / "a.json"),
                "--key-file", str(tmp / "key"), "--report", str(tmp / "r.json"), *extra, cwd=tmp)


def test_marginals_clips_a_burst_in_one_cell_and_the_others_are_unchanged(tmp_path: Path) -> None:
    """ε = 4000: noise ~1e-3, so the answers show the counts. Tick 3 gets 500 events in cell
    (1, 0); the bound is 20 per cell and tick: that cell counts 20, every other cell as it is,
    and all 8 ticks are released."""
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "q.json").write_text("[[0, 1]]")
    rng = np.random.default_rng(7)
    rows = [(float(rng.uniform(0, 80)), "".join(rng.choice(["0", "1"], 2))) for _ in range(120)]
    rows += [(25.0 + i / 1000, "10") for i in range(500)]  # the burst: tick 3, cell 0b10
    rows.sort()
    _log(tmp_path / "ev.jsonl", rows)
    got = _marginals(tmp_path, "--max-events-per-tick", "20")
    assert got.returncode == 0, got.stderr
    answers = json.loads((tmp_path / "a.json").read_text())
    assert answers["tick"] == 8
    cells = np.zeros((8, 4))  # exact counts per tick and cell, clipped at 20
    for ts, a in rows:
        cells[math.floor(ts / 10), int(a, 2)] += 1
    decay = 0.9 ** np.arange(7, -1, -1.0)
    want = (np.minimum(cells, 20) * decay[:, None]).sum(axis=0)
    unclipped = (cells * decay[:, None]).sum(axis=0)
    assert cells[2, 2] > 400 and unclipped[2] - want[2] > 250  # the clip is what moves it
    np.testing.assert_allclose(answers["answers"][0], want, atol=0.05)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["cell_clip_events_per_tick"] == 20
    b = report["budget"]
    exact = Fraction(b["bootstrap"]) + b["n_tables"] * Fraction(b["per_table"])
    assert Fraction(b["spent_exact"]) == exact <= Fraction(b["epsilon"])
    assert f"ε spent {b['spent_exact']} (exact) of 4000.0" in got.stderr.splitlines()[-1]
    # a bound beyond a named strategy's range: one line, exit 2
    bad = _marginals(tmp_path, "--max-events-per-tick", str(2**40), "--strategy", "tree-ls",
                     "--decay", "1")
    assert bad.returncode == 2 and "numeric range of tree-ls" in bad.stderr
    assert bad.stderr.strip().count("\n") == 0 or "error:" in bad.stderr.splitlines()[-1]


def test_marginals_prints_raw_figures_only_with_verbose(tmp_path: Path) -> None:
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "q.json").write_text("[[0]]")
    _log(tmp_path / "ev.jsonl", [(1.0 + i, "01") for i in range(37)])  # 37 events, last tick 4
    quiet = _marginals(tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    # the temporary folder's name may hold any digits (pytest-370): look past the paths
    said = quiet.stderr.replace(str(tmp_path), "<tmp>")
    assert "37" not in said and "events" not in said.split("structure:")[0]
    assert "releasing ticks 1..8" in quiet.stderr  # the public --last-tick
    loud = _marginals(tmp_path, "--verbose")
    assert loud.returncode == 0, loud.stderr
    assert "37 events, the last in tick 4" in loud.stderr


@pytest.mark.parametrize(("extra", "words"), [
    ({"STREAM_DP_STRATEGY": "tree-ls", "STREAM_DP_MAX_EVENTS_PER_TICK": str(2**29),
      "STREAM_DP_ATTRIBUTE_BOOTSTRAP_FRACTION": "0.0001"}, "numeric range of tree-ls"),
    ({"STREAM_DP_ATTRIBUTE_BOOTSTRAP_FRACTION": "0.2"}, "bootstrap budget ε₀ = 2000 is too large"),
])
def test_worker_refuses_what_the_tables_cannot_run_in_one_line(
        tmp_path: Path, extra: dict[str, str], words: str) -> None:
    """The worker checks the banks it will really run (at ε_t, every epoch) and the bootstraps
    an epoch's end may measure, before it connects to anything (the broker address is dead)."""
    import time

    _domain(tmp_path / "d.toml", 3)
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    env = {"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1",
           "STREAM_DP_CACHE_DIR": str(tmp_path / ".cache"), "STREAM_DP_ORIGIN": str(int(time.time())),
           "STREAM_DP_DOMAIN_FILE": "d.toml", "STREAM_DP_KEY_FILE": "key", "STREAM_DP_P": "1",
           "STREAM_DP_SHARDS": "1",
           "STREAM_DP_EPSILON": "10000", "STREAM_DP_BOOTSTRAP": "127.0.0.1:1", **extra}
    got = subprocess.run([sys.executable, "-m", "agents.cli", "worker", "--no-web"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env=env | {"PYTHONPATH": str(ROOT)})
    assert got.returncode == 2, got.stderr
    assert got.stderr.count("\n") == 1 and "Traceback" not in got.stderr
    assert words in got.stderr and "binary-attribute domain 'basket'" in got.stderr


def test_marginals_runs_with_other_bounds_do_not_share_noise(tmp_path: Path) -> None:
    """No cell reaches either bound, so only the noise can differ: it must (runs that differ
    only in their clipping would otherwise cancel their noise in a difference)."""
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "q.json").write_text("[[0, 1]]")
    _log(tmp_path / "ev.jsonl", [(1.0 + i, "01") for i in range(30)])
    out = []
    for bound in ("50", "60", "50"):
        got = _marginals(tmp_path, "--max-events-per-tick", bound, "--epsilon", "1")
        assert got.returncode == 0, got.stderr
        out.append((tmp_path / "a.json").read_text())
    assert out[0] == out[2] != out[1]


def test_an_empty_log_is_released_like_a_log_of_one_event(tmp_path: Path) -> None:
    """Neighbouring logs: no event, and one event. With the ticks to release public
    (--last-tick), both are released (exit 0, ticks 1..8, the same kind of line); the empty
    log used to exit 2 ("holds no events"), so the exit status told a count of 0 from 1."""
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "q.json").write_text("[[0, 1]]")
    seen = []
    for rows in ([], [(12.0, "11")]):
        _log(tmp_path / "ev.jsonl", rows)
        got = _marginals(tmp_path)
        assert got.returncode == 0, got.stderr
        answers = json.loads((tmp_path / "a.json").read_text())
        assert answers["tick"] == 8 and len(answers["answers"]) == 1
        last = got.stderr.splitlines()[-1]
        assert last.startswith("stream-dp marginals: tick 8: 1 answers written to ")
        seen.append(np.asarray(answers["answers"][0]))
    # ε = 4000: the noise is ~1e-3, so the released cells show the one event, decayed 0.9^6
    np.testing.assert_allclose(seen[0], 0.0, atol=0.05)
    np.testing.assert_allclose(seen[1], [0, 0, 0, 0.9**6], atol=0.05)


@pytest.mark.parametrize("ts", ["1E+999999999", "1E-999999999"])
def test_a_timestamp_with_a_huge_exponent_is_refused_at_once(tmp_path: Path, ts: str) -> None:
    """Ten bytes of JSON whose exact value has a billion digits: the command read it exactly
    (Fraction of the Decimal) and hung for minutes; now exit 2, one line naming the line."""
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "q.json").write_text("[[0]]")
    (tmp_path / "ev.jsonl").write_text('{"ts": 12, "attrs": "01"}\n{"ts": ' + ts
                                       + ', "attrs": "10"}\n')
    args = ["marginals", "--events", str(tmp_path / "ev.jsonl"), "--attributes", "2",
            "--epsilon", "1", "--decay", "0.9", "--tick-seconds", "10", "--origin", "0",
            "--last-tick", "8", "--queries", str(tmp_path / "q.json"),
            "--out", str(tmp_path / "a.json"), "--key-file", str(tmp_path / "key")]
    got = subprocess.run([sys.executable, "-m", "agents.cli", *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"})
    assert got.returncode == 2, got.stderr
    assert got.stderr.count("\n") == 1 and "ev.jsonl:2: ts must be unix seconds" in got.stderr
    other = [ts if a == "0" and args[i - 1] == "--origin" else a for i, a in enumerate(args)]
    (tmp_path / "ev.jsonl").write_text('{"ts": 12, "attrs": "01"}\n')
    bad_origin = subprocess.run([sys.executable, "-m", "agents.cli", *other], cwd=tmp_path,
                                capture_output=True, text=True, timeout=60,
                                env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"})
    assert bad_origin.returncode == 2 and "--origin must be a number of at most" in \
        bad_origin.stderr


def test_a_bootstrap_budget_that_underflows_is_refused_in_one_line(tmp_path: Path) -> None:
    """ε = 5·10⁻³²⁴ (the smallest float) with a bootstrap share of 0.999: 5 % of ε₀ is 0 and
    the histogram's scale was 1/0 — a ZeroDivisionError traceback, exit 1. Now exit 2 and one
    line naming the bootstrap budget."""
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "q.json").write_text("[[0, 1]]")
    _log(tmp_path / "ev.jsonl", [(12.0, "11")])
    got = _cli("marginals", "--events", str(tmp_path / "ev.jsonl"), "--attributes", "2",
               "--epsilon", "5e-324", "--bootstrap-fraction", "0.999", "--decay", "0.9",
               "--tick-seconds", "10", "--origin", "0", "--last-tick", "8",
               "--queries", str(tmp_path / "q.json"), "--out", str(tmp_path / "a.json"),
               "--key-file", str(tmp_path / "key"), cwd=tmp_path)
    assert got.returncode == 2, got.stderr
    last = got.stderr.strip().splitlines()[-1]
    assert "Traceback" not in got.stderr and "bootstrap budget" in last


def test_marginals_prints_no_elapsed_time_without_verbose(tmp_path: Path) -> None:
    """The '[  12.3 s]' stamp on every progress line grows with the log's number of events
    (reading it, the bootstrap, every tick's cells): a raw figure on the terminal. Without
    --verbose no line carries it; with --verbose every progress line does."""
    import re

    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "q.json").write_text("[[0]]")
    _log(tmp_path / "ev.jsonl", [(1.0 + i / 100, "01") for i in range(500)])
    stamp = re.compile(r"\[\s*\d+\.\d s\]")
    quiet = _marginals(tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert not stamp.search(quiet.stderr), quiet.stderr
    loud = _marginals(tmp_path, "--verbose")
    assert loud.returncode == 0, loud.stderr
    progress = [x for x in loud.stderr.splitlines() if "releasing ticks" in x or "structure:" in x]
    assert len(progress) == 2 and all(stamp.search(x) for x in progress)
