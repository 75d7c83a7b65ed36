"""``stream-dp marginals``: the evaluation's command — format, ticks, errors, reproducibility."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from stream_dp.cli import main
from stream_dp.commands.marginals import tick_of

M = 6


def _write_events(path: Path, rows: list[tuple[float, str]]) -> None:
    path.write_text("".join(json.dumps({"ts": ts, "attrs": a}) + "\n" for ts, a in rows))


def _dataset(n: int = 3000, ticks: int = 20, seed: int = 0) -> list[tuple[float, str]]:
    rng = np.random.default_rng(seed)
    z = rng.random(n) < 0.3
    bits = np.where(z[:, None], rng.random((n, M)) < 0.8, rng.random((n, M)) < 0.05)
    ts = np.sort(rng.uniform(100.0, 100.0 + 10.0 * ticks, n))
    return [
        (round(float(t), 3), "".join("1" if b else "0" for b in row))
        for t, row in zip(ts, bits, strict=True)
    ]


def _args(tmp: Path, **over: str) -> list[str]:
    opts = {
        "--events": str(tmp / "ev.jsonl"),
        "--attributes": str(M),
        "--epsilon": "50",
        "--decay": "0.9",
        "--tick-seconds": "10",
        "--origin": "100",
        "--last-tick": "20",  # the data's ticks are 1..20; the end is public, not the data's
        "--queries": str(tmp / "q.json"),
        "--out": str(tmp / "ans.json"),
        "--key-file": str(tmp / "key"),
    }
    opts.update(over)
    out: list[str] = ["marginals"]
    for k, v in opts.items():
        if v != "":
            out += [k, v]
    return out


@pytest.fixture()
def tmp(tmp_path: Path) -> Path:
    (tmp_path / "key").write_text("ab53e19c07f4d2a86b1e5c93a0f7d24e8c61b3f09a2e7d54c1b8f36a0e9d27c5")
    (tmp_path / "key").chmod(0o600)  # key files open to group or others are refused
    (tmp_path / "q.json").write_text(json.dumps([[0, 1, 2], [5], [3, 0]]))
    _write_events(tmp_path / "ev.jsonl", _dataset())
    return tmp_path


def _exact(rows: list[tuple[float, str]], q: list[int], p: float, last: int) -> np.ndarray:
    out = np.zeros(1 << len(q))
    for ts, a in rows:
        t = tick_of(ts, 100, 10)
        cell = 0
        for i in q:
            cell = cell * 2 + int(a[i])
        out[cell] += p ** (last - t)
    return out


def test_end_to_end_format_and_accuracy(tmp: Path) -> None:
    # one joint table over all 6 attributes: the answers are exact up to the (small) noise
    assert main(_args(tmp, **{"--max-cluster": "6"})) == 0
    doc = json.loads((tmp / "ans.json").read_text())
    assert set(doc) == {"tick", "answers"}
    rows = _dataset()
    last = max(tick_of(ts, 100, 10) for ts, _ in rows)
    assert doc["tick"] == last == 20
    assert [len(a) for a in doc["answers"]] == [8, 2, 4]
    for q, ans in zip([[0, 1, 2], [5], [3, 0]], doc["answers"], strict=True):
        exact = _exact(rows, q, 0.9, last)
        # ε = 50: little noise; cell order = first attribute most significant
        tv = 0.5 * np.abs(np.array(ans) / sum(ans) - exact / exact.sum()).sum()
        assert tv < 0.05, (q, ans, exact)
        assert abs(sum(ans) - exact.sum()) < 0.05 * exact.sum()


def test_same_key_same_log_is_bit_identical(tmp: Path) -> None:
    assert main(_args(tmp)) == 0
    first = (tmp / "ans.json").read_bytes()
    assert main(_args(tmp)) == 0
    assert (tmp / "ans.json").read_bytes() == first


def test_without_key_file_says_so(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_args(tmp, **{"--key-file": ""})) == 0
    assert "fresh random noise key" in capsys.readouterr().err


def test_tick_boundaries_exact() -> None:
    assert tick_of(100, 100, 10) == 1
    assert tick_of(109.999, 100, 10) == 1
    assert tick_of(110, 100, 10) == 2
    D = Decimal
    assert tick_of(D("0.3"), D("0.1"), D("0.2")) == 2  # floats would say 1
    assert tick_of(D("0.3"), 0, D("0.1")) == 4  # floats would say 3
    assert tick_of(D("0.7"), D("0.1"), D("0.2")) == 4


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"ts": 105, "attrs": "01010"}', "ev.jsonl:2: attrs has 5 characters"),
        ('{"ts": 105, "attrs": "0101a0"}', "ev.jsonl:2: attrs may contain only 0 and 1"),
        ('{"ts": 105, "attrs": ', "ev.jsonl:2: not valid JSON"),
        ('{"ts": 99, "attrs": "010100"}', "ev.jsonl:2: ts 99 is before the origin"),
        ('{"ts": "x", "attrs": "010100"}', "ev.jsonl:2: ts must be a finite number"),
        ('{"attrs": "010100"}', 'ev.jsonl:2: an event must be an object with "ts"'),
    ],
)
def test_bad_events(tmp: Path, capsys: pytest.CaptureFixture[str], line: str, message: str) -> None:
    (tmp / "ev.jsonl").write_text('{"ts": 100, "attrs": "000000"}\n' + line + "\n")
    assert main(_args(tmp)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize(
    ("queries", "message"),
    [
        ([[0, 6]], "index 6 out of range"),
        ([[1, 1]], "repeats an attribute"),
        ([list(range(9))], "allowed 1..8"),
        ([[]], "allowed 1..8"),
        ([["a"]], "is not an integer"),
        ({"q": 1}, "JSON list"),
    ],
)
def test_bad_queries(
    tmp: Path, capsys: pytest.CaptureFixture[str], queries: object, message: str
) -> None:
    (tmp / "q.json").write_text(json.dumps(queries))
    assert main(_args(tmp)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_alpha_above_8_with_wide_domain(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [(100.0 + i, "0" * 12) for i in range(5)]
    _write_events(tmp / "ev.jsonl", rows)
    (tmp / "q.json").write_text(json.dumps([list(range(9))]))
    assert main(_args(tmp, **{"--attributes": "12"})) == 2
    assert "allowed 1..8" in capsys.readouterr().err


def test_missing_key_file(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_args(tmp, **{"--key-file": str(tmp / "nope")})) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--key-file" in err[0]


def test_bad_parameters(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for over in (
        {"--attributes": "65"},
        {"--epsilon": "0"},
        {"--decay": "1.5"},
        {"--tick-seconds": "0"},
        {"--tick-seconds": "abc"},
        {"--origin": "nan"},
        {"--attributes": "six"},
        {"--epsilon": "x"},
    ):
        assert main(_args(tmp, **over)) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_empty_ticks_are_released_through_the_last_tick(tmp: Path) -> None:
    rows = [(100.0, "110000"), (100.5, "110000"), (395.0, "000011")]  # ticks 1, 1, 30
    _write_events(tmp / "ev.jsonl", rows)
    assert main(_args(tmp, **{"--epsilon": "100", "--last-tick": "30"})) == 0
    doc = json.loads((tmp / "ans.json").read_text())
    assert doc["tick"] == 30
    exact = _exact(rows, [0, 1, 2], 0.9, 30)
    assert np.allclose(doc["answers"][0], exact, atol=0.5), (doc["answers"][0], exact)


def test_last_tick_is_a_public_end(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_args(tmp, **{"--last-tick": "25"})) == 0
    doc = json.loads((tmp / "ans.json").read_text())
    assert doc["tick"] == 25  # the data ends in tick 20; ticks 21..25 are released too
    assert main(_args(tmp, **{"--last-tick": "10"})) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "lies after tick 10" in err[-1]


def test_last_tick_is_required(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """#23 item 8: the end of the release is public; it is never taken from the data."""
    with pytest.raises(SystemExit) as exit_:
        main(_args(tmp, **{"--last-tick": ""}))
    assert exit_.value.code == 2
    assert "--last-tick" in capsys.readouterr().err


def test_removing_the_last_event_does_not_change_the_released_ticks(tmp: Path) -> None:
    rows = _dataset()
    assert main(_args(tmp)) == 0
    full = json.loads((tmp / "ans.json").read_text())
    _write_events(tmp / "ev.jsonl", rows[:-1])
    assert main(_args(tmp)) == 0
    assert json.loads((tmp / "ans.json").read_text())["tick"] == full["tick"] == 20
    _write_events(tmp / "ev.jsonl", [r for r in rows if tick_of(r[0], 100, 10) <= 15])
    assert main(_args(tmp)) == 0  # five quiet ticks at the end: still released through 20
    assert json.loads((tmp / "ans.json").read_text())["tick"] == 20


def test_help_states_the_key_length_the_command_enforces(
    capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["marginals", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "≥ 16" not in text and ">= 16" not in text
    assert ">= 32 bytes" in text and "≥ 32 bytes" in text
