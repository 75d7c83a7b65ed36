"""The default log lines do not move with a raw count (DESIGN.md §2, rules 6 and 7).

The companion of ``test_metrics_neighbours.py`` for the worker's default log (JSON lines on
stderr: the worker, its pipeline, reconcile side agent and web server/dashboard). Two real
``stream-dp worker`` processes read two neighbouring logs — the second holds one record more:
an event that lifts one stream to the clip limit, a forged close marker, or a malformed
record — release every tick, stop, and are started again (restoring from their checkpoints,
which is when a worker says the most about its state). Their two logs, taken as multisets of
lines, must be equal apart from time-based fields (``ts``, durations, the web server's port)
and the reconcile diagnostics computed from the noisy releases. Their default ``/metrics``
after the first run are compared as in ``test_metrics_neighbours.py`` (which adds only the
clipping event), for these other neighbours too.

Found by the issue #32 review: the ingest stage's restore line printed the events partition's
offset and the ingest checkpoint's sequence number (``ingest partition 0 restored (checkpoint
seq 3, offset 5)``): with one declared stream, two restarts' offsets differ by exactly that
stream's raw count (the exported ``stream_dp_consumer_lag_messages`` is operator-only for the
same reason), and the sequence number counts ingest commits, which follow the arrival of
records (``stream_dp_ingest_checkpoint_seconds`` is operator-only for that reason).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from agents.config.settings import Settings
from agents.kafka.embedded_broker import free_port
from agents.kafka.processes import dying_with_parent
from tests.integration.pipeline_support import (
    ROOT,
    close_ticks,
    create_topics,
    event_bytes,
    make_settings,
    produce,
    settings_env,
)
from tests.integration.test_metrics_neighbours import (
    CLIP_EVENTS,
    LAST_TICK,
    LEAVES,
    _done,
    _http,
)
from tests.integration.test_metrics_neighbours import _normalised as _metrics_normalised

pytestmark = pytest.mark.integration

#: fields of a JSON log line that are time-based, or post-processing of the noisy releases
_DROPPED = {"ts", "url", "metrics", "solve_seconds", "residual", "iterations", "pid"}
_DURATION = re.compile(r"\bin \d+(\.\d+)? s\b")


async def _produce_extra(s: Settings, kind: str) -> None:
    """The added record of the neighbouring log (before the final markers)."""
    from aiokafka import AIOKafkaProducer

    from agents.kafka.codec import CLOSE_HEADER, CLOSE_SCHEMA

    t1 = s.tick_bounds(1)[0]
    prod = AIOKafkaProducer(bootstrap_servers=s.bootstrap)
    await prod.start()
    try:
        if kind == "clipped":
            await prod.send_and_wait(s.events_topic, event_bytes("a/x", t1 + 0.2)[1],
                                     key=b"a/x", partition=0)
        elif kind == "forged_marker":
            forged = json.dumps({"schema": CLOSE_SCHEMA, "time": t1 + 1.0, "final": True,
                                 "mac": "0" * 64}).encode()
            await prod.send_and_wait(s.events_topic, forged, partition=0,
                                     headers=[(CLOSE_HEADER, b"1")])
        else:
            await prod.send_and_wait(s.events_topic, b"{not json", partition=0)
    finally:
        await prod.stop()


def _normalised(log: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for line in log.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            out[line] += 1
            continue
        if not isinstance(doc, dict):
            out[line] += 1
            continue
        doc = {k: v for k, v in doc.items() if k not in _DROPPED}
        if isinstance(doc.get("msg"), str):
            doc["msg"] = _DURATION.sub("in T s", doc["msg"])
        out[json.dumps(doc, sort_keys=True)] += 1
    return out


def _restarted(text: str) -> bool:
    """The second run restored both stages and its reconcile agent resumed (nothing is left
    to release: its release counters stay at 0)."""
    second = text.split('"msg": "worker started"', 2)[-1] if text.count(
        '"msg": "worker started"') >= 2 else ""
    return ("ingest partition 0 restored" in second or "ingest partition" in second) and \
        "release partition 0 restored" in second and "reconcile leader resuming" in second


def _run_until_done(s: Settings, log: Path, first: bool) -> str:
    """One ``stream-dp worker`` run (appending to ``log``): the first until every tick and
    histogram is out, the second until it restored its state; then a graceful stop. Returns
    the last /metrics exposition scraped before the stop."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(dying_with_parent([sys.executable, "-m", "agents.cli", "worker"]),
                                env=settings_env(s), cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (_done(_http(f"http://127.0.0.1:{s.web_port}/metrics")) if first
                   else _restarted(log.read_text())):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        time.sleep(1.0)  # anything still on its way
        return _http(f"http://127.0.0.1:{s.web_port}/metrics")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("kind", ["clipped", "forged_marker", "malformed"])
def test_default_logs_are_the_same_for_neighbouring_logs_across_a_restart(
        kafka_broker: str, tmp_path: Path, unique_name: str, kind: str) -> None:
    logs: dict[bool, Path] = {}
    metrics: dict[bool, list[str]] = {}
    for extra in (False, True):
        name = f"{unique_name}-{int(extra)}"
        (tmp_path / name).mkdir()
        s = make_settings(kafka_broker, tmp_path / name, name, LEAVES, events_partitions=1,
                          shards=1, counts_partitions=1, cap=1.0,
                          max_events_per_tick=CLIP_EVENTS, web_port=free_port())
        asyncio.run(create_topics(s))
        t1, t2 = s.tick_bounds(1)[0], s.tick_bounds(2)[0]
        asyncio.run(produce(s, [event_bytes("a/x", t1 + 0.1), event_bytes("a/y", t2 + 0.1)]))
        if extra:
            asyncio.run(_produce_extra(s, kind))
        asyncio.run(close_ticks(s, LAST_TICK))
        logs[extra] = tmp_path / f"worker-{int(extra)}.log"
        for first in (True, False):  # a first run, then a restart from the checkpoints
            scraped = _run_until_done(s, logs[extra], first)
            if first:  # the default /metrics too, for these neighbours (dead letters)
                metrics[extra] = _metrics_normalised(scraped)
    base = _normalised(logs[False].read_text())
    neighbour = _normalised(logs[True].read_text())
    assert any("restored" in line for line in base)
    assert base == neighbour, "\n".join(sorted((base - neighbour) + (neighbour - base)))
    assert metrics[False] and metrics[False] == metrics[True], "\n".join(
        sorted(set(metrics[False]).symmetric_difference(metrics[True])))
