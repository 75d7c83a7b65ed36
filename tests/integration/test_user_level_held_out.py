"""Held-out check of user-level privacy (issue #34), through the documented interfaces only.

Written from docs/privacy.md ("User-level privacy (preview)"), docs/configuration.md and
docs/CONTRACTS.md, not from the code: settings as environment variables, `stream-dp topics
create`, `stream-dp worker` as its own process, events produced with a plain Kafka producer keyed
by the person's identifier (the documented producer contract), and the `dp.counts.v1` records
read back from the counts topic.

Two deployments read two logs that differ by every record of one person — the nastiest we could
write: 400 events on every stream, duplicates, a period boundary, records on a partition their
identifier does not map to, an identifier that is a number on some. At ε = 10^4 per event the
releases are exact to 10^-2, so they must equal an oracle written from the documented rule (the
first K events of each person per aligned period, in log order, after the event-level checks),
and their difference must be exactly that person's bounded contribution: at most K events per
period in any stream. The records must say their unit.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from tests.integration.test_commands_service import CLI, _read, _worker_env, cli

LEAVES = ["eu/fr", "eu/de", "us/ny"]  # the domain of _worker_env: root "all"
NODES = {"eu/fr": ["all", "eu", "eu/fr"], "eu/de": ["all", "eu", "eu/de"],
         "us/ny": ["all", "us", "us/ny"]}
K, PERIOD, TICKS, P, EPS = 3, 4, 10, 0.9, 1e4


#: one event: (person, event time, leaf, identifier as the JSON says it)
Event = tuple[str, float, str, object]


def _people(rng: np.random.Generator, origin: float) -> list[Event]:
    """60 ordinary people, heavy-tailed (most a few events, some dozens), ticks 1..TICKS."""
    out: list[Event] = []
    for i in range(60):
        for _ in range(int(min(40, rng.zipf(1.6)))):
            tick = int(rng.integers(1, TICKS + 1))
            out.append((f"person-{i}", origin + tick - 1 + float(rng.uniform(0.05, 0.95)),
                        LEAVES[int(rng.integers(3))], f"person-{i}"))
    return out


def _nasty(origin: float) -> list[Event]:
    """The person whose records make the neighbouring log: 400 events on every leaf, on both
    sides of the period boundary 4|5, each twice (duplicates); every 9th says its identifier
    as a number (invalid: dead-lettered, never counted, never spends the budget)."""
    name = "nasty \u2603 \u00e9"
    out: list[Event] = []
    for j in range(200):
        tick = [3, 4, 5, 6, 8, 1][j % 6]
        ident: object = 12345 if j % 9 == 0 else name
        ev = (name, origin + tick - 1 + 0.5, LEAVES[j % 3], ident)
        out += [ev, ev]
    return out


def _oracle(log: list[Event]) -> dict[tuple[str, int], float]:
    """Per (node, tick) the decayed count of the counted events, by the documented rule (the
    first K of each person per aligned period, in log order), of a log of valid records."""
    counted: Counter[tuple[str, int]] = Counter()
    used: Counter[tuple[str, int]] = Counter()
    for person, ts, leaf, _ in log:
        tick = int(ts - ORIGIN[0]) + 1
        if used[(person, (tick - 1) // PERIOD)] < K:
            used[(person, (tick - 1) // PERIOD)] += 1
            for node in NODES[leaf]:
                counted[(node, tick)] += 1
    out = {}
    for node in ("all", "eu", "us", *LEAVES):
        acc = 0.0
        for tick in range(1, TICKS + 3):
            acc = P * acc + counted[(node, tick)]
            out[(node, tick)] = acc
    return out


ORIGIN = [0.0]


async def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes, int | None]]
                   ) -> None:
    from aiokafka import AIOKafkaProducer

    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await prod.start()
    try:
        for key, value, partition in records:
            await prod.send(topic, value, key=key, partition=partition)
        await prod.flush()
    finally:
        await prod.stop()


async def _releases(bootstrap: str, topic: str, want: set[tuple[str, int]], timeout: float
                    ) -> dict[tuple[str, int], dict[str, object]]:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                         auto_offset_reset="earliest", isolation_level="read_committed")
    await c.start()
    got: dict[tuple[str, int], dict[str, object]] = {}
    try:
        deadline = time.monotonic() + timeout
        while not want <= set(got) and time.monotonic() < deadline:
            for records in (await c.getmany(timeout_ms=500)).values():
                for r in records:
                    rec = json.loads(r.value)
                    got[(rec["stream"], rec["tick"])] = rec
        return got
    finally:
        await c.stop()


def _env(tmp_path: Path, bootstrap: str, name: str) -> dict[str, str]:
    env = _worker_env(tmp_path, bootstrap, name, 0)
    env.update({
        "STREAM_DP_EPSILON": str(EPS), "STREAM_DP_P": str(P), "STREAM_DP_STRATEGY": "naive",
        "STREAM_DP_ALLOWED_LATENESS_S": "1.0",
        "STREAM_DP_PRIVACY_UNIT": "user", "STREAM_DP_USER_FIELD": "who",
        "STREAM_DP_USER_MAX_EVENTS": str(K), "STREAM_DP_USER_PERIOD_TICKS": str(PERIOD),
        "STREAM_DP_INGEST_USERS_TOPIC": f"{name}.users",
    })
    created = cli("topics", "create", env=env)
    assert created.returncode == 0, created.stderr
    return env


def _records(events: list[Event], misplaced: set[int]) -> list[tuple[bytes, bytes, int | None]]:
    """Kafka records, keyed by the identifier's UTF-8 bytes (the documented producer
    contract); the ones in ``misplaced`` are put on the other partition by hand."""
    out: list[tuple[bytes, bytes, int | None]] = []
    for i, (person, ts, leaf, ident) in enumerate(events):
        value = json.dumps({"key": leaf, "ts": ts, "who": ident}).encode()
        out.append((person.encode(), value, (1 - _home(person)) if i in misplaced else None))
    return out


def _home(person: str) -> int:
    """The partition Kafka's default partitioner gives the key over 2 partitions."""
    from aiokafka.partitioner import DefaultPartitioner

    return int(DefaultPartitioner()(person.encode(), [0, 1], [0, 1]))


@pytest.mark.slow
def test_held_out_one_person_changes_only_their_bounded_contribution(
    tmp_path: Path, kafka_broker: str, unique_name: str
) -> None:
    rng = np.random.default_rng(34)
    envs = [_env(tmp_path, kafka_broker, f"{unique_name}-{x}") for x in "ab"]
    origin = ORIGIN[0] = float(int(time.time())) + 3.0  # tick 1 starts after the topics exist
    base, nasty = _people(rng, origin), _nasty(origin)
    # per tick: deployment a's records, and b's: the same in the same order with the person's
    # records inserted at random places; every 7th of theirs on the wrong partition
    waves: list[tuple[list[Event], list[Event], set[int]]] = []
    logged: list[Event] = []  # a's records in log order
    kept: list[Event] = []  # b's valid, well-placed records in log order
    dead: Counter[str] = Counter()  # b's dead letters by reason, by the documented rules
    for tick in range(1, TICKS + 1):
        mine = [e for e in base if int(e[1] - origin) + 1 == tick]
        rng.shuffle(mine)  # type: ignore[arg-type]
        theirs = list(mine)
        for ev in (e for e in nasty if int(e[1] - origin) + 1 == tick):
            theirs.insert(int(rng.integers(0, len(theirs) + 1)), ev)
        misplaced = {i for i, e in enumerate(theirs) if e[0].startswith("nasty") and i % 7 == 0}
        kept += [e for i, e in enumerate(theirs)
                 if i not in misplaced and isinstance(e[3], str)]
        logged += mine
        dead.update("invalid_user" if not isinstance(e[3], str) else "wrong_partition"
                    for i, e in enumerate(theirs)
                    if not isinstance(e[3], str) or i in misplaced)
        waves.append((mine, theirs, misplaced))

    procs, logs = [], [tmp_path / "a.log", tmp_path / "b.log"]
    for env, path in zip(envs, logs, strict=True):
        with open(path, "wb") as out:
            procs.append(subprocess.Popen([*CLI, "worker"], env={
                **env, "STREAM_DP_ORIGIN": str(origin)}, stdout=subprocess.DEVNULL, stderr=out))
    want = {(n, t) for n in ("all", "eu", "us", *LEAVES) for t in range(1, TICKS + 3)}
    try:
        for tick, (mine, theirs, misplaced) in enumerate(waves, start=1):
            while time.time() < origin + tick - 1 + 0.05:  # sent within their own tick
                time.sleep(0.01)

            async def send(mine=mine, theirs=theirs, misplaced=misplaced) -> None:  # type: ignore[no-untyped-def]
                await asyncio.gather(
                    _produce(kafka_broker, envs[0]["STREAM_DP_EVENTS_TOPIC"],
                             _records(mine, set())),
                    _produce(kafka_broker, envs[1]["STREAM_DP_EVENTS_TOPIC"],
                             _records(theirs, misplaced)))

            asyncio.run(send())
        a = asyncio.run(_releases(kafka_broker, envs[0]["STREAM_DP_COUNTS_TOPIC"], want, 180))
        b = asyncio.run(_releases(kafka_broker, envs[1]["STREAM_DP_COUNTS_TOPIC"], want, 180))
        dlq = [asyncio.run(_read(kafka_broker, env["STREAM_DP_DLQ_TOPIC"], 10**9, timeout=3))
               for env in envs]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert want <= set(a), logs[0].read_text()[-3000:]
    assert want <= set(b), logs[1].read_text()[-3000:]

    # dead letters: none in a; in b the person's records only, each for its own reason, and
    # none repeats the identifier in its detail
    assert dlq[0] == []
    assert Counter(str(r["reason"]) for r in dlq[1]) == dead
    assert not [r for r in dlq[1] if "nasty" in str(r["detail"])]
    want_a, want_b = _oracle(logged), _oracle(kept)
    for key in want:
        assert a[key]["value"] == pytest.approx(want_a[key], abs=0.02), key
        assert b[key]["value"] == pytest.approx(want_b[key], abs=0.02), key
    # the difference is the person's bounded contribution: K events per period on the root
    # (the flood is bounded, not dropped whole), at most K on any node
    per_period: defaultdict[tuple[str, int], float] = defaultdict(float)
    for node, tick in want:
        prev = (want_b.get((node, tick - 1), 0.0) - want_a.get((node, tick - 1), 0.0))
        per_period[(node, (tick - 1) // PERIOD)] += (
            want_b[(node, tick)] - want_a[(node, tick)] - P * prev)
    assert per_period[("all", 0)] == pytest.approx(K) and per_period[("all", 1)] == pytest.approx(K)
    assert all(-1e-9 <= v <= K + 1e-9 for v in per_period.values()), per_period
    # every record says its unit (docs/CONTRACTS.md)
    for rec in list(a.values()) + list(b.values()):
        priv = rec["privacy"]
        assert isinstance(priv, dict)
        assert priv["unit"] == "person" and priv["period_ticks"] == PERIOD, priv
        per = priv["per_person"]
        assert per["stream"] == pytest.approx(K * EPS) and per["total"] <= K * 3 * EPS, per
