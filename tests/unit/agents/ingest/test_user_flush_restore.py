"""The restore of the lazily written per-person table, through the ingest stage (issue #34,
checkpoint version 10: ``user_flush_interval_s``, :mod:`agents.ingest.user_flush`,
:mod:`agents.ingest.user_replay`, ``IngestStage.after_restore`` / ``_replay_users``).

The restore is driven through the real ``IngestStage.after_restore`` (it reads the changelog,
the schedule topic and the events since the table's last write with the real
``read_all`` / ``read_range``) over :class:`_Log`, an in-memory stand-in for the broker's
committed records (the Kafka client, not the system under test). The worker is modelled as in
``test_user_level._crashy_partition``: records processed, commits that write the table (a
*flush*) or only carry the flush point, outputs kept only when committed, a kill -9 that
loses everything since the last commit. Oracle: the same log on a state that never crashes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from agents.ingest.records import Record
from agents.ingest.stage import IngestStage
from agents.ingest.state import IngestState
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
    _state,
)

_S = _settings()
EVENTS, USERS, SCHEDULE = _S.events_topic, _S.ingest_users_topic, _S.schedule_topic


@dataclass
class _Rec:
    """A committed record as the reader returns it (aiokafka's ``ConsumerRecord`` fields)."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = -1
    timestamp_type: int = 0
    headers: tuple[Any, ...] = ()


@dataclass
class _Log:
    """The committed records of the topics one events partition's restore reads, and a
    consumer over them with the calls ``read_all`` / ``read_range`` make (no group,
    ``read_committed``: only what a commit made visible is here)."""

    topics: dict[tuple[str, int], list[_Rec]] = field(default_factory=dict)
    _pos: dict[Any, int] = field(default_factory=dict)

    def records(self, topic: str, p: int = 0) -> list[_Rec]:
        return self.topics.setdefault((topic, p), [])

    def append(self, topic: str, key: bytes | None, value: bytes | None, p: int = 0) -> int:
        recs = self.records(topic, p)
        off = recs[-1].offset + 1 if recs else 0
        recs.append(_Rec(off, key, value))
        return off

    def assign(self, tps: list[Any]) -> None:
        pass

    def unsubscribe(self) -> None:
        pass

    async def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: (self.records(tp.topic, tp.partition) or [_Rec(0, None, None)])[0].offset
                for tp in tps}

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        out = {}
        for tp in tps:
            recs = self.records(tp.topic, tp.partition)
            out[tp] = recs[-1].offset + 1 if recs else 0
        return out

    def seek(self, tp: Any, offset: int) -> None:
        self._pos[(tp.topic, tp.partition)] = offset

    async def position(self, tp: Any) -> int:
        return self._pos[(tp.topic, tp.partition)]

    async def getmany(self, tp: Any, timeout_ms: int = 0) -> dict[Any, list[_Rec]]:
        at = self._pos[(tp.topic, tp.partition)]
        got = [r for r in self.records(tp.topic, tp.partition) if r.offset >= at][:7]
        if got:
            self._pos[(tp.topic, tp.partition)] = got[-1].offset + 1
        return {tp: got} if got else {}


def _stage(s: Any, log: _Log) -> IngestStage:
    """An IngestStage whose restore reads ``log`` (no broker)."""
    stage = object.__new__(IngestStage)
    stage.s = s
    stage.topic = EVENTS
    stage.reader = log
    stage.w = SimpleNamespace(key=KEY, router=ROUTER, domain_id="")
    return stage


class _Worker:
    """One events partition (0) as the worker runs it, committing into ``log``."""

    def __init__(self, s: Any, log: _Log) -> None:
        self.s = s
        self.log = log
        self.state = self.fresh()
        self.ckpt: bytes | None = None

    def fresh(self) -> IngestState:
        st = _state(self.s, 0)
        assert st.users is not None
        st.users.changelog = True
        return st

    def feed(self, values: list[bytes], arrival: float) -> None:
        """Append records to the events topic and process them (one batch)."""
        recs = []
        for v in values:
            off = self.log.append(EVENTS, b"k", v)
            recs.append(Record(off, b"k", v, int(arrival * 1000), 0))
            self.log.records(EVENTS)[-1].timestamp = int(arrival * 1000)
        self.state.process_batch(recs)

    def close(self, through: int) -> None:
        """The clock rule closes every tick through ``through`` at the log end."""
        st = self.state
        st.schedule_close(through, len(self.log.records(EVENTS)), "clock", NOW)
        st.apply_due()

    def commit(self, flush: bool) -> None:
        """IngestStage._commit: the table's changes if it is written now, the closing points,
        the checkpoint; the schedule topic's offset read back after the commit."""
        st = self.state
        changes = st.user_changes() if flush or st.flush_point is None else []
        for person, value in changes:
            self.log.append(USERS, person, value)
        offsets = [self.log.append(SCHEDULE, b"k", e.encode(st.entry_key))
                   for e in st.out.entries]
        self.ckpt = st.to_bytes()
        if offsets:
            st.schedule_from = max(st.schedule_from, max(offsets) + 1)
        st.out.clear()
        st.dirty = False

    def crash_and_restore(self) -> IngestState:
        """kill -9, then the real restore (IngestStage.after_restore) of the last commit."""
        assert self.ckpt is not None
        st = self.fresh()
        st.restore(self.ckpt, seq=1)
        start = asyncio.run(_stage(self.s, self.log).after_restore(st, True))
        assert start is None
        self.state = st
        return st


def _table(st: IngestState) -> list[Any]:
    assert st.users is not None
    return sorted(st.users.bounder.export())


def _idle_period_closed(written: bool) -> tuple[_Worker, list[str]]:
    """Four people's events in tick 1 (periods of one tick, K = 2), the table written at
    offset 4, then tick 1 closed by the clock with no record since, and a commit that writes
    the table again (``written``) or only carries the flush point."""
    s = _settings(user_period_ticks=1, user_max_events=2)
    log = _Log()
    w = _Worker(s, log)
    people = [_home(0, f"idle{i}") for i in range(4)]
    w.feed([_event(LEAVES[i % 3], ORIGIN + 1.0 + i, who) for i, who in enumerate(people)],
           arrival=ORIGIN + 5.0)
    w.commit(flush=True)  # the table written at offset 4
    w.close(1)  # tick 1 (period 1) closed by the clock, no record since: its people go
    w.commit(flush=written)  # a tick close commits; lazy: the table is not due yet
    return w, people


@pytest.mark.parametrize("written", [True, False], ids=["written-at-close", "lazy"])
def test_a_period_closed_by_the_clock_after_the_last_write_is_forgotten_on_restore_too(
        written: bool) -> None:
    """An idle partition: the table is written at offset Y, then the clock closes the last
    tick of a period with no record in between (the events offset stays Y) and the next commit
    carries the flush point (within user_flush_interval_s). The closed period's forgetting
    (``UserState.closed_before``) happened after the write: ``after_restore`` re-decides
    whenever the flush point's offset *or next open tick* differs from the checkpoint's, so
    the restored table drops the people the period's close dropped, as the run without the
    crash did (found by the adversarial review: a re-decision only when the offset moved kept
    them). (``written-at-close``: the same run with the table written at the close.)"""
    w, _ = _idle_period_closed(written)
    straight = _table(w.state)
    assert straight == [] and w.state.flush_point is not None
    assert w.state.flush_point.offset == w.state.offset  # nothing to re-decide by offset
    restored = w.crash_and_restore()
    assert restored.next_tick == 2
    assert _table(restored) == straight, "people of a closed period came back on restore"


@pytest.mark.parametrize("crash", [False, True], ids=["straight", "restored"])
def test_the_stale_people_move_the_partition_to_the_dict_table_for_good(crash: bool
                                                                         ) -> None:
    """What stale people would cost (the test above): one of them with events for the next two
    open ticks (periods of one tick; the later tick within max_future_skew_s) holds three
    periods in the restored table (the closed one still there), which the compact table
    cannot hold, so the partition's table would move to the dict ``Bounder`` for good (≈ 10×
    the memory a person, the pure path for every record). Restored or not, it stays on the
    compact table, and nothing is bounded either way."""
    from stream_dp.user_level import Bounder

    w, people = _idle_period_closed(False)
    if crash:
        w.crash_and_restore()
    w.feed([_event("a/x", ORIGIN + L + 1.0, people[0]),
            _event("a/x", ORIGIN + 2 * L + 1.0, people[0])], arrival=ORIGIN + L + 1.5)
    assert w.state.users is not None and w.state.out.bounded == 0
    assert type(w.state.users.bounder) is not Bounder


def _stage_run(s: Any, segments: list[list[tuple[int, bytes, float]]], seed: int,
               crashes: bool, flush: float = 0.2, restart_after_restore: float = 0.3,
               batch: int = 3) -> tuple[dict[tuple[int, int], int], list[Any], IngestState]:
    """Partition 0 of ``segments`` (``test_user_level._log``) through :class:`_Worker`: random
    batches, commits (the table written with a share ``flush`` of them), clock closes at each
    tick's end (always committed), and with ``crashes`` kill -9 at random points, restored by
    the real ``after_restore`` (sometimes crashing again right after a restore, before any
    commit). Returns the committed sums, dead letters and the last state."""
    import random
    from collections import defaultdict

    rng = random.Random(seed)
    log = _Log()
    closes: dict[int, int] = {}
    recs: list[Record] = []
    for tick, seg in enumerate(segments, start=1):
        for q, v, at in seg:
            if q == 0:
                off = log.append(EVENTS, b"k", v)
                log.records(EVENTS)[-1].timestamp = int(at * 1000)
                recs.append(Record(off, b"k", v, int(at * 1000), 0))
        closes[len(recs)] = tick
    w = _Worker(s, log)
    sums: dict[tuple[int, int], int] = defaultdict(int)
    dead: list[Any] = []
    n_crashes = 0

    def commit_collect(flush_now: bool) -> None:
        st = w.state
        for part in st.out.partials:
            for node, c in zip(part.idx, part.counts, strict=True):
                sums[(part.tick, int(node))] += int(c)
        dead.extend((r.reason, v) for _, r, v, _ in st.out.dead_letters)
        w.commit(flush_now)

    while True:
        st = w.state
        o = st.offset
        if o in closes and closes[o] >= st.next_tick:
            st.schedule_close(closes[o], o, "clock", NOW)
            st.apply_due()
            commit_collect(rng.random() < flush)
        if o >= len(recs):
            break
        end = min(c for c in closes if c > o)  # batches end at a tick's end at the latest
        st.process_batch(recs[o:min(end, o + rng.randint(1, batch))])
        roll = rng.random()
        if roll < 0.2:
            commit_collect(rng.random() < flush)
        elif crashes and roll < 0.3 and w.ckpt is not None:
            n_crashes += 1
            w.crash_and_restore()
            while rng.random() < restart_after_restore:  # a restore that itself dies
                n_crashes += 1
                w.crash_and_restore()
    assert not crashes or n_crashes > 3
    return dict(sums), dead, w.state


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bounds", [dict(user_max_events=3, user_period_ticks=4),
                                    dict(user_max_events=2, user_period_ticks=1,
                                         user_min_separation_ticks=1, user_max_streams=1)],
                         ids=["K3-T4", "K2-T1-b1-L1"])
def test_kill9_anywhere_through_the_real_restore_gives_the_straight_run(
        bounds: dict[str, int], seed: int) -> None:
    """Crashes at random points (and again right after a restore) with the table written at
    one commit in five: the sums, dead letters and table are those of the run without
    crashes (records the clock refused included). Holds (the harness re-decides 10-30
    records per restore on average)."""
    from tests.unit.agents.ingest.test_user_level import _clock_future, _log

    s = _settings(**bounds)
    nasty = _home(0, "nasty")
    log = _clock_future(_log(seed + 20, nasty), nasty)
    want_sums, want_dead, straight = _stage_run(s, log, seed, crashes=False)
    got_sums, got_dead, state = _stage_run(s, log, seed, crashes=True)
    assert got_sums == want_sums
    assert sorted(got_dead) == sorted(want_dead)
    assert _table(state) == _table(straight)


class _FastClock(asyncio.SelectorEventLoop):
    """An event loop whose clock moves one second at every reading: a wait on the loop's
    clock (``read_range``'s 120 s without records) passes at once."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0

    def time(self) -> float:
        self._now += 1.0
        return self._now


@pytest.mark.parametrize("lost", ["tail", "recreated"])
def test_a_log_that_ends_before_the_checkpoint_stops_the_worker_not_a_retry_loop(
        lost: str) -> None:
    """The broker lost records it had acknowledged (a development broker killed with kill -9)
    or the events topic was deleted and created again, under a checkpoint whose table was last
    written before its offset: one line, exit status 4 ("the checkpoint ... is ahead of the
    log", as ``_Stage._check_not_ahead`` says it), never a re-decision waiting for records
    that never come (``read_range``'s 120 s, retried for ever: what the adversarial review
    found before ``read_range`` checked the partition's end)."""
    from agents.kafka.checkpoints import CheckpointRefused

    s = _settings()
    log = _Log()
    w = _Worker(s, log)
    people = [_home(0, f"lost{i}") for i in range(5)]
    w.feed([_event(LEAVES[i % 3], ORIGIN + 1.0, people[i % 5]) for i in range(10)],
           arrival=ORIGIN + 1.5)
    w.commit(flush=True)  # the table written at offset 10
    w.feed([_event(LEAVES[i % 3], ORIGIN + 2.0, people[i % 5]) for i in range(10)],
           arrival=ORIGIN + 2.5)
    w.commit(flush=False)  # the checkpoint at offset 20
    if lost == "tail":
        del log.records(EVENTS)[14:]
    else:
        log.records(EVENTS).clear()
    st = w.fresh()
    st.restore(w.ckpt or b"", seq=1)
    loop = _FastClock()
    try:
        with pytest.raises(CheckpointRefused, match="ahead of the log"):
            loop.run_until_complete(_stage(s, log).after_restore(st, True))
    finally:
        loop.close()


def _three_periods(segments: list[list[tuple[int, bytes, float]]], who: str, seed: int
                   ) -> list[list[tuple[int, bytes, float]]]:
    """``segments`` with, in half the ticks, two events of ``who`` for the next two ticks
    (within max_future_skew_s): with periods of one tick the person holds three open periods,
    which moves the compact table to the dict ``Bounder`` — between two writes of the table,
    so a restore reads a table that fits the compact one again and re-decides on it."""
    import random

    rng = random.Random(seed)
    out = []
    for i, seg in enumerate(segments):
        seg = list(seg)
        start = ORIGIN + i * L
        if rng.random() < 0.5:
            for k in (1, 2):
                seg.insert(rng.randrange(len(seg) + 1),
                           (0, _event("a/x", start + k * L + 0.5, who), start + 1.0))
        out.append(seg)
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bounds", [dict(user_max_events=3, user_period_ticks=1),
                                    dict(user_max_events=2, user_period_ticks=1,
                                         user_min_separation_ticks=1)],
                         ids=["K3-T1", "K2-T1-b1"])
def test_kill9_across_the_move_to_the_dict_table_gives_the_straight_run(
        bounds: dict[str, int], seed: int) -> None:
    """The move to the dict table between two writes, kill -9 anywhere: the restore
    re-decides on the compact table what the live run decided on the dict one (and the other
    way round). Holds: the same sums, dead letters and table as the run without crashes."""
    from tests.unit.agents.ingest.test_user_level import _clock_future, _log

    s = _settings(**bounds)
    nasty = _home(0, "nasty")
    log = _three_periods(_clock_future(_log(seed + 20, nasty, ticks=14), nasty), nasty, seed)
    want_sums, want_dead, straight = _stage_run(s, log, seed, crashes=False)
    got_sums, got_dead, state = _stage_run(s, log, seed + 100, crashes=True)
    assert got_sums == want_sums
    assert sorted(got_dead) == sorted(want_dead)
    assert _table(state) == _table(straight)
