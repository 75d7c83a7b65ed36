"""Releases and samples are bit-identical to the stored ones (issue #35: the tick's speed-ups
must not move a single sample; ``NOISE_FORMAT`` promises replayable noise for the same key).

The fixture was computed by the code before the speed-ups (``tests/unit/_pinned_noise.py``).
"""

from __future__ import annotations

import json
import math

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
    if cfg[0] != "tree-ls":
        for tick, (g, w) in enumerate(zip(got, want, strict=True), start=1):
            assert g == w, f"tick {tick}: releases changed"
        return
    # tree-ls's decoder weights come from LAPACK and meet the residuals in a BLAS product,
    # whose last bits depend on the host's kernels: 1 ulp of the largest release on an AVX2-only
    # AMD EPYC against the host that wrote the fixture, 2 with OpenBLAS forced to its
    # Sandybridge kernels. The releases must agree to 16 ulps of their largest value (5.7e-14
    # here): one unit of a leaf sample moves a release by the grid (4.8e-7), of a node sample
    # by grid·β·2⁻¹² (≥ 1.5e-14 for the smallest weight, far more for most); the samples
    # themselves are compared bit for bit (test_samples_are_pinned)
    scale = max(abs(float.fromhex(v)) for row in want for v in row)
    tol = 16.0 * math.ulp(scale)
    for tick, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        off = max(abs(float.fromhex(a) - float.fromhex(b)) for a, b in zip(g, w, strict=True))
        assert off <= tol, f"tick {tick}: releases changed by {off!r} (> {tol!r})"


@pytest.mark.parametrize("kind,param", pinned.SAMPLES, ids=lambda v: str(v))
def test_samples_are_pinned(kind: str, param: float) -> None:
    assert pinned.sample_digest(kind, param) == _DATA["samples"][f"{kind}/{float(param).hex()}"]
