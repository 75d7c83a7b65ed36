"""A binary-attribute domain through the whole service on the real (embedded) broker.

`stream-dp simulate attributes` → `stream-dp replay` (close markers) → `stream-dp worker`
(ingest, release, reconcile) → dp.tables.v1 on the counts topic and dp.marginals.v1 on the
histograms topic → `stream-dp tail marginals --query`. Oracle: the library's LiveMarginals fed
the same events with the same key and description gives bit-identical tables at every tick.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from agents.config.domain import load_domain
from agents.config.settings import Settings
from agents.kafka.codec import validate
from agents.kafka.topics import ensure_topics
from agents.release.attributes import new_live
from simulators.logfile import read_log
from tests.integration.pipeline_support import KEY_HEX, read_topic, settings_env

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TICKS = 12


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    # a hang guard, not a timing check: the burst test's replay of 650 000 events took over
    # 300 s on a shared 2-core machine while other suites ran (about 2 min alone)
    return subprocess.run([sys.executable, "-m", "agents.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("m", [10, 64])
async def test_attribute_tables_through_the_worker_match_the_library(
    kafka_broker: str, unique_name: str, tmp_path: Path, m: int
) -> None:
    """``m = 64``: events with the last attribute set (a pattern of 64 bits) used to become
    negative int64 patterns; their partials were refused and no tick was released."""
    log, dom_file = tmp_path / "events.jsonl", tmp_path / "domain.toml"
    sim = _cli("simulate", "attributes", "--attributes", str(m), "--ticks", str(TICKS),
               "--rate", "60", "--tick-seconds", "10", "--seed", "4", "--out", str(log),
               "--domain-out", str(dom_file), "--settings-out", str(tmp_path / "s.toml"))
    assert sim.returncode == 0, sim.stderr
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)  # key files open to group or others are refused
    n = unique_name
    s = Settings.load(tmp_path / "s.toml", env={}).replace(
        bootstrap=kafka_broker, app_id=n, worker_id="w0", events_topic=f"{n}.events",
        counts_topic=f"{n}.counts", histograms_topic=f"{n}.histograms", dlq_topic=f"{n}.dlq",
        partials_topic=f"{n}.partials", ingest_checkpoints_topic=f"{n}.ckpt.ingest",
        release_checkpoints_topic=f"{n}.ckpt.release", schedule_topic=f"{n}.schedule",
        leader_topic=f"{n}.leader", events_partitions=2, counts_partitions=2,
        key_file=str(tmp_path / "key"), allowed_lateness_s=0.5, max_future_skew_s=1e9,
        epsilon=2.0, attribute_epoch_ticks=5, attribute_max_cluster=3,
        session_timeout_s=6.0, transaction_timeout_s=10.0, commit_interval_s=0.5,
        web_port=0,
    )
    await ensure_topics(kafka_broker, s)
    rep = _cli("replay", str(log), "--bootstrap", kafka_broker, "--topic", s.events_topic,
               "--no-progress", "--key-file", str(tmp_path / "key"),
               "--until", str(1704067200 + 10 * TICKS - 1))  # public end: inside tick TICKS
    assert rep.returncode == 0, rep.stderr
    worker_log = open(tmp_path / "worker.log", "ab")  # noqa: SIM115 - owned by the child
    env = settings_env(s)
    worker = subprocess.Popen([sys.executable, "-m", "agents.cli", "worker"], env=env, cwd=ROOT,
                              stdout=worker_log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    worker_log.close()
    try:
        marginals: dict[int, dict[str, object]] = {}
        for _ in range(600):
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            recs = await read_topic(kafka_broker, s.histograms_topic)
            marginals = {json.loads(r.value)["tick"]: json.loads(r.value) for r in recs}
            if TICKS in marginals:
                break
            await asyncio.sleep(0.5)
        else:
            pytest.fail("no consistent tables for the last tick: "
                        + (tmp_path / "worker.log").read_text()[-3000:])
        tables = [json.loads(r.value) for r in await read_topic(kafka_broker, s.counts_topic)]
        answer = _cli("tail", "marginals", "--bootstrap", kafka_broker, "--topic",
                      s.histograms_topic, "--from-tick", str(TICKS), "--max-messages", "1",
                      "--query", "a0,a3", "--query", "1,2,5", "--json")
    finally:
        os.kill(worker.pid, signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
    assert worker.returncode == 0, (tmp_path / "worker.log").read_text()[-3000:]

    # every tick released once per table, keyed so a tick's tables stay in order in one partition
    by_tick: dict[int, list[dict[str, object]]] = {}
    for t in tables:
        validate("dp.tables.v1", t)
        by_tick.setdefault(int(t["tick"]), []).append(t)  # type: ignore[call-overload]
    assert sorted(by_tick) == list(range(1, TICKS + 1))
    # oracle: the library object, fed the log's events tick by tick with the deployment's key
    dom = load_domain(dom_file)
    from agents.kafka.nonce import adopt_nonce  # the deployment's nonce, from its schedule topic

    nonce = await adopt_nonce(s, str(dom.digest()), s.noise_key(), {})
    live = new_live(s, dom, s.noise_key(), nonce)
    events = [r.event for r in read_log(log)]
    ticks = np.array([math.floor((e.ts - s.origin) / s.tick_seconds) + 1 for e in events])
    pats = np.array([dom.pattern(e.attrs) for e in events], dtype=np.uint64)
    for t in range(1, TICKS + 1):
        u, c = np.unique(pats[ticks == t], return_counts=True)
        lt = live.step(u, c.astype(np.float64))
        got = sorted(by_tick[t], key=lambda r: r["table"])  # type: ignore[arg-type, return-value]
        assert [tuple(r["attributes"]) for r in got] == list(lt.tables)  # type: ignore[arg-type]
        for r, v in zip(got, lt.values, strict=True):
            assert np.array_equal(np.array(r["cells"]), v), t
        assert got[0]["epoch"] == (t - 1) // 5
    # structure re-decided at ticks 5 and 10, its bootstrap reported once per epoch
    assert [t for t in by_tick if by_tick[t][0]["bootstrap"] or any(
        r["bootstrap"] for r in by_tick[t])] == [5, 10]
    # reconcile: every tick, consistent, schema-valid
    assert set(marginals) >= set(range(1, TICKS + 1))
    last = marginals[TICKS]
    validate("dp.marginals.v1", last)
    totals = [sum(tb["cells"]) for tb in last["tables"]]  # type: ignore[union-attr, attr-defined]
    assert max(totals) - min(totals) < 1e-6 * max(1.0, abs(totals[0]))
    # the query helper through tail: 2^α cells each, summing to the consistent total
    assert answer.returncode == 0, answer.stderr
    got = json.loads(answer.stdout.strip().splitlines()[-1])
    assert got["tick"] == TICKS and [len(a["counts"]) for a in got["answers"]] == [4, 8]
    for a in got["answers"]:
        assert sum(a["counts"]) == pytest.approx(last["total"], rel=1e-6)


#: Issue 37: more events in one cell of one tick than the tree-ls banks ``auto`` used to run
#: hold (5.24·10⁵ at p = 1, ε_t ≈ 10⁴), with max_events_per_tick = 6·10⁵ above that range
BURST, BOUND = 650_000, 600_000


async def test_a_burst_past_the_range_in_one_cell_is_clipped_and_releases_go_on(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """Real broker, real worker: 650,000 events of one pattern in tick 2. The banks run a
    strategy whose range covers max_events_per_tick (6·10⁵), the cell is clipped to it, every
    tick is released, and every table equals the library's (the same clip) bit for bit — so
    every other cell is exactly what it would be without the burst's excess. Before: the banks
    ran tree-ls (range 5.24·10⁵), the release stage raised at tick 2 and nothing more came."""
    ticks = 6
    sim = _cli("simulate", "attributes", "--attributes", "3", "--ticks", str(ticks),
               "--rate", "20", "--tick-seconds", "10", "--seed", "5",
               "--out", str(tmp_path / "base.jsonl"), "--domain-out", str(tmp_path / "d.toml"),
               "--settings-out", str(tmp_path / "s.toml"))
    assert sim.returncode == 0, sim.stderr
    origin = 1704067200
    base = (tmp_path / "base.jsonl").read_text().splitlines()
    burst_line = '{"ts": %.3f, "attrs": "101"}'
    lines = [ln for ln in base if json.loads(ln)["ts"] < origin + 10]
    lines += [burst_line % (origin + 10 + 4 * i / BURST) for i in range(BURST)]
    lines += [ln for ln in base if json.loads(ln)["ts"] >= origin + 10]
    log = tmp_path / "events.jsonl"
    log.write_text("\n".join(lines) + "\n")
    (tmp_path / "key").write_text(KEY_HEX)
    (tmp_path / "key").chmod(0o600)
    n = unique_name
    s = Settings.load(tmp_path / "s.toml", env={}).replace(
        bootstrap=kafka_broker, app_id=n, worker_id="w0", events_topic=f"{n}.events",
        counts_topic=f"{n}.counts", histograms_topic=f"{n}.histograms", dlq_topic=f"{n}.dlq",
        partials_topic=f"{n}.partials", ingest_checkpoints_topic=f"{n}.ckpt.ingest",
        release_checkpoints_topic=f"{n}.ckpt.release", schedule_topic=f"{n}.schedule",
        leader_topic=f"{n}.leader", events_partitions=1, counts_partitions=1,
        key_file=str(tmp_path / "key"), allowed_lateness_s=0.5, max_future_skew_s=1e9,
        p=1.0, epsilon=1e4, attribute_bootstrap_fraction=1e-4, attribute_epoch_ticks=4,
        max_events_per_tick=BOUND, session_timeout_s=6.0, transaction_timeout_s=10.0,
        commit_interval_s=0.5, web_port=0,
    )
    await ensure_topics(kafka_broker, s)
    rep = _cli("replay", str(log), "--bootstrap", kafka_broker, "--topic", s.events_topic,
               "--no-progress", "--key-file", str(tmp_path / "key"),
               "--until", str(origin + 10 * ticks - 1))
    assert rep.returncode == 0, rep.stderr
    worker_log = open(tmp_path / "worker.log", "ab")  # noqa: SIM115 - owned by the child
    worker = subprocess.Popen([sys.executable, "-m", "agents.cli", "worker", "--no-web"],
                              env=settings_env(s), cwd=ROOT, stdout=worker_log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    worker_log.close()
    try:
        by_tick: dict[int, list[dict[str, object]]] = {}
        for _ in range(1200):
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            by_tick = {}
            for r in await read_topic(kafka_broker, s.counts_topic):
                rec = json.loads(r.value)
                by_tick.setdefault(int(rec["tick"]), []).append(rec)
            if ticks in by_tick:
                break
            await asyncio.sleep(0.5)
        else:
            pytest.fail("tick 6 was never released: "
                        + (tmp_path / "worker.log").read_text()[-3000:])
    finally:
        if worker.poll() is None:  # it may have stopped by itself (the bug this catches)
            os.kill(worker.pid, signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
    text = (tmp_path / "worker.log").read_text()
    assert worker.returncode == 0, text[-3000:]
    assert sorted(by_tick) == list(range(1, ticks + 1))  # every tick, the burst's included
    start = next(json.loads(ln) for ln in text.splitlines()
                 if ln.startswith("{") and json.loads(ln).get("msg") == "worker started")
    acc = start["privacy"]
    assert acc["cell_clip_events_per_tick"] == BOUND and acc["first_epoch_strategy"] != "tree-ls"
    assert Fraction(acc["spent_per_event_exact"]) <= Fraction(1e4)
    # oracle: the library fed the same events, unclipped: it clips the same way
    dom = load_domain(tmp_path / "d.toml")
    from agents.kafka.nonce import adopt_nonce

    nonce = await adopt_nonce(s, str(dom.digest()), s.noise_key(), {})
    live = new_live(s, dom, s.noise_key(), nonce)
    events = [json.loads(ln) for ln in lines]
    tick_of = np.array([math.floor((e["ts"] - origin) / 10) + 1 for e in events])
    pats = np.array([dom.pattern(e["attrs"]) for e in events], dtype=np.uint64)
    for t in range(1, ticks + 1):
        u, c = np.unique(pats[tick_of == t], return_counts=True)
        lt = live.step(u, c.astype(np.float64))
        got = sorted(by_tick[t], key=lambda r: r["table"])  # type: ignore[arg-type, return-value]
        for r, v in zip(got, lt.values, strict=True):
            assert np.array_equal(np.array(r["cells"]), v), t
        if t == 2:  # the burst's cell reads the bound, not the burst
            cell = int("101", 2)
            assert abs(float(got[0]["cells"][cell]) - BOUND) < 100  # type: ignore[index]
