"""Helpers for the pipeline integration tests (tests/integration/test_pipeline_*.py).

Settings with per-test topic names, an events producer, a read-to-end consumer, the offline
exact decayed-count oracle, and worker subprocesses (``python -m agents.worker.pipeline``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agents.config.settings import Settings
from agents.kafka.topics import ensure_topics

ROOT = Path(__file__).resolve().parents[2]
KEY_HEX = "8d3a61f0c47e25b9a1e6d0937f4c28b5e0a9173dc62f8b4e5d17a0c39b6e2f84"  # 32 random bytes


def hierarchy_paths(a: int, b: int, c: int) -> list[str]:
    """Leaf paths of a 3-level hierarchy with a*b*c leaves (plus internal nodes and a root)."""
    return [f"r{i}/s{j}/l{k}" for i in range(a) for j in range(b) for k in range(c)]


def write_domain(path: Path, paths: Sequence[str], extra_flat: Sequence[str] = ()) -> Path:
    lines = ['name = "test"', 'kind = "hierarchy"', 'root = "all"',
             "paths = [" + ", ".join(json.dumps(p) for p in paths) + "]"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_settings(bootstrap: str, tmp: Path, name: str, paths: Sequence[str], **kw: Any) -> Settings:
    domain = write_domain(tmp / "domain.toml", paths)
    key_file = tmp / "key.hex"
    key_file.write_text(KEY_HEX, encoding="utf-8")
    key_file.chmod(0o600)  # key files open to group or others are refused
    base: dict[str, Any] = {
        "bootstrap": bootstrap,
        "app_id": name,
        "worker_id": "w0",
        "events_topic": f"{name}.events",
        "counts_topic": f"{name}.counts",
        "histograms_topic": f"{name}.histograms",
        "dlq_topic": f"{name}.dlq",
        "partials_topic": f"{name}.partials",
        "ingest_checkpoints_topic": f"{name}.ckpt.ingest",
        "release_checkpoints_topic": f"{name}.ckpt.release",
        "schedule_topic": f"{name}.schedule",
        "leader_topic": f"{name}.leader",
        # a pre-produced historical log: ticks close at the close markers (close_ticks below)
        "schedule": "markers",
        "events_partitions": 4,
        "shards": 3,
        "counts_partitions": 2,
        "domain_file": str(domain),
        "key_file": str(key_file),
        "tick_seconds": 2.0,
        "origin": 1_700_000_000.0,
        "allowed_lateness_s": 0.5,
        "max_future_skew_s": 1e9,
        "p": 0.9,
        "strategy": "naive",
        "horizon": 255,
        "epsilon": 1.0,
        "session_timeout_s": 6.0,
        "transaction_timeout_s": 10.0,
        "commit_interval_s": 0.5,
    }
    base.update(kw)
    return Settings(**base)


def settings_env(s: Settings) -> dict[str, str]:
    """The environment that makes ``Settings.load()`` in a subprocess return ``s``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    for name in Settings.__dataclass_fields__:
        env["STREAM_DP_" + name.upper()] = str(getattr(s, name))
    env["PYTHONUNBUFFERED"] = "1"
    return env


async def create_topics(s: Settings) -> None:
    await ensure_topics(s.bootstrap, s)


async def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    """One plain topic (replication 1) on the test broker."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


async def produce(s: Settings, messages: Iterable[tuple[bytes | None, bytes | None]]) -> int:
    """Produce ``(key, value)`` messages to the events topic (default partitioner by key)."""
    from aiokafka import AIOKafkaProducer

    prod = AIOKafkaProducer(bootstrap_servers=s.bootstrap, linger_ms=20, max_batch_size=1 << 20,
                            max_request_size=1 << 22)
    await prod.start()
    n = 0
    try:
        for key, value in messages:
            await prod.send(s.events_topic, value, key=key)
            n += 1
        await prod.flush()
    finally:
        await prod.stop()
    return n


async def produce_raw(s: Settings, items: Sequence[tuple[bytes | None, bytes, Any, list[Any]]]
                      ) -> None:
    """``(key, value, partition or None, headers)`` to the events topic, in order."""
    from aiokafka import AIOKafkaProducer

    prod = AIOKafkaProducer(bootstrap_servers=s.bootstrap, linger_ms=2)
    await prod.start()
    try:
        for key, value, part, headers in items:
            await prod.send(s.events_topic, value, key=key, partition=part, headers=headers)
        await prod.flush()
    finally:
        await prod.stop()


async def close_ticks(s: Settings, through_tick: int) -> None:
    """Write a final close marker for ``through_tick`` into every events partition (what
    ``stream-dp replay`` does at the end of a log; markers schedule)."""
    from aiokafka import AIOKafkaProducer

    from agents.kafka.codec import close_marker, marker_key

    mac_key = marker_key(s.noise_key())  # authentic: the deployment's own key
    prod = AIOKafkaProducer(bootstrap_servers=s.bootstrap)
    await prod.start()
    try:
        for p in range(s.events_partitions):
            headers, value = close_marker(s.tick_bounds(through_tick)[0], True, mac_key=mac_key,
                                          topic=s.events_topic, partition=p)
            await prod.send(s.events_topic, value, partition=p, headers=headers)
        await prod.flush()
    finally:
        await prod.stop()


def live_settings(bootstrap: str, tmp: Path, name: str, paths: Sequence[str], **kw: Any
                  ) -> Settings:
    """Settings on the clock schedule, tick 1 starting a moment from now (1 s ticks)."""
    base: dict[str, Any] = {
        "schedule": "clock", "origin": float(int(time.time())) + 2.0, "tick_seconds": 1.0,
        "allowed_lateness_s": 0.5, "close_grace_s": 0.2, "max_future_skew_s": 300.0,
    }
    base.update(kw)
    return make_settings(bootstrap, tmp, name, paths, **base)


def event_bytes(key: str, ts: float, value: float | None = None) -> tuple[bytes, bytes]:
    body: dict[str, Any] = {"key": key, "ts": ts}
    if value is not None:
        body["value"] = value
    return key.encode(), json.dumps(body).encode()


async def read_topic(
    bootstrap: str, topic: str, *, committed: bool = True, timeout_s: float = 60.0
) -> list[Any]:
    """Every record currently in ``topic`` (all partitions), up to the end offsets."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed" if committed else "read_uncommitted",
        enable_auto_commit=False,
        fetch_max_bytes=64 << 20,
        max_partition_fetch_bytes=16 << 20,
    )
    await c.start()
    try:
        await c.topics()
        parts = c.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return []
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        end = await c.end_offsets(tps)
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        async def behind() -> bool:
            for tp in tps:
                if await c.position(tp) < end[tp]:
                    return True
            return False

        while await behind():
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} took more than {timeout_s} s")
            batch = await c.getmany(timeout_ms=500, max_records=100000)
            for tp, recs in batch.items():
                out.extend(r for r in recs if r.offset < end[tp])
        return out
    finally:
        await c.stop()


async def released(s: Settings, *, committed: bool = True) -> dict[tuple[str, int], list[bytes]]:
    """``(stream, tick) -> [raw message values]`` of the counts topic; for a compact-only
    deployment (``counts_json = 0``) the per-stream view of every compact record (each copy of
    a record — aborted ones too when ``committed=False`` — gives one copy per stream)."""
    out: dict[tuple[str, int], list[bytes]] = defaultdict(list)
    if not s.counts_json:
        from agents.kafka.codec import encode
        from stream_dp.compact import decode_block, decode_manifest

        manifests: dict[str, Any] = {}

        async def read_manifests() -> None:
            for r in await read_topic(s.bootstrap, s.manifests_topic):
                man = decode_manifest(r.value)
                manifests[man.sha256] = man

        await read_manifests()
        for r in await read_topic(s.bootstrap, s.compact_topic, committed=committed):
            block = decode_block(r.value)
            for attempt in range(5):
                # a record read after its manifest's topic was: the manifest (committed with
                # the shard's first record) is there when the manifests are read again
                if block.header["manifest"] in manifests:
                    break
                await asyncio.sleep(0.2 * attempt)
                await read_manifests()
            for m in block.records(manifests[block.header["manifest"]]):
                out[(m["stream"], m["tick"])].append(encode(m))
        return out
    for r in await read_topic(s.bootstrap, s.counts_topic, committed=committed):
        m = json.loads(r.value)
        out[(m["stream"], m["tick"])].append(r.value)
    return out


async def wait_for_ticks(
    s: Settings, n_streams: int, last_tick: int, timeout_s: float, poll_s: float = 1.0,
    workers: Sequence[WorkerProcess] = (),
) -> dict[tuple[str, int], list[bytes]]:
    """Poll the counts topic until every stream released ticks 1..last_tick. On a timeout the
    message ends with each of ``workers``' state and the end of its log."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await released(s)
        have = sum(1 for (_, t) in got if t <= last_tick)
        if have >= n_streams * last_tick:
            return got
        if time.monotonic() > deadline:
            logs = "".join(
                f"\n--- worker {w.worker_id} ({'alive' if w.alive() else 'exited'}), its log's "
                f"end:\n{w.log_tail()}" for w in workers)
            raise TimeoutError(
                f"only {have} of {n_streams * last_tick} (stream, tick) releases after "
                f"{timeout_s} s{logs}"
            )
        await asyncio.sleep(poll_s)


async def run_worker_until(s: Settings, n_streams: int, last_tick: int, timeout_s: float = 90
                           ) -> tuple[dict[tuple[str, int], list[bytes]], Any]:
    """Run an in-process worker until every stream released ticks 1..last_tick; stop it."""
    from agents.worker.pipeline import Worker

    stop = asyncio.Event()
    worker = Worker(s)
    task = asyncio.create_task(worker.run(stop))
    try:
        got = await wait_for_ticks(s, n_streams, last_tick, timeout_s=timeout_s, poll_s=0.5)
    finally:
        stop.set()
        await task
    return got, worker


def exact_decayed(
    domain: Any, events: Iterable[tuple[str, float, float]], s: Settings, last_tick: int
) -> dict[tuple[str, int], float]:
    """The offline oracle: ``s_t = p·s_{t-1} + D_t`` per node, events clamped to ``cap``."""
    counts: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for key, ts, value in events:
        t = math.floor((ts - s.origin) / s.tick_seconds) + 1
        for n in domain.nodes_for_event(key):
            counts[int(n)][t] += min(value, s.cap)
    out: dict[tuple[str, int], float] = {}
    for i, name in enumerate(domain.names):
        acc = 0.0
        for t in range(1, last_tick + 1):
            acc = s.p * acc + counts[i].get(t, 0.0)
            out[(name, t)] = acc
    return out


async def on_time(s: Settings, sent: Sequence[tuple[str, float, float]]
                  ) -> list[tuple[str, float, float]]:
    """``sent`` (live traffic, ``(key, ts, value)`` as produced with :func:`event_bytes`) less
    the events the workers dead-lettered as late, one per dead letter. A batch stamped with the
    wall clock and produced more than ``allowed_lateness_s`` later (a loaded machine) arrives
    after its tick closed: the workers are right to leave it out, so the oracle does too. Any
    other dead letter fails the test."""
    dead = [json.loads(r.value) for r in await read_topic(s.bootstrap, s.dlq_topic)]
    assert all(d["reason"] == "late" for d in dead), [d["reason"] for d in dead][:10]
    late: dict[tuple[str, float], int] = defaultdict(int)
    for d in dead:
        body = json.loads(d["raw"])
        late[(body["key"], float(body["ts"]))] += 1
    kept = []
    for key, ts, value in sent:
        if late.get((key, ts), 0) > 0:
            late[(key, ts)] -= 1
        else:
            kept.append((key, ts, value))
    assert not any(late.values()), "a late dead letter for an event never sent"
    return kept


def within_noise(message: dict[str, Any], want: float, sigmas: float = 10.0) -> bool:
    """Whether a release's ``value`` is ``want`` up to its own claimed noise: ``sigmas`` times the
    ``stderr`` it carries (10σ: a Gaussian exceeds it with probability 2·10^-23, a sum of decayed
    Laplace draws below 10^-6), plus float slack. A miscount of one event at a high ε is still
    hundreds of σ away, so the check fails where a count is wrong."""
    return abs(float(message["value"]) - want) <= sigmas * float(message["stderr"]) + 1e-9


class WorkerProcess:
    """A worker subprocess running ``python -m agents.worker.pipeline`` with settings in its env."""

    def __init__(self, s: Settings, worker_id: str, log_dir: Path) -> None:
        self.settings = s.replace(worker_id=worker_id)
        self.worker_id = worker_id
        self.log_path = log_dir / f"worker-{worker_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agents.worker.pipeline"],
            env=settings_env(self.settings), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    async def wait_log(self, text: str, timeout_s: float = 60.0, count: int = 1) -> None:
        """Wait until the worker's log holds ``text`` at least ``count`` times."""
        deadline = time.monotonic() + timeout_s
        while self.log_count(text) < count:
            if time.monotonic() > deadline or not self.alive():
                raise TimeoutError(f"worker {self.worker_id}: no {text!r} in its log")
            await asyncio.sleep(0.2)

    def log_count(self, text: str) -> int:
        """How many times ``text`` is in the worker's log so far (0 before its first start)."""
        return self.log_path.read_text(errors="replace").count(text) if (
            self.log_path.exists()) else 0

    def log_tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of the worker's log ('' before its first start)."""
        return self.log_path.read_text(errors="replace")[-chars:] if (
            self.log_path.exists()) else ""

    def starts(self) -> int:
        return self.log_count("release: assigned")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.terminate()
