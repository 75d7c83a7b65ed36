"""A binary-attribute deployment with the person as unit of privacy (issue #34) through the real
worker on the real (embedded) broker, killed with SIGKILL while the log arrives.

Records are keyed by their person's identifier; a heavy person's copies on another partition
and records without a valid identifier are dead-lettered. Oracle: the library's
:class:`~stream_dp.attributes.live.LiveMarginals` (the deployment's key and nonce) fed only the
events the rescanning oracle ``keep_mask`` keeps, tick by tick, gives **bit-identical** tables
at every tick: a restart that forgot a budget or counted an event twice would show. Every
record says the person: ``K`` times the exact ε per event per period, an upper bound.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agents.config.domain import load_domain
from agents.ingest.users import user_bounds
from agents.kafka.codec import validate
from agents.kafka.partitioner import key_partition as kafka_partition
from agents.release.attributes import new_live
from stream_dp.attributes.release import worst_spent
from stream_dp.user_level import keep_mask
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.crash,
              pytest.mark.timeout(600)]

N_TICKS = 16
NAMES = ["a", "b", "c", "d"]


def _log(s: Any, n: int) -> list[tuple[str, str, float]]:
    """``(person, attrs, ts)`` in log order: heavy-tailed people over all 16 cells."""
    rng = np.random.default_rng(29)
    people = [f"u{i}" for i in range(200)]
    weights = 1.0 / np.arange(1, len(people) + 1) ** 1.2
    who = rng.choice(len(people), n, p=weights / weights.sum())
    ts = np.sort(rng.uniform(s.origin, s.origin + N_TICKS * s.tick_seconds, n))
    cells = rng.integers(0, 16, n)
    return [(people[w], format(int(c), "04b"), float(t))
            for w, c, t in zip(who, cells, ts, strict=True)]


def _message(person: str, attrs: str, ts: float) -> tuple[bytes, bytes]:
    return person.encode(), json.dumps({"ts": ts, "attrs": attrs, "user": person}).encode()


async def _tables(s: Any, timeout_s: float, worker: Any) -> list[dict[str, Any]]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        recs = [json.loads(r.value) for r in await ps.read_topic(s.bootstrap, s.counts_topic)]
        if {r["tick"] for r in recs} >= set(range(1, N_TICKS + 1)):
            return recs
        assert worker.alive(), worker.log_path.read_text()[-3000:]
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail("not every tick released: " + worker.log_path.read_text()[-3000:])
        await asyncio.sleep(1.0)


async def test_tables_of_bounded_people_survive_kill9_bit_for_bit(
        kafka_broker: str, unique_name: str, tmp_path: Path) -> None:
    dom_file = tmp_path / "basket.toml"
    dom_file.write_text('name = "basket"\nkind = "binary"\nattributes = '
                        + json.dumps(NAMES) + "\n", encoding="utf-8")
    s = ps.make_settings(kafka_broker, tmp_path, unique_name, ["x"], domain_file=str(dom_file),
                         shards=1, events_partitions=3, epsilon=50.0, tick_seconds=1.0,
                         attribute_epoch_ticks=1000, attribute_max_cluster=4,
                         privacy_unit="user", user_period_ticks=5, user_max_events=3,
                         user_max_events_per_stream=2)
    await ps.create_topics(s)
    dom = load_domain(dom_file)
    log = _log(s, 6000)
    heavy = [e for e in log if e[0] == "u0"][:40]
    home = kafka_partition(b"u0", s.events_partitions)
    await ps.produce_raw(s, [(*_message(*e), (home + 1) % s.events_partitions, [])
                             for e in heavy])
    invalid = [json.dumps({"ts": heavy[0][2], "attrs": "0101", **extra}).encode()
               for extra in ({}, {"user": 7}, {"user": ""}, {"user": "x" * 300})]
    await ps.produce_raw(s, [(b"k", v, None, []) for v in invalid])
    rng = random.Random(31)
    worker = ps.WorkerProcess(s, "w0", tmp_path)
    parts = 4
    try:
        for i in range(parts):
            await ps.produce(s, (_message(*e) for e in log[i * len(log) // parts:
                                                           (i + 1) * len(log) // parts]))
            worker.start()
            await asyncio.sleep(rng.uniform(3.0, 5.0))
            assert worker.alive(), worker.log_path.read_text()[-3000:]
            worker.kill9()
        await ps.close_ticks(s, N_TICKS)
        worker.start()
        tables = await _tables(s, 300, worker)
    finally:
        code = worker.terminate()
    text = worker.log_path.read_text()
    assert code == 0, text[-3000:]
    for person in ("u0", "u1", "u17"):  # identifiers are never logged
        assert f'"{person}"' not in text and f"'{person}'" not in text

    # oracle: the bounded log through the library object, the deployment's key and nonce
    from agents.kafka.nonce import adopt_nonce

    nonce = await adopt_nonce(s, str(dom.digest()), s.noise_key(), {})
    live = new_live(s, dom, s.noise_key(), nonce)
    ticks = [int((t - s.origin) // s.tick_seconds) + 1 for _, _, t in log]
    pats = [dom.pattern(a) for _, a, _ in log]
    keep = keep_mask([(p, t, (q,)) for (p, _, _), t, q in zip(log, ticks, pats, strict=True)],
                     user_bounds(s))
    assert sum(keep) < len(log) // 2  # the bounds bite
    spent = worst_spent(s.epsilon, dom.m, s.epsilon * s.attribute_bootstrap_fraction)
    by_tick: dict[int, list[dict[str, Any]]] = {}
    for r in tables:
        validate("dp.tables.v1", r)
        by_tick.setdefault(r["tick"], []).append(r)
    for t in range(1, N_TICKS + 1):
        mine = [q for q, tt, k in zip(pats, ticks, keep, strict=True) if k and tt == t]
        u, c = np.unique(np.array(mine, dtype=np.uint64), return_counts=True)
        lt = live.step(u, c.astype(np.float64))
        got = sorted(by_tick[t], key=lambda r: r["table"])
        assert len(got) == len(lt.tables), f"tick {t} released {len(got)} copies"
        for r, v in zip(got, lt.values, strict=True):
            assert np.array_equal(np.array(r["cells"]), v), t
            per = r["privacy"]["per_person"]
            assert r["privacy"]["unit"] == "person" and r["privacy"]["period_ticks"] == 5
            assert per["stream"] == per["total"] and per["exact"] is False
            assert Fraction(per["total"]) >= 3 * spent > Fraction(per["total"]) - Fraction(
                1, 10**6) * max(1, math.ceil(float(spent)))
    dead = await ps.read_topic(s.bootstrap, s.dlq_topic)
    reasons = [json.loads(r.value)["reason"] for r in dead]
    assert reasons.count("wrong_partition") == len(heavy), reasons[:20]
    assert reasons.count("invalid_user") == len(invalid), reasons[:20]
