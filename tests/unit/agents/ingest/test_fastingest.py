"""The compiled ingest fast path (``agents.ingest._fastingest``) against the pure-Python path.

The pure path of :meth:`agents.ingest.state.IngestState.process_batch` is authoritative. The compiled
scanner handles only records it is sure about and hands every other record back, so both paths
must leave *identical* state for every input: open buckets (integer units), running digest,
offset, next tick, closing points (pending, applied, persisted entries), dead letters with their
reasons and details, counters, partials and the checkpoint bytes. The property test below
drives both with nasty logs (malformed JSON, escapes and non-ASCII in keys, duplicate and extra
members, numbers such as 1e400, -0.0, 1.0000000000000002, huge integers, NaN tokens, odd
whitespace, headers, authentic and forged close markers, LogAppendTime and CreateTime records,
missing timestamps), random batch splits, clock closing points, a checkpoint/restore in the
middle and a second run that follows the persisted closing points.

That an event's fate depends only on its own record and the public closing points is the pure
path's property (tests/unit/agents/ingest/test_schedule_properties.py); equality with the pure path carries
it over to the compiled one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.config.settings import Settings
from agents.ingest import records as ingest_records
from agents.ingest.digest import _UNKEYED, record_digest
from agents.ingest.records import _NO_STOP, FAST_PATH_STATUS, Record
from agents.ingest.routing import Router
from agents.ingest.schedule import ScheduleMismatch
from agents.ingest.state import IngestState
from agents.kafka.codec import close_marker, marker_key
from stream_dp.domain import Domain

fast = pytest.importorskip("agents.ingest._fastingest", reason="the compiled fast path did not build")
pytestmark = pytest.mark.skipif(ingest_records._fastingest is None, reason=FAST_PATH_STATUS)

ORIGIN = 1_000_000.0
L = 10.0
N_TICKS = 6
LEAVES = ["a/x", "a/y", "b/z", "é/ü", "c/🙂"]
_ROUTER = Router(Domain.from_paths(LEAVES), 2)
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "250"))


def _settings(tmp: Path, **kw: Any) -> Settings:
    base: dict[str, Any] = dict(
        origin=ORIGIN, tick_seconds=L, allowed_lateness_s=2.0, close_grace_s=0.5,
        domain_file=str(tmp / "d.toml"), events_partitions=1, shards=2, cap=1.0,
        max_future_skew_s=30.0,
    )
    base.update(kw)
    return Settings(**base)


# ---------------------------------------------------------------------------- the digest


@pytest.mark.parametrize("key_len", [0, 1, 16, 32, 64])
def test_vendored_blake2b_matches_hashlib(key_len: int) -> None:
    for n in [*range(0, 260), 511, 512, 1000, 4096]:
        key = bytes((7 * i + key_len) % 256 for i in range(key_len))
        data = bytes((i * 31 + n) % 256 for i in range(n))
        for size in (16, 32, 64):
            want = hashlib.blake2b(data, key=key, digest_size=size).digest()
            assert fast.blake2b(key, data, size) == want, (n, size)


# ---------------------------------------------------------------------------- the parser


@pytest.mark.parametrize("raw,expected", [
    (b'{"key": "a/x", "ts": 1000001.5, "value": 2}', ("a/x", 1000001.5, 2.0)),
    (b'{"ts":1,"key":"a/x"}', ("a/x", 1.0, 1.0)),
    (b' \t\n{ "value" : 0.5 , "key" : "\xc3\xa9/\xc3\xbc" , "ts" : 1e6 }\r\n',
     ("é/ü", 1e6, 0.5)),
    (b'{"key": "a/x", "ts": -0.0, "value": 1.0000000000000002}',
     ("a/x", -0.0, 1.0000000000000002)),
    # other members with plain values: ignored by the pure path, skipped here
    (b'{"user": "u1", "key": "a/x", "ts": 1, "n": null, "t": true, "f": false, "x": -2.5e3,'
     b' "\xc3\xa9": "\xc3\xbc", "": ""}', ("a/x", 1.0, 1.0)),
    (b'{"key": "a/x", "ts": 1, "extra": 0}', ("a/x", 1.0, 1.0)),
])
def test_strict_parser_takes_the_plain_shape(raw: bytes, expected: tuple[str, float, float]
                                             ) -> None:
    got = fast.parse_event(raw)
    assert got == expected
    assert math.copysign(1.0, got[1]) == math.copysign(1.0, expected[1])


@pytest.mark.parametrize("raw", [
    b'{"key": "a\\u002fx", "ts": 1}',  # an escape: the pure path decides
    b'{"key": "a/x", "key": "a/y", "ts": 1}',  # duplicate member
    b'{"key": "a/x", "ts": 1, "extra": [0]}', b'{"key": "a/x", "ts": 1, "extra": {}}',
    b'{"key": "a/x", "ts": 1, "extra": NaN}', b'{"key": "a/x", "ts": 1, "extra": 1e400}',
    b'{"key": "a/x", "ts": 1, "extra": "\\n"}', b'{"key": "a/x", "ts": 1, "extra": "\xff"}',
    b'{"key": "a/x", "ts": 1, "extra": "a\x01"}', b'{"key": "a/x", "ts": 1, "e\x01": 0}',
    b'{"key": "a/x", "ts": 1, "\xed\xa0\x80": 0}', b'{"key": "a/x", "ts": 1, "extra": tru}',
    b'{"key": "a/x", "ts": 1, "extra": nulll}', b'{"key": "a/x", "ts": 1, "extra": 01}',
    b'{"key": "a/x", "ts": 1, "extra":}',
    b'{"key": "a/x", "ts": NaN}', b'{"key": "a/x", "ts": Infinity}',
    b'{"key": "a/x", "ts": 1e400}', b'{"key": "a/x", "ts": 1e-400}',
    b'{"key": "a/x", "ts": 123456789012345678901234567890}',
    b'{"key": "a/x", "ts": 01}', b'{"key": "a/x", "ts": +1}', b'{"key": "a/x", "ts": .5}',
    b'{"key": "a/x", "ts": 1.}', b'{"key": "a/x", "ts": 1, }', b'{"key": "a/x", "ts": 1} x',
    b'{"key": "a/x", "ts": 1', b'{"key": "a/x"}', b'{"ts": 1}', b'{}', b'[]', b'',
    b'{"key": "a/x", "ts": true}', b'{"key": "a/x", "ts": "1"}', b'{"key": 1, "ts": 1}',
    b'{"key": "a\x01x", "ts": 1}', b'{"key": "\xff", "ts": 1}', b'{"key": "\xed\xa0\x80", "ts": 1}',
    b'\xef\xbb\xbf{"key": "a/x", "ts": 1}', b'{"key": "a/x",\x0b"ts": 1}',
    b'{"key": "a/x", "ts": 1.00000000000000000001}',
])
def test_strict_parser_leaves_every_doubt_to_the_pure_path(raw: bytes) -> None:
    assert fast.parse_event(raw) is None


def test_scanner_accepts_plain_events(tmp_path: Path) -> None:
    """The fast path is really taken for the plain shape (else the property test below would
    compare the pure path with itself)."""
    s = _settings(tmp_path, schedule="markers")
    state = IngestState(s, _ROUTER, 0, offset=0)
    state.clock = lambda: ORIGIN + 1e6
    scanner = state._fast_scanner()
    assert scanner is not None
    recs = [Record(i, b"k", json.dumps({"key": "a/x", "ts": ORIGIN + i, "value": 1.0}).encode(),
                   -1, 0, ()) for i in range(5)]
    end, added, accepted, clamped, _bounded = scanner.scan(recs, 0, 1, _NO_STOP, math.inf, False,
                                                 {}, _ROUTER.declared)
    assert (end, accepted, clamped) == (5, 5, 0)
    want = sum(record_digest(state._dkey, r.offset, -1, 0, r.key, r.value) for r in recs)
    assert added == want % (1 << 128)


def test_a_leaf_with_many_events_in_one_scan_sums_them_all(tmp_path: Path) -> None:
    """Repeated leaves inside one scan call, values equal (the scanner shares one int object
    for a leaf's first sum: a repeat must still add) and different, against exact sums."""
    s = _settings(tmp_path, schedule="markers")
    state = IngestState(s, _ROUTER, 0, offset=0)
    scanner = state._fast_scanner()
    keys = ["a/x", "a/x", "b/z", "a/x", "b/z", "a/y"]
    values = [1.0, 1.0, 0.5, 0.25, 0.5, 1.0]
    recs = [Record(i, None, json.dumps({"key": k, "ts": ORIGIN + 1.0, "value": v}).encode(),
                   -1, 0, ()) for i, (k, v) in enumerate(zip(keys, values, strict=True))]
    buckets: dict[int, dict[Any, int]] = {}
    end, _added, accepted, _clamped, _bounded = scanner.scan(recs, 0, 1, _NO_STOP, math.inf,
                                                   False, buckets, _ROUTER.declared)
    u = 1 << 23  # units of 1.0 (cap 1.0)
    leaf = _ROUTER.declared
    assert (end, accepted) == (6, 6)
    assert buckets == {1: {leaf["a/x"]: u + u + u // 4, leaf["b/z"]: u, leaf["a/y"]: u}}


# ---------------------------------------------------------------------------- nasty logs

_LEAF = st.sampled_from(LEAVES)
_KEYS = st.one_of(
    _LEAF, _LEAF, _LEAF,
    st.sampled_from(["nope", "", "a/x ", "A/X", "a\\u002fx", "\\u00e9/\\u00fc", "a/\\ud800",
                     "x" * 1025, "a/x\\n", "\\\"", "a/\x7fx"]),
    st.text(max_size=6),
)


def _num_text(x: float) -> st.SearchStrategy[str]:
    """Spellings of (about) ``x`` as JSON numbers and not-quite-numbers."""
    return st.one_of(
        st.just(repr(x)), st.just(repr(x)), st.just(repr(x)),
        st.just(str(int(x))), st.just(f"{x:.17g}"), st.just(f"{x:e}"), st.just(f"{x:E}"),
        st.just(f"{x / 1e6!r}e6"), st.just(f"{x / 1e6!r}E+6"), st.just(f"{x * 1e3!r}e-3"),
        st.just(f"{x:.25f}"), st.just(repr(-x)),
    )


_ODD_NUMBERS = st.sampled_from([
    "1e400", "-1e400", "1e-400", "-0.0", "-0", "0", "0.0", "1.0000000000000002", "1e308",
    "2.2250738585072014e-308", "4.9e-324", str(2**64), str(2**53 + 1), str(10**30), "NaN",
    "Infinity", "-Infinity", "nan", "01", "+1", ".5", "1.", "1e", "1e+", "0x10", "1_0", "١",
    "true", "null", '"1"', "[1]", "{}", "1" * 16, "1" * 15, "9" * 17 + ".0", "0." + "0" * 20 + "1",
    "1.5e-3", "100000000000000000000e-20",
])
_WS = st.sampled_from(["", " ", "\n", "\t ", "\r\n"] * 8 + ["\x0b", "\xa0", "\u2028"])


@st.composite
def _payload(draw: st.DrawFn, arrival: float) -> bytes:
    kind = draw(st.sampled_from(["plain"] * 12 + ["odd", "odd", "binary", "mutated", "json"]))
    if kind == "binary":
        return draw(st.binary(max_size=40))
    if kind == "json":
        obj = {"key": draw(_LEAF), "ts": arrival - draw(st.floats(-5, 40)),
               "value": draw(st.sampled_from([1.0, 0.5, 3.0, 1, 0]))}
        return json.dumps(obj, ensure_ascii=draw(st.booleans())).encode()
    ts = arrival - draw(st.one_of(st.floats(0, 2), st.floats(0, 2), st.floats(-5, 40),
                                  st.sampled_from([0.0, 1e6, -1e6])))
    ts_text = draw(st.one_of(_num_text(ts), _ODD_NUMBERS) if kind == "odd" else _num_text(ts))
    v = draw(st.sampled_from([1.0, 0.5, 3.0, 0.1, 1e-9, 7e5, 2e6, 0.0]))
    v_text = draw(st.one_of(_num_text(v), _ODD_NUMBERS) if kind == "odd" else _num_text(v))
    members = [("key", draw(_KEYS) if draw(st.integers(0, 9)) == 9  # unquoted: malformed
                else json.dumps(draw(_KEYS), ensure_ascii=draw(st.booleans()))),
               ("ts", ts_text)]
    if draw(st.integers(0, 4)) < 4:
        members.append(("value", v_text))
    if kind == "odd":
        if draw(st.booleans()):
            members.append((draw(st.sampled_from(["key", "ts", "value", "extra", "k\\u0065y",
                                                  "user", "", "\u00e9", "e\x01", "\udc80"])),
                            draw(st.one_of(
                                st.sampled_from(['"a/y"', "1", "2.5", "null", "[]", "true",
                                                 "false", "tru", '"\\n"', '"a\x01"',
                                                 '"\udc80"', '"\u00fc"', '{"key": "a/y"}']),
                                _ODD_NUMBERS))))
        members = draw(st.permutations(members))
    ws = draw(_WS)
    body = "{" + ws + ("," + ws).join(f'"{k}"{ws}:{ws}{v}' for k, v in members) + ws + "}"
    raw = (draw(_WS) + body + draw(_WS)).encode("utf-8", "surrogatepass")
    if kind == "mutated" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + draw(st.binary(min_size=0, max_size=2)) + raw[at + 1:]
    return raw


@st.composite
def _record(draw: st.DrawFn, offset: int, markers: bool, v0: bool = False
            ) -> tuple[Record, float]:
    """One record; ``v0``: possibly a message-format v0 record (no timestamp at all, which a
    v2 record batch cannot hold: only for the record-object paths)."""
    arrival = draw(st.floats(ORIGIN - 20, ORIGIN + N_TICKS * L + 20))
    ts_type: Any = draw(st.sampled_from([0, 0, 1]))
    stamp = draw(st.sampled_from(["arrival"] * 12 + ["none", "far", "zero"]
                                 + (["v0"] if v0 else [])))
    ms: Any = {"arrival": math.floor(arrival * 1000), "none": -1, "far": 9_900_000_000_000,
               "zero": 0, "v0": None}[stamp]
    if stamp == "v0":  # message format v0: aiokafka gives timestamp and type None (issue #32)
        ts_type = None
    key = draw(st.sampled_from([b"k", b"k", None, b"", b"\xff" * 3]))
    headers: list[tuple[str, bytes | None]] = []
    h = 20 - draw(st.integers(0, 20))  # hypothesis favours small draws: 20 = no headers
    if h == 0:
        headers = [("x-trace", b"1")]
    elif h == 1:
        headers = [("x-empty", None)]
    elif h == 2:
        headers, raw = close_marker(draw(st.floats(ORIGIN, ORIGIN + N_TICKS * L + 10)),
                                    draw(st.booleans()), mac_key=marker_key(_UNKEYED),
                                    topic="dp.events.v1", partition=0)
        return Record(offset, key, raw, ms, ts_type, headers), arrival
    elif h == 3:
        headers = [("stream-dp-close", b"1")]  # a forged marker around any payload
    value: bytes | None
    if draw(st.integers(0, 2)) < 2:  # an honest event (on time, or nearly), as producers write
        value = json.dumps({"key": draw(_LEAF), "ts": arrival - draw(st.floats(0, 3)),
                            "value": draw(st.sampled_from([1.0, 0.5, 3.0, 1, 2]))},
                           ensure_ascii=draw(st.booleans())).encode()
    else:
        value = draw(_payload(arrival)) if draw(st.integers(0, 30)) < 30 else None
    return Record(offset, key, value, ms, ts_type, headers), arrival


@st.composite
def _case(draw: st.DrawFn, v0: bool = False) -> dict[str, Any]:
    markers = draw(st.booleans())
    cfg: dict[str, Any] = {"schedule": "markers" if markers else "clock",
                           "events_timestamp_type": draw(st.sampled_from(
                               ["LogAppendTime", "CreateTime"])),
                           "max_event_age_s": draw(st.sampled_from([0.0, 0.0, 15.0])),
                           "max_message_bytes": draw(st.sampled_from([4096] * 5 + [40])),
                           "max_event_value": draw(st.sampled_from([1e6, 2.0])),
                           "max_events_per_tick": draw(st.sampled_from([10_000, 2]))}
    cap = draw(st.sampled_from([1.0, 1.0, 0.3, 2.0]))
    if draw(st.integers(0, 4)) == 0:
        cfg["strategy"], cap = "naive-int", 2.0
    cfg["cap"] = cap
    n = draw(st.integers(0, 50))
    recs = [draw(_record(i, markers, v0)) for i in range(n)]
    closes = sorted(draw(st.lists(st.tuples(st.integers(1, N_TICKS + 2), st.integers(0, n)),
                                  max_size=4)))
    splits = draw(st.lists(st.integers(1, 20), max_size=4))
    restart = draw(st.one_of(st.none(), st.integers(0, 4)))
    rewind = draw(st.integers(0, 3))
    clock = draw(st.sampled_from([ORIGIN + 200.0, ORIGIN + 25.0, ORIGIN - 100.0]))
    return {"cfg": cfg, "log": [r for r, _ in recs], "closes": closes, "splits": splits,
            "restart": restart, "rewind": rewind, "clock": clock}


def _snapshot(state: IngestState) -> dict[str, Any]:
    out = state.out
    return {
        "offset": state.offset, "next_tick": state.next_tick, "digest": state.digest,
        "range_start": state.range_start, "pending": list(state.pending),
        "known": list(state.known), "buckets": {t: dict(b) for t, b in state.buckets.items()},
        "dead": [(k, r.reason, r.detail, v, o) for k, r, v, o in out.dead_letters],
        "partials": list(out.partials), "entries": list(out.entries),
        "counters": (out.accepted, out.clamped, out.late, out.ticks_closed),
        "checkpoint": state.to_bytes(), "dirty": state.dirty,
    }


def _drive(s: Settings, case: dict[str, Any], use_fast: bool,
           known: list[Any] | None = None) -> tuple[IngestState, Any]:
    """Run the log through one state; returns the state and an outcome tag (or the error)."""
    log: list[Record] = case["log"]

    def new_state() -> IngestState:
        st_ = IngestState(s, _ROUTER, 0, offset=0)
        st_.use_fast_path = use_fast
        st_.clock = lambda: case["clock"]
        return st_

    state = new_state()
    try:
        if known is not None:
            state.load_known(known)
        for n, end in case["closes"]:
            state.schedule_close(n, end, "clock", ORIGIN + n * L)
        i = 0
        for k, size in enumerate([*case["splits"], len(log)]):
            lo = max(0, i - case["rewind"])  # a re-delivery of records already processed
            state.process_batch(log[lo:i + size])
            i += size
            if case["restart"] == k:  # a checkpoint, a restart, the same closing points
                blob, seq, pending = state.to_bytes(), state.seq, list(state.pending)
                old_out = state.out
                state = new_state()
                state.restore(blob, seq)
                state.out = old_out
                if known is not None:
                    state.load_known([e for e in known if e.through >= state.next_tick])
                else:
                    state.pending = pending
            if i >= len(log):
                break
        state.advance_to(len(log))
    except ScheduleMismatch as exc:
        return state, ("mismatch", str(exc))
    return state, "ok"


def _compare(s: Settings, case: dict[str, Any], known: list[Any] | None = None
             ) -> list[Any]:
    pure, pure_tag = _drive(s, case, use_fast=False, known=known)
    compiled, fast_tag = _drive(s, case, use_fast=True, known=known)
    assert fast_tag == pure_tag
    assert _snapshot(compiled) == _snapshot(pure)
    return list(pure.out.entries)


@hsettings(max_examples=EXAMPLES, deadline=None,
           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=_case(v0=True))
def test_compiled_and_pure_paths_leave_identical_state(case: dict[str, Any], tmp_path_factory:
                                                       pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.getbasetemp()
    s = _settings(tmp, **case["cfg"])
    entries = _compare(s, case)
    if entries:
        # Following the persisted closing points (a restart or a replay): the same log is
        # reproduced; a changed log (one record's payload replaced) is refused the same way.
        _compare(s, case, known=entries)
        log = list(case["log"])
        if log:
            r = log[len(log) // 2]
            log[len(log) // 2] = r._replace(value=(r.value or b"") + b" ")
            _compare(s, {**case, "log": log}, known=entries)


def test_fast_path_status_is_one_line() -> None:
    assert "\n" not in FAST_PATH_STATUS
    assert FAST_PATH_STATUS.startswith("ingest: ")


@pytest.mark.parametrize("schedule", ["clock", "markers"])
def test_a_record_without_a_timestamp_is_dead_lettered_never_a_crash(
        schedule: str, tmp_path: Path) -> None:
    """Issue #32: aiokafka yields ``timestamp=None`` (and ``timestamp_type=None``) for
    message-format v0 records; both paths divided it by 1000. On the clock schedule such a
    record is dead-lettered ``no_timestamp`` like one stamped -1 (its arrival cannot be
    checked); on the markers schedule arrivals are not used and the event counts. The compiled
    and the pure path leave the same state, and the records around it are unaffected."""
    s = _settings(tmp_path, schedule=schedule)
    arrival_ms = math.floor((ORIGIN + 3.0) * 1000)

    def event(offset: int, ms: Any, ts_type: Any) -> Record:
        value = json.dumps({"key": "a/x", "ts": ORIGIN + 2.0, "value": 1.0}).encode()
        return Record(offset, b"k", value, ms, ts_type, ())

    log = [event(0, arrival_ms, 0), event(1, None, None), event(2, arrival_ms, 0)]
    case = {"cfg": {}, "log": log, "closes": [], "splits": [1], "restart": None, "rewind": 0,
            "clock": ORIGIN + 4.0}
    _compare(s, case)
    state, tag = _drive(s, case, use_fast=True)
    assert tag == "ok"
    dead = [(o, r.reason) for _, r, _, o in state.out.dead_letters]
    if schedule == "clock":
        assert dead == [(1, "no_timestamp")] and state.out.accepted == 2
        # the same fate as a record stamped -1 (no timestamp in a newer format)
        minus_one, _ = _drive(s, {**case, "log": [log[0], event(1, -1, 0), log[2]]}, True)
        assert _snapshot(minus_one) == _snapshot(state)
    else:
        assert dead == [] and state.out.accepted == 3
