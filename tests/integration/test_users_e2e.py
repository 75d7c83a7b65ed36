"""Users' path end to end with real `stream-dp worker` processes on the real broker.

simulate -> log file -> replay -> worker -> counts topic -> tail. Two fresh deployments fed the
same log with the same noise key publish bit-identical releases (DESIGN.md §2.5: a replay
reproduces, it does not spend budget again); a third with another key publishes different ones,
and replay warns about it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.config.settings import Settings
from agents.kafka.topics import ensure_topics
from stream_dp.domain import Domain
from tests.integration._users import ROOT, stream_dp
from tests.integration.pipeline_support import (
    exact_decayed,
    released,
    settings_env,
    wait_for_ticks,
)

pytestmark = pytest.mark.integration

KEY_1 = "1f8c3e72a90d4b65e17c2a9f03b8d65e4c1a7f92b30e5d86c4f1a27b9e603d58"  # 32 random bytes
KEY_2 = "2e9a4c17f3b85d06a2e1c94f7b30d8a65f2c1e84a97b3d06c5e2f18a4b7d9c03"
TICKS = 12


def _settings(bootstrap: str, tmp: Path, name: str, key_hex: str, epsilon: float) -> Settings:
    key_file = tmp / f"{name}.key"
    key_file.write_text(key_hex, encoding="utf-8")
    key_file.chmod(0o600)  # key files open to group or others are refused
    loaded = Settings.load(tmp / "stream-dp.toml", env={})  # written by `simulate --settings-out`
    return loaded.replace(
        bootstrap=bootstrap, app_id=name, worker_id=f"{name}-w0",
        events_topic=f"{name}.events", counts_topic=f"{name}.counts",
        histograms_topic=f"{name}.histograms", dlq_topic=f"{name}.dlq",
        partials_topic=f"{name}.partials", ingest_checkpoints_topic=f"{name}.ckpt.ingest",
        release_checkpoints_topic=f"{name}.ckpt.release",
        events_partitions=2, shards=2, counts_partitions=2,
        key_file=str(key_file), epsilon=epsilon, strategy="naive", horizon=255,
        allowed_lateness_s=0.5, max_future_skew_s=1e9, schedule_topic=f"{name}.schedule",
        leader_topic=f"{name}.leader",
        session_timeout_s=6.0, transaction_timeout_s=10.0, commit_interval_s=0.5,
    )


@contextlib.contextmanager
def _worker(s: Settings, log_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    asyncio.run(ensure_topics(s.bootstrap, s))
    with open(log_dir / f"{s.app_id}.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agents.cli", "worker", "--no-web"],
            env=settings_env(s), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


#: the public end of every replay here: inside tick TICKS of the simulated logs (2 s ticks from
#: the simulators' default start, 2024-01-01T00:00:00Z), fixed in advance, not the last event's
UNTIL = str(1704067200 + 2 * TICKS - 1)


def _replay(log: Path, s: Settings, *extra: str) -> subprocess.CompletedProcess[str]:
    return stream_dp("replay", str(log), "--bootstrap", s.bootstrap, "--topic", s.events_topic,
                     "--key-file", s.key_file, "--until", UNTIL, *extra, check=True)


def _run(s: Settings, log: Path, tmp: Path, n_streams: int, *extra: str) -> tuple[
        dict[tuple[str, int], list[bytes]], str]:
    with _worker(s, tmp) as proc:
        out = _replay(log, s, *extra).stderr
        got = asyncio.run(wait_for_ticks(s, n_streams, TICKS, timeout_s=120, poll_s=0.5))
        assert proc.poll() is None, (tmp / f"{s.app_id}.log").read_text()[-3000:]
    return got, out


@pytest.mark.slow  # three deployments, about 30 s
def test_same_key_replay_reproduces_releases_bit_for_bit(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    log = tmp_path / "web.csv"
    stream_dp("simulate", "searchlogs", "--seed", "11", "--ticks", str(TICKS), "--tick-seconds",
              "2", "--rate", "40", "--out", str(log), "--domain-out", str(tmp_path / "domain.toml"),
              "--settings-out", str(tmp_path / "stream-dp.toml"), check=True)
    domain = Domain.from_file(tmp_path / "domain.toml")
    n = len(domain.names)

    a = _settings(kafka_broker, tmp_path, f"{unique_name}-a", KEY_1, epsilon=1.0)
    first, out_a = _run(a, log, tmp_path, n)
    assert "first replay" in out_a

    # the same deployment from scratch: its state and output topics deleted and created anew,
    # its events and schedule topics (the log; the deployment nonce and closing points) kept
    asyncio.run(_delete_topics(a, keep=(a.events_topic, a.schedule_topic)))
    with _worker(a, tmp_path) as proc:
        second = asyncio.run(wait_for_ticks(a, n, TICKS, timeout_s=120, poll_s=0.5))
        assert proc.poll() is None
    # replay says what the same key on the same log means in another deployment (a throwaway
    # topic: its own noise, so new releases and the budget spent again)
    b = _settings(kafka_broker, tmp_path, f"{unique_name}-b", KEY_1, epsilon=1.0)
    asyncio.run(ensure_topics(b.bootstrap, b))
    out_b = _replay(log, b, "--restart").stderr
    assert "same noise key" in out_b and "another deployment" in out_b
    assert "spent AGAIN" in out_b

    keys = [(name, t) for name in domain.names for t in range(1, TICKS + 1)]
    for k in keys:
        assert len(set(first[k])) == 1 and len(set(second[k])) == 1  # duplicates identical
        assert first[k][0] == second[k][0], k  # the very same bytes: value, stderr, everything

    # the releases are noisy decayed counts of this log (not, say, all zeros)
    events = [(r["key"], float(r["ts"]), float(r["value"])) for r in _csv_rows(log)]
    exact = exact_decayed(domain, events, a, TICKS)
    values = {k: json.loads(first[k][0])["value"] for k in keys}
    assert sum(exact.values()) > 100
    assert values != exact

    # another key: other releases, and replay says the budget is spent again
    c = _settings(kafka_broker, tmp_path, f"{unique_name}-c", KEY_2, epsilon=1.0)
    third, out_c = _run(c, log, tmp_path, n, "--restart")
    assert "WARNING" in out_c and "spent AGAIN" in out_c
    differ = sum(json.loads(third[k][0])["value"] != values[k] for k in keys)
    assert differ > 0.9 * len(keys)

    # tail reads the released counts back, filtered by prefix and tick
    tail = stream_dp("tail", "counts", "--bootstrap", kafka_broker, "--topic", a.counts_topic,
                     "--from-tick", str(TICKS), "--prefix", "www/", "--json", "--timeout", "3",
                     check=True)
    lines = [json.loads(x) for x in tail.stdout.splitlines()]
    www = [name for name in domain.names if name.startswith("www/")]
    assert sorted(m["stream"] for m in lines if m["tick"] == TICKS) == sorted(www)
    assert all(m["tick"] >= TICKS and m["stream"].startswith("www/") for m in lines)
    for m in lines:
        if m["tick"] == TICKS:
            assert json.dumps(m, separators=(",", ":")).encode() == first[(m["stream"], TICKS)][0] \
                or m == json.loads(first[(m["stream"], TICKS)][0])


async def _delete_topics(s: Settings, keep: tuple[str, ...] = ()) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    from agents.kafka.topics import topic_specs

    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap)
    await admin.start()
    try:
        names = [t.name for t in topic_specs(s) if t.name not in keep]
        existing = set(await admin.list_topics())
        await admin.delete_topics([n for n in names if n in existing])
        for _ in range(100):
            if not set(await admin.list_topics()) & set(names):
                return
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


def _csv_rows(path: Path) -> list[dict[str, Any]]:
    import csv

    with open(path, encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_released_with_huge_epsilon_equal_the_simulators_truth(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """simulate -> replay -> worker: with ε = 10⁴ the releases are the simulator's exact counts."""
    log = tmp_path / "sales.jsonl"
    stream_dp("simulate", "restaurant", "--seed", "4", "--ticks", str(TICKS), "--tick-seconds",
              "2", "--out", str(log), "--domain-out", str(tmp_path / "domain.toml"),
              "--settings-out", str(tmp_path / "stream-dp.toml"), check=True)
    domain = Domain.from_file(tmp_path / "domain.toml")
    s = _settings(kafka_broker, tmp_path, f"{unique_name}-x", KEY_1, epsilon=1e4)
    got, _ = _run(s, log, tmp_path, len(domain.names))

    from simulators.base import TimeAxis
    from simulators.restaurant import CONSTRAINTS, RestaurantSales

    sim = RestaurantSales(TimeAxis(TICKS, 2.0), seed=4)
    truth = list(sim.tick_counts())
    for i, name in enumerate(domain.names):
        acc = 0.0
        for t in range(1, TICKS + 1):
            acc = s.p * acc + float(truth[t - 1][i])
            value = json.loads(got[(name, t)][0])["value"]
            assert abs(value - acc) < 5e-3, (name, t, value, acc)  # noise sd ≈ 3e-4
    # the package constraints hold for the released decayed values too (linear, exact here)
    for t in range(1, TICKS + 1):
        v = [json.loads(got[(name, t)][0])["value"] for name in domain.names]
        assert all(abs(sum(c * x for c, x in zip(row, v, strict=True))) < 1e-2 for row in CONSTRAINTS)
    assert len(asyncio.run(released(s))) >= len(domain.names) * TICKS


@pytest.mark.slow  # two deployments, about 20 s
def test_replay_speed_and_worker_start_order_do_not_change_releases(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """P2 for replays: as fast as possible into a running worker, or paced (--speed, progress
    markers) into a worker started afterwards: the same counts (review F3: progress markers at
    positions fixed by the log, not by the wall clock)."""
    log = tmp_path / "web.csv"
    stream_dp("simulate", "searchlogs", "--seed", "5", "--ticks", str(TICKS), "--tick-seconds",
              "2", "--rate", "30", "--out", str(log), "--domain-out", str(tmp_path / "domain.toml"),
              "--settings-out", str(tmp_path / "stream-dp.toml"), check=True)
    n = len(Domain.from_file(tmp_path / "domain.toml").names)
    # two deployments draw their own noise (docs/privacy.md, "Threat model"): compare what they
    # count, at ε = 10^4 (noise below 10^-3), not their bytes
    a = _settings(kafka_broker, tmp_path, f"{unique_name}-fast", KEY_1, epsilon=1e4)
    fast, _ = _run(a, log, tmp_path, n, "--marker-every", "2")
    b = _settings(kafka_broker, tmp_path, f"{unique_name}-paced", KEY_1, epsilon=1e4)
    asyncio.run(ensure_topics(b.bootstrap, b))
    out = _replay(log, b, "--restart", "--speed", "8", "--json", "--no-progress",
                  "--marker-every", "2").stdout
    status = json.loads(out)
    assert status["status"] == "replayed" and status["key"] == "same"
    from tests.integration._users import close_markers

    markers = [m.json() for m in close_markers(kafka_broker, b.events_topic)]
    assert sum(not m["final"] for m in markers) >= 2  # progress markers (one per second)
    assert sum(m["final"] for m in markers) == b.events_partitions
    with _worker(b, tmp_path) as proc:  # started after the replay
        paced = asyncio.run(wait_for_ticks(b, n, TICKS, timeout_s=120, poll_s=0.5))
        assert proc.poll() is None
    keys = [k for k in fast if k[1] <= TICKS]
    assert len(keys) == n * TICKS
    vf = {k: json.loads(fast[k][0])["value"] for k in keys}
    vp = {k: json.loads(paced[k][0])["value"] for k in keys}
    assert all(abs(vf[k] - vp[k]) < 0.01 for k in keys)
    assert any(vf[k] != vp[k] for k in keys)  # and their noise is their own


@pytest.mark.slow  # one deployment, about 30 s
def test_a_second_copy_of_a_replayed_log_is_refused_or_dead_lettered_never_silent(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """Issue #24: replaying a log again into the same markers deployment said "bit for bit"
    (or, under another key, "budget spent AGAIN") while the worker ignored every event, with
    no release, no dead letter and no log line. Now `replay` refuses that target up front (exit
    2, one line: the topic ends with an earlier final marker), and a copy that reaches the
    topic anyway (another producer) goes to the dead-letter topic as `tick_closed`, counted in
    a rate-limited warning that names why (an operator-only line, with metrics_event_counts = 1);
    the releases do not change."""
    from tests.integration._users import close_markers
    from tests.integration.pipeline_support import event_bytes, produce_raw, read_topic

    log = tmp_path / "web.csv"
    stream_dp("simulate", "searchlogs", "--seed", "7", "--ticks", str(TICKS), "--tick-seconds",
              "2", "--rate", "20", "--out", str(log), "--domain-out", str(tmp_path / "domain.toml"),
              "--settings-out", str(tmp_path / "stream-dp.toml"), check=True)
    n = len(Domain.from_file(tmp_path / "domain.toml").names)
    rows = _csv_rows(log)
    s = _settings(kafka_broker, tmp_path, unique_name, KEY_1, epsilon=1.0)
    with _worker(s, tmp_path) as proc:
        _replay(log, s)
        first = asyncio.run(wait_for_ticks(s, n, TICKS, timeout_s=120, poll_s=0.5))
        sent = len(asyncio.run(read_topic(s.bootstrap, s.events_topic)))
        again = stream_dp("replay", str(log), "--bootstrap", s.bootstrap, "--topic",
                          s.events_topic, "--key-file", s.key_file, "--until", UNTIL,
                          "--restart")
        assert again.returncode == 2, again.stdout + again.stderr
        lines = [x for x in again.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and "already holds the final close marker" in lines[0]
        assert "tick_closed" in lines[0] and "fresh deployment" in lines[0]
        assert len(asyncio.run(read_topic(s.bootstrap, s.events_topic))) == sent  # nothing sent

    # while the worker is stopped, another producer writes the same events, then copies of the
    # final markers: on restart each partition's fetch ends with a marker that closes nothing
    # (such a batch was never committed, so the copy vanished without a trace)
    copies = [(k, v, None, []) for k, v in (
        event_bytes(r["key"], float(r["ts"]), float(r.get("value") or 1.0)) for r in rows)]
    finals = [m for m in close_markers(s.bootstrap, s.events_topic) if m.json()["final"]]
    assert len(finals) == s.events_partitions
    asyncio.run(produce_raw(s, [*copies, *((None, m.value, m.partition, list(m.headers))
                                           for m in finals)]))
    # the warning line is operator-only (it moves with one late record): shown with
    # metrics_event_counts = 1, like the event counters
    with _worker(s.replace(metrics_event_counts=1), tmp_path) as proc:
        worker_log = tmp_path / f"{s.app_id}.log"
        deadline = time.monotonic() + 90
        while True:
            dead = asyncio.run(read_topic(s.bootstrap, s.dlq_topic))
            if len(dead) >= len(rows):
                break
            assert proc.poll() is None, worker_log.read_text()[-3000:]
            assert time.monotonic() < deadline, (len(dead), worker_log.read_text()[-3000:])
            time.sleep(0.5)
        after = asyncio.run(released(s))
    assert sorted(json.loads(d.value)["reason"] for d in dead) == ["tick_closed"] * len(rows)
    warnings = [json.loads(x)["msg"] for x in worker_log.read_text().splitlines()
                if "events for ticks already closed" in x]
    assert warnings and len(warnings) <= 4, warnings  # rate-limited: 3, then 1 per 10 s
    assert "replayed again into this markers deployment" in warnings[0]
    assert f"went to {s.dlq_topic} as tick_closed" in warnings[0]
    assert {k: v[0] for k, v in after.items()} == {k: v[0] for k, v in first.items()}


def test_a_forged_final_marker_does_not_stop_a_genuine_replay(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """Issue #32: a writer of a markers deployment's events topic appends, before the genuine
    replay, one record per partition that looks like a final close marker closing the whole
    log: one signed with another noise key (a real marker of another deployment), one with a
    MAC of zeros. The worker dead-letters both (`forged_marker`); `stream-dp replay` used to
    refuse the genuine replay up front (exit 2, nothing sent, no tick ever released). A marker
    that does not verify under the replay's key decides nothing (DESIGN.md §2 rule 7): the
    replay goes on (exit 0, one note), every tick is released, and the only dead letters are
    the two forgeries."""
    from agents.kafka.codec import CLOSE_HEADER, close_marker, marker_key
    from tests.integration.pipeline_support import produce_raw, read_topic

    log = tmp_path / "web.csv"
    stream_dp("simulate", "searchlogs", "--seed", "5", "--ticks", str(TICKS), "--tick-seconds",
              "2", "--rate", "10", "--out", str(log), "--domain-out", str(tmp_path / "domain.toml"),
              "--settings-out", str(tmp_path / "stream-dp.toml"), check=True)
    n = len(Domain.from_file(tmp_path / "domain.toml").names)
    s = _settings(kafka_broker, tmp_path, unique_name, KEY_1, epsilon=1.0)
    asyncio.run(ensure_topics(s.bootstrap, s))
    closes_all = float(UNTIL)  # at least as late as every event of the log
    _, other = close_marker(closes_all, True, mac_key=marker_key(bytes.fromhex(KEY_2)),
                            topic=s.events_topic, partition=0)
    _, genuine_shape = close_marker(closes_all, True, mac_key=marker_key(b"x" * 32),
                                    topic=s.events_topic, partition=1)
    doc = json.loads(genuine_shape)
    zeros = json.dumps({**doc, "mac": "0" * len(doc["mac"])}).encode()
    header = [(CLOSE_HEADER, b"1")]
    asyncio.run(produce_raw(s, [(None, other, 0, header), (None, zeros, 1, header)]))

    with _worker(s, tmp_path) as proc:
        replayed = stream_dp("replay", str(log), "--bootstrap", s.bootstrap, "--topic",
                             s.events_topic, "--key-file", s.key_file, "--until", UNTIL)
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        assert "already holds the final close marker" not in replayed.stderr
        notes = [x for x in replayed.stderr.splitlines() if "does not verify" in x]
        assert len(notes) == 1 and "decides nothing" in notes[0], replayed.stderr
        assert "first replay" in replayed.stderr
        got = asyncio.run(wait_for_ticks(s, n, TICKS, timeout_s=120, poll_s=0.5))
        assert proc.poll() is None, (tmp_path / f"{s.app_id}.log").read_text()[-3000:]
        dead = asyncio.run(read_topic(s.bootstrap, s.dlq_topic))
    assert sum(1 for (_, t) in got if t <= TICKS) == n * TICKS
    assert sorted(json.loads(d.value)["reason"] for d in dead) == ["forged_marker"] * 2
