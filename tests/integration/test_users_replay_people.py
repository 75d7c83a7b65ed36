"""`stream-dp replay` into a user-level deployment (issue #34), against the real broker and a
real worker: replay reads the deployment's settings, keys every record by the person's
identifier, so Kafka's default partitioner puts each person on the partition the worker
checks (0 ``wrong_partition`` dead letters), and the worker's per-person bound decides what is
counted (the releases equal the exact decayed counts of the *bounded* log)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agents.config.domain import load_domain
from agents.ingest.users import user_bounds
from agents.kafka.partitioner import key_partition
from stream_dp.user_level import keep_mask
from tests.integration import pipeline_support as ps
from tests.integration._users import ROOT, read_all
from tests.integration.test_pipeline_crashes import bound_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

N_TICKS = 12


def _people_log(s: Any, leaves: list[str], n: int) -> list[dict[str, Any]]:
    """Heavy-tailed people in time order: person u0 with about a third of the events (far
    beyond K), most with a handful; every leaf; ticks across period boundaries."""
    rng = np.random.default_rng(34)
    weights = 1.0 / np.arange(1, 61) ** 1.3
    who = rng.choice(60, n, p=weights / weights.sum())
    ts = np.sort(rng.uniform(s.origin, s.origin + N_TICKS * s.tick_seconds, n))
    keys = rng.integers(0, len(leaves), n)
    return [{"key": leaves[k], "ts": round(float(t), 3), "value": 1, "user": f"u{w}"}
            for w, k, t in zip(who, keys, ts, strict=True)]


def _replay(s: Any, log: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = ps.settings_env(s)  # the deployment's settings, privacy_unit = user among them
    env["STREAM_DP_KEY_FILE"] = s.key_file
    env["STREAM_DP_REPLAY_HISTORY"] = str(tmp_path / "history.json")
    env.pop("STREAM_DP_KEY", None)
    until = str(s.tick_bounds(N_TICKS)[0])
    return subprocess.run(
        [sys.executable, "-m", "agents.cli", "replay", str(log), "--until", until,
         "--topic", s.events_topic, "--bootstrap", s.bootstrap, "--no-progress", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


async def test_replayed_people_land_on_their_partition_and_are_bounded(
        kafka_broker: str, unique_name: str, tmp_path: Path) -> None:
    leaves = ps.hierarchy_paths(2, 2, 3)
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, leaves, epsilon=1e4,
                         strategy="naive", privacy_unit="user", user_period_ticks=4,
                         user_max_events=3, events_partitions=4)
    await ps.create_topics(s)
    domain = load_domain(s.domain_file)
    log = _people_log(s, leaves, 1500)
    path = tmp_path / "people.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in log), encoding="utf-8")

    proc = await asyncio.to_thread(_replay, s, path, tmp_path)
    assert proc.returncode == 0, proc.stderr

    # every record keyed by its person, on the partition murmur2 names for the person
    events = [m for m in await asyncio.to_thread(read_all, s.bootstrap, s.events_topic)
              if m.key is not None]
    assert len(events) == len(log)
    for m in events:
        person = m.json().get("user")
        assert person is not None and m.key == person.encode("utf-8"), m

        assert m.partition == key_partition(m.key, s.events_partitions)

    worker = ps.WorkerProcess(s, "w0", tmp_path).start()
    try:
        await ps.wait_for_ticks(s, domain.size, N_TICKS, timeout_s=240)
    finally:
        worker.stop()
    dead = [json.loads(r.value) for r in await ps.read_topic(s.bootstrap, s.dlq_topic)]
    assert [d for d in dead if d.get("reason") == "wrong_partition"] == []
    assert [d for d in dead if d.get("reason") == "invalid_user"] == []

    # the bound applied: the releases are the exact decayed counts of the bounded log
    bounds = user_bounds(s)
    ticks = [(e["user"], int((e["ts"] - s.origin) // s.tick_seconds) + 1, e["key"]) for e in log]
    kept = [(e["key"], e["ts"], 1.0) for e, k in zip(log, keep_mask(ticks, bounds), strict=True)
            if k]
    assert len(kept) < len(log) // 2  # u0 alone is far over K: the bound must bite
    exact = ps.exact_decayed(domain, kept, s, N_TICKS)
    unbounded = ps.exact_decayed(domain, [(e["key"], e["ts"], 1.0) for e in log], s, N_TICKS)
    got = {k: json.loads(v[0]) for k, v in (await ps.released(s)).items() if k[1] <= N_TICKS}
    bound = bound_of(s)
    for key, want in exact.items():
        msg = got[key]
        assert abs(msg["value"] - want) <= bound + 12 * msg["stderr"], (key, msg, want)
    assert "keyed by its person's identifier (field 'user')" in proc.stderr
    top = max(domain.names, key=lambda name: unbounded[(name, N_TICKS)])
    assert abs(got[(top, N_TICKS)]["value"] - unbounded[(top, N_TICKS)]) > 50


def test_a_record_without_its_person_is_counted_and_refused(tmp_path: Path,
                                                            unique_name: str) -> None:
    """A user-level replay of a log whose lines lack a valid identifier stops before anything
    is sent, with one line counting them (no broker needed: nothing connects)."""
    s = ps.make_settings("127.0.0.1:1", tmp_path, unique_name, ["a", "b"], privacy_unit="user",
                         user_period_ticks=4, user_max_events=3)
    lines = [{"key": "a", "ts": s.origin + 1, "user": "u1"},
             {"key": "a", "ts": s.origin + 2},
             {"key": "b", "ts": s.origin + 3, "user": 7},
             {"key": "b", "ts": s.origin + 4, "user": ""},
             {"key": "b", "ts": s.origin + 5, "user": "x" * 257},
             {"key": "b", "ts": s.origin + 6, "user": "u2"}]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines), encoding="utf-8")
    proc = _replay(s, path, tmp_path)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr
    assert "4 of 6 records carry no valid person identifier in the field 'user'" in err[0]
    assert "bad.jsonl:2: the person's identifier (field 'user') is missing" in err[0]
    assert "nothing was sent" in err[0]
    assert not (tmp_path / "history.json").exists() or "bad.jsonl" not in (
        tmp_path / "history.json").read_text()
    assert os.environ.get("STREAM_DP_PRIVACY_UNIT") is None  # the test's own env untouched
