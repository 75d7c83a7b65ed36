"""`stream-dp replay` end to end against the real (embedded) broker.

Every replay here runs with the noise key (``STREAM_DP_KEY`` = KEY_A unless a test says
otherwise: replay refuses to run without one) and a public end (``--until``), and each test has its
own replay history (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from agents.commands._replay_send import HEADER
from agents.commands._replay_state import ReplayState, key_fingerprint, state_path
from agents.commands.replay_history import ReplayHistory
from agents.kafka.codec import marker_key, parse_close_marker
from simulators.logfile import read_log
from tests.integration._users import (
    ROOT,
    close_markers,
    create_topic,
    read_all,
    read_events,
    stream_dp,
)

pytestmark = pytest.mark.integration

KEY_A = "a3f1c07e5b92d4186e0fa7c3b5d29e41f6087ac2d3e5b9f10c4a7e6d28b3f951"  # hex, 32 random bytes
KEY_B = "b71e04c9a2f5d8363c1be7a09d4f52e8c61a3f7b0e95d2c48a6f1b3e07d9c52a"
KEY_C = "c58d2e07f1a94b36e0d7c5a18f3b62e94d0a7c1f58e36b2d9a04f7c1e3b85d26"
#: a public end after every simulated log here (they start 2024-01-01; no worker reads them)
UNTIL = "2024-01-08T00:00:00Z"


@pytest.fixture(autouse=True)
def _key_a(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_KEY", KEY_A)
    monkeypatch.delenv("STREAM_DP_KEY_FILE", raising=False)


def _log_events(path: Path) -> Counter[tuple[str, float, float]]:
    return Counter((r.event.key, r.event.ts, r.event.value) for r in read_log(path))


def _topic_events(bootstrap: str, topic: str) -> Counter[tuple[str, float, float]]:
    out: Counter[tuple[str, float, float]] = Counter()
    for m in read_events(bootstrap, topic):
        v = m.json()
        assert m.key == v["key"].encode()
        # the record timestamp is the sending time (old event times would fall to retention)
        assert m.timestamp > 1_700_000_000_000 and m.timestamp > v["ts"] * 1000
        out[(v["key"], v["ts"], v["value"])] += 1
    return out


def test_replay_csv_sends_every_event_once_keeping_event_time(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    create_topic(kafka_broker, unique_name)
    log = tmp_path / "sales.csv"
    stream_dp("simulate", "restaurant", "--seed", "5", "--ticks", "15", "--out", str(log), check=True)
    proc = stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
                     "--until", UNTIL, env={"STREAM_DP_KEY": KEY_A}, check=True)
    assert "bit for bit" in proc.stderr
    assert proc.stdout == ""  # notes and progress on stderr; stdout is for --json only
    expected = _log_events(log)
    assert sum(expected.values()) > 500
    assert _topic_events(kafka_broker, unique_name) == expected
    state = ReplayState.load(state_path(log, None))
    assert state is not None and state.complete and state.records_acked == sum(expected.values())
    assert KEY_A not in state_path(log, None).read_text()  # fingerprint only, never the key

    again = stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
                      "--until", UNTIL, check=True)
    assert "already replayed completely" in again.stderr
    assert _topic_events(kafka_broker, unique_name) == expected  # nothing sent twice


def test_replay_jsonl_with_iso_times_and_default_value(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    create_topic(kafka_broker, unique_name, partitions=1)
    log = tmp_path / "events.jsonl"
    log.write_text(
        '{"key": "www/news", "ts": "2024-01-01T00:00:00.250Z"}\n'
        "\n"
        '{"key": "api/v1", "ts": 1704067201.5, "value": 3}\n'
        '{"key": "www/news", "ts": "2024-01-01T00:00:02"}\n',
        encoding="utf-8",
    )
    stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
              "--until", UNTIL, "--state-dir", str(tmp_path / "state"), check=True)
    got = [m.json() for m in sorted(read_events(kafka_broker, unique_name), key=lambda m: m.offset)]
    assert got == [
        {"key": "www/news", "ts": 1704067200.25, "value": 1.0},
        {"key": "api/v1", "ts": 1704067201.5, "value": 3.0},
        {"key": "www/news", "ts": 1704067202.0, "value": 1.0},
    ]
    assert not (tmp_path / "events.jsonl.replay.json").exists()
    assert list((tmp_path / "state").glob("events.jsonl-*.replay.json"))


def test_replay_resumes_after_kill_9_without_duplicates_or_loss(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    create_topic(kafka_broker, unique_name)
    log = tmp_path / "net.csv"
    # 2 000+ events over 40 s of event time; at --speed 8 the first run needs ~5 s
    stream_dp("simulate", "nettrace", "--seed", "1", "--ticks", "40", "--rate", "60",
              "--out", str(log), check=True)
    spath = state_path(log, None)
    child = subprocess.Popen(
        [sys.executable, "-m", "agents.cli", "replay", str(log), "--bootstrap", kafka_broker,
         "--topic", unique_name, "--speed", "8", "--chunk", "50", "--no-progress",
         "--until", UNTIL],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = ReplayState.load(spath) if spath.exists() else None
            if state is not None and state.records_acked >= 300:
                break
            assert child.poll() is None, child.communicate()
            time.sleep(0.05)
        else:
            pytest.fail("replay made no progress")
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    state = ReplayState.load(spath)
    assert state is not None and not state.complete
    expected = _log_events(log)
    assert 0 < state.records_acked < sum(expected.values())

    proc = stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
                     "--until", UNTIL, check=True)
    assert "resuming" in proc.stderr
    assert _topic_events(kafka_broker, unique_name) == expected


def test_resume_skips_records_delivered_after_the_last_checkpoint(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """A crash between delivery and the state write: the headers in the topic prevent resends."""
    create_topic(kafka_broker, unique_name)
    log = tmp_path / "census.csv"
    stream_dp("simulate", "census", "--seed", "2", "--ticks", "10", "--out", str(log), check=True)
    stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
              "--until", UNTIL, check=True)
    expected = _log_events(log)
    before = read_events(kafka_broker, unique_name)
    assert all(any(h == HEADER for h, _ in m.headers) for m in before)

    # Rewind the state as if the process died right after sending, before recording: every
    # record after #100 was delivered but is not acknowledged in the state file.
    spath = state_path(log, None)
    data = json.loads(spath.read_text())
    rec100 = next(r for r in read_log(log) if r.number == 100)
    data.update(records_acked=100, byte_offset=rec100.end_offset, complete=False, delivered=[],
                scan_from={str(p): 0 for p in range(3)})
    spath.write_text(json.dumps(data))

    proc = stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
                     "--until", UNTIL, check=True)
    assert f"{sum(expected.values()) - 100} later records already delivered" in proc.stderr
    assert "0 sent" in proc.stderr
    assert _topic_events(kafka_broker, unique_name) == expected


def test_key_fingerprint_same_key_reproduces_other_key_warns(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """Each replay goes to a fresh topic (a fresh deployment, its own noise): the same key and
    log say the budget is spent again there, another key likewise, with a warning. Into a topic an earlier replay
    closed already (its final marker ends the partitions), replay refuses, exit 2, one line:
    a markers worker would dead-letter every event (tick_closed) and release nothing new, while
    replay used to say "bit for bit" or "spent AGAIN" (issue #24)."""
    topics = [unique_name, unique_name + "-same", unique_name + "-other"]
    for topic in topics:
        create_topic(kafka_broker, topic, partitions=1)
    log = tmp_path / "small.csv"
    log.write_text("ts,key\n1704067200,item1\n1704067201,item2\n", encoding="utf-8")
    key_file = tmp_path / "key"
    key_file.write_text(KEY_B)
    key_file.chmod(0o600)  # key files open to group or others are refused

    def replay(topic: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", topic,
                         "--restart", "--until", "2024-01-01T00:00:30Z", *extra,
                         env={"STREAM_DP_KEY": KEY_A})

    first = replay(topics[0])
    assert first.returncode == 0 and "first replay" in first.stderr
    assert "WARNING" not in first.stderr
    # the same topic under the same key: its ticks are closed (another key's final marker
    # looks like a forgery and decides nothing: test_users_e2e.py, issue #32)
    again = replay(topics[0])
    assert again.returncode == 2, again.stdout + again.stderr
    lines = [x for x in again.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in again.stderr, again.stderr
    assert f"{topics[0]} already holds the final close marker" in lines[0]
    assert "signed with this key" in lines[0] and "nothing was sent" in lines[0]
    # the same log under the same key into another deployment (another events topic: its own
    # noise): said to be new releases, the budget spent again (it said "bit for bit" before)
    same = replay(topics[1])
    assert same.returncode == 0 and "same noise key" in same.stderr
    assert "another deployment" in same.stderr and "spent AGAIN" in same.stderr
    assert "bit for bit" not in same.stderr.split("another deployment")[0]
    other = replay(topics[2], "--key-file", str(key_file))
    assert other.returncode == 0 and "WARNING" in other.stderr and "spent AGAIN" in other.stderr
    assert KEY_A not in first.stderr + same.stderr + other.stdout + other.stderr
    assert [len(read_events(kafka_broker, t)) for t in topics] == [2, 2, 2]  # nothing twice
    # each replay ends with a final close marker in every partition at --until (not at the last
    # event's time), signed for this topic and partition with the key it was run with (#23 item 5)
    keys = [bytes.fromhex(KEY_A), bytes.fromhex(KEY_A), bytes.fromhex(KEY_B)]
    for topic, key in zip(topics, keys, strict=True):
        markers = close_markers(kafka_broker, topic)
        assert [m.json()["time"] for m in markers] == [1704067230.0]
        assert all(m.json()["schema"] == "dp.close.v2" and m.json()["final"] for m in markers)
        m = markers[0]
        good = parse_close_marker(m.value, mac_key=marker_key(key), topic=topic,
                                  partition=m.partition)
        assert good == (1704067230.0, True)
        wrong = bytes.fromhex(KEY_B if key == bytes.fromhex(KEY_A) else KEY_A)
        assert not isinstance(parse_close_marker(m.value, mac_key=marker_key(wrong),
                                                 topic=topic, partition=m.partition), tuple)
        assert not isinstance(parse_close_marker(m.value, mac_key=marker_key(key),
                                                 topic=topic + "x", partition=m.partition),
                              tuple)


def test_records_appended_after_the_final_marker_do_not_hide_it(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """Issue #32: replay looked only at the last record of each partition, so any writer of
    the events topic who appended one record (a forged marker, an event) after a genuine final
    marker made a second copy of the log go in (the worker dead-letters it, tick_closed, and
    events after the earlier --until would count twice). Replay now looks at the partitions'
    last records: the genuine marker still refuses (exit 2, one line, nothing sent), and the
    forged one decides nothing."""
    import asyncio

    from agents.kafka.codec import CLOSE_HEADER, CLOSE_SCHEMA

    create_topic(kafka_broker, unique_name, partitions=2)
    log = tmp_path / "small.csv"
    log.write_text("ts,key\n1704067200,item1\n1704067201,item2\n", encoding="utf-8")

    def replay() -> subprocess.CompletedProcess[str]:
        return stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
                         "--restart", "--until", "2024-01-01T00:00:30Z")

    assert replay().returncode == 0
    forged = json.dumps({"schema": CLOSE_SCHEMA, "time": 1704067230.0, "final": True,
                         "mac": "0" * 64}).encode()

    async def append() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker)
        await producer.start()
        try:
            for p in (0, 1):
                await producer.send_and_wait(unique_name, forged, partition=p,
                                             headers=[(CLOSE_HEADER, b"1")])
                await producer.send_and_wait(
                    unique_name, b'{"key": "item3", "ts": 1704067202}', partition=p)
        finally:
            await producer.stop()

    asyncio.run(append())
    before = len(read_all(kafka_broker, unique_name))
    again = replay()
    assert again.returncode == 2, again.stdout + again.stderr
    lines = [x for x in again.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in again.stderr, again.stderr
    assert f"{unique_name} already holds the final close marker" in lines[0]
    assert "signed with this key" in lines[0] and "nothing was sent" in lines[0]
    assert len(read_all(kafka_broker, unique_name)) == before


def test_many_records_appended_after_the_final_marker_do_not_hide_it(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """Issue #32 (adversarial review): replay looked for an earlier final marker only among
    the last 1000 records of each partition (and gave up silently after 10 s), so a writer of
    the events topic who appended 1001 records after a genuine final marker hid it: a second
    copy of the log went in (its events after the earlier --until would count twice, an event
    contributing twice its cap). Replay now reads each partition whole: the genuine marker
    still refuses (exit 2, one line, nothing sent)."""
    create_topic(kafka_broker, unique_name, partitions=1)
    log = tmp_path / "small.csv"
    log.write_text("ts,key\n1704067200,item1\n1704067201,item2\n", encoding="utf-8")

    def replay() -> subprocess.CompletedProcess[str]:
        return stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
                         "--restart", "--until", "2024-01-01T00:00:30Z")

    assert replay().returncode == 0

    async def append() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker, linger_ms=20)
        await producer.start()
        try:
            sent = [await producer.send(unique_name, b'{"key": "item3", "ts": 1704067202}',
                                        partition=0)
                    for _ in range(1001)]
            for fut in sent:
                await fut
        finally:
            await producer.stop()

    asyncio.run(append())
    before = len(read_all(kafka_broker, unique_name))
    again = replay()
    assert again.returncode == 2, again.stdout + again.stderr
    lines = [x for x in again.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in again.stderr, again.stderr
    assert f"{unique_name} already holds the final close marker" in lines[0]
    assert len(read_all(kafka_broker, unique_name)) == before


def test_changed_log_under_the_same_key_is_refused_whole_log_checked(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """P4: a byte changed far past the first 64 KiB, a record added or removed: exit 3."""
    create_topic(kafka_broker, unique_name, partitions=1)
    log = tmp_path / "big.csv"
    rows = [f"{1704067200 + i * 0.01:.2f},item{i % 7}" for i in range(8000)]  # > 64 KiB
    log.write_text("ts,key\n" + "\n".join(rows) + "\n", encoding="utf-8")
    assert log.stat().st_size > 100_000
    args = ("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
            "--restart", "--json", "--no-progress", "--until", UNTIL)
    first = stream_dp(*args, env={"STREAM_DP_KEY": KEY_A}, check=True)
    status = json.loads(first.stdout)
    assert status["status"] == "replayed" and status["key"] == "new"
    assert status["records"] == 8000 and status["exit_status"] == 0
    sent = len(read_events(kafka_broker, unique_name))
    for change, fresh_key in (("edit", KEY_B), ("add", "c2" + KEY_A[2:]), ("remove", "d4" + KEY_B[2:])):
        changed = list(rows)
        if change == "edit":
            changed[-3] = changed[-3].replace("item", "itex")
        elif change == "add":
            changed.append(f"{1704067300:.2f},item1")
        else:
            del changed[5000]
        log.write_text("ts,key\n" + "\n".join(changed) + "\n", encoding="utf-8")
        proc = stream_dp(*args, env={"STREAM_DP_KEY": KEY_A})
        assert proc.returncode == 3, (change, proc.stdout, proc.stderr)
        status = json.loads(proc.stdout)
        assert status["status"] == "log_differs" and status["exit_status"] == 3
        assert "REFUSED" in proc.stderr and "differs" in proc.stderr
        assert len(read_events(kafka_broker, unique_name)) == sent  # nothing sent
        # another key into a fresh topic (a fresh deployment): fresh noise, the budget is spent
        # again, said out loud (a key is bound to one log per deployment: KEY_B on a second
        # changed log into that topic would be refused too). Into this topic, which key A's
        # final marker closed, replay
        # would go on: a final marker another key signed decides nothing (it may be forged;
        # issue #32), only one this key verifies refuses (issue #24).
        fresh = [*args[:5], unique_name + "-" + change, *args[6:]]
        create_topic(kafka_broker, fresh[5], partitions=1)
        other = stream_dp(*fresh, env={"STREAM_DP_KEY": fresh_key}, check=True)
        status = json.loads(other.stdout)
        assert status["key"] == "different" and status["budget"] == "spent_again"
        assert "spent AGAIN" in other.stderr
        # back to key A: the state now records key B's replay; restore the original log
        log.write_text("ts,key\n" + "\n".join(rows) + "\n", encoding="utf-8")
        fresh[5] += "-a"
        create_topic(kafka_broker, fresh[5], partitions=1)
        stream_dp(*fresh, env={"STREAM_DP_KEY": KEY_A}, check=True)
        assert len(read_events(kafka_broker, unique_name)) == sent


def test_bad_line_names_its_line_and_nothing_is_sent(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """The whole log is read before anything is sent or recorded: fixing the line afterwards
    is not "another log" under the key."""
    create_topic(kafka_broker, unique_name, partitions=1)
    log = tmp_path / "bad.csv"
    log.write_text("key,ts,value\nitem1,1704067200,1\nitem2,1704067201,1\nitem3,yesterday,1\n"
                   "item4,1704067203,1\n", encoding="utf-8")
    proc = stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
                     "--until", UNTIL)
    assert proc.returncode == 2
    assert "bad.csv:4:" in proc.stderr and "ts must be" in proc.stderr
    assert "nothing was sent" in proc.stderr
    assert read_all(kafka_broker, unique_name) == []
    log.write_text(log.read_text().replace("yesterday", "1704067202"), encoding="utf-8")
    stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
              "--until", UNTIL, check=True)
    assert [m.json()["key"] for m in read_events(kafka_broker, unique_name)] == [
        "item1", "item2", "item3", "item4"]


def test_missing_topic_is_a_clear_error(kafka_broker: str, unique_name: str, tmp_path: Path) -> None:
    log = tmp_path / "x.csv"
    log.write_text("ts,key\n1704067200,item1\n", encoding="utf-8")
    proc = stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
                     "--until", UNTIL)
    assert proc.returncode == 1
    assert "does not exist" in proc.stderr


def test_retime_now_shifts_every_event_by_one_constant(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    create_topic(kafka_broker, unique_name, partitions=1)
    log = tmp_path / "old.csv"
    log.write_text("ts,key\n2024-01-01T00:00:00Z,a\n2024-01-01T00:00:00.500Z,b\n"
                   "2024-01-01T00:00:01.250Z,a\n", encoding="utf-8")
    before = time.time()
    proc = stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
                     "--retime", "now", "--speed", "10", "--no-close-markers", check=True)
    assert "NEW releases" in proc.stderr and "bit for bit" not in proc.stderr
    got = [m.json() for m in sorted(read_events(kafka_broker, unique_name), key=lambda m: m.offset)]
    ts = [m["ts"] for m in got]
    assert [m["key"] for m in got] == ["a", "b", "a"]
    assert before - 1 <= ts[0] <= time.time()
    assert [round(t - ts[0], 3) for t in ts] == [0.0, 0.5, 1.25]  # gaps kept exactly
    state = ReplayState.load(state_path(log, None))
    assert state is not None and state.time_offset == round(ts[0] - 1704067200.0, 3)
    assert close_markers(kafka_broker, unique_name) == []
    # 'now' again is another shift: other counts in the same ticks under the same key: refused
    again = stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
                      "--retime", "now", "--no-close-markers", "--restart")
    assert again.returncode == 3 and "retimed" in again.stderr


def test_ctrl_c_saves_progress_and_the_same_command_resumes(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    create_topic(kafka_broker, unique_name)
    log = tmp_path / "rest.csv"
    stream_dp("simulate", "restaurant", "--seed", "9", "--ticks", "30", "--tick-seconds", "1",
              "--out", str(log), check=True)
    args = [sys.executable, "-m", "agents.cli", "replay", str(log), "--bootstrap",
            kafka_broker, "--topic", unique_name, "--until", UNTIL]
    child = subprocess.Popen([*args, "--speed", "2", "--chunk", "20", "--no-progress"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    spath = state_path(log, None)
    try:
        for _ in range(600):
            st = ReplayState.load(spath) if spath.exists() else None
            if st is not None and st.records_acked > 0:
                break
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, err
    assert "interrupted after record" in err and "Traceback" not in err and out == ""
    st = ReplayState.load(spath)
    assert st is not None and not st.complete and st.records_acked > 0
    stream_dp(*args[3:], check=True)
    assert _topic_events(kafka_broker, unique_name) == _log_events(log)


def test_the_guard_follows_the_content_not_the_file_name(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """#23 item 7: a changed log under another name, a prefix then the full log under another
    name: refused with exit 3 and nothing sent; the very same log under another name: allowed
    (into another deployment: its own noise, the budget spent again). Each allowed replay goes to a fresh topic (a fresh
    deployment): a topic an earlier replay closed is refused on its own (exit 2, issue #24)."""
    for suffix in ("", "-copy", "-c"):
        create_topic(kafka_broker, unique_name + suffix, partitions=2)
    rows = [f"{1704067200 + i * 0.5:.1f},item{i % 5}" for i in range(200)]

    def write(path: Path, lines: list[str]) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("ts,key\n" + "\n".join(lines) + "\n", encoding="utf-8")
        return path

    def replay(log: Path, key: str, suffix: str = "") -> tuple[int, dict[str, object], str]:
        proc = stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic",
                         unique_name + suffix,
                         "--until", UNTIL, "--json", "--no-progress",
                         env={"STREAM_DP_KEY": key})
        return proc.returncode, json.loads(proc.stdout), proc.stderr

    original = write(tmp_path / "a" / "sales.csv", rows)
    rc, status, _ = replay(original, KEY_A)
    assert (rc, status["key"], status["budget"]) == (0, "new", "spent")
    sent = len(read_events(kafka_broker, unique_name))
    assert sent == 200

    # the same bytes under another name and folder, into another deployment: allowed, and said
    # to spend the budget again (that deployment draws its own noise)
    copy = write(tmp_path / "b" / "renamed.csv", rows)
    rc, status, _ = replay(copy, KEY_A, "-copy")
    assert (rc, status["key"], status["budget"]) == (0, "same", "spent_again")
    assert len(read_events(kafka_broker, unique_name + "-copy")) == 200

    # one event removed, under a third name: the difference would be published exactly
    changed = write(tmp_path / "c" / "sales-fixed.csv", rows[:150] + rows[151:])
    rc, status, err = replay(changed, KEY_A)
    assert rc == 3 and status["status"] == "log_differs" and status["budget"] == "refused"
    assert "REFUSED" in err and str(original) in err and KEY_A not in err
    assert len(read_events(kafka_broker, unique_name)) == sent  # nothing sent
    assert not state_path(changed, None).exists()

    # a prefix first (day 1), then the full log under another name, with another key
    prefix = write(tmp_path / "d" / "day1.csv", rows[:100])
    rc, status, _ = replay(prefix, KEY_C, "-c")
    assert (rc, status["key"]) == (0, "new")
    sent = len(read_events(kafka_broker, unique_name + "-c"))
    full = write(tmp_path / "e" / "week.csv", rows)
    rc, status, err = replay(full, KEY_C, "-c")
    assert rc == 3 and status["status"] == "log_differs" and str(prefix) in err
    assert len(read_events(kafka_broker, unique_name + "-c")) == sent

    history = ReplayHistory()  # $STREAM_DP_REPLAY_HISTORY of this test
    text = history.path.read_text()
    assert KEY_A not in text and KEY_C not in text
    assert str(copy.resolve()) in text and str(changed.resolve()) not in text


def test_one_key_replays_one_log_per_deployment(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """Issue #32: the replay history bound a key to one log for good, across deployments,
    although the noise is bound to the deployment. Now it is keyed by (key, deployment: the
    cluster's id and the events topic): into the deployment that got a log, a renamed and
    edited, a prefix, an extended and a prefixed log are refused (exit 3, nothing sent), also
    when the cluster is reached by another address; another log goes into another deployment
    (exit 0, a first content there), which then refuses the first log in turn."""
    first_topic, second_topic = unique_name, unique_name + "-second"
    for topic in (first_topic, second_topic):
        create_topic(kafka_broker, topic, partitions=1)
    rows = [f"{1704067200 + i * 0.5:.1f},item{i % 5}" for i in range(60)]

    def write(path: Path, lines: list[str]) -> Path:
        path.write_text("ts,key\n" + "\n".join(lines) + "\n", encoding="utf-8")
        return path

    def replay(log: Path, topic: str, bootstrap: str = kafka_broker
               ) -> tuple[int, dict[str, object], str]:
        proc = stream_dp("replay", str(log), "--bootstrap", bootstrap, "--topic", topic,
                         "--until", UNTIL, "--json", "--no-progress", "--restart")
        return proc.returncode, json.loads(proc.stdout), proc.stderr

    original = write(tmp_path / "sales.csv", rows)
    rc, status, _ = replay(original, first_topic)
    assert (rc, status["key"], status["budget"]) == (0, "new", "spent")
    changed = {
        "renamed+edited": write(tmp_path / "renamed.csv",
                                [*rows[:30], rows[30].replace("item", "itex"), *rows[31:]]),
        "prefix": write(tmp_path / "day1.csv", rows[:40]),
        "extended": write(tmp_path / "week.csv", [*rows, "1704067300.0,item1"]),
        "prefixed": write(tmp_path / "earlier.csv", ["1704067100.0,item1", *rows]),
    }
    port = kafka_broker.rsplit(":", 1)[1]
    from agents.commands._replay_target import cluster_id

    # the broker reached by another address reports the same cluster (not a fallback)
    assert asyncio.run(cluster_id(f"localhost:{port}")) == asyncio.run(cluster_id(kafka_broker))
    for name, log in changed.items():
        for bootstrap in (kafka_broker, f"localhost:{port}"):  # one cluster, two addresses
            rc, status, err = replay(log, first_topic, bootstrap)
            assert rc == 3 and status["status"] == "log_differs", (name, bootstrap, err)
            assert "REFUSED" in err and "into this deployment" in err
    assert len(read_events(kafka_broker, first_topic)) == len(rows)  # nothing more sent

    # another deployment (its own events topic, so its own noise): another log goes in
    rc, status, err = replay(changed["extended"], second_topic)
    assert (rc, status["key"], status["budget"]) == (0, "new", "spent"), err
    assert len(read_events(kafka_broker, second_topic)) == len(rows) + 1
    # and that deployment now refuses the first log
    rc, status, err = replay(original, second_topic)
    assert rc == 3 and status["status"] == "log_differs" and str(changed["extended"]) in err
    entries = ReplayHistory().entries(key_fingerprint(bytes.fromhex(KEY_A)))
    assert [[d["topic"] for d in e["deployments"]] for e in entries] == [
        [first_topic], [second_topic]]
    assert len({d["cluster"] for e in entries for d in e["deployments"]}) == 1
    # the same log into a third deployment, which draws its own noise: the budget is spent
    # again, and said so (it said "no_new_budget" before the history knew deployments)
    create_topic(kafka_broker, f"{first_topic}-third", partitions=2)
    rc, status, err = replay(original, f"{first_topic}-third")
    assert (rc, status["key"], status["budget"]) == (0, "same", "spent_again"), err
    assert "spent AGAIN" in err


def test_no_key_open_key_file_or_no_public_end_sends_nothing(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """Exit status 2 and one line on stderr, before anything reaches the topic."""
    create_topic(kafka_broker, unique_name, partitions=1)
    log = tmp_path / "x.csv"
    log.write_text("ts,key\n1704067200,item1\n1704067201,item2\n", encoding="utf-8")
    base = ("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name)
    open_key = tmp_path / "noise.key"
    open_key.write_text(KEY_B)
    open_key.chmod(0o644)
    cases = [
        ((*base, "--until", UNTIL), {"STREAM_DP_KEY": ""}, "no noise key"),
        ((*base, "--until", UNTIL, "--key-file", str(open_key)), {}, "chmod 600"),
        (base, {}, "--until TIME is required"),
        ((*base, "--until", "2999-01-01T00:00:00Z"), {}, "in the future"),
    ]
    for argv, env, message in cases:
        proc = stream_dp(*argv, env=env)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert KEY_B not in proc.stderr and "Traceback" not in proc.stderr
    assert read_all(kafka_broker, unique_name) == []
    assert not state_path(log, None).exists()


def test_a_log_written_to_while_it_is_replayed_binds_the_key_for_good(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """The sent records may be neither the checked content nor the final one: both contents
    are recorded under the key, which then refuses every further replay (said out loud)."""
    create_topic(kafka_broker, unique_name, partitions=1)
    log = tmp_path / "growing.csv"
    head = "ts,key\n" + "".join(f"{1704067200 + i * 0.1:.1f},item{i % 3}\n" for i in range(40))
    log.write_text(head, encoding="utf-8")
    child = subprocess.Popen(
        [sys.executable, "-m", "agents.cli", "replay", str(log), "--bootstrap", kafka_broker,
         "--topic", unique_name, "--speed", "1", "--until", UNTIL, "--no-progress"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        spath = state_path(log, None)
        for _ in range(400):  # wait until the replay has started sending
            if spath.exists():
                break
            time.sleep(0.02)
        with open(log, "a", encoding="utf-8") as fh:
            fh.write("1704067204.5,item1\n")
        _out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert "changed while it was being replayed" in err
    assert len(ReplayHistory().entries(key_fingerprint(bytes.fromhex(KEY_A)))) == 2
    for content in (head, log.read_text()):
        log.write_text(content, encoding="utf-8")
        again = stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic",
                          unique_name, "--until", UNTIL, "--restart")
        assert again.returncode == 3, again.stderr


def test_progress_markers_never_pass_until(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """#23 item 8: progress markers stop at the public end, so events after --until never
    close a tick past it; and (review F3) they sit at positions fixed by the log: the same
    markers, in the same places, paced or not."""
    create_topic(kafka_broker, unique_name, partitions=1)
    log = tmp_path / "paced.csv"
    log.write_text("ts,key\n" + "".join(f"{1704067200 + i * 0.25:.2f},item{i % 3}\n"
                                        for i in range(33)), encoding="utf-8")  # 8 s of log
    until = 1704067201.0
    stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", unique_name,
              "--speed", "2", "--until", str(until), "--marker-every", "1", "--no-progress",
              check=True)
    markers = [m.json() for m in close_markers(kafka_broker, unique_name)]
    progress = [m["time"] for m in markers if not m["final"]]
    assert progress == [until] * 8  # boundaries 1..8 s into the log, each capped at --until
    assert [m["time"] for m in markers if m["final"]] == [until]
    # unpaced, into another topic: the very same markers at the very same offsets
    other = unique_name + "-fast"
    create_topic(kafka_broker, other, partitions=1)
    stream_dp("replay", str(log), "--bootstrap", kafka_broker, "--topic", other, "--restart",
              "--until", str(until), "--marker-every", "1", "--no-progress", check=True)
    again = [m.json() for m in close_markers(kafka_broker, other)]
    assert [(m["time"], m["final"]) for m in again] == [(m["time"], m["final"]) for m in markers]
    assert [m.offset for m in close_markers(kafka_broker, other)] == [
        m.offset for m in close_markers(kafka_broker, unique_name)]
