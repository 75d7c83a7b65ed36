"""The replay guard is per noise key and log *content*, never per file name (issue #23, item 7),
and replay's end is public (item 8): the history store and ``stream-dp replay``'s refusals, which
all happen before anything connects to a broker (the bootstrap below is a closed port)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from agents.cli import main
from agents.commands.replay import ReplayState, key_fingerprint, log_digest, state_path
from agents.replay_history import ANY, Content, Deployment, ReplayHistory, default_history_path

KEY_A = bytes.fromhex("a3f1c07e5b92d4186e0fa7c3b5d29e41f6087ac2d3e5b9f10c4a7e6d28b3f951")
KEY_B = bytes.fromhex("b71e04c9a2f5d8363c1be7a09d4f52e8c61a3f7b0e95d2c48a6f1b3e07d9c52a")
FP_A, FP_B = key_fingerprint(KEY_A), key_fingerprint(KEY_B)
NOWHERE = "127.0.0.1:1"  # nothing listens: every refusal below happens before connecting
UNTIL = "2024-01-01T00:10:00Z"
ROWS = [f"{1704067200 + i},item{i % 3}" for i in range(40)]
#: the deployment the store tests replay into: cluster "c1", events topic "t"
HERE = Deployment("c1", "t")
TARGET = {"bootstrap": NOWHERE, "topic": "t"}


def _log(path: Path, rows: list[str]) -> Path:
    path.write_text("ts,key\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def _record(history: ReplayHistory, fp: str, log: Path, offset: float = 0.0) -> str:
    verdict = history.check_and_record(fp, Content(log_digest(log), offset), log=str(log),
                                       target=TARGET, deployment=HERE)
    assert not verdict.refused
    return verdict.key


@pytest.fixture()
def history(tmp_path: Path) -> ReplayHistory:
    return ReplayHistory(tmp_path / "history.json")


# ---------------------------------------------------------------------------------- the store
def test_identical_content_under_another_name_is_allowed(history: ReplayHistory,
                                                         tmp_path: Path) -> None:
    a = _log(tmp_path / "sales.csv", ROWS)
    assert _record(history, FP_A, a) == "new"
    copy = tmp_path / "elsewhere" / "renamed.csv"
    copy.parent.mkdir()
    shutil.copy(a, copy)
    assert _record(history, FP_A, copy) == "same"  # bit-identical replay: no new budget
    (entry,) = history.entries(FP_A)
    assert entry["paths"] == [str(a), str(copy)] and entry["log_sha256"] == log_digest(a)


def test_changed_log_under_another_name_is_refused(history: ReplayHistory,
                                                   tmp_path: Path) -> None:
    a = _log(tmp_path / "sales.csv", ROWS)
    _record(history, FP_A, a)
    changed = _log(tmp_path / "sales-fixed.csv", [*ROWS[:20], ROWS[20].replace("item", "itex"),
                                                  *ROWS[21:]])
    verdict = history.check_and_record(FP_A, Content(log_digest(changed)), log=str(changed),
                                       target=TARGET, deployment=HERE)
    assert verdict.refused and verdict.previous is not None
    assert verdict.previous["log_sha256"] == log_digest(a)
    assert len(history.entries(FP_A)) == 1  # the refused content is not recorded


def test_prefix_then_full_log_under_another_name_is_refused(history: ReplayHistory,
                                                            tmp_path: Path) -> None:
    prefix = _log(tmp_path / "day1.csv", ROWS[:25])
    _record(history, FP_A, prefix)
    full = _log(tmp_path / "full.csv", ROWS)
    assert history.check_and_record(FP_A, Content(log_digest(full)), log=str(full),
                                    target=TARGET, deployment=HERE).refused
    # and the other way round: the full log first, then a prefix (an event removed at the end)
    other = ReplayHistory(tmp_path / "other.json")
    _record(other, FP_A, full)
    assert other.check_and_record(FP_A, Content(log_digest(prefix)), log=str(prefix),
                                  target=TARGET, deployment=HERE).refused


def test_changed_log_in_place_is_refused_and_another_key_is_new_budget(
    history: ReplayHistory, tmp_path: Path
) -> None:
    log = _log(tmp_path / "sales.csv", ROWS)
    _record(history, FP_A, log)
    _log(log, ROWS[:-1])  # the last event removed
    assert history.lookup(FP_A, Content(log_digest(log)), HERE).refused
    assert _record(history, FP_B, log) == "new"
    _log(log, ROWS)  # back to the original: key A has replayed it, key B has not
    assert history.lookup(FP_A, Content(log_digest(log)), HERE).key == "same"
    assert history.lookup(FP_B, Content(log_digest(log)), HERE).refused
    fresh = ReplayHistory(tmp_path / "h2.json")
    _record(fresh, FP_A, log)
    assert _record(fresh, FP_B, log) == "different"  # same content, another key: spent again


def test_another_time_shift_is_another_content(history: ReplayHistory, tmp_path: Path) -> None:
    """The same file retimed by another constant puts other counts into the same ticks."""
    log = _log(tmp_path / "sales.csv", ROWS)
    _record(history, FP_A, log, offset=3600.0)
    assert _record(history, FP_A, log, offset=3600.0) == "same"
    assert history.lookup(FP_A, Content(log_digest(log), 0.0), HERE).refused
    assert history.lookup(FP_A, Content(log_digest(log), 7200.0), HERE).refused


def test_a_key_replays_another_log_only_into_another_deployment(history: ReplayHistory,
                                                               tmp_path: Path) -> None:
    """Issue #32: the noise is bound to the deployment, so one key may replay one log into one
    deployment and another log into another one; into the same deployment (the same events
    topic on the same cluster, whatever address reached it) a renamed, prefixed, extended or
    edited log is still refused."""
    log = _log(tmp_path / "sales.csv", ROWS)
    assert _record(history, FP_A, log) == "new"
    changed = {
        "renamed+edited": _log(tmp_path / "renamed.csv",
                               [*ROWS[:9], ROWS[9].replace("item", "itex"), *ROWS[10:]]),
        "prefix": _log(tmp_path / "prefix.csv", ROWS[:30]),
        "extended": _log(tmp_path / "extended.csv", [*ROWS, f"{1704067300},item1"]),
        "prefixed": _log(tmp_path / "prefixed.csv", [f"{1704067100},item1", *ROWS]),
    }
    for name, other in changed.items():
        content = Content(log_digest(other))
        assert history.lookup(FP_A, content, HERE).refused, name
        for elsewhere in (Deployment("c1", "u"), Deployment("c2", "t")):
            assert not history.lookup(FP_A, content, elsewhere).refused, (name, elsewhere)
        # a query that does not know its cluster counts every cluster: refused
        assert history.lookup(FP_A, content, Deployment(ANY, "t")).refused, name
    other = changed["extended"]
    verdict = history.check_and_record(FP_A, Content(log_digest(other)), log=str(other),
                                       target=TARGET, deployment=Deployment("c1", "u"))
    assert not verdict.refused and verdict.key == "new"  # the first content of that deployment
    # now each deployment holds its own log: neither takes the other's
    assert history.lookup(FP_A, Content(log_digest(other)), HERE).refused
    assert history.lookup(FP_A, Content(log_digest(log)), Deployment("c1", "u")).refused
    assert history.lookup(FP_A, Content(log_digest(log)), HERE).key == "same"
    assert [e["deployments"] for e in history.entries(FP_A)] == [
        [HERE.as_dict()], [{"cluster": "c1", "topic": "u"}]]


def test_a_version_1_history_refuses_at_least_what_it_refused(tmp_path: Path) -> None:
    """A file written before the deployment was recorded: each entry counts for its target
    topics on any cluster, or, with no target, for every deployment; the next record writes
    version 2 and keeps them so."""
    path = tmp_path / "history.json"
    old = {"log_sha256": "1" * 64, "time_offset": 0.0, "paths": ["/old.csv"],
           "targets": [{"bootstrap": "old:9092", "topic": "t"}], "first": "x", "last": "x"}
    bare = {**old, "log_sha256": "2" * 64, "targets": []}
    path.write_text(json.dumps({"version": 1, "keys": {FP_A: [old], FP_B: [bare]}}))
    history = ReplayHistory(path)
    new = Content("3" * 64)
    for cluster in ("c1", "c2", ""):
        assert history.lookup(FP_A, new, Deployment(cluster, "t")).refused
        assert history.lookup(FP_B, new, Deployment(cluster, "u")).refused
    assert not history.lookup(FP_A, new, Deployment("c1", "u")).refused
    assert history.lookup(FP_A, Content("1" * 64), Deployment("c9", "t")).key == "same"
    history.check_and_record(FP_A, new, log="/new.csv", target=TARGET,
                             deployment=Deployment("c1", "u"))
    data = json.loads(path.read_text())
    assert data["version"] == 2
    assert data["keys"][FP_A][0]["deployments"] == [{"cluster": ANY, "topic": "t"}]
    assert data["keys"][FP_B][0]["deployments"] == [{"cluster": ANY, "topic": ANY}]
    assert ReplayHistory(path).lookup(FP_A, new, Deployment("c7", "t")).refused


def test_history_file_holds_no_key_and_is_private(history: ReplayHistory, tmp_path: Path) -> None:
    _record(history, FP_A, _log(tmp_path / "sales.csv", ROWS))
    text = history.path.read_text()
    assert KEY_A.hex() not in text and KEY_A.hex()[:16] not in text
    assert history.path.stat().st_mode & 0o077 == 0
    assert json.loads(text)["version"] == 2


def test_default_location_does_not_depend_on_the_log(tmp_path: Path) -> None:
    assert default_history_path({"STREAM_DP_REPLAY_HISTORY": str(tmp_path / "h.json")}) == \
        tmp_path / "h.json"
    assert default_history_path({"XDG_STATE_HOME": str(tmp_path)}) == \
        tmp_path / "stream-dp" / "replay-history.json"
    assert default_history_path({"HOME": "/nonexistent"}).name == "replay-history.json"


# ---------------------------------------------------------------------------------- the command
def _run(tmp: Path, log: Path, *extra: str, key: bytes | None, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object], str]:
    monkeypatch.delenv("STREAM_DP_KEY_FILE", raising=False)
    if key is None:
        monkeypatch.delenv("STREAM_DP_KEY", raising=False)
    else:
        monkeypatch.setenv("STREAM_DP_KEY", key.hex())
    rc = main(["replay", str(log), "--bootstrap", NOWHERE, "--topic", "t", "--json",
               "--no-progress", "--history-file", str(tmp / "history.json"), *extra])
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


def test_replay_of_a_renamed_changed_log_exits_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    history = ReplayHistory(tmp_path / "history.json")
    _record(history, FP_A, _log(tmp_path / "a.csv", ROWS))
    renamed = _log(tmp_path / "b.csv", [*ROWS, f"{1704067300},item1"])  # an extension
    rc, status, err = _run(tmp_path, renamed, "--until", UNTIL, key=KEY_A,
                           monkeypatch=monkeypatch, capsys=capsys)
    assert rc == 3 and status["status"] == "log_differs" and status["exit_status"] == 3
    assert "REFUSED" in err and str(tmp_path / "a.csv") in err and KEY_A.hex()[:8] not in err
    assert not state_path(renamed, None).exists()  # nothing was started


def test_replay_without_a_key_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path / "a.csv", ROWS)
    rc, status, err = _run(tmp_path, log, "--until", UNTIL, key=None,
                           monkeypatch=monkeypatch, capsys=capsys)
    assert rc == 2 and status["error"] == "no noise key"
    assert err.count("\n") == 1 and "--key-file" in err and "STREAM_DP_KEY" in err
    assert not (tmp_path / "history.json").exists()


def test_replay_with_an_open_key_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path / "a.csv", ROWS)
    key_file = tmp_path / "noise.key"
    key_file.write_text(KEY_A.hex())
    key_file.chmod(0o644)
    rc, _, err = _run(tmp_path, log, "--until", UNTIL, "--key-file", str(key_file), key=None,
                      monkeypatch=monkeypatch, capsys=capsys)
    assert rc == 2 and err.count("\n") == 1 and "chmod 600" in err and str(key_file) in err
    assert KEY_A.hex() not in err


@pytest.mark.parametrize("extra, message", [
    ((), "--until TIME is required"),
    (("--until", "2999-01-01T00:00:00Z"), "is in the future"),
    (("--no-close-markers", "--until", "2024-01-01T00:00:00Z"), "no effect with"),
])
def test_replay_end_must_be_public_and_past(
    extra: tuple[str, ...], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = _log(tmp_path / "a.csv", ROWS)
    rc, status, err = _run(tmp_path, log, *extra, key=KEY_A, monkeypatch=monkeypatch,
                           capsys=capsys)
    assert rc == 2 and status["status"] == "error" and message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "history.json").exists()


def test_until_just_ahead_of_the_wall_clock_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path / "a.csv", ROWS)
    rc, _, err = _run(tmp_path, log, "--until", f"{time.time() + 30:.3f}", key=KEY_A,
                      monkeypatch=monkeypatch, capsys=capsys)
    assert rc == 2 and "in the future" in err


def test_a_bad_line_is_found_before_anything_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path / "a.csv", [*ROWS[:5], "yesterday,item1", *ROWS[5:]])
    rc, _, err = _run(tmp_path, log, "--until", UNTIL, key=KEY_A,
                      monkeypatch=monkeypatch, capsys=capsys)
    assert rc == 2 and "a.csv:7:" in err and "nothing was sent" in err
    assert ReplayHistory(tmp_path / "history.json").entries(FP_A) == []


def test_a_state_file_of_the_per_path_guard_is_not_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Upgrading: pairs recorded per path by an earlier version join the history when read."""
    log = _log(tmp_path / "a.csv", ROWS)
    old_digest = "0" * 64
    ReplayState(log=str(log), log_sha256=old_digest, topic="t", run_id="r", complete=True,
                key_fingerprint=FP_A, history=[[FP_A, old_digest]]).save(state_path(log, None))
    rc, status, _ = _run(tmp_path, log, "--until", UNTIL, key=KEY_A,
                         monkeypatch=monkeypatch, capsys=capsys)
    assert rc == 3 and status["status"] == "log_differs"
    assert [e["log_sha256"] for e in ReplayHistory(tmp_path / "history.json").entries(FP_A)] \
        == [old_digest]


def test_a_log_changed_during_its_replay_binds_both_contents(history: ReplayHistory,
                                                              tmp_path: Path) -> None:
    """What was sent may be neither the checked content nor the final one: both are recorded,
    and the key refuses every further replay, the original included."""
    log = _log(tmp_path / "growing.csv", ROWS[:20])
    before = Content(log_digest(log))
    _record(history, FP_A, log)
    _log(log, ROWS)  # appended to while it was being sent
    history.add(FP_A, Content(log_digest(log)), log=str(log), target=TARGET, deployment=HERE)
    assert history.lookup(FP_A, before, HERE).refused
    assert history.lookup(FP_A, Content(log_digest(log)), HERE).refused
    assert len(history.entries(FP_A)) == 2
