"""The per-person changelog's records (:mod:`agents.ingest.user_records`) and the compiled
table's own pass that writes them (``UserTable.changelog``, ``UserTable.digest_sum``,
agents/ingest/csrc/userlog.c): the encoding against an independent decoder, the tag against
tampering, and the compiled records and digest against the Python ones byte for byte, tagged,
over random traffic with closed periods."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.ingest import records as ingest_records
from agents.ingest.user_digest import TableDigest
from agents.ingest.user_records import ChangelogMac, decode_state, encode_state
from agents.ingest.users import UserState, record_bytes
from stream_dp.integrity import IntegrityError
from stream_dp.user_level import Bounder

KEY = b"k" * 32
CONTEXT = b'{"kind":"ingest checkpoint","partition":3}'

ints = st.integers(min_value=0, max_value=2**40)
leaves = st.one_of(st.integers(min_value=-(2**40), max_value=2**40),
                   st.lists(st.integers(min_value=-(2**20), max_value=2**20),
                            max_size=4).map(tuple))
states = st.tuples(ints, st.lists(st.tuples(ints, ints, st.dictionaries(leaves, ints,
                                                                         max_size=4)),
                                  max_size=3))


def _oracle_decode(value: bytes) -> Any:
    """An independent reading of the format in agents.ingest.user_records' docstring: bits
    by hand, a list of numbers first."""
    nums = []
    n = shift = 0
    for b in value[1:]:
        n += (b % 128) * 2**shift
        shift += 7
        if b < 128:
            nums.append(n)
            n = shift = 0
    it = iter(nums)

    def signed(z: int) -> int:
        return z // 2 if z % 2 == 0 else -(z + 1) // 2

    last_tick, periods = next(it), []
    for _ in range(next(it)):
        period, count, per_leaf = next(it), next(it), {}
        for _ in range(next(it)):
            kind = next(it)
            leaf = signed(next(it)) if kind == 0 else tuple(signed(next(it))
                                                            for _ in range(kind - 1))
            per_leaf[leaf] = next(it)
        periods.append((period, count, per_leaf))
    assert next(it, None) is None
    return value[0], last_tick, periods


@given(states)
@hsettings(max_examples=300, deadline=None)
def test_a_state_reads_back_as_written(state: Any) -> None:
    value = encode_state(state)
    assert decode_state(value) == state
    assert _oracle_decode(value) == (2, state[0], state[1])


@pytest.mark.parametrize("bad", [
    b"",                                   # empty
    b'[3,[[0,1,[]]]]',                     # the earlier preview's JSON form
    bytes.fromhex("0246010003"),           # ends inside a period
    bytes.fromhex("024601000300ff"),       # a byte past the end
    bytes.fromhex("02c60001000300"),       # 70 as 0xc6 0x00: not the shortest form
    bytes.fromhex("0246010003020002000201"),  # leaf 1 twice
])
def test_anything_else_is_refused(bad: bytes) -> None:
    with pytest.raises(ValueError):
        decode_state(bad)


def test_the_tag_binds_the_value_the_person_and_the_context() -> None:
    mac = ChangelogMac(KEY, CONTEXT)
    person, value = bytes(range(16)), encode_state((70, [(0, 3, {})]))
    sealed = mac.seal(person, value)
    assert mac.key is not None
    assert len(sealed) == len(value) + 32
    assert mac.open(person, sealed) == value
    expected = hashlib.blake2b(hashlib.blake2b(CONTEXT, digest_size=32).digest() + person
                               + value, digest_size=32, key=mac.key).digest()
    assert sealed[-32:] == expected
    flipped = bytearray(sealed)
    flipped[1] ^= 1
    for who, what, under in [
        (person, bytes(flipped), mac),                               # another count
        (bytes(16), sealed, mac),                                    # another person
        (person, sealed, ChangelogMac(KEY, CONTEXT + b" ")),         # another partition
        (person, sealed, ChangelogMac(b"j" * 32, CONTEXT)),          # another deployment
        (person, sealed[:-1], mac),                                  # cut
        (None, sealed, mac),                                         # a record without a key
    ]:
        with pytest.raises(IntegrityError):
            under.open(who, what)  # type: ignore[arg-type]
    assert ChangelogMac(None, CONTEXT).seal(person, value) == value  # tests only: untagged


class _Settings:
    user_field = "user"
    events_partitions = 1

    def __init__(self, k: int, t: int, b: int) -> None:
        self.user_max_events, self.user_period_ticks = k, t
        self.user_min_separation_ticks = b
        self.user_max_streams = 0
        self.user_max_events_per_stream = 0


fast = pytest.importorskip("agents.ingest._fastingest", reason="the compiled fast path did not build")


@pytest.mark.skipif(ingest_records._fastingest is None, reason="the compiled fast path")
@pytest.mark.parametrize(("k", "t", "b"), [(3, 4, 0), (2, 3, 1), (200, 1, 0), (5, 10**6, 2)])
def test_the_compiled_pass_writes_the_python_records_and_digest(k: int, t: int, b: int) -> None:
    rng = random.Random(k * 1000 + t)
    compact = UserState(_Settings(k, t, b), 0, KEY)
    ref = UserState(_Settings(k, t, b), 0, KEY)
    ref.bounder = Bounder(ref.bounds)
    compact.changelog = ref.changelog = True
    assert type(compact.bounder) is fast.UserTable
    mac = ChangelogMac(KEY, CONTEXT)
    tick, records, tombstones = 1, 0, 0
    for i in range(8000):
        if rng.random() < 0.01:
            tick += rng.randint(1, 3)
            compact.closed_before(tick)
            ref.closed_before(tick)
        obj = {"user": f"p{rng.randrange(400)}"}
        at = tick + rng.randrange(2)
        assert compact.decide_obj(obj, at, 0) == ref.decide_obj(obj, at, 0), i
        if rng.random() < 0.004 or i == 7999:
            got, want = compact.take_changes(mac), ref.take_changes(mac)
            assert got == want, i
            records += len(got)
            tombstones += sum(v is None for _, v in got)
            assert compact.digest.total == ref.digest.total
            # the whole sum, compiled, is the Python one over the export
            oracle = TableDigest(compact.digest.key, record_bytes)
            oracle.load((p, (lt, per)) for p, lt, per in ref.bounder.export())
            assert int.from_bytes(compact.bounder.digest_sum(compact.digest.key),
                                  "little") == oracle.total == compact.digest.total
    assert records > 500 and (tombstones > 0 or t == 10**6)


@pytest.mark.skipif(ingest_records._fastingest is None, reason="the compiled fast path")
def test_the_compiled_pass_refuses_bad_arguments() -> None:
    table = fast.UserTable(3, 4, 0)
    with pytest.raises(ValueError, match="context_hash"):
        table.changelog([], None, b"x" * 31, KEY)
    with pytest.raises(ValueError, match="digest_key"):
        table.changelog([], None, b"x" * 32, b"")
    with pytest.raises(TypeError, match="16-byte"):
        table.changelog([b"short"], None, b"x" * 32, KEY)
    assert table.changelog([], None, b"x" * 32, KEY) == ([], bytes(32))
