"""The compiled kernels (stream_dp._fastnoise) give bit-identical samples, buffers and releases
to the authoritative pure-Python path, on many keys and scales (issue #35)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_dp.budget import ZCDP
from stream_dp.counters import CounterBank
from stream_dp.noise import _exact, _fast
from stream_dp.noise.keyed import KeyedNoise
from stream_dp.noise.keys import stream_ids
from stream_dp.planner import make_mechanism
from stream_dp.strategies import _dd

pytestmark = pytest.mark.skipif(
    _fast.kernels is None, reason="compiled kernels not built (STREAM_DP_TEST_ALLOW_PURE)")

_IDS = stream_ids([f"k{i}" for i in range(3000)])


def _both(monkeypatch: pytest.MonkeyPatch, fn):  # type: ignore[no-untyped-def]
    compiled = fn()
    with monkeypatch.context() as m:
        m.setattr(_fast, "kernels", None)
        pure = fn()
    return compiled, pure


@given(key=st.binary(min_size=32, max_size=32),
       scale=st.one_of(st.floats(2.0**-8, 2.0**50), st.sampled_from([1.0, 2.0**17, 3.0, 0.75])),
       node=st.integers(0, 2**48 - 1))
def test_laplace_matches_pure(key: bytes, scale: float, node: int) -> None:
    noise = KeyedNoise(key, "fast-vs-pure", _IDS)
    with pytest.MonkeyPatch.context() as mp:
        compiled, pure = _both(mp, lambda: noise.discrete_laplace(node, scale))
    assert np.array_equal(compiled, pure)


@given(key=st.binary(min_size=32, max_size=32),
       sigma=st.one_of(st.floats(2.0**-8, 2.0**46), st.sampled_from([1.0, 2.0**30, 0.5])),
       node=st.integers(0, 2**48 - 1))
def test_gaussian_matches_pure(key: bytes, sigma: float, node: int) -> None:
    noise = KeyedNoise(key, "fast-vs-pure", _IDS)
    with pytest.MonkeyPatch.context() as mp:
        compiled, pure = _both(mp, lambda: noise.discrete_gaussian(node, sigma))
    assert np.array_equal(compiled, pure)


@pytest.mark.parametrize("log2_margin", [-40, -4])
def test_exact_paths_agree(monkeypatch: pytest.MonkeyPatch, log2_margin: int) -> None:
    # a huge margin sends most comparisons to the exact paths (the kernels' "undecided" codes)
    monkeypatch.setattr(_exact, "FLOAT_MARGIN_LOG2", log2_margin)
    noise = KeyedNoise(b"m" * 32, "exact", _IDS[:400])
    before = _exact.exact_calls
    for scale in (3.0, 1000.0, 2.0**20 + 1):
        compiled, pure = _both(monkeypatch, lambda s=scale: noise.discrete_laplace(5, s))
        assert np.array_equal(compiled, pure)
        compiled, pure = _both(monkeypatch, lambda s=scale: noise.discrete_gaussian(5, s))
        assert np.array_equal(compiled, pure)
    if log2_margin > -10:
        assert _exact.exact_calls - before > 1000


_F = st.floats(allow_nan=False, allow_infinity=False, width=64)


@given(data=st.lists(st.tuples(_F, _F, st.integers(-2**40, 2**40)), min_size=1, max_size=40),
       theta=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8))
def test_dd_update_matches_pure(data: list[tuple[float, float, int]],
                                theta: list[float]) -> None:
    k = len(theta)
    hi = np.array([[h for h, _, _ in data]] * k) * np.linspace(1.0, 1e-300, k)[:, None]
    lo = np.array([[lo for _, lo, _ in data]] * k) * 2.0**-60
    clipped = np.array([float(c) for _, _, c in data])
    th = np.array(theta)
    want_hi, want_lo = hi.copy(), lo.copy()
    with np.errstate(all="ignore"):
        for i in range(k):
            a, b = _dd.mul(want_hi[i], want_lo[i], float(th[i]))
            want_hi[i], want_lo[i] = _dd.add(a, b, clipped)
    _fast.kernels.dd_update(hi, lo, th, clipped)
    assert hi.tobytes() == want_hi.tobytes() and lo.tobytes() == want_lo.tobytes()
    out = np.empty(len(data))
    _fast.kernels.dd_feedback(hi, th, out)
    with np.errstate(all="ignore"):
        f = th[0] * hi[0]
        for i in range(1, k):
            f = f + th[i] * hi[i]
    assert out.tobytes() == f.tobytes()


@pytest.mark.parametrize("p,horizon,ticks", [(0.999, 127, 5), (1.0, 5, 12)])
def test_blt_bank_matches_pure(monkeypatch: pytest.MonkeyPatch, p: float, horizon: int,
                               ticks: int) -> None:
    mech = make_mechanism("blt", p, horizon, ZCDP(0.5))
    names = [f"n{i}" for i in range(500)]
    counts = np.random.default_rng(3).poisson(4.0, (ticks, 500)).astype(np.float64)

    def run() -> list[bytes]:
        bank = CounterBank(mech, names, b"b" * 32)
        return [bank.step(c).tobytes() for c in counts]

    compiled, pure = _both(monkeypatch, run)
    assert compiled == pure


def test_kernels_reject_wrong_sizes() -> None:
    with pytest.raises(ValueError, match="bytes"):
        _fast.kernels.dd_update(np.zeros((2, 3)), np.zeros((2, 4)), np.ones(2), np.zeros(3))
    with pytest.raises(ValueError, match="bytes"):
        _fast.kernels.gaussian_accept(np.zeros((3, 2), np.uint64), np.zeros(2, np.int64), 0.0,
                                      1.0, 1e-12, 0.0, np.zeros(3, np.uint8))
