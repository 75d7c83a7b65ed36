"""A binary-attribute deployment with the person as unit of privacy (issue #34): the same
bound as the counts path (:class:`stream_dp.user_level.Bounder`, K per period, applied after
every event-level check), its "stream" for L and k the event's attribute pattern, and the
tables' ``privacy`` block saying ``K·ε`` per person per period (an upper bound).

The property, through the real :class:`IngestState` (two events partitions) and
:class:`AttributeReleaseState`: two logs that differ by every record of one nasty person
(thousands of events over every cell, duplicates, late records, records on the wrong
partition, invalid ones, across period boundaries) give partials that differ by exactly that
person's bounded contribution (an oracle that rescans the person's records, independent of the
Bounder), table releases that differ by its decayed counts and nothing else, and the same dead
letters apart from that person's.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agents.config.domain import check_attribute_settings, load_domain
from agents.config.settings import Settings
from agents.ingest.records import Record
from agents.ingest.routing import Partial, Router
from agents.ingest.state import IngestState
from agents.ingest.users import user_bounds
from agents.kafka.codec import validate
from agents.kafka.partitioner import key_partition as kafka_partition
from agents.reconcile.tables import TableAssembler, decode_table_record, marginals_message
from agents.release.attributes import AttributeReleaseState, attribute_accounting, new_live
from agents.release.person import privacy_block
from stream_dp.attributes.domain import BinaryDomain
from stream_dp.attributes.tables import count_table

KEY = b"attribute-user-level-test-key-01"
NAMES = ["a", "b", "c", "d"]
M = len(NAMES)
ORIGIN = 1000.0
L = 10.0
LATENESS = 2.0
NOW = ORIGIN + 10_000.0
TICKS = 7
P = 0.9


def _setup(tmp_path: Path, **kw: Any) -> tuple[Settings, BinaryDomain]:
    dom_file = tmp_path / "d.toml"
    dom_file.write_text('name = "basket"\nkind = "binary"\nattributes = '
                        + json.dumps(NAMES) + "\n", encoding="utf-8")
    base: dict[str, Any] = dict(
        origin=ORIGIN, tick_seconds=L, allowed_lateness_s=LATENESS, close_grace_s=0.5,
        domain_file=str(dom_file), events_partitions=2, shards=1, epsilon=1000.0, p=P,
        max_future_skew_s=30.0, events_timestamp_type="CreateTime",
        attribute_epoch_ticks=1440, attribute_max_cluster=2,
        privacy_unit="user", user_period_ticks=3, user_max_events=3)
    base.update(kw)
    s = Settings(**base)
    dom = load_domain(dom_file)
    assert isinstance(dom, BinaryDomain)
    return s, dom


def _home(partition: int, prefix: str) -> str:
    """An identifier that Kafka's default partitioner puts on ``partition`` (of 2)."""
    i = 0
    while kafka_partition(f"{prefix}-{i}".encode(), 2) != partition:
        i += 1
    return f"{prefix}-{i}"


def _attrs(rng: random.Random) -> str:
    return "".join(rng.choice("01") for _ in range(M))


def _event(ts: float, attrs: str, user: str | None, **extra: Any) -> bytes:
    doc: dict[str, Any] = {"ts": ts, "attrs": attrs, **extra}
    if user is not None:
        doc["user"] = user
    return json.dumps(doc).encode()


def _log(seed: int, nasty: str | None) -> list[list[tuple[int, bytes, float]]]:
    """Per tick, the records ``(partition, value, arrival)`` appended while it is open. The
    others draw from their own random stream (the same with or without the person); the nasty
    person has hundreds of records every tick over all 16 cells."""
    rng = random.Random(seed)
    rng_n = random.Random(seed + 1000)
    others = [_home(i % 2, f"other{i}") for i in range(8)]
    segments = []
    for tick in range(1, TICKS + 1):
        start = ORIGIN + (tick - 1) * L
        seg: list[tuple[int, bytes, float]] = []
        for _ in range(rng.randrange(10, 30)):
            who = rng.choice(others)
            home = kafka_partition(who.encode(), 2)
            part = home if rng.random() < 0.9 else 1 - home
            ts = start + rng.uniform(0.0, L - 0.01)
            roll = rng.random()
            if roll < 0.05:
                seg.append((part, _event(ts, _attrs(rng), None), ts + 0.1))  # no identifier
            elif roll < 0.1 and tick > 1:
                seg.append((part, _event(ts - L, _attrs(rng), who), ts + 0.1))  # late
            else:
                seg.append((part, _event(ts, _attrs(rng), who), ts + 0.1))
        n_others = len(seg)
        if nasty is not None:
            mine = []
            cells = [format(c, f"0{M}b") for c in range(1 << M)]
            for j in range(rng_n.randrange(300, 500)):
                ts = start + rng_n.uniform(0.0, L - 0.01)
                attrs = cells[j % len(cells)] if j < 2 * len(cells) else rng_n.choice(cells)
                v = _event(ts, attrs, nasty)
                roll = rng_n.random()
                if roll < 0.1:
                    mine.append((1, v, ts + 0.1))  # wrong partition
                elif roll < 0.2 and tick > 1:
                    mine.append((0, _event(ts - L, attrs, nasty), ts + 0.1))  # late
                elif roll < 0.25:
                    mine.append((0, _event(ts, attrs, nasty, value=5), ts + 0.1))  # invalid
                else:
                    mine.append((0, v, ts + 0.1))
                    if rng_n.random() < 0.2:
                        mine.append((0, v, ts + 0.1))  # a duplicate
            slots = set(rng_n.sample(range(n_others + len(mine)), len(mine)))
            it_o, it_m = iter(seg), iter(mine)
            seg = [next(it_m) if i in slots else next(it_o)
                   for i in range(n_others + len(mine))]
        segments.append(seg)
    return segments


def _run(s: Settings, dom: BinaryDomain, segments: list[list[tuple[int, bytes, float]]]
         ) -> tuple[dict[tuple[int, int], int], list[Any], list[Any], int]:
    """Both partitions through the log, tick by tick, then the release: per (tick, pattern)
    the summed partials, the dead letters ``(partition, reason, value)``, the releases, and
    how many events the bound dropped."""
    router = Router(dom, s.shards)
    states = []
    for p in (0, 1):
        st = IngestState(s, router, p, offset=0, key=KEY)
        st.clock = lambda: NOW
        states.append(st)
    sums: dict[tuple[int, int], int] = defaultdict(int)
    dead: list[Any] = []
    partials: list[Any] = []
    bounded = 0
    for tick, seg in enumerate(segments, start=1):
        for p in (0, 1):
            base = states[p].offset
            recs = [Record(base + i, b"k", v, int(at * 1000), 0)
                    for i, (_, v, at) in enumerate(x for x in seg if x[0] == p)]
            states[p].process_batch(recs)
            states[p].schedule_close(tick, states[p].offset, "clock", NOW)
            states[p].apply_due()
            for part in states[p].out.partials:
                partials.append(part)
                for pattern, c in zip(part.idx, part.counts, strict=True):
                    sums[(part.tick, int(pattern))] += int(c)
            dead.extend((p, r.reason, v) for _, r, v, _ in states[p].out.dead_letters)
            bounded += states[p].out.bounded
            states[p].out.clear()
    rel = AttributeReleaseState(s, router, 0, new_live(s, dom, KEY), key=KEY)
    for off, part in enumerate(sorted(partials, key=lambda q: (q.tick, q.source))):
        rel.add(off, Partial.decode(part.encode()))
    releases = []
    while rel.ready():
        releases.append(rel.step())
    assert [r.tick for r in releases] == list(range(1, TICKS + 1))
    return dict(sums), dead, releases, bounded


def _kept(s: Settings, segments: list[list[tuple[int, bytes, float]]], nasty: str
          ) -> list[tuple[int, int]]:
    """The oracle: ``(tick, pattern)`` of the nasty person's counted events. Eligible: on
    their home partition (0), valid (value absent or 1), not late and its tick still open;
    then each one is kept by rescanning the ones kept before it (not the library's Bounder):
    fewer than K in its period, its pattern among the first L of the period (or L = 0),
    fewer than k on its pattern, and b ticks after the last kept one."""
    K, T = s.user_max_events, s.user_period_ticks
    big_l, k, b = s.user_max_streams, s.user_max_events_per_stream or K, \
        s.user_min_separation_ticks
    kept: list[tuple[int, int]] = []
    for tick, seg in enumerate(segments, start=1):
        for p, v, at in seg:
            doc = json.loads(v)
            if p != 0 or doc.get("user") != nasty or "value" in doc:
                continue
            ev_tick = int((doc["ts"] - ORIGIN) // L) + 1
            if ev_tick < tick or at >= ORIGIN + ev_tick * L + LATENESS:
                continue
            pattern = sum(1 << i for i, c in enumerate(doc["attrs"]) if c == "1")
            period = 0 if T == 0 else (ev_tick - 1) // T
            same = [q for t, q in kept if (0 if T == 0 else (t - 1) // T) == period]
            if len(same) >= K or same.count(pattern) >= k:
                continue
            if big_l and pattern not in same and len(set(same)) >= big_l:
                continue
            if b and kept and ev_tick < max(t for t, _ in kept) + b:
                continue
            kept.append((ev_tick, pattern))
    return kept


BOUNDS = [
    dict(user_max_events=3, user_period_ticks=3),
    dict(user_max_events=5, user_period_ticks=2, user_max_streams=2,
         user_max_events_per_stream=2),
    dict(user_max_events=4, user_period_ticks=0, user_min_separation_ticks=2),
]


@pytest.mark.parametrize("bounds", BOUNDS, ids=["K-T", "L-k", "b-epoch"])
@pytest.mark.parametrize("seed", [1, 2])
def test_removing_one_person_changes_the_tables_only_by_their_bounded_events(
        tmp_path: Path, bounds: dict[str, int], seed: int) -> None:
    s, dom = _setup(tmp_path, **bounds)
    check_attribute_settings(s, dom)  # refused before: "not built yet"
    nasty = _home(0, "nasty")
    log_with = _log(seed, nasty)
    with_p, dead_with, rel_with, dropped = _run(s, dom, log_with)
    without, dead_without, rel_without, _ = _run(s, dom, _log(seed, None))
    assert dropped > 1000  # thousands of the person's events were over the bound
    # the inputs to the noise: per tick and cell, exactly the person's counted events
    kept = _kept(s, log_with, nasty)
    want: dict[tuple[int, int], int] = defaultdict(int)
    for key in kept:
        want[key] += 1
    diff = {k: with_p.get(k, 0) - without.get(k, 0) for k in set(with_p) | set(without)}
    assert {k: d for k, d in diff.items() if d} == dict(want)
    per_period: dict[int, int] = defaultdict(int)
    for t, _ in kept:
        per_period[0 if s.user_period_ticks == 0 else (t - 1) // s.user_period_ticks] += 1
    # the bound binds, and holds: min(K, L·k) over the 16 cells
    assert max(per_period.values()) == user_bounds(s).per_node_events(leaves_below=1 << M)
    # the releases (same key, same structure): every table cell differs by the person's
    # decayed counts, nothing more
    bits = np.array([[(q >> i) & 1 for i in range(M)] for _, q in kept], dtype=np.uint8)
    ticks = np.array([t for t, _ in kept])
    for a, b in zip(rel_with, rel_without, strict=True):
        assert a.live.tables == b.live.tables
        w = np.where(ticks <= a.tick, P ** (a.tick - ticks).astype(np.float64), 0.0)
        for attrs, va, vb in zip(a.live.tables, a.live.values, b.live.values, strict=True):
            np.testing.assert_allclose(va - vb, count_table(bits, attrs, w), atol=1e-6)
    # dead letters: the same, apart from the person's own
    assert [x for x in dead_with if nasty.encode() not in x[2]] == dead_without
    mine = {r for _, r, v in dead_with if nasty.encode() in v}
    assert {"wrong_partition", "value_not_one"} <= mine and mine & {"late", "tick_closed"}
    assert not any(nasty.encode() in v for _, _, v in dead_without)


def test_the_tables_and_marginals_say_the_person_and_k_times_epsilon(tmp_path: Path) -> None:
    """dp.tables.v1 and dp.marginals.v1 carry the privacy block of a person: K times the
    exact ε one event spends, per period, an upper bound; the records validate."""
    from fractions import Fraction

    from stream_dp.attributes.release import worst_spent

    s, dom = _setup(tmp_path, epsilon=1.1, user_max_events=7, user_period_ticks=1440)
    block = privacy_block(s, dom, None)
    spent = worst_spent(1.1, M, 0.2 * 1.1)
    assert block["unit"] == "person" and block["period_ticks"] == 1440
    per = block["per_person"]
    assert per["stream"] == per["total"] and per["exact"] is False
    assert Fraction(per["total"]) >= 7 * spent > Fraction(per["total"]) - Fraction(1, 10**12)
    _, _, releases, _ = _run(s, dom, _log(3, _home(0, "nasty")))
    asm = TableAssembler()
    for off, rel in enumerate(releases):
        for i, (_, value) in enumerate(rel.messages(s, block)):
            rec = json.loads(value)
            validate("dp.tables.v1", rec)
            assert rec["privacy"] == block
            asm.add_table(0, off * 100 + i, decode_table_record(value, "basket"))
    done = asm.pop_complete()
    assert len(done) == TICKS
    msg, _ = marginals_message(done[-1], dom.names, "basket")
    validate("dp.marginals.v1", json.loads(json.dumps(msg)))
    assert msg["privacy"] == block
    lines = attribute_accounting(s, dom)["per_person"]
    assert any("per period over every table" in line and "an upper bound" in line
               for line in lines)
    # event level: the block and the start-up accounting are unchanged
    ev = s.replace(privacy_unit="event", user_period_ticks=-1, user_max_events=0)
    assert privacy_block(ev, dom, None) == ev.privacy.as_dict()
    assert "per_person" not in attribute_accounting(ev, dom)


def test_tail_shows_the_person_on_tables_and_marginals_and_nothing_at_event_level() -> None:
    """``stream-dp tail tables`` / ``tail marginals`` lines of a user-level deployment end
    with the per-event and per-person budgets; an event-level line is unchanged."""
    from agents.commands._tail_format import format_marginals, format_table_row

    table = {"names": ["a", "b"], "kind": "cluster", "cells": [1.0, 2.0, 3.0, 4.0],
             "stderr": 1.0, "tick": 3, "table": 0, "tables": 1, "epoch": 0}
    event = {"model": "pure", "epsilon": 2.0}
    person = {**event, "unit": "person", "period_ticks": 5,
              "per_person": {"stream": 6.0, "total": 6.0, "exact": False}}
    plain = format_table_row({**table, "privacy": event})
    assert plain == format_table_row(table) and "person" not in plain
    row = format_table_row({**table, "privacy": person})
    assert row.startswith(plain) and row.endswith("ε=2 · ε=6 per person per period")
    block = format_marginals({"tick": 3, "tables": [table], "clusters": [[0, 1]],
                              "privacy": person})
    assert block.splitlines()[0].endswith("ε=2 · ε=6 per person per period")
    assert "person" not in format_marginals({"tick": 3, "tables": [table],
                                             "clusters": [[0, 1]], "privacy": event})
