"""Adversarial review of the bounded hand-over of a closed backlog (IngestState.unsent /
hand_over, agents/ingest/state.py) and of the ingest stage's commit protocol around it.

The worker model (:func:`_worker`) is the ingest stage's loop on the pure state: process a
batch, apply the closing points reached, hand over one more step of the backlog when no
partials wait, then *commit* (the partials, dead letters and schedule entries join what the
topics hold, the checkpoint becomes the one a restart reads) — or crash instead of committing
(everything since the last commit is lost; the next life restores the last checkpoint and
re-reads the log from its offset). Oracle: the same log on a state that hands everything over
at once and never crashes. Whatever the crash points, batch sizes and step size, the topics
must end up holding exactly the oracle's partials (each tick once per shard, same contents,
tick order), dead letters and closing points: nothing counted twice, nothing skipped.

The hostile records are forged CreateTime events whose event time *and* record timestamp lie
in ticks that are closed but not handed over yet (their buckets are still in memory and in
the checkpoint): they must be dead letters (``tick_closed``), never added to those buckets.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.ingest.records import Record
from agents.ingest.state import IngestState
from tests.unit.agents.ingest.test_schedule_properties import (
    _ROUTER,
    LEAVES,
    N_TICKS,
    ORIGIN,
    L,
    _marker,
    _payload,
    _settings,
)

#: the backlog: one closing point covering ticks 1..BACKLOG at once
BACKLOG = N_TICKS + 40


def _event(offset: int, leaf: str, ts: float, value: float = 1.0) -> Record:
    """A CreateTime event whose record timestamp (ms) is its own event time: not late by its
    own stamp, which a hostile producer chooses freely."""
    return Record(offset, b"k", _payload(leaf, ts, value), math.floor(ts * 1000), 0)


def _log(seed: int, markers: bool) -> tuple[list[Record], list[tuple[int, int]]]:
    """Honest events in ticks 1..N_TICKS, then (at offset ``k``) the backlog's closing point,
    then records a hostile writer appends while the backlog is handed over: events for the
    closed ticks (first, middle, last of the backlog) and for open ticks after it. Returns the
    log and the clock closes ``(through, offset)`` (empty on a markers deployment: its close
    is a marker record)."""
    import random

    rng = random.Random(seed)
    recs: list[Record] = []
    for _ in range(30):
        ts = rng.uniform(ORIGIN, ORIGIN + N_TICKS * L)
        recs.append(_event(len(recs), rng.choice(LEAVES), ts))
    closes: list[tuple[int, int]] = []
    if markers:
        # a final marker at the end of tick BACKLOG closes ticks 1..BACKLOG
        headers, raw = _marker(ORIGIN + BACKLOG * L - 0.5, True)
        recs.append(Record(len(recs), None, raw, 0, 0, headers))
    else:
        closes.append((BACKLOG, len(recs)))
    for tick in (1, 2, N_TICKS, N_TICKS + 1, BACKLOG // 2, BACKLOG - 1, BACKLOG, BACKLOG + 1,
                 BACKLOG + 2, BACKLOG + 2, 1):
        ts = ORIGIN + (tick - 1) * L + rng.uniform(0.1, L - 0.1)  # inside `tick`
        recs.append(_event(len(recs), rng.choice(LEAVES), ts, rng.choice([1.0, 0.5, 3.0])))
    if markers:
        headers, raw = _marker(ORIGIN + (BACKLOG + 3) * L - 0.5, True)
        recs.append(Record(len(recs), None, raw, 0, 0, headers))
    else:
        closes.append((BACKLOG + 3, len(recs)))
    return recs, closes


def _fresh(s: Any, limit: int | None, fast: bool) -> IngestState:
    state = IngestState(s, _ROUTER, 0, offset=0)
    state.hand_over_limit = limit
    state.use_fast_path = fast
    return state


def _oracle(s: Any, log: list[Record], closes: list[tuple[int, int]], fast: bool
            ) -> IngestState:
    """Everything at once, no crash: the reference."""
    state = _fresh(s, None, fast)
    for through, end in closes:
        state.schedule_close(through, end, "clock", ORIGIN + 5000.0)
    state.process_batch(log)
    state.advance_to(len(log))
    return state


def _worker(s: Any, log: list[Record], closes: list[tuple[int, int]], limit: int,
            batches: list[int], crashes: set[int], fast: bool, persisted: Sequence[Any] = ()
            ) -> tuple[list[bytes], list[tuple[int, str]], list[tuple[int, int]], int, int]:
    """The ingest stage's loop on one partition with crashes instead of commits at the loop
    iterations in ``crashes``. Returns what the topics hold: partials (encoded, in write
    order), dead letters ``(offset, reason)``, closing points ``(first, through)``, how many
    lives the worker had and how many of its crashes came with ticks still to hand over.
    ``persisted``: closing points already on the schedule topic (a fresh deployment following
    them: IngestStage.after_restore), read back at every start."""
    partials: list[bytes] = []
    dead: list[tuple[int, str]] = []
    entries: list[tuple[int, int]] = []
    ckpt: bytes | None = None
    lives = 0
    mid = 0

    def start() -> IngestState:
        nonlocal lives
        lives += 1
        state = _fresh(s, limit, fast)
        if ckpt is not None:
            state.restore(ckpt, lives)
            state.hand_over_limit = limit  # what IngestStage.new_state sets
        if persisted:  # IngestStage.after_restore: follow the persisted points
            state.load_known(list(persisted))
            if ckpt is None and state.known:
                state.range_start = state.offset = state.known[0].start_offset
        # the clock rule decides again what the checkpoint does not cover (same end offsets:
        # the log was complete before the worker started)
        for through, end in closes:
            state.schedule_close(through, end, "clock", ORIGIN + 5000.0)
        return state

    state = start()
    for it in range(10_000):
        size = batches[it % len(batches)] if batches else len(log)
        pos = state.offset
        state.process_batch(log[pos : pos + size])
        state.advance_to(min(len(log), pos + size))
        if state.unsent and not state.out.partials:  # IngestStage.handle: one more step
            state.hand_over(state.hand_over_limit)
        if it in crashes:  # SIGKILL before the transaction commits: its outputs are lost
            mid += bool(state.unsent)
            state = start()
            continue
        partials += [p.encode() for p in state.out.partials]
        dead += [(o, r.reason) for _, r, _, o in state.out.dead_letters]
        entries += [(e.first, e.through) for e in state.out.entries]
        ckpt = state.to_bytes()
        state.out.clear()
        state.dirty = False
        if state.offset >= len(log) and not state.unsent and not state.pending:
            break
    else:
        raise AssertionError("the worker never finished (a tick is never handed over)")
    return partials, dead, entries, lives, mid


@pytest.mark.parametrize("markers", [False, True], ids=["clock", "markers"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "pure"])
@hsettings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    limit=st.integers(1, 9),
    batches=st.lists(st.integers(1, 13), max_size=4),
    crashes=st.sets(st.integers(0, 40), max_size=8),
)
def test_adv_crashes_mid_hand_over_give_the_oracle_topics(
    tmp_path_factory: pytest.TempPathFactory, markers: bool, fast: bool, seed: int,
    limit: int, batches: list[int], crashes: set[int],
) -> None:
    """Crash (before a commit) at any loop iteration, any number of times, during a backlog's
    hand-over with hostile events for the closed-but-unsent ticks arriving meanwhile: the
    partials topic holds each tick's partials exactly once, equal to the all-at-once oracle;
    every hostile event for a closed tick is a dead letter exactly once."""
    s = _settings(tmp_path_factory.getbasetemp(), events_timestamp_type="CreateTime",
                  schedule="markers" if markers else "clock")
    log, closes = _log(seed, markers)
    ref = _oracle(s, log, closes, fast)
    want = [p.encode() for p in ref.out.partials]
    total = BACKLOG + 3
    assert ref.next_tick == total + 1 and not ref.unsent
    assert sorted({p.tick for p in ref.out.partials}) == list(range(1, total + 1))
    ref_dead = [(o, r.reason) for _, r, _, o in ref.out.dead_letters]
    # the hostile events for ticks 1..BACKLOG after the backlog's close are all tick_closed
    assert [r for _, r in ref_dead] == ["tick_closed"] * 8

    got, dead, entries, _, _ = _worker(s, log, closes, limit, batches, crashes, fast)
    assert got == want  # each tick once, same sums, tick order: nothing twice, nothing skipped
    assert dead == ref_dead
    assert entries == [(e.first, e.through) for e in ref.out.entries]


@pytest.mark.parametrize("markers", [False, True], ids=["clock", "markers"])
def test_adv_the_crash_model_does_crash_mid_hand_over(tmp_path: Path, markers: bool) -> None:
    """The property above is not vacuous: with a small step the model crashes while ticks
    still wait to be handed over, several times, and still ends with the oracle's topics."""
    s = _settings(tmp_path, events_timestamp_type="CreateTime",
                  schedule="markers" if markers else "clock")
    log, closes = _log(7, markers)
    ref = _oracle(s, log, closes, True)
    got, dead, _, lives, mid = _worker(s, log, closes, 2, [5, 9], {3, 5, 6, 9, 14, 20}, True)
    assert mid >= 4 and lives == 7
    assert got == [p.encode() for p in ref.out.partials]
    assert dead == [(o, r.reason) for _, r, _, o in ref.out.dead_letters]


def test_adv_an_event_for_a_closed_tick_waiting_hand_over_is_dead_lettered(tmp_path: Path
                                                                          ) -> None:
    """One forged event (CreateTime stamp = its event time, so not late by its own stamp) for
    a tick that is closed but whose partials are not handed over yet must not reach that
    tick's bucket (it is still in memory): its partials equal those without the event."""
    s = _settings(tmp_path, events_timestamp_type="CreateTime")
    honest = [_event(i, "a/x", ORIGIN + 1 + 3 * i) for i in range(10)]
    for fast in (True, False):
        a = _fresh(s, 1, fast)
        a.process_batch(honest)
        a.schedule_close(BACKLOG, len(honest), "clock", ORIGIN + 5000.0)
        a.apply_due()
        assert a.unsent and a.handed_over_through() == 1  # tick 2 not handed over yet
        assert 2 in a.buckets
        b = _fresh(s, 1, fast)
        b.restore(a.to_bytes(), 1)
        b.hand_over_limit = 1
        before = dict(b.buckets[2])
        b.process_batch([_event(len(honest), "a/x", ORIGIN + L + 1.0)])  # tick 2
        assert b.buckets[2] == before
        assert [r.reason for _, r, _, _ in b.out.dead_letters] == ["tick_closed"]
        assert b.dirty  # the dead letter is committed with the next transaction
        a.hand_over(None)
        b.hand_over(None)
        assert [p.encode() for p in b.out.partials] == [
            p.encode() for p in a.out.partials[len(a.out.partials) - len(b.out.partials):]]


def _unsealed(state: IngestState, unsent: list[list[Any]]) -> bytes:
    doc = json.loads(state.to_bytes())
    doc["unsent"] = unsent
    doc["v"] = 6 if unsent else 5
    return json.dumps(doc).encode()


def test_a_checkpoint_with_ticks_to_hand_over_is_version_6_so_an_older_worker_refuses_it(
    tmp_path: Path,
) -> None:
    """Workers from before the bounded hand-over read version 5 and ignore keys they do not
    know: given a checkpoint taken mid hand-over they would drop the closed ticks still to be
    handed over. Such a checkpoint is version 6 (which they refuse); one without is still 5,
    and a version that disagrees with the list is refused here too."""
    s = _settings(tmp_path, events_timestamp_type="CreateTime")
    a = _fresh(s, None, True)
    a.process_batch([_event(i, "a/x", ORIGIN + 1 + 3 * i) for i in range(10)])
    assert json.loads(a.to_bytes())["v"] == 5
    a.hand_over_limit = 1
    a.schedule_close(BACKLOG, 10, "clock", ORIGIN + 5000.0)
    a.apply_due()
    assert a.unsent
    doc = json.loads(a.to_bytes())
    assert doc["v"] == 6 and doc["unsent"]
    b = IngestState(s, _ROUTER, 0)
    b.restore(a.to_bytes(), 1)
    assert b.unsent == a.unsent
    for v, unsent in ((5, doc["unsent"]), (6, [])):
        bad = dict(doc, v=v, unsent=unsent)
        with pytest.raises(ValueError, match="version 6"):
            IngestState(s, _ROUTER, 0).restore(json.dumps(bad).encode(), 1)


@pytest.mark.parametrize("unsent", [
    [[3, 5, 0.0], [4, 6, 0.0]],  # overlapping: ticks 4, 5 would be handed over twice
    [[5, 6, 0.0], [2, 3, 0.0]],  # out of order: handed_over_through() would say 4
    [[2, 3, 0.0], [2, 3, 0.0]],  # the same range twice
    [[2, 3, math.nan]],  # a decided_at that is not a time
])
def test_adv_restore_refuses_an_inconsistent_list_of_ticks_to_hand_over(
    tmp_path: Path, unsent: list[list[Any]],
) -> None:
    """A checkpoint whose ``unsent`` ranges overlap, repeat or are out of tick order would
    hand some ticks over twice (a second, empty partial: the bucket was popped) or make the
    release stage's "state ahead of the log" check (handed_over_through) read the wrong tick.
    Sealed checkpoints cannot be forged without the noise key, so this is defence in depth:
    restore checks the ranges as strictly as it checks that they are closed."""
    s = _settings(tmp_path, events_timestamp_type="CreateTime")
    state = _fresh(s, None, True)
    state.schedule_close(8, 0, "clock", ORIGIN + 5000.0)
    state.apply_due()
    assert state.next_tick == 9
    with pytest.raises(ValueError, match="hand over"):
        IngestState(s, _ROUTER, 0).restore(_unsealed(state, unsent), 1)
    # the consistent form of the same ticks is accepted
    IngestState(s, _ROUTER, 0).restore(_unsealed(state, [[2, 3, 0.0], [5, 6, 0.0]]), 1)


@pytest.mark.parametrize("markers", [False, True], ids=["clock", "markers"])
@hsettings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    limit=st.integers(1, 9),
    batches=st.lists(st.integers(1, 13), max_size=4),
    crashes=st.sets(st.integers(0, 40), max_size=8),
)
def test_adv_following_persisted_points_with_crashes_mid_hand_over(
    tmp_path_factory: pytest.TempPathFactory, markers: bool, seed: int, limit: int,
    batches: list[int], crashes: set[int],
) -> None:
    """A fresh deployment following the persisted closing points of the log (the backlog's
    one point included) hands the backlog over in steps and may crash anywhere: it writes no
    closing point again and its partials topic equals the oracle's."""
    s = _settings(tmp_path_factory.getbasetemp(), events_timestamp_type="CreateTime",
                  schedule="markers" if markers else "clock")
    log, closes = _log(seed, markers)
    ref = _oracle(s, log, closes, True)
    got, dead, entries, _, _ = _worker(s, log, closes, limit, batches, crashes, True,
                                       persisted=ref.out.entries)
    assert got == [p.encode() for p in ref.out.partials]
    assert dead == [(o, r.reason) for _, r, _, o in ref.out.dead_letters]
    assert entries == []  # followed, not written again


class _FakeConsumer:
    """end_offsets/position of a consumer that has read every partition to its end."""

    def __init__(self, ends: dict[Any, int]) -> None:
        self.ends = ends

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.ends.get((tp.topic, tp.partition), 0) for tp in tps}

    async def position(self, tp: Any) -> int:
        return self.ends.get((tp.topic, tp.partition), 0)


def _release_stage(ingest_state: IngestState, tick: int) -> tuple[Any, list[BaseException]]:
    """A ReleaseStage (no Kafka) whose shard 0 waits for tick ``tick`` from events partition 0,
    owned by this worker's ingest stage with ``ingest_state``."""
    from types import SimpleNamespace

    from agents.release.stage import ReleaseStage

    failed: list[BaseException] = []
    ingest = SimpleNamespace(states={0: ingest_state}, topic="events",
                             consumer=_FakeConsumer({("events", 0): ingest_state.offset}))
    stage = object.__new__(ReleaseStage)
    stage.topic = "partials"
    stage.states = {0: SimpleNamespace(next_tick=tick, pending={tick: {1: object()}})}
    stage.consumer = _FakeConsumer({("partials", 0): 7})
    stage.w = SimpleNamespace(ingest=ingest, release_error=lambda reason: None,
                              fail=failed.append)
    return stage, failed


def test_adv_partials_in_an_uncommitted_hand_over_step_are_not_a_lost_log(tmp_path: Path
                                                                         ) -> None:
    """Race: the release stage has waited stall_timeout_s for tick T from events partition 0
    (its previous owner died mid hand-over); this worker has just restored it and handed tick
    T over *in memory* — the transaction with those partials is still being sent (the release
    stage runs between its awaits). The release stage's check (``_lost_records``) read the
    in-memory hand-over and stopped the worker (exit 4, "the broker lost records it had
    acknowledged") although nothing was lost. Only a committed hand-over says the partials
    were written."""
    import asyncio

    s = _settings(tmp_path, events_timestamp_type="CreateTime")
    state = _fresh(s, 4, True)
    state.schedule_close(BACKLOG, 0, "clock", ORIGIN + 5000.0)
    state.apply_due()  # ticks 1..4 handed over in memory, their transaction not committed
    assert state.out.partials and state.handed_over_through() == 4
    stage, failed = _release_stage(state, 3)
    assert asyncio.run(stage._lost_records([0], 3)) is False
    assert failed == []
    # once that step is committed and the partials are still not there, the log lost them
    state.mark_written()
    stage, failed = _release_stage(state, 3)
    assert asyncio.run(stage._lost_records([0], 3)) is True
    assert "ahead of the log" in str(failed[0])
    # a restored state's checkpoint says what was written
    again = IngestState(s, _ROUTER, 0)
    again.restore(state.to_bytes(), 2)
    assert again.written_through == 4


@pytest.mark.parametrize("schedule", ["clock", "markers"])
def test_adv_a_batch_of_one_hostile_header_record_is_committed(tmp_path: Path, schedule: str
                                                               ) -> None:
    """A hostile writer's record carrying the close header (on a clock deployment: not
    schedule input; on a markers deployment: signed with a key it guesses) is the whole batch.
    The marker branch moves the offset itself, so before the dirty fix the batch left the state
    clean: its dead letter and offset waited in memory, uncommitted, until something else
    happened — the worker skipped dead-lettering it as long as the writer sent only these."""
    from agents.kafka.codec import close_marker
    from tests.unit.agents.ingest.test_schedule_properties import FORGED_KEY, TOPIC

    s = _settings(tmp_path, schedule=schedule)
    headers, raw = close_marker(ORIGIN + 25.0, True, mac_key=FORGED_KEY, topic=TOPIC,
                                partition=0)
    state = _fresh(s, None, True)
    state.process_batch([Record(0, None, raw, int(ORIGIN * 1000), 0, headers)])
    assert [r.reason for _, r, _, _ in state.out.dead_letters] in (
        ["unexpected_marker"], ["forged_marker"])
    assert state.offset == 1 and state.dirty and state.next_tick == 1
