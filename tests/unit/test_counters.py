"""CounterBank / DecayedCounter: Monte-Carlo MSE vs the exact analytics, replay, checkpoints, validation."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stream_dp import CounterBank, DecayedCounter
from stream_dp.budget import PureDP
from stream_dp.integrity import IntegrityError, seal, unseal
from stream_dp.planner import make_mechanism

KEY = bytes(range(32))
STRATEGIES = ("naive", "dm", "dmfda", "fenwick-opt")


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_CACHE_DIR", str(tmp_path))


def test_decayed_counter_replays_bit_identically_and_keys_matter() -> None:
    counts = [3, 0, 1, 7, 2, 0, 0, 5]
    a = DecayedCounter(p=0.9, epsilon=1.0, strategy="dmfda", horizon=7, key=KEY, name="x")
    b = DecayedCounter(p=0.9, epsilon=1.0, strategy="dmfda", horizon=7, key=KEY, name="x")
    c = DecayedCounter(p=0.9, epsilon=1.0, strategy="dmfda", horizon=7, key=bytes(32), name="x")
    d = DecayedCounter(p=0.9, epsilon=1.0, strategy="dmfda", horizon=7, key=KEY, name="y")
    ra = [a.update(x) for x in counts]
    assert ra == [b.update(x) for x in counts]
    assert ra != [c.update(x) for x in counts]
    assert ra != [d.update(x) for x in counts]
    assert all(isinstance(x, float) for x in ra)
    assert a.tick == len(counts) and a.strategy == "dmfda"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_checkpoint_round_trip_continues_bit_identically(strategy: str) -> None:
    names = ["shop/a", "shop/b", "web/ü"]
    mech = make_mechanism(strategy, 1.0, 4, PureDP(0.5), cap=2.0)  # p = 1: epochs of 4, 8, 16, ...
    bank = CounterBank(mech, names, KEY)
    rng = np.random.default_rng(5)
    D = rng.uniform(0, 2, (30, 3))
    for t in range(13):
        bank.step(D[t])
    blob = bank.to_bytes()
    assert KEY not in blob
    for n in names:
        assert n.encode() in blob
    restored = CounterBank.from_bytes(blob, KEY)
    assert restored.tick == 13 and restored.names == tuple(names)
    assert restored.mechanism.name == strategy and restored.mechanism.cap == 2.0
    np.testing.assert_array_equal(restored.releases, bank.releases)
    for t in range(13, 30):
        np.testing.assert_array_equal(restored.step(D[t]), bank.step(D[t]))


def test_noise_of_a_stream_does_not_depend_on_the_bank() -> None:
    mech = make_mechanism("dm", 0.8, 15, PureDP(1.0))
    big = CounterBank(mech, ["a", "b", "c"], KEY)
    small = CounterBank(mech, ["c"], KEY)
    for t in range(20):
        np.testing.assert_array_equal(big.step([1.0, 2.0, float(t)])[2:], small.step([float(t)]))


@pytest.mark.parametrize(
    ("counts", "match"),
    [
        ([1.0], r"shape \(2,\)"),
        ([[1.0, 2.0]], r"shape \(2,\)"),
        ([1.0, math.nan], "finite"),
        ([math.inf, 1.0], "finite"),
        ([1.0, -0.5], "≥ 0"),
        ([1e30, 0.0], "counts"),
    ],
)
def test_bad_counts_raise_and_leave_state_unchanged(counts: list[object], match: str) -> None:
    bank = CounterBank(make_mechanism("dmfda", 0.9, 31, PureDP(1.0)), ["x", "y"], KEY)
    bank.step([1.0, 2.0])
    before = bank.to_bytes()
    with pytest.raises(ValueError, match=match):
        bank.step(counts)  # type: ignore[arg-type]
    assert bank.to_bytes() == before
    assert bank.tick == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"key": None}, "key must"),
        ({"key": b"short"}, "key must"),
        ({"key": "a string key of many chars"}, "key must"),
        ({"p": 0.0}, "p must"),
        ({"p": 1.0001}, "p must"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": math.nan}, "epsilon"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"horizon": 0}, "horizon must"),
        ({"strategy": "bogus"}, "strategy must"),
        ({"cap": -1.0}, "cap must"),
    ],
)
def test_decayed_counter_bad_parameters(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "p": 0.9,
        "epsilon": 1.0,
        "strategy": "naive",
        "horizon": 15,
        "key": KEY,
        "name": "c",
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        DecayedCounter(**args)  # type: ignore[arg-type]


def test_decayed_counter_bad_count_leaves_state() -> None:
    c = DecayedCounter(p=0.9, epsilon=1.0, strategy="naive", key=KEY, name="c")
    c.update(1)
    blob = c.to_bytes()
    for bad in (-1, math.nan, "3", None):
        with pytest.raises(ValueError, match="count"):
            c.update(bad)  # type: ignore[arg-type]
    assert c.to_bytes() == blob and c.tick == 1
    again = DecayedCounter.from_bytes(blob, KEY)
    assert again.update(4) == c.update(4)


def test_bank_bad_construction_and_corrupt_checkpoints() -> None:
    mech = make_mechanism("naive", 0.5, 7, PureDP(1.0))
    with pytest.raises(ValueError, match="distinct"):
        CounterBank(mech, ["a", "a"], KEY)
    with pytest.raises(ValueError, match="stream_names"):
        CounterBank(mech, "ab", KEY)
    with pytest.raises(ValueError, match="key must"):
        CounterBank(mech, ["a"], b"")
    bank = CounterBank(mech, ["a", "b"], KEY)
    bank.step([1, 2])
    blob = bank.to_bytes()
    with pytest.raises(IntegrityError, match="failed authentication"):
        CounterBank.from_bytes(blob[:-40] + bytes([blob[-40] ^ 1]) + blob[-39:], KEY)
    with pytest.raises(IntegrityError, match="not a sealed blob"):
        CounterBank.from_bytes(b"garbage", KEY)
    assert math.isnan(CounterBank(mech, ["z"], KEY).stderr)


@pytest.mark.parametrize("strategy", ["naive", "dm", "dmfda", "fenwick-opt", "tree"])
def test_budget_beyond_the_samplers_range_fails_at_construction_not_mid_tick(strategy: str) -> None:
    """An ε so large the noise falls below the grid is refused up front, naming ε — or works."""
    try:
        counter = DecayedCounter(
            p=0.9, epsilon=1e12, strategy=strategy, horizon=63, key=KEY, name="c"
        )
    except ValueError as exc:
        assert "epsilon" in str(exc)
        return
    # Strategies whose grid follows the noise scale accept it: then every tick must work.
    releases = [counter.update(2.0) for _ in range(70)]
    assert abs(releases[-1] - 2.0 / (1 - 0.9)) < 1e-3


def test_decayed_counter_takes_exactly_one_budget() -> None:
    zcdp = DecayedCounter(p=0.9, rho=0.5, strategy="auto", horizon=63, key=KEY, name="c")
    assert zcdp.strategy == "blt"
    assert abs(zcdp.update(1.0)) < 50
    for bad in ({}, {"epsilon": 1.0, "rho": 0.5}):
        with pytest.raises(ValueError, match="exactly one budget"):
            DecayedCounter(p=0.9, key=KEY, name="c", **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rho"):
        DecayedCounter(p=0.9, rho=float("nan"), key=KEY, name="c")


def test_decayed_counter_requires_a_name() -> None:
    """Two unnamed counters under one key would share their noise: refuse to build one."""
    with pytest.raises(ValueError, match="name"):
        DecayedCounter(p=0.9, epsilon=1.0, key=KEY)
    with pytest.raises(ValueError, match="name"):
        DecayedCounter(p=0.9, epsilon=1.0, key=KEY, name="")


def _reseal_header(data: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """``data`` with its JSON header edited and sealed again *with the key* (what another
    library version holding the key would write); the stored context is kept."""
    import json
    import struct

    from stream_dp.counters import CHECKPOINT_PURPOSE, _stored_context

    context = _stored_context(data)
    body = unseal(KEY, CHECKPOINT_PURPOSE, context, data)
    magic_len = body.index(b"{") - 8
    (hlen,) = struct.unpack_from("<Q", body, magic_len)
    header = json.loads(body[magic_len + 8 : magic_len + 8 + hlen])
    edit(header)
    new_header = json.dumps(header).encode()
    new_body = body[:magic_len] + struct.pack("<Q", len(new_header)) + new_header
    new_body += body[magic_len + 8 + hlen :]
    return seal(KEY, CHECKPOINT_PURPOSE, context, new_body)


def test_checkpoint_from_another_noise_format_is_refused() -> None:
    """Resuming with different noise would re-release ticks with different values."""
    from stream_dp.noise.keyed import NOISE_FORMAT

    bank = CounterBank(make_mechanism("naive", 0.9, 63, PureDP(1.0)), ["a", "b"], KEY)
    bank.step(np.array([1.0, 2.0]))
    data = bank.to_bytes()
    assert CounterBank.from_bytes(data, KEY).to_bytes() == data

    def older(header: dict[str, Any]) -> None:
        assert header["noise_format"] == NOISE_FORMAT
        header["noise_format"] = "older"

    with pytest.raises(ValueError, match="noise format"):
        CounterBank.from_bytes(_reseal_header(data, older), KEY)


def test_checkpoint_whose_mechanism_rebuilds_differently_is_refused() -> None:
    bank = CounterBank(make_mechanism("tree", 0.99, 63, PureDP(1.0)), ["a"], KEY)
    bank.step(np.array([1.0]))
    data = bank.to_bytes()

    def other_horizon(header: dict[str, Any]) -> None:
        header["mechanism"]["horizon"] = 127

    with pytest.raises(IntegrityError, match="rebuilds differently"):
        CounterBank.from_bytes(_reseal_header(data, other_horizon), KEY)


def test_forged_checkpoint_with_a_valid_unkeyed_checksum_is_refused() -> None:
    """Whoever can write the checkpoint topic but lacks the key cannot forge state."""
    import hashlib

    bank = CounterBank(make_mechanism("dmfda", 0.9, 63, PureDP(1.0)), ["a"], KEY)
    bank.step(np.array([1.0]))
    data = bank.to_bytes()
    forged = data[:-32] + hashlib.sha256(data[:-32]).digest()
    with pytest.raises(IntegrityError, match="failed authentication") as info:
        CounterBank.from_bytes(forged, KEY)
    assert info.value.reason == "tampered"


def test_checkpoint_without_names_needs_the_same_names() -> None:
    """``to_bytes(names=False)`` stores only the names' SHA-256 (a 10^6-stream shard does not
    repeat its names at every commit); restoring needs exactly those names, in that order."""
    key = b"names-free-checkpoint-key-012345"
    mech = make_mechanism("naive", 0.9, 15, PureDP(1.0), 1.0)
    names = [f"stream/{i}" for i in range(50)]
    bank = CounterBank(mech, names, key)
    bank.step(np.arange(50.0))
    slim, full = bank.to_bytes(names=False), bank.to_bytes()
    assert len(slim) < len(full) and b"stream/49" not in slim
    back = CounterBank.from_bytes(slim, key, mechanism=mech, stream_names=names)
    assert back.names == bank.names and np.array_equal(back.step(np.ones(50)), bank.step(np.ones(50)))
    for wrong in (None, names[::-1], names[:-1]):
        with pytest.raises(ValueError):
            CounterBank.from_bytes(slim, key, mechanism=mech, stream_names=wrong)
