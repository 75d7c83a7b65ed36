"""Persons keyed by SipHash-2-4-128 (issue #34, checkpoint version 11): every reference
vector on both implementations, and the checkpoints of the development builds it replaces
refused in their own words (from the adversarial review of the change).
"""

from __future__ import annotations

import json

import pytest

from agents.ingest.schedule import ScheduleMismatch
from agents.ingest.siphash import siphash128_py
from stream_dp.integrity import IntegrityError, seal, unseal
from stream_dp.mechanism import canonical_json
from tests.unit.agents.ingest.test_siphash import ALL_VECTORS
from tests.unit.agents.ingest.test_user_changelog_digest import _history, _Partition
from tests.unit.agents.ingest.test_user_level import KEY


def _context_before_siphash(p: _Partition) -> bytes:
    """The ingest checkpoint context a version 7 to 10 worker (BLAKE2b persons) bound its sealed
    checkpoints to: today's without ``users.id_hash`` (the only field the change added)."""
    ctx = json.loads(p.state.context())
    assert ctx["users"].pop("id_hash") == "siphash-2-4-128"
    return canonical_json(ctx)


@pytest.mark.parametrize("version", [7, 8, 9, 10])
def test_a_sealed_earlier_checkpoint_is_refused_with_its_own_line(version: int) -> None:
    """A sealed checkpoint of a development build's user level (versions 7 to 10, bound to the
    context before ``users.id_hash``) is refused with its version's own line (ScheduleMismatch:
    exit status 3, "start a new deployment"), not the generic "another configuration" refusal
    the new ``id_hash`` field would give it (the adversarial review found the lines
    unreachable for every keyed deployment)."""
    p = _Partition(key=KEY)
    _history(p)
    payload = json.loads(unseal(KEY, "ingest checkpoint", p.state.context(), p.checkpoint))
    assert payload["v"] == 11
    payload["v"] = version  # what a v7-v10 worker wrote: the same document, its own version
    if version == 7:
        del payload["users"]["digest"]
    old = seal(KEY, "ingest checkpoint", _context_before_siphash(p),
               json.dumps(payload).encode())
    again = p.fresh()
    with pytest.raises(ScheduleMismatch, match=f"version {version}") as got:
        again.restore(old, seq=1)
    assert "\n" not in str(got.value) and "deployment new" in str(got.value)


@pytest.mark.parametrize("version", [6, 11])
def test_only_a_genuine_earlier_user_level_checkpoint_gets_that_line(version: int) -> None:
    """The second look under the pre-11 context is for versions 7 to 10 only: a checkpoint of
    any other version sealed under it, one sealed under another key, or one changed after it
    was sealed keeps the integrity refusal (nothing is accepted either way)."""
    p = _Partition(key=KEY)
    _history(p)
    payload = json.loads(unseal(KEY, "ingest checkpoint", p.state.context(), p.checkpoint))
    payload["v"] = version
    old = seal(KEY, "ingest checkpoint", _context_before_siphash(p),
               json.dumps(payload).encode())
    with pytest.raises(IntegrityError, match="another configuration"):
        p.fresh().restore(old, seq=1)
    payload["v"] = 10
    other_key = seal(bytes(reversed(KEY)), "ingest checkpoint", _context_before_siphash(p),
                     json.dumps(payload).encode())
    with pytest.raises(IntegrityError, match="failed authentication"):
        p.fresh().restore(other_key, seq=1)
    genuine = bytearray(seal(KEY, "ingest checkpoint", _context_before_siphash(p),
                             json.dumps(payload).encode()))
    genuine[-1] ^= 1
    with pytest.raises(IntegrityError, match="failed authentication"):
        p.fresh().restore(bytes(genuine), seq=1)


def test_held_every_reference_vector_unaligned_and_every_byte_value() -> None:
    """Held: the compiled and the pure SipHash give the 64 reference vectors, the compiled one
    also from buffers at every alignment (a memoryview 1..7 bytes into its bytes), and both
    agree on every byte value at the lengths around a block (one person, one hash: the fast
    path, the pure path and a restore's re-decision agree)."""
    from agents.ingest.records import _fastingest
    from agents.ingest.siphash import siphash128

    key = bytes(range(16))
    assert len(ALL_VECTORS) == 64
    for n, want in enumerate(ALL_VECTORS):
        msg = bytes(range(n))
        assert siphash128_py(key, msg).hex() == want, n
        assert siphash128(key, msg).hex() == want, n
        if _fastingest is not None:
            for off in range(1, 8):
                view = memoryview(bytes(off) + msg)[off:]
                assert _fastingest.siphash128(key, view).hex() == want, (n, off)
    for b in range(256):
        for n in (1, 7, 8, 9, 15, 16, 17):
            msg = bytes([b]) * n
            assert siphash128(key, msg) == siphash128_py(key, msg), (b, n)
