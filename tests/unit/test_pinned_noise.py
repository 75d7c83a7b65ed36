"""Releases and samples are bit-identical to the stored ones (issue #35: the tick's speed-ups
must not move a single sample; ``NOISE_FORMAT`` promises replayable noise for the same key).

The fixture was computed by the code before the speed-ups (``tests/unit/_pinned_noise.py``).
"""

from __future__ import annotations

import json

import pytest

from stream_dp.noise.keyed import NOISE_FORMAT
from tests.unit import _pinned_noise as pinned

_DATA = json.loads(pinned.FIXTURE.read_text())


def test_noise_format_is_the_pinned_one() -> None:
    # the fixture belongs to this format: a new format needs a new fixture
    assert NOISE_FORMAT == "aes256-hkdf-sha256/cks2020-split8/2"


@pytest.mark.parametrize("cfg", pinned.BANKS, ids=lambda c: "/".join(map(str, c)))
def test_bank_releases_are_pinned(cfg: tuple[str, float, int, str, float, int]) -> None:
    want = _DATA["banks"]["/".join(map(str, cfg))]
    got = pinned.bank_releases(*cfg)
    for tick, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        assert g == w, f"tick {tick}: releases changed"


@pytest.mark.parametrize("kind,param", pinned.SAMPLES, ids=lambda v: str(v))
def test_samples_are_pinned(kind: str, param: float) -> None:
    assert pinned.sample_digest(kind, param) == _DATA["samples"][f"{kind}/{float(param).hex()}"]
