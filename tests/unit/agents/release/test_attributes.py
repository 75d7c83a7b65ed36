"""The service's binary-attribute path without Kafka: ingest → partials → table releases.

Oracle: :class:`stream_dp.attributes.live.LiveMarginals` fed the same events directly (same key
and description) must give bit-identical tables; the released cells must match the exact decayed
counts within their standard errors; an added event changes only the cells that contain it, and
only until the structure epoch ends; checkpoints resume bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from agents.config.domain import check_attribute_settings, load_domain
from agents.config.settings import Settings
from agents.ingest.routing import Partial, Router
from agents.ingest.state import IngestState
from agents.kafka.checkpoints import CheckpointRefused
from agents.kafka.codec import Rejection, decode_attribute_event, validate
from agents.reconcile.tables import TableAssembler, decode_table_record, marginals_message
from agents.release.attributes import AttributeReleaseState, new_live
from stream_dp.attributes.domain import BinaryDomain
from stream_dp.attributes.tables import count_table

KEY = b"attribute-service-test-key-01234"
NAMES = [f"f{i}" for i in range(10)]


def _setup(tmp_path: Path, **kw: object) -> tuple[Settings, BinaryDomain]:
    dom_file = tmp_path / "d.toml"
    dom_file.write_text('name = "basket"\nkind = "binary"\nattributes = ['
                        + ", ".join(json.dumps(n) for n in NAMES) + "]\n", encoding="utf-8")
    base: dict[str, object] = dict(
        origin=1000.0, tick_seconds=10.0, domain_file=str(dom_file), events_partitions=2,
        shards=1, epsilon=2.0, p=0.9, allowed_lateness_s=0.0, attribute_epoch_ticks=6,
        attribute_max_cluster=3)
    base.update(kw)
    s = Settings(**base)  # type: ignore[arg-type]
    dom = load_domain(dom_file)
    assert isinstance(dom, BinaryDomain) and dom.name == "basket" and dom.m == 10
    return s, dom


def _events(n_ticks: int, seed: int = 0) -> list[tuple[float, str]]:
    rng = np.random.default_rng(seed)
    out = []
    for t in range(n_ticks):
        for _ in range(40):
            z = rng.random() < 0.4
            bits = [(rng.random() < (0.8 if z else 0.1)) if i < 4 else (rng.random() < 0.3)
                    for i in range(10)]
            out.append((1000.0 + 10 * t + float(rng.uniform(0, 9.9)),
                        "".join("1" if b else "0" for b in bits)))
    return out


def _run(s: Settings, dom: BinaryDomain, events: list[tuple[float, str]], ticks: int,
         ckpt_at: int | None = None, burst: tuple[int, int, int] | None = None) -> list[object]:
    """The service's release path; ``burst = (tick, pattern, n)`` adds ``n`` events of
    ``pattern`` to events partition 0's partial of ``tick`` (a burst no real log can hold)."""
    router = Router(dom, s.shards)
    ing = [IngestState(s, router, p, offset=0) for p in range(s.events_partitions)]
    offsets = [0] * s.events_partitions
    for i, (ts, attrs) in enumerate(events):
        p = i % s.events_partitions
        raw = json.dumps({"ts": ts, "attrs": attrs}).encode()
        ing[p].process(offsets[p], None, raw, timestamp=int(ts * 1000))
        offsets[p] += 1
    for p, state in enumerate(ing):
        assert not state.out.dead_letters
        assert state.schedule_close(ticks, offsets[p], "clock", 0.0)
        state.apply_due()
    partials = [q for state in ing for q in state.out.partials]
    assert len(partials) == ticks * s.events_partitions
    rel = AttributeReleaseState(s, router, 0, new_live(s, dom, KEY), key=KEY)
    for off, part in enumerate(partials):
        got = Partial.decode(part.encode())
        if burst is not None and (got.tick, got.source) == (burst[0], 0):
            acc = dict(zip(got.idx.tolist(), got.counts.tolist(), strict=True))
            acc[burst[1]] = acc.get(burst[1], 0) + burst[2]
            got = dataclasses.replace(got, idx=sorted(acc), counts=[acc[k] for k in sorted(acc)])
        rel.add(off, got)
    out = []
    while rel.ready():
        if ckpt_at is not None and rel.next_tick == ckpt_at:
            twin = AttributeReleaseState(s, router, 0, new_live(s, dom, KEY), key=KEY)
            twin.restore(rel.to_bytes(), 1, KEY)
            rel = twin
        out.append(rel.step())
    return out


def test_service_tables_equal_the_library_and_the_exact_counts(tmp_path: Path) -> None:
    s, dom = _setup(tmp_path)
    events = _events(14)
    releases = _run(s, dom, events, 14)
    assert [r.tick for r in releases] == list(range(1, 15))  # type: ignore[attr-defined]
    # oracle 1: the library object fed the same events (same key, same description)
    live = new_live(s, dom, KEY)
    bits = np.array([[int(c) for c in a] for _, a in events], dtype=np.uint8)
    ticks = np.array([int((ts - 1000.0) // 10) + 1 for ts, _ in events])
    pats = np.array([dom.pattern(a) for _, a in events], dtype=np.uint64)
    for t in range(1, 15):
        u, c = np.unique(pats[ticks == t], return_counts=True)
        lt = live.step(u, c.astype(np.float64))
        rel = releases[t - 1]
        assert rel.live.tables == lt.tables  # type: ignore[attr-defined]
        for a, b in zip(rel.live.values, lt.values, strict=True):  # type: ignore[attr-defined]
            assert a.tobytes() == b.tobytes()
    # the structure was re-decided at ticks 6 and 12, from the bootstrap alone
    assert [r.live.bootstrap is not None for r in releases] == [  # type: ignore[attr-defined]
        t % 6 == 0 for t in range(1, 15)]
    assert {r.live.epoch for r in releases} == {0, 1, 2}  # type: ignore[attr-defined]
    # oracle 2: exact decayed counts of every table cell within 6 standard errors (epoch 0:
    # no carry, the stderr is the bank's analytic noise)
    for rel in releases[:6]:
        t = rel.tick  # type: ignore[attr-defined]
        w = np.where(ticks <= t, 0.9 ** (t - ticks).astype(np.float64), 0.0)
        for attrs, vals, se in zip(rel.live.tables, rel.live.values,  # type: ignore[attr-defined]
                                   rel.live.stderr, strict=True):  # type: ignore[attr-defined]
            exact = count_table(bits, attrs, w)
            assert np.all(np.abs(vals - exact) <= 6 * se + 1e-9), (t, attrs)
    # the records validate against their schema and carry the budget split
    recs = releases[5].records(s, s.privacy.as_dict())  # type: ignore[attr-defined]
    for r in recs:
        validate("dp.tables.v1", json.loads(json.dumps(r)))
    b = recs[0]["budget"]
    assert Fraction(b["bootstrap"]) + b["tables"] * Fraction(b["per_table"]) <= Fraction(2.0)
    assert b["bootstrap"] == pytest.approx(0.4)
    assert recs[0]["bootstrap"]["epoch"] == 0 and recs[1]["bootstrap"] is None


def test_an_added_event_changes_only_its_own_cells_until_the_epoch_ends(tmp_path: Path) -> None:
    """Neighbouring logs, same key: one extra event with every attribute set, at the very last
    instant of a tick. Every table changes in exactly one cell (the event's), from the event's
    tick to the end of its structure epoch, by exactly the decayed count (the tables' noise is
    the same); every other cell is bit-identical."""
    s, dom = _setup(tmp_path)
    base = _events(6, seed=3)
    extra = (1000.0 + 10 * 3 - 2**-30, "1" * 10)  # tick 3, just before it ends
    a = _run(s, dom, base, 6)
    b = _run(s, dom, [*base, extra], 6)
    for ra, rb in zip(a, b, strict=True):
        t = ra.tick  # type: ignore[attr-defined]
        assert ra.live.tables == rb.live.tables  # type: ignore[attr-defined]
        for attrs, va, vb in zip(ra.live.tables, ra.live.values,  # type: ignore[attr-defined]
                                 rb.live.values, strict=True):  # type: ignore[attr-defined]
            diff = np.flatnonzero(va != vb)
            if t < 3:
                assert diff.size == 0
            else:
                cell = (1 << len(attrs)) - 1  # all ones
                assert diff.tolist() == [cell]
                assert vb[cell] - va[cell] == pytest.approx(0.9 ** (t - 3), rel=1e-9, abs=1e-9)


def test_checkpoints_resume_bit_for_bit_across_an_epoch_change(tmp_path: Path) -> None:
    s, dom = _setup(tmp_path)
    events = _events(14, seed=5)
    plain = _run(s, dom, events, 14)
    resumed = _run(s, dom, events, 14, ckpt_at=8)
    for x, y in zip(plain, resumed, strict=True):
        assert np.concatenate(x.live.values).tobytes() == np.concatenate(  # type: ignore[attr-defined]
            y.live.values).tobytes()  # type: ignore[attr-defined]
    # another key or configuration is refused
    router = Router(dom, 1)
    st = AttributeReleaseState(s, router, 0, new_live(s, dom, KEY), key=KEY)
    blob = st.to_bytes()
    other = s.replace(attribute_max_cluster=2)
    with pytest.raises(CheckpointRefused):
        AttributeReleaseState(other, router, 0, new_live(other, dom, KEY), key=KEY).restore(
            blob, 1, KEY)
    with pytest.raises(CheckpointRefused):
        st.restore(blob, 1, b"another-key-0123456789abcdef0123")


def test_attribute_events_are_validated() -> None:
    dom = BinaryDomain(["milk", "bread", "eggs"])
    ok = decode_attribute_event(b'{"ts": 5, "attrs": "101"}', 4096, dom)
    assert ok == (5, 5.0)
    assert decode_attribute_event(b'{"ts": 5, "attrs": ["eggs", "milk"], "value": 1}', 4096,
                                  dom) == (5, 5.0)
    bad = {
        b'{"ts": 5, "attrs": "10"}': "invalid_attributes",
        b'{"ts": 5, "attrs": "1x1"}': "invalid_attributes",
        b'{"ts": 5, "attrs": ["tea"]}': "invalid_attributes",
        b'{"ts": 5, "attrs": [1]}': "invalid_attributes",
        b'{"ts": 5}': "invalid_attributes",
        b'{"ts": 5, "attrs": "101", "value": 2}': "value_not_one",
        b'{"ts": "5", "attrs": "101"}': "invalid_schema",
        b'{"ts": 5, "attrs": "101", "key": 3}': "invalid_schema",
        b"[1]": "invalid_schema",
        b"{": "malformed_json",
    }
    for raw, reason in bad.items():
        got = decode_attribute_event(raw, 4096, dom)
        assert isinstance(got, Rejection) and got.reason == reason, raw
    with pytest.raises(Exception) as err:
        validate("dp.events.attributes.v1", {"ts": 1, "attrs": "10x"})
    assert "10x" in str(err.value)


def test_settings_a_binary_domain_refuses(tmp_path: Path) -> None:
    s, dom = _setup(tmp_path)
    check_attribute_settings(s, dom)
    for change, word in [({"shards": 2}, "shards"), ({"privacy_model": "zcdp"}, "pure"),
                         ({"compact_topic": "c"}, "compact")]:
        with pytest.raises(ValueError, match=word):
            check_attribute_settings(s.replace(**change), dom)
    for bad in ({"attribute_epoch_ticks": 0}, {"attribute_max_cluster": 9},
                {"attribute_bootstrap_fraction": 1.0}):
        with pytest.raises(ValueError):
            s.replace(**bad)


def test_naive_int_is_accepted_and_the_banks_range_is_what_is_checked(tmp_path: Path) -> None:
    """Issue 37: ``auto`` runs the banks on naive-int at the defaults, so naming it is fine
    (every cell count is a whole number of events); the range checked at start-up is the one
    of the banks (at ε_t, per epoch), against max_events_per_tick."""
    from agents.release.attributes import attribute_accounting

    s, dom = _setup(tmp_path, p=0.95, attribute_epoch_ticks=1440)
    assert attribute_accounting(s, dom)["first_epoch_strategy"] == "naive-int"
    check_attribute_settings(s.replace(strategy="naive-int"), dom)  # refused before
    big = s.replace(p=1.0, epsilon=1e4, attribute_bootstrap_fraction=1e-4, attribute_epoch_ticks=4,
                    max_events_per_tick=2**29)
    check_attribute_settings(big, dom)  # auto: a strategy whose range covers 2**29
    assert attribute_accounting(big, dom)["first_epoch_strategy"] != "tree-ls"
    with pytest.raises(ValueError, match=r"max_events_per_tick = 536870912.*range of tree-ls"):
        check_attribute_settings(big.replace(strategy="tree-ls"), dom)


def test_start_up_accounting_is_exact_and_spends_no_bootstrap_for_one_attribute(
        tmp_path: Path) -> None:
    from agents.release.attributes import attribute_accounting

    s, dom = _setup(tmp_path, epsilon=1.1)
    acc = attribute_accounting(s, dom)
    assert acc["bootstrap_per_event"] == 0.2 * 1.1
    from stream_dp.attributes.release import split_budget

    # oracle: the exact sum for every table count 10 attributes allow (1 … 2m − 1)
    totals = [Fraction(0.2 * 1.1) + k * Fraction(split_budget(1.1, k, 0.2 * 1.1).per_table)
              for k in range(1, 20)]
    assert Fraction(acc["spent_per_event_exact"]) == max(totals) <= Fraction(1.1)
    one = tmp_path / "one.toml"
    one.write_text('name = "one"\nkind = "binary"\nattributes = ["x"]\n', encoding="utf-8")
    acc1 = attribute_accounting(s, load_domain(one))
    assert acc1["bootstrap_per_event"] == 0.0  # reported 0.22 before: none is ever measured
    assert Fraction(acc1["spent_per_event_exact"]) <= Fraction(1.1)


def test_a_burst_past_every_range_is_clipped_and_releases_go_on(tmp_path: Path) -> None:
    """10⁹ events of one pattern in one tick (past 2**29 = max_events_per_tick and far past
    the 5.2·10⁵ of the tree-ls banks ``auto`` ran before): the tick is released, as if the cell
    held exactly max_events_per_tick events; before, the bank raised and releases stopped."""
    s, dom = _setup(tmp_path, p=1.0, epsilon=1e4, attribute_bootstrap_fraction=1e-4,
                    attribute_epoch_ticks=6, max_events_per_tick=2**29)
    events = _events(5, seed=3)
    pattern = dom.pattern(events[0][1])
    got = _run(s, dom, events, 5, burst=(2, pattern, 10**9))
    assert [r.tick for r in got] == [1, 2, 3, 4, 5]  # type: ignore[attr-defined]
    at_bound = _run(s, dom, events, 5, burst=(2, pattern, 2**29))
    for a, b in zip(got, at_bound, strict=True):
        assert a.values.tobytes() == b.values.tobytes()  # type: ignore[attr-defined]
    quiet = _run(s, dom, events, 5)
    lt = got[1].live  # type: ignore[attr-defined]
    for i, t in enumerate(lt.tables):  # only the burst's own cell of each table moved
        diff = np.nonzero(lt.values[i] != quiet[1].live.values[i])[0]  # type: ignore[attr-defined]
        own = sum(((pattern >> a) & 1) << (len(t) - 1 - j) for j, a in enumerate(t))
        assert diff.tolist() == [own]


def test_reconcile_makes_the_tables_consistent(tmp_path: Path) -> None:
    s, dom = _setup(tmp_path)
    releases = _run(s, dom, _events(8, seed=9), 8)
    asm = TableAssembler()
    for off, rel in enumerate(releases[::-1]):  # any order
        for i, r in enumerate(rel.messages(s, s.privacy.as_dict())):  # type: ignore[attr-defined]
            asm.add_table(0, off * 100 + i, decode_table_record(r[1], "basket"))
    done = asm.pop_complete()
    assert [t.tick for t in done] == list(range(1, 9))
    msg, diag = marginals_message(done[-1], dom.names, "basket")
    validate("dp.marginals.v1", json.loads(json.dumps(msg)))
    tables = msg["tables"]
    totals = [sum(t["cells"]) for t in tables]
    assert max(totals) - min(totals) < 1e-6 * max(1.0, abs(totals[0]))
    # shared attributes have equal one-way marginals in every table holding them
    for a in range(10):
        ones = [sum(c for i, c in enumerate(t["cells"])
                    if (i >> (len(t["attributes"]) - 1 - t["attributes"].index(a))) & 1)
                for t in tables if a in t["attributes"]]
        assert max(ones) - min(ones) < 1e-6 * max(1.0, abs(totals[0])), a
    assert diag.iterations >= 1 and math.isfinite(diag.residual)


def test_ticks_without_events_are_released(tmp_path: Path) -> None:
    """Ticks with no events — the first (a live demo's feeder starts after the worker), one
    mid-epoch and the epoch's last (tick 6, where the structure is re-decided) — are released
    like any other. The service steps the tables with ``cell_clip``, which raised numpy's
    UFuncTypeError on an empty tick (the attributes demo's intermittent 'commit failed
    (UFuncTypeError)' with no tick released). Oracle: the library object fed the same events
    without a clip, bit for bit."""
    s, dom = _setup(tmp_path)
    empty = {1, 4, 6}
    events = [(ts, a) for ts, a in _events(8, seed=3) if int((ts - 1000.0) // 10) + 1 not in empty]
    releases = _run(s, dom, events, 8)
    assert [r.tick for r in releases] == list(range(1, 9))  # type: ignore[attr-defined]
    live = new_live(s, dom, KEY)
    ticks = np.array([int((ts - 1000.0) // 10) + 1 for ts, _ in events])
    pats = np.array([dom.pattern(a) for _, a in events], dtype=np.uint64)
    for t in range(1, 9):
        u, c = np.unique(pats[ticks == t], return_counts=True)
        assert (u.size == 0) == (t in empty)
        lt = live.step(u, c.astype(np.float64))
        rel = releases[t - 1]
        assert rel.live.tables == lt.tables  # type: ignore[attr-defined]
        for a, b in zip(rel.live.values, lt.values, strict=True):  # type: ignore[attr-defined]
            assert a.tobytes() == b.tobytes()


def test_attribute_63_of_a_64_attribute_domain_reaches_the_tables(tmp_path: Path) -> None:
    """m = 64: an event with the last attribute set must be counted like any other. Its
    pattern used to be computed with NumPy int64 shifts (``1 << np.int64(63)`` wraps to
    -2**63; all 64 ones gave -1): the partial then held a negative index, the release stage
    refused it as undecodable, and that tick (hence every later one) was never released — one
    event stopped the deployment. Oracle: the pattern read as a binary number (Python ints),
    the library's LiveMarginals fed those patterns, and the exact cell counts."""
    dom_file = tmp_path / "d64.toml"
    dom_file.write_text('name = "wide"\nkind = "binary"\nattributes = ['
                        + ", ".join(json.dumps(f"a{i}") for i in range(64)) + "]\n",
                        encoding="utf-8")
    s = Settings(origin=1000.0, tick_seconds=10.0, domain_file=str(dom_file),
                 events_partitions=1, shards=1, epsilon=2.0, p=0.9, allowed_lateness_s=0.0,
                 attribute_epoch_ticks=2, attribute_max_cluster=8)
    dom = load_domain(dom_file)
    assert isinstance(dom, BinaryDomain) and dom.m == 64
    strings = ["1" * 64, "0" * 63 + "1", "1" + "0" * 63, "0" * 64, "01" * 32, "10" * 32]
    for a in strings:  # bit i = attribute i = character i
        assert dom.pattern(a) == int(a[::-1], 2)
    assert dom.pattern(["a63", "a63", "a0"]) == (1 << 63) | 1  # duplicates count once
    events = [(1000.0 + 10 * (i % 3) + 1 + i / 10, a) for i, a in enumerate(strings)]
    releases = _run(s, dom, events, 3)
    assert [r.tick for r in releases] == [1, 2, 3]  # type: ignore[attr-defined]
    live = new_live(s, dom, KEY)
    for t in range(1, 4):
        mine = [int(a[::-1], 2) for ts, a in events if int((ts - 1000.0) // 10) + 1 == t]
        pats, counts = np.unique(np.array(mine, dtype=np.uint64), return_counts=True)
        lt = live.step(pats, counts.astype(np.float64))
        got = releases[t - 1].live  # type: ignore[attr-defined]
        assert got.tables == lt.tables
        for a, b in zip(got.values, lt.values, strict=True):
            assert np.array_equal(a, b)


@pytest.mark.slow
def test_a_tick_of_distinct_patterns_still_fits_one_partial_record(tmp_path: Path) -> None:
    """A burst of events with distinct patterns in one tick: its partial (one record on the
    partials topic, produced in the ingest transaction) must fit the topic's record limit,
    else the release stops for good. Real ingest state, real encoder; the limit is the one
    ``stream-dp topics create`` sets on the partials topic."""
    from agents.kafka.topics import topic_specs

    dom_file = tmp_path / "d64.toml"
    dom_file.write_text('name = "wide"\nkind = "binary"\nattributes = ['
                        + ", ".join(json.dumps(f"a{i}") for i in range(64)) + "]\n",
                        encoding="utf-8")
    s = Settings(origin=1000.0, tick_seconds=10.0, domain_file=str(dom_file),
                 events_partitions=1, shards=1, epsilon=2.0, p=0.9, allowed_lateness_s=0.0)
    dom = load_domain(dom_file)
    limit = next(int(v) for spec in topic_specs(s) if spec.name == s.partials_topic
                 for k, v in spec.configs if k == "max.message.bytes")
    ing = IngestState(s, Router(dom, 1), 0, offset=0)
    rng = np.random.default_rng(5)
    n = limit // 20  # > limit / 22.4 bytes per distinct 64-bit pattern
    words = rng.integers(0, 2**63, size=n, dtype=np.int64).tolist()
    for i, w in enumerate(words):  # distinct with overwhelming probability; the top bit set
        attrs = format(w | (1 << 63), "064b")
        ing.process(i, None, b'{"ts":1001.0,"attrs":"' + attrs.encode() + b'"}',
                    timestamp=1_001_000)
    assert not ing.out.dead_letters
    assert ing.schedule_close(1, n, "clock", 0.0)
    ing.apply_due()
    # one entry per distinct pattern, which no setting bounds: cut into records that each fit
    # the partials topic (one record was 18.8 MB, its transaction never committed)
    parts = ing.out.partials
    assert len(parts) > 1 and [p.piece for p in parts] == list(range(len(parts)))
    assert all(len(p.encode()) <= limit for p in parts)
    whole = Partial.join([Partial.decode(p.encode()) for p in reversed(parts)])
    assert len(whole.idx) > 0.99 * n and sum(whole.counts) == n
    # the release state joins the pieces read in order, and counts the tick once
    rel = AttributeReleaseState(s, Router(dom, 1), 0, None, key=b"k" * 32)
    for offset, p in enumerate(parts):
        assert not rel.ready()
        rel.add(offset, Partial.decode(p.encode()))
    assert rel.ready() and rel.pending[1][0] == whole and not rel.pieces


def test_partial_pieces_round_trip_through_a_release_checkpoint(tmp_path: Path) -> None:
    """A partial cut into pieces (Partial.split): the release state holds the pieces read so
    far in its checkpoint, and after a restore joins them with the rest into the very partial;
    a duplicate piece counts nothing; pieces that are not one partial's are refused."""
    dom_file = tmp_path / "d3.toml"
    dom_file.write_text('name = "w"\nkind = "binary"\nattributes = ["a", "b", "c"]\n',
                        encoding="utf-8")
    s = Settings(origin=1000.0, tick_seconds=10.0, domain_file=str(dom_file),
                 events_partitions=1, shards=1, epsilon=2.0, p=0.9)
    router = Router(load_domain(dom_file), 1)
    whole = Partial(1, 0, 0, (0, 2, 3, 5, 6, 7, 9), (4, 1, 1, 2, 8, 1, 3), 1010.5)
    pieces = whole.split(3)
    assert [(p.piece, p.pieces, len(p.idx)) for p in pieces] == [(0, 3, 3), (1, 3, 3), (2, 3, 1)]
    assert whole.split(7) == [whole] and b'"pieces"' not in whole.encode()  # same bytes as before
    key = b"k" * 32
    first = AttributeReleaseState(s, router, 0, None, key=key)
    first.add(0, Partial.decode(pieces[0].encode()))
    first.add(1, Partial.decode(pieces[0].encode()))  # the same piece again
    assert first.duplicates == 1 and not first.ready()
    data = first.to_bytes()
    again = AttributeReleaseState(s, router, 0, None, key=key)
    again.restore(data, 1, key)
    again.add(2, Partial.decode(pieces[2].encode()))
    assert not again.ready()
    again.add(3, Partial.decode(pieces[1].encode()))
    assert again.ready() and again.pending[1][0] == whole and not again.pieces
    with pytest.raises(ValueError, match="pieces"):
        Partial.join([pieces[0], pieces[0], pieces[2]])
    with pytest.raises(ValueError, match="piece fields"):
        Partial.decode(pieces[0].encode().replace(b'"piece":0', b'"piece":3'))
