"""Reading a log with people for a user-level replay (issue #34): ``read_log(user_field=)``
takes each record's identifier as the worker will (a string of 1–256 UTF-8 bytes, nothing
normalised), keys the record by it, and names every record without a valid one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.commands._replay_checks import _check_log
from agents.commands._replay_send import _shifted, encode_event
from agents.ingest.users import _identifier
from agents.kafka.codec import Rejection
from simulators.logfile import LogFormatError, read_log, user_problem

EDGE = [None, "", "u1", "x" * 256, "x" * 257, "é" * 128, "é" * 129, 7, 1.5, True, [], {},
        "a\u0000b", "\ud800", " u1 ", "U1"]


@pytest.mark.parametrize("raw", EDGE)
def test_the_identifier_rule_is_the_workers(raw: object) -> None:
    """The replay's rule against the worker's own (agents.ingest.users), case by case."""
    worker = _identifier({"user": raw} if raw is not None else {}, "user")
    assert (user_problem(raw, "user") is None) == (not isinstance(worker, Rejection))


def test_json_and_csv_records_carry_and_are_keyed_by_their_person(tmp_path: Path) -> None:
    js = tmp_path / "p.jsonl"
    js.write_text('{"key":"a","ts":1.5,"value":1,"who":"ü 1"}\n{"key":"b","ts":2,"who":"u2"}\n')
    got = [r.event for r in read_log(js, user_field="who")]
    assert [(e.user, e.partition_key) for e in got] == [("ü 1", "ü 1"), ("u2", "u2")]
    assert json.loads(encode_event(got[0])) == {"key": "a", "ts": 1.5, "value": 1.0, "who": "ü 1"}
    # retimed events keep their person
    assert [r.event.user for r in _shifted(read_log(js, user_field="who"), 10.0)] == ["ü 1", "u2"]
    # event level: the field is ignored and the record keyed by the event key, as before
    plain = [r.event for r in read_log(js)]
    assert [(e.user, e.partition_key) for e in plain] == [(None, "a"), (None, "b")]
    assert json.loads(encode_event(plain[0])) == {"key": "a", "ts": 1.5, "value": 1.0}
    csv = tmp_path / "p.csv"
    csv.write_text('ts,key,value,who\n1.5,a,1,"u,1"\n2,b,1,u2\n')
    assert [r.event.partition_key for r in read_log(csv, user_field="who")] == ["u,1", "u2"]
    with pytest.raises(LogFormatError, match="must name the column visitor"):
        list(read_log(csv, user_field="visitor"))


def test_every_record_without_a_person_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("ts,key,value,user\n1,a,1,u1\n2,a,1,\n3,a,1,u3\n4,a,1,\n")
    with pytest.raises(LogFormatError) as err:
        _check_log(path, "csv", "user")
    assert str(err.value).startswith("2 of 4 records carry no valid person identifier")
    assert f"the first: {path}:3: the person's identifier (field 'user') is missing" in str(
        err.value)
    _check_log(path, "csv")  # event level: nothing to check there
    with pytest.raises(LogFormatError, match=r"p.csv:3: the person's identifier"):
        list(read_log(path, user_field="user"))


def test_an_interrupted_replay_resumes_only_with_the_same_unit(tmp_path: Path) -> None:
    """A replay interrupted at event level is not resumed keyed by person (its first records
    went out keyed by stream), nor the other way round: one line, exit 2, nothing sent."""
    import os
    import subprocess
    import sys

    from agents.commands._replay_state import ReplayState, log_digest, state_path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    env["STREAM_DP_KEY"] = "a3f1c07e5b92d4186e0fa7c3b5d29e41f6087ac2d3e5b9f10c4a7e6d28b3f951"
    env["STREAM_DP_REPLAY_HISTORY"] = str(tmp_path / "history.json")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agents.cli", *args], cwd=root, env=env,
                              capture_output=True, text=True, timeout=120)

    log = tmp_path / "log.jsonl"
    assert cli("simulate", "nettrace", "--ticks", "5", "--people", "9", "--out", str(log),
               "--domain-out", str(tmp_path / "d.toml"),
               "--settings-out", str(tmp_path / "s.toml")).returncode == 0
    for before, config, said in ((None, "s.toml", "was event level, these settings say keyed "
                                  "by the person's 'user'"),
                                 ("user", None, "was keyed by the person's 'user', these "
                                  "settings say event level")):
        ReplayState(log=str(log), log_sha256=log_digest(log), topic="dp.events.v1", run_id="r",
                    records_acked=1, user_field=before).save(state_path(log, None))
        proc = cli("replay", str(log), "--no-close-markers", "--bootstrap", "127.0.0.1:1",
                   *(("--config", str(tmp_path / config)) if config else ()))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and said in proc.stderr, proc.stderr
