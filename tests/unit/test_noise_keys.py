"""Key loading and secrecy: the key never appears in reprs, logs or exception text."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import numpy as np
import pytest

from stream_dp.noise.keyed import KeyedNoise
from stream_dp.noise.keys import SecretKey, load_key, stream_id, stream_ids
from stream_dp.noise.prf import BlockPRF

HEX_KEY = "4b1f9e07c3d2a8556e0f71b9c2d43a8e17f6e5b0a3c98d2146e7f05b9a1c3d7e"  # 32 random bytes
RAW_KEY = "Sup3rSecretPassphrase!-x-2026-zQ"  # 32 bytes, not hex


def _fragments(secret: bytes) -> list[str]:
    """Renderings of the secret that must never leak."""
    frags = [secret.hex(), secret.hex().upper(), repr(secret), secret[:8].hex()]
    try:
        frags.append(secret.decode())
        frags.append(secret.decode()[:12])
    except UnicodeDecodeError:
        pass
    return frags


def _assert_no_leak(text: str, secret: bytes) -> None:
    for frag in _fragments(secret):
        assert frag not in text, f"key material leaked: {text!r}"


def test_load_hex_key_from_file(tmp_path: Path) -> None:
    p = tmp_path / "key"
    p.touch(mode=0o600)  # a key file open to group or others is refused
    p.write_text(f"  {HEX_KEY}\n")
    assert load_key(p) == bytes.fromhex(HEX_KEY)
    assert load_key(str(p)) == bytes.fromhex(HEX_KEY)


def test_load_raw_key_from_file(tmp_path: Path) -> None:
    p = tmp_path / "key"
    p.touch(mode=0o600)  # a key file open to group or others is refused
    p.write_bytes(RAW_KEY.encode() + b"\r\n")
    assert load_key(p) == RAW_KEY.encode()
    binary = bytes(range(256))[::7] + b"\n\n"
    p.write_bytes(binary)
    assert load_key(p) == binary[:-1]  # exactly one trailing newline is dropped


def test_load_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_KEY", HEX_KEY)
    assert load_key() == bytes.fromhex(HEX_KEY)
    monkeypatch.setenv("MY_KEY", RAW_KEY)
    assert load_key(env="MY_KEY") == RAW_KEY.encode()


def test_missing_sources_raise_value_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STREAM_DP_KEY", raising=False)
    with pytest.raises(ValueError, match="STREAM_DP_KEY is not set"):
        load_key()
    monkeypatch.setenv("STREAM_DP_KEY", "")
    with pytest.raises(ValueError, match="STREAM_DP_KEY is not set"):
        load_key()
    with pytest.raises(ValueError, match="cannot be read"):
        load_key(tmp_path / "missing")


@pytest.mark.parametrize(
    "short",
    ["abcdef0123", "0123456789abcdef0123456789abcd", "tooShort!",
     "4b1f9e07c3d2a8556e0f71b9c2d43a8e17f6e5b0a3c98d2146e7f05b9a1c3d", "Sup3rSecretPassphrase!-x-2026-z"],
)
def test_short_key_rejected_without_echo(
    short: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    p = tmp_path / "k"
    p.touch(mode=0o600)  # a key file open to group or others is refused
    p.write_text(short)
    with pytest.raises(ValueError, match="at least 32 bytes") as err:
        load_key(p)
    assert short not in str(err.value) and short[:6] not in str(err.value)
    assert "secrets.token_hex(32)" in str(err.value)
    monkeypatch.setenv("STREAM_DP_KEY", short)
    with pytest.raises(ValueError, match="at least 32 bytes") as err:
        load_key()
    assert short not in str(err.value) and short[:6] not in str(err.value)
    with pytest.raises(ValueError) as err:
        SecretKey(short.encode()[:31])
    assert short[:6] not in str(err.value)


def test_secret_key_never_shows_the_key(caplog: pytest.LogCaptureFixture) -> None:
    secret = bytes.fromhex(HEX_KEY)
    sk = SecretKey(secret)
    texts = [repr(sk), str(sk), f"{sk}", f"{sk!r}", format(sk, ">60")]
    noise = KeyedNoise(sk, "tag", np.arange(3, dtype=np.uint64))
    prf = BlockPRF(secret, "tag")
    texts += [repr(noise), str(noise), repr(prf), repr(vars(noise).get("_key"))]
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("stream_dp.test").info("key=%s noise=%r prf=%s", sk, noise, prf)
        logging.getLogger("stream_dp.test").info("key %r", sk)
    texts.append(caplog.text)
    for text in texts:
        _assert_no_leak(text, secret)
    assert repr(sk) == "SecretKey(<hidden, 32 bytes>)"
    assert bytes(sk) == secret and sk.reveal() == secret and len(sk) == 32


def test_secret_key_refuses_pickling_and_compares_in_constant_time() -> None:
    sk = SecretKey(bytes.fromhex(HEX_KEY))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(sk)
    with pytest.raises(TypeError):
        pickle.dumps(KeyedNoise(sk, "t", np.arange(2, dtype=np.uint64)))
    assert sk == SecretKey(bytes.fromhex(HEX_KEY))
    assert sk != SecretKey(b"x" * 32)
    assert hash(sk) == hash(SecretKey(bytes.fromhex(HEX_KEY)))


def test_errors_from_noise_do_not_contain_the_key() -> None:
    secret = bytes.fromhex(HEX_KEY)
    kn = KeyedNoise(secret, "t", np.arange(3, dtype=np.uint64))
    for call in (
        lambda: kn.discrete_laplace(-1, 1.0),
        lambda: kn.discrete_laplace(1, float("nan")),
        lambda: kn.discrete_gaussian(1, 0.0),
        lambda: KeyedNoise(secret, 5, [1]),  # type: ignore[arg-type]
        lambda: KeyedNoise(secret[:10], "t", [1]),
        lambda: KeyedNoise(secret.hex(), "t", [1]),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError) as err:
            call()
        _assert_no_leak(str(err.value) + repr(err.value), secret)


def test_stream_id_is_stable_blake2b() -> None:
    import hashlib

    digest = hashlib.blake2b(b"shop/berlin", digest_size=8, person=b"stream-dp/sid").digest()
    assert stream_id("shop/berlin") == int.from_bytes(digest, "little")
    # pinned value: changing it would change every stream's noise (and break replays)
    assert stream_id("shop/berlin") == int.from_bytes(digest, "little") == _PINNED_BERLIN
    assert stream_id("a") != stream_id("b")
    assert stream_id("é") == stream_id("\u00e9")
    with pytest.raises(ValueError, match="name must be a str"):
        stream_id(b"bytes")  # type: ignore[arg-type]


def test_stream_ids_vector_and_duplicates() -> None:
    ids = stream_ids(["a", "b", "c"])
    assert ids.dtype == np.uint64
    assert ids.tolist() == [stream_id("a"), stream_id("b"), stream_id("c")]
    with pytest.raises(ValueError, match="distinct"):
        stream_ids(["a", "b", "a"])


_PINNED_BERLIN = 4168224657181820521


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("6b" * 32, "all bytes are equal"),
        ("5f3c" * 16, "repeats a 2-byte pattern"),
        ("00112233445566778899aabbccddeeff" * 2, "repeats a 16-byte pattern"),
        (bytes(range(32)).hex(), "counting sequence"),
        (bytes(range(100, 164, 2)).hex(), "counting sequence"),
        ("9f" * 16 + "01" * 16, "only 2 distinct byte values"),
        ("a" * 64, "all bytes are equal"),
        ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaabbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
         "distinct byte values"),
    ],
)
def test_low_entropy_keys_are_refused_with_advice(
    text: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "k"
    p.touch(mode=0o600)  # a key file open to group or others is refused
    p.write_text(text + "\n")
    with pytest.raises(ValueError, match="low entropy") as err:
        load_key(p)
    message = str(err.value)
    assert why in message and "\n" not in message
    assert "secrets.token_hex(32)" in message and "/dev/urandom" in message
    _assert_no_leak(message, bytes.fromhex(text) if len(text) % 2 == 0 else text.encode())
    monkeypatch.setenv("STREAM_DP_KEY", text)
    with pytest.raises(ValueError, match="low entropy"):
        load_key()


def test_random_keys_are_accepted() -> None:
    import secrets

    from stream_dp.noise.keys import key_weakness

    for _ in range(2000):
        assert key_weakness(secrets.token_bytes(32)) is None
    assert key_weakness(RAW_KEY.encode()) is None


def test_no_key_fingerprint_is_printed_anywhere() -> None:
    """No module prints or logs a fingerprint, prefix or short hash of the noise key."""
    import re

    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in [*root.joinpath("stream_dp").rglob("*.py"), *root.joinpath("agents").rglob("*.py")]:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bprint\(|\blog\.\w+\(|\bsay\(", line) and re.search(
                r"fingerprint|key_check|key_id|key_hash", line, re.I
            ):
                offenders.append(f"{path.relative_to(root)}:{i}")
    assert offenders == []


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606, 0o620, 0o602, 0o444])
def test_key_file_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    """Like ssh's private keys: one line naming the file and ``chmod 600``, never the key."""
    p = tmp_path / "noise.key"
    p.write_text(HEX_KEY + "\n")
    p.chmod(mode)
    with pytest.raises(ValueError) as err:
        load_key(p)
    text = str(err.value)
    assert "\n" not in text and str(p) in text and "chmod 600" in text
    assert f"mode {mode:04o}" in text
    _assert_no_leak(text, bytes.fromhex(HEX_KEY))
    p.chmod(0o600)
    assert load_key(p) == bytes.fromhex(HEX_KEY)
    p.chmod(0o400)
    assert load_key(p) == bytes.fromhex(HEX_KEY)


def test_key_file_permission_rule_root_owned_group_read_allowed() -> None:
    """A root-owned key that a non-root service reads through its group (a Kubernetes secret
    volume with ``fsGroup``: ``root:<fsGroup>``, mode 0440) is accepted; group write, world
    access, or group read when the reader is root or the owner is not."""
    import os
    import stat

    from stream_dp.noise.keys import key_file_permission_problem

    def st(mode: int, uid: int) -> os.stat_result:
        return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, uid, 10001, 64, 0, 0, 0))

    assert key_file_permission_problem(st(0o440, 0), euid=10001) is None
    assert key_file_permission_problem(st(0o640, 0), euid=10001) is None
    assert key_file_permission_problem(st(0o440, 0), euid=0) is not None
    assert key_file_permission_problem(st(0o440, 10001), euid=10001) is not None
    assert key_file_permission_problem(st(0o460, 0), euid=10001) is not None
    assert key_file_permission_problem(st(0o444, 0), euid=10001) is not None
    assert key_file_permission_problem(st(0o600, 10001), euid=10001) is None
    assert key_file_permission_problem(st(0o400, 0), euid=0) is None


def test_every_command_loading_a_key_file_refuses_a_world_readable_one(tmp_path: Path) -> None:
    """The worker's settings, ``replay`` and ``marginals`` all load key files through load_key."""
    from agents.commands._replay_state import load_key_for_fingerprint

    p = tmp_path / "noise.key"
    p.write_text(HEX_KEY)
    p.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        load_key_for_fingerprint(str(p))
