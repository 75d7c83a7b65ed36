"""The per-person changelog read back (adversarial review of the binary records, issue #34): a
restore from the records the worker wrote — compiled pass or Python, whichever table wrote
them and whichever table reads them — gives the table as committed and its digest, across
every move the table makes: periods opened out of order, a third open period or a tick past
the compact table's range (the move to the dict ``Bounder``), closed periods (persons gone
and their tombstones), restarts from the changelog. And a restore refuses what a writer of the
topic can assemble out of those very records."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agents.ingest import records as ingest_records
from agents.ingest.user_records import ChangelogMac
from agents.ingest.users import UserState
from stream_dp.user_level import Bounder
from tests.unit.agents.ingest.test_user_changelog_c import _Settings

pytestmark = pytest.mark.skipif(ingest_records._fastingest is None,
                                reason="the compiled fast path")

KEY = bytes(range(40, 72))
CONTEXT = b'{"kind":"ingest checkpoint","partition":0}'


def _restored(k: int, t: int, b: int, topic: list[tuple[bytes, bytes | None]], mac: ChangelogMac,
              compact: bool) -> UserState:
    """A fresh table from the changelog (as ``IngestState.load_user_changes`` does)."""
    st = UserState(_Settings(k, t, b), 0, KEY)
    st.compact = compact
    st.changelog = True
    st.restore({"changelog": True, "open_period": 0, "people": 0, "digest": ""})
    st.load_changes([(p, None if v is None else mac.open(p, v)) for p, v in topic])
    return st


def _table(st: UserState) -> list[Any]:
    return sorted(st.bounder.export())


@pytest.mark.parametrize(("k", "t", "b"), [(3, 4, 0), (2, 3, 1), (5, 2, 0), (4, 6, 2)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_restore_gives_the_table_as_committed_across_every_move(k: int, t: int, b: int,
                                                                  seed: int) -> None:
    rng = random.Random(seed * 7919 + k)
    mac = ChangelogMac(KEY, CONTEXT)
    writers = [UserState(_Settings(k, t, b), 0, KEY) for _ in range(2)]
    writers[1].compact = False
    writers[1].bounder = Bounder(writers[1].bounds)
    for w in writers:
        w.changelog = True
    topics: list[list[tuple[bytes, bytes | None]]] = [[], []]
    tick, restores, moved, tombstones = 1, 0, 0, 0
    for i in range(3000):
        r = rng.random()
        if r < 0.02:
            tick += rng.randint(1, 2 * t)
            for w in writers:
                w.closed_before(tick)
        # mostly the open ticks; now and then a later period first (periods out of order), a
        # third open period, or a tick past the compact table's 2^31 - 1
        at = tick + rng.choice([0, 0, 0, 1, t, 2 * t, 3 * t])
        if rng.random() < 0.002:
            at = 2**31 + rng.randrange(4)
        obj = {"user": f"p{rng.randrange(60)}"}
        got = [w.decide_obj(obj, at, 0) for w in writers]
        assert got[0] == got[1], i
        if rng.random() < 0.05 or i == 2999:
            changes = [w.take_changes(mac) for w in writers]
            assert changes[0] == changes[1], i
            tombstones += sum(v is None for _, v in changes[0])
            for j in range(2):
                topics[j].extend(changes[j])
            assert writers[0].digest.tag() == writers[1].digest.tag(), i
            moved += type(writers[0].bounder) is Bounder
            for compact in (True, False):
                back = _restored(k, t, b, topics[0], mac, compact)
                assert _table(back) == _table(writers[1]), i
                assert back.digest.tag() == writers[0].digest.tag(), i
            if rng.random() < 0.3:  # kill -9 after the commit: the restored tables write on
                restores += 1
                writers = [_restored(k, t, b, topics[j], mac, j == 0) for j in range(2)]
                for w in writers:
                    w.open_period = writers[0].bounds.period_of(tick)
    assert restores > 3 and tombstones > 0 and moved > 0


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "dict"])
def test_an_older_record_or_a_tombstone_appended_is_refused(compact: bool) -> None:
    """Every single re-append of a genuine record (or a tombstone) that changes the table
    changes its digest: the restore's tag differs from the committed one."""
    mac = ChangelogMac(KEY, CONTEXT)
    w = UserState(_Settings(3, 4, 0), 0, KEY)
    if not compact:
        w.compact = False
        w.bounder = Bounder(w.bounds)
    w.changelog = True
    topic: list[tuple[bytes, bytes | None]] = []
    rng = random.Random(5)
    for _ in range(6):
        for _ in range(40):
            w.decide_obj({"user": f"p{rng.randrange(12)}"}, 1 + rng.randrange(8), 0)
        topic.extend(w.take_changes(mac))
    committed = w.digest.tag()
    assert _restored(3, 4, 0, topic, mac, compact).digest.tag() == committed
    refused = 0
    for j, (person, value) in enumerate(topic):
        appended: list[list[tuple[bytes, bytes | None]]] = [[(person, value)], [(person, None)]]
        for extra in appended:
            back = _restored(3, 4, 0, topic + extra, mac, compact)
            if _table(back) != _table(w):
                assert back.digest.tag() != committed, j
                refused += 1
            else:
                assert back.digest.tag() == committed, j
    assert refused > 10


def test_a_commit_of_many_persons_is_written_in_hash_order_as_python_writes_it() -> None:
    """More than 4096 persons in one commit (the compiled pass sorts them by buckets, not by
    ``qsort``) and more than 65536 (the burst's buffer is freed after the take): the records
    and the digest are the Python ones, persons counted and persons a closed period changed
    (``extra``) alike, and the restore reads them back."""
    mac = ChangelogMac(KEY, CONTEXT)
    writers = [UserState(_Settings(2, 3, 0), 0, KEY) for _ in range(2)]
    writers[1].compact = False
    writers[1].bounder = Bounder(writers[1].bounds)
    for w in writers:
        w.changelog = True
    assert type(writers[0].bounder) is not Bounder
    topic: list[tuple[bytes, bytes | None]] = []
    rng = random.Random(9)
    n = 70_000
    for rnd, (lo, hi, tick) in enumerate([(0, n, 1), (0, 6000, 2), (3000, 9000, 4),
                                          (0, 5000, 5), (0, 0, 7)]):
        if rnd == 3:  # period 0 closes: every person changes (most of them dropped)
            for w in writers:
                w.closed_before(4)
        if rnd == 4:
            for w in writers:
                w.closed_before(7)
        for j in rng.sample(range(lo, hi), hi - lo):
            obj = {"user": f"many{j}"}
            assert writers[0].decide_obj(obj, tick, 0) == writers[1].decide_obj(obj, tick, 0)
        got, want = (w.take_changes(mac) for w in writers)
        assert got == want, rnd
        assert [p for p, _ in got] == sorted({p for p, _ in got}), rnd
        assert writers[0].digest.total == writers[1].digest.total, rnd
        topic.extend(got)
        for compact in (True, False):
            back = _restored(2, 3, 0, topic, mac, compact)
            assert back.digest.tag() == writers[0].digest.tag(), rnd
            assert len(back.bounder) == len(writers[1].bounder), rnd


@pytest.mark.parametrize("last", [1, 2**31 - 1])
def test_the_longest_compact_record_is_written_whole(last: int) -> None:
    """The compact table's largest state (a tick of 2^31 - 1, two periods near 2^32, counts of
    65535: a 25-byte value, the compiled pass's UL_MAX_VALUE) is written byte for byte as
    Python writes it, tagged, and its digest term is Python's."""
    from agents.ingest.user_digest import TableDigest
    from agents.ingest.users import record_bytes

    mac = ChangelogMac(KEY, CONTEXT)
    table = ingest_records._fastingest.UserTable(65535, 2**32 - 1, 0)
    person = bytes(range(200, 216))
    state: tuple[int, list[tuple[int, int, dict[Any, int]]]] = (
        last, [(2**32 - 1, 65535, {}), (2**32 - 2, 65534, {})])
    table.load([(person, *state)])
    digest = TableDigest(bytes(range(32)), record_bytes)
    out, delta = table.changelog([person], mac.key, mac.context_hash, digest.key)
    value = record_bytes(state)
    assert len(value) == (25 if last > 2**28 else 21)
    assert out == [(person, mac.seal(person, value))]
    term = digest.term(person, value)
    assert int.from_bytes(table.digest_sum(digest.key), "little") == term
    assert int.from_bytes(delta, "little") == term  # (an extra person: the caller sums whole)
