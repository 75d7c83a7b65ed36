"""The reconcile agent's bookkeeping without Kafka: decoding releases, assembling complete ticks,
resume offsets, and the histogram message (checked against its JSON Schema)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from agents.kafka.codec import count_message, encode, validate
from agents.reconcile.config import ReconcilerConfig
from agents.reconcile.messages import histogram_message
from agents.reconcile.ticks import CompleteTick, Release, TickAssembler

NAMES = ("all", "a", "b")


def rel(stream: str, tick: int, value: float = 1.0, stderr: float = 2.0) -> Release:
    return Release(stream, tick, float(tick), value, stderr)


def test_release_from_counts_message() -> None:
    msg = count_message(stream="a", tick=3, tick_start=2.0, tick_end=3.0, value=-1.25,
                        stderr=0.5, strategy="dm", p=0.9, privacy={"model": "pure", "epsilon": 1},
                        cap=1.0, horizon=7)
    assert Release.from_json(encode(msg)) == Release("a", 3, 3.0, -1.25, 0.5)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"{not json", "not JSON"),
        (b"[1]", "JSON object"),
        (b'{"stream": "a", "tick": 1, "tick_end": 1, "value": 1}', "lacks field 'stderr'"),
        (b'{"stream": 1, "tick": 1, "tick_end": 1, "value": 1, "stderr": 1}', "'stream'"),
        (b'{"stream": "a", "tick": 0, "tick_end": 1, "value": 1, "stderr": 1}', "'tick'"),
        (b'{"stream": "a", "tick": true, "tick_end": 1, "value": 1, "stderr": 1}', "'tick'"),
        (b'{"stream": "a", "tick": 1, "tick_end": 1, "value": "x", "stderr": 1}', "'value'"),
        (b'{"stream": "a", "tick": 1, "tick_end": 1, "value": 1, "stderr": -1}', "'stderr'"),
        (b'{"stream": "a", "tick": 1, "tick_end": 1, "value": 1, "stderr": NaN}',
         "'stderr'|not JSON"),
    ],
)
def test_invalid_counts_messages_rejected(raw: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Release.from_json(raw)


def test_ticks_complete_in_order_in_domain_order() -> None:
    a = TickAssembler(NAMES)
    a.add(0, 0, rel("b", 1, 3.0))
    a.add(1, 0, rel("all", 1, 5.0))
    a.add(0, 1, rel("b", 2))
    assert a.pop_complete() == []
    a.add(1, 1, rel("a", 1, 4.0))
    (t1,) = a.pop_complete()
    assert t1 == CompleteTick(1, 1.0, (5.0, 4.0, 3.0), (2.0, 2.0, 2.0))
    assert a.after_tick == 1 and a.pending_ticks == [2]


def test_old_ticks_and_duplicates_ignored_conflicts_counted() -> None:
    a = TickAssembler(NAMES, after_tick=4)
    a.add(0, 0, rel("a", 3))  # already published: ignored
    assert a.pending_ticks == []
    a.add(0, 1, rel("a", 5, 1.0))
    a.add(0, 2, rel("a", 5, 1.0))  # identical re-publication
    a.add(0, 3, rel("a", 5, 9.0))  # a conflicting one (must never happen): first value kept
    a.add(0, 4, rel("zzz", 5))     # not in the domain
    a.add(0, 5, rel("all", 5))
    a.add(0, 6, rel("b", 5))
    (t,) = a.pop_complete()
    assert t.noisy == (1.0, 1.0, 1.0)
    assert (a.conflicts, a.unknown_streams) == (1, 1)


def test_every_n_ticks() -> None:
    a = TickAssembler(NAMES, every=3)
    for tick in range(1, 7):
        for i, n in enumerate(NAMES):
            a.add(0, tick * 10 + i, rel(n, tick))
    assert [t.tick for t in a.pop_complete()] == [3, 6]


def test_incomplete_tick_older_than_a_complete_one_is_dropped() -> None:
    a = TickAssembler(NAMES)
    a.add(0, 0, rel("a", 1))
    for i, n in enumerate(NAMES):
        a.add(0, 10 + i, rel(n, 2))
    assert [t.tick for t in a.pop_complete()] == [2]
    assert list(a.dropped_ticks) == [1] and a.dropped == 1 and a.pending_ticks == []


def test_pending_ticks_are_bounded() -> None:
    a = TickAssembler(NAMES, max_pending=3)
    for tick in range(1, 6):  # "b" never arrives (its shard is down)
        a.add(0, tick, rel("all", tick))
        a.add(1, tick, rel("a", tick))
    assert a.pending_ticks == [3, 4, 5]
    assert list(a.dropped_ticks) == [1, 2]
    a.add(2, 0, rel("b", 1))  # a late release of a dropped tick is not buffered again
    assert a.pending_ticks == [3, 4, 5] and a.dropped == 3
    for tick in (3, 4, 5):
        a.add(2, tick, rel("b", tick))
    assert [t.tick for t in a.pop_complete()] == [3, 4, 5]


def test_resume_offsets_point_at_first_pending_message() -> None:
    a = TickAssembler(NAMES)
    for i, n in enumerate(NAMES):
        a.add(i % 2, 100 + i, rel(n, 1))
    a.add(0, 200, rel("a", 2))
    a.add(1, 150, rel("b", 2))
    assert [t.tick for t in a.pop_complete()] == [1]
    # Tick 2 is pending: partition 0 restarts at 200, partition 1 at 150; others where they are.
    assert a.resume_offsets({0: 202, 1: 151, 2: 7}) == {0: 200, 1: 150, 2: 7}


def test_a_given_index_assembles_the_same_ticks_as_one_built_from_the_names() -> None:
    index = {n: i for i, n in enumerate(NAMES)}
    built, given = TickAssembler(NAMES), TickAssembler(NAMES, index=index)
    assert given.index is index  # the caller's, not a copy (one per leadership at 10^7 names)
    for a in (built, given):
        for part, off, r in [(0, 0, rel("b", 1, 3.0)), (1, 0, rel("all", 1, 5.0)),
                             (1, 1, rel("a", 1, 4.0)), (0, 1, rel("zz", 1))]:
            a.add(part, off, r)
    assert built.pop_complete() == given.pop_complete() != []
    assert built.unknown_streams == given.unknown_streams == 1
    with pytest.raises(ValueError, match="every name its position"):
        TickAssembler(NAMES, index={"all": 0, "a": 1})


def test_assembler_validates_arguments() -> None:
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        TickAssembler(NAMES, every=0)
    with pytest.raises(ValueError, match="max_pending must be an integer >= 1"):
        TickAssembler(NAMES, max_pending=0)
    with pytest.raises(ValueError, match="distinct"):
        TickAssembler(("a", "a"))
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        ReconcilerConfig(bootstrap="x:1", every=0)
    with pytest.raises(ValueError, match="bootstrap"):
        ReconcilerConfig(bootstrap="")


@dataclass
class Result:
    values: np.ndarray
    iterations: int = 1
    residual: float = 0.0
    seconds: float = 0.001
    consistent: bool = True


def test_histogram_message_matches_schema_and_is_deterministic() -> None:
    tick = CompleteTick(7, 70.0, (5.0, 2.0, 2.5), (1.0, 1.0, 1.5))
    result = Result(np.array([4.75, 2.0, 2.75]))
    msg = histogram_message(NAMES, tick, result, "shop")
    validate("dp.histograms.v1", msg)
    assert msg["nodes"][2] == {"stream": "b", "value": 2.75, "noisy": 2.5, "stderr": 1.5}
    assert msg["domain"] == "shop" and msg["tick"] == 7 and msg["consistent"] is True
    again = histogram_message(NAMES, tick, Result(np.array([4.75, 2.0, 2.75])), "shop")
    assert encode(msg) == encode(again)
    assert json.loads(encode(msg)) == msg
    with pytest.raises(ValueError, match="solver returned 2 values for 3 nodes"):
        histogram_message(NAMES, tick, Result(np.array([1.0, 2.0])))
