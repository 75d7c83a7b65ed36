"""stream_dp.integrity: sealed blobs are refused after any change, under another key, purpose or
configuration, and the refusal says which."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from stream_dp.integrity import IntegrityError, seal, unseal

KEY = bytes(range(32))
CTX = json.dumps({"strategy": "dmfda", "privacy": {"epsilon": 1.0}}, sort_keys=True).encode()


def test_round_trip_and_empty_payload() -> None:
    assert unseal(KEY, "p", CTX, seal(KEY, "p", CTX, b"state")) == b"state"
    assert unseal(KEY, "p", b"", seal(KEY, "p", b"", b"")) == b""


def test_every_changed_byte_is_refused() -> None:
    blob = seal(KEY, "release checkpoint", CTX, b"some counter state \x00\x01")
    for i in range(len(blob)):
        for bit in (0x01, 0x80):
            bad = blob[:i] + bytes([blob[i] ^ bit]) + blob[i + 1 :]
            with pytest.raises(IntegrityError) as info:
                unseal(KEY, "release checkpoint", CTX, bad)
            assert info.value.reason in ("tampered", "malformed")


@hsettings(max_examples=200, deadline=None)
@given(cut=st.integers(0, 200), extra=st.binary(min_size=1, max_size=8))
def test_truncated_or_extended_blobs_are_refused(cut: int, extra: bytes) -> None:
    blob = seal(KEY, "p", CTX, b"x" * 64)
    for bad in (blob[: min(cut, len(blob) - 1)], blob + extra):
        with pytest.raises(IntegrityError):
            unseal(KEY, "p", CTX, bad)


def test_other_key_or_purpose_is_refused_as_not_authentic() -> None:
    blob = seal(KEY, "release checkpoint", CTX, b"state")
    for key, purpose in ((bytes(32), "release checkpoint"), (KEY, "ingest checkpoint")):
        with pytest.raises(IntegrityError, match="failed authentication") as info:
            unseal(key, purpose, CTX, blob)
        assert info.value.reason == "tampered"


def test_other_configuration_is_named() -> None:
    blob = seal(KEY, "release checkpoint", CTX, b"state")
    other = json.dumps({"strategy": "tree", "privacy": {"epsilon": 1.0}}, sort_keys=True).encode()
    with pytest.raises(IntegrityError, match="another configuration: strategy: 'dmfda'") as info:
        unseal(KEY, "release checkpoint", other, blob)
    assert info.value.reason == "configuration"
    assert "'tree'" in str(info.value)
    # a non-JSON context still gives a clear (generic) message
    with pytest.raises(IntegrityError, match="another configuration"):
        unseal(KEY, "p", b"v2", seal(KEY, "p", b"v1", b"s"))


def test_forged_context_cannot_fake_a_configuration_message() -> None:
    """Without the key, changing the stored context is 'tampered', never 'configuration'."""
    blob = seal(KEY, "p", CTX, b"state")
    forged = blob.replace(b"dmfda", b"treee")
    with pytest.raises(IntegrityError) as info:
        unseal(KEY, "p", CTX, forged)
    assert info.value.reason == "tampered"


def test_the_secret_is_never_in_the_blob_and_short_secrets_are_refused() -> None:
    blob = seal(KEY, "p", CTX, b"state")
    assert KEY not in blob
    with pytest.raises(ValueError, match="secret"):
        seal(b"short", "p", CTX, b"state")
    with pytest.raises(ValueError, match="purpose"):
        seal(KEY, "", CTX, b"state")
    assert issubclass(IntegrityError, ValueError)
