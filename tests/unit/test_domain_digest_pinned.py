"""``Domain.digest`` pinned to bytes computed by the code before its start-up was made faster
(one scan of every name, indexes built with ``dict(zip(...))``): the digest binds a
deployment's noise and checkpoints, so a change of it would refuse every existing checkpoint."""

from __future__ import annotations

import pytest

from stream_dp.domain import Domain

PINNED = [
    (lambda: Domain.from_paths(["eu/fr/paris", "eu/fr/lyon", "eu/de/berlin", "us/ny/nyc",
                                "é/ü/☃"]),
     "3d76e759c8afbeaaf6ebe9e510642417a94e9b14a85baf308b50a61d01c19867"),
    (lambda: Domain.flat(["a", "b", "c"]),
     "49c89de9756f34db12343d271f76f4e2c86664fadc503025ce1e9c6f4ac9d236"),
    (lambda: Domain.grid({"region": ["north", "south"], "age": ["young", "old"]}),
     "9dde6380d15648f0b0888f752008e41775e9e770e6af696a13ff88f3ebbe2578"),
]


@pytest.mark.parametrize(("build", "digest"), PINNED, ids=["paths", "flat", "grid"])
def test_the_digest_of_a_domain_is_pinned(build, digest):
    assert build().digest() == digest


def test_a_bad_name_is_still_named_after_the_one_scan():
    with pytest.raises(ValueError, match=r"names\[2\] must not contain control characters"):
        Domain.flat(["a", "b", "c\x1f"])
    with pytest.raises(ValueError, match=r"names\[1\] must be valid UTF-8"):
        Domain.flat(["a", "b\udcff", "c\x00"])
    assert Domain.flat(["é\u2028\x80", "b"]).names == ("é\u2028\x80", "b")


def test_a_bad_name_past_the_first_scan_block_is_named():
    names = [f"n{i}" for i in range(140_000)]
    names[131_073] = "x\udc80"
    with pytest.raises(ValueError, match=r"names\[131073\] must be valid UTF-8"):
        Domain.flat(names)
    names[131_073] = "\U0001f600"  # astral characters are text
    assert Domain.flat(names).names[131_073] == "\U0001f600"
