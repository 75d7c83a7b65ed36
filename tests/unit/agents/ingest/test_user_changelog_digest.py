"""The per-person changelog against a writer of ``ingest_users_topic`` (issue #34, review of
the user-level preview; :mod:`agents.ingest.user_digest`), through the real
:class:`IngestState` in the worker's changelog form: every commit writes the sealed records of
the people it changed, then the sealed checkpoint; a restore reads the checkpoint and the
topic to its end (the last record per person wins, a null value deletes).

A writer of the topic holds genuine sealed records of every commit and can append any of them
again, and tombstones (null values, which nothing seals), in any order. Whatever table it
leaves other than the sealed one, the restore refuses: the checkpoint's keyed digest of the
table differs. The attacks keep the number of people the checkpoint states, which is all the
restore checked before. Restores of the genuine topic (as written, with copies of the newest
records, compacted) give the table of the uninterrupted run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from agents.config.settings import Settings
from agents.ingest.records import Record
from agents.ingest.schedule import ScheduleMismatch
from agents.ingest.siphash import siphash128
from agents.ingest.state import IngestState
from agents.ingest.user_digest import TableDigest, table_digest_key
from agents.ingest.users import record_bytes
from stream_dp.integrity import IntegrityError
from tests.unit.agents.ingest.test_user_level import (
    KEY,
    LEAVES,
    NOW,
    ORIGIN,
    ROUTER,
    L,
    _event,
    _home,
    _settings,
)

Topic = list[tuple[bytes, bytes | None]]
#: periods of 2 ticks, K = 3: the people of period 0 are freed (tombstones) when it closes
S = _settings(user_period_ticks=2, user_max_events=3, user_max_streams=2)
PEOPLE = [_home(0, f"who{i}") for i in range(6)]


class _Partition:
    """Events partition 0 (or ``partition``) as the worker runs it: changelog form, and a
    commit writes the changed people's records to :attr:`topic`, then the checkpoint."""

    def __init__(self, s: Settings = S, partition: int = 0, key: bytes | None = KEY,
                 domain_id: str = "") -> None:
        self.s, self.partition, self.key, self.domain_id = s, partition, key, domain_id
        self.state = self.fresh()
        self.topic: Topic = []
        #: the records of each commit (what a writer of the topic can replay)
        self.commits: list[Topic] = []
        self.checkpoint = self.state.to_bytes()

    def fresh(self) -> IngestState:
        state = IngestState(self.s, ROUTER, self.partition, offset=0, key=self.key,
                            domain_id=self.domain_id)
        state.clock = lambda: NOW
        assert state.users is not None
        state.users.changelog = True
        return state

    def feed(self, tick: int, who: str, n: int = 1, leaf: int = 0) -> None:
        ts = ORIGIN + (tick - 1) * L + 1.0
        st = self.state
        st.process_batch([Record(st.offset + i, who.encode(), _event(LEAVES[leaf], ts, who),
                                 int((ts + 0.1) * 1000), 0) for i in range(n)])

    def close(self, tick: int) -> None:
        self.state.schedule_close(tick, self.state.offset, "clock", NOW)
        self.state.apply_due()

    def commit(self) -> None:
        changes = self.state.user_changes()
        self.commits.append(changes)
        self.topic.extend(changes)
        self.checkpoint = self.state.to_bytes()
        self.state.out.clear()

    def restore(self, topic: Topic) -> IngestState:
        """A new state from the last checkpoint and ``topic`` (the worker's restore)."""
        again = self.fresh()
        again.restore(self.checkpoint, seq=1)
        again.load_user_changes(list(topic))
        return again

    def hashes(self) -> dict[str, bytes]:
        """Identifier -> the person's keyed hash (what the changelog's keys are)."""
        assert self.state.users is not None
        out = {}
        for who in PEOPLE:
            out[who] = siphash128(self.state.users.key, who.encode())
        return out


def _history(p: _Partition) -> None:
    """Ticks 1–4 (periods {1, 2} and {3, 4}): people with several events per period,
    commits between them, and the close of period 0 (its people's tombstones) on the way."""
    a, b, c, d, e, f = PEOPLE
    p.feed(1, a)
    p.feed(1, b)
    p.feed(1, c, 2, leaf=1)
    p.commit()
    p.feed(1, a)
    p.feed(2, d)
    p.commit()
    p.close(1)
    p.feed(2, a)
    p.feed(2, b, 3)
    p.commit()
    p.close(2)  # period 0 closes: everyone in it is freed (no spacing): tombstones
    p.commit()
    p.feed(3, a)
    p.feed(3, e)
    p.feed(3, f)
    p.commit()
    p.feed(3, a)
    p.feed(4, e, 2, leaf=2)
    p.commit()
    p.feed(4, a)  # a: 3 of K = 3 in period 1, written in three commits
    p.feed(4, f)
    p.commit()


def _written(p: _Partition, person: bytes) -> list[bytes | None]:
    """The records of ``person`` in the topic, oldest first (``None``: a tombstone)."""
    return [v for k, v in p.topic if k == person]


def _table(state: IngestState) -> list[Any]:
    """The table, in hash order."""
    assert state.users is not None
    return sorted(state.users.bounder.export())


def _count(state: IngestState, person: bytes) -> int:
    """What the person has counted in the open period (0: not in the table)."""
    assert state.users is not None
    got = state.users.bounder.person(person)
    return 0 if got is None else sum(c for per, c, _ in got[1] if per == 1)


def _refused(p: _Partition, topic: Topic) -> IngestState:
    """The restore of ``topic`` refuses in one line naming the topic and the way out; returns
    the state it was building (the table it would have restored)."""
    again = p.fresh()
    again.restore(p.checkpoint, seq=1)
    with pytest.raises(ScheduleMismatch) as got:
        again.load_user_changes(list(topic))
    msg = str(got.value)
    assert "\n" not in msg and repr(S.ingest_users_topic) in msg, msg
    assert "does not hold the table the checkpoint sealed" in msg
    assert "stream-dp deployment new" in msg
    return again


# ------------------------------------------------------------------ attacks
def _older_record(p: _Partition, h: dict[str, bytes]) -> Topic:
    """Person a's first record of period 1 again: their count goes back from 3 to 1."""
    mine = [v for v in _written(p, h[PEOPLE[0]]) if v is not None]
    return [(h[PEOPLE[0]], mine[-3])]


def _newest_dropped(p: _Partition, h: dict[str, bytes]) -> Topic:
    """Person a's newest record dropped: the one before it appended after it."""
    mine = _written(p, h[PEOPLE[0]])
    return [(h[PEOPLE[0]], mine[-2])]


def _freed_for_live(p: _Partition, h: dict[str, bytes]) -> Topic:
    """A tombstone for e (a live person: their budget restarts) and the last record of b, whom
    the close of period 0 freed, back: the number of people stays the same."""
    freed = [v for v in _written(p, h[PEOPLE[1]]) if v is not None]
    return [(h[PEOPLE[4]], None), (h[PEOPLE[1]], freed[-1])]


def _commit_replayed(p: _Partition, h: dict[str, bytes]) -> Topic:
    """A whole earlier commit (the fifth, after period 0 closed) appended again."""
    return list(p.commits[4])


ATTACKS: dict[str, Callable[[_Partition, dict[str, bytes]], Topic]] = {
    "an older record of a person": _older_record,
    "the newest record dropped": _newest_dropped,
    "a freed person in place of a live one": _freed_for_live,
    "an earlier commit replayed": _commit_replayed,
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_table_assembled_from_genuine_records_is_refused(attack: str) -> None:
    p = _Partition()
    _history(p)
    h = p.hashes()
    assert _table(p.restore(p.topic)) == _table(p.state)
    appended = ATTACKS[attack](p, h)
    assert appended and all(v is None or v in {x for _, x in p.topic} for _, v in appended)
    would = _refused(p, p.topic + appended)
    assert would.users is not None and p.state.users is not None
    # what the check stops: the same number of people (all the restore checked before), but
    # another table, in which someone has more of their budget left than they have
    assert len(would.users.bounder) == len(p.state.users.bounder)
    assert any(_count(would, x) < _count(p.state, x) for x in h.values())


def test_a_record_of_another_partition_or_deployment_is_refused() -> None:
    """Keyed (the worker): the seal already refuses a record of another partition or another
    deployment (its context names both). Without seals (the unkeyed states of tests) the
    digest alone refuses the same table: the check does not rest on the seal."""
    for key in (KEY, None):
        p = _Partition(key=key)
        _history(p)
        h = p.hashes()
        # the same person's genuine records elsewhere: another deployment with the same key
        # (another deployment id), and another partition's table (person b moved there)
        other = _Partition(key=key, domain_id="another deployment")
        _history(other)
        moved = _Partition(key=key, partition=1)
        moved.state.users.partition = 0  # type: ignore[union-attr]  # b's events accepted
        moved.feed(3, PEOPLE[1])
        moved.commit()
        for appended in ([(h[PEOPLE[0]], _written(other, h[PEOPLE[0]])[-3])],
                         [(h[PEOPLE[4]], None), moved.commits[0][0]]):
            if key is not None:
                again = p.fresh()
                again.restore(p.checkpoint, seq=1)
                with pytest.raises(IntegrityError):
                    again.load_user_changes(p.topic + appended)
            else:
                _refused(p, p.topic + appended)


def test_the_genuine_topic_restores_the_table_as_written_copied_or_compacted() -> None:
    """No false refusal: the topic as written, with every person's newest record (tombstones
    too) appended again, and compacted as Kafka does (the last record per key, tombstones
    then removed), restores the table of the uninterrupted run and passes the check."""
    p = _Partition()
    p.state.load_user_changes([])  # no checkpoint yet (a new deployment): the empty table
    _history(p)
    newest: dict[bytes, bytes | None] = {}
    for k, v in p.topic:
        newest[k] = v
    compacted = [(k, v) for k, v in newest.items() if v is not None]
    for topic in (p.topic, p.topic + list(newest.items()), compacted):
        again = p.restore(topic)
        assert _table(again) == _table(p.state)
        # and it goes on: one more commit after the restore is checked again
        p2 = _Partition()
        p2.state, p2.topic = again, list(topic)
        p2.feed(4, PEOPLE[5])
        p2.commit()
        assert _table(p2.restore(p2.topic)) == _table(p2.state)


def test_the_digest_is_incremental_and_equals_the_whole_sum() -> None:
    """After every commit the kept digest is the sum over the whole table (as written); only a
    commit that follows a period's close sums the whole table, the others touch the people
    they write."""
    p = _Partition()
    users = p.state.users
    assert users is not None
    whole_sums = []
    export = users.bounder.export

    def counted_export() -> Any:
        whole_sums.append(len(p.commits))
        return export()

    users.bounder.export = counted_export  # type: ignore[method-assign]
    commit = p.commit

    def checked_commit() -> None:
        commit()
        oracle = TableDigest(table_digest_key(KEY), record_bytes)
        oracle.load((person, (lt, per)) for person, lt, per in export())
        assert users.digest.total == oracle.total

    p.commit = checked_commit  # type: ignore[method-assign]
    _history(p)
    assert len(p.commits) == 7
    assert whole_sums == [3]  # the fourth commit: the one after period 0 closed


@pytest.mark.parametrize("version", [7, 8, 9, 10])
def test_a_preview_checkpoint_is_refused_in_one_line(version: int) -> None:
    """The preview's checkpoints carry no digest (version 7) or point at a changelog of JSON
    records (version 8): neither can be read, so a restore refuses them (a fatal mismatch: the
    worker stops, exit 3)."""
    p = _Partition(key=None)
    _history(p)
    doc = json.loads(p.checkpoint)
    assert doc["v"] == 11 and len(doc["users"]["digest"]) == 64 and doc["users"]["flush"]
    doc["v"] = version
    if version == 7:
        del doc["users"]["digest"]
    again = p.fresh()
    with pytest.raises(ScheduleMismatch, match=f"version {version}") as got:
        again.restore(json.dumps(doc).encode(), seq=1)
    assert "\n" not in str(got.value) and "deployment new" in str(got.value)
