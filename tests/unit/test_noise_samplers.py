"""Exact discrete samplers driven by keyed AES bits: distribution, determinism, independence.

Statistical tests use fixed keys and reject only at p < 1e-4 (or > 5 standard errors).
"""

from __future__ import annotations

import math
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from stream_dp.noise import _exact, laplace
from stream_dp.noise.gaussian import discrete_gaussian_variance
from stream_dp.noise.keyed import KeyedNoise, NoiseExhaustedError
from stream_dp.noise.keys import stream_ids
from stream_dp.noise.laplace import discrete_laplace_variance
from stream_dp.noise.prf import MAX_DRAWS

KEY = bytes.fromhex("9f" * 16 + "01" * 16)
OTHER_KEY = bytes.fromhex("9f" * 16 + "02" * 16)
P_MIN = 1e-4


def _noise(n: int, key: bytes = KEY, tag: str = "test/samplers", offset: int = 0) -> KeyedNoise:
    return KeyedNoise(key, tag, np.arange(offset, offset + n, dtype=np.uint64))


# ---------------------------------------------------------------- exact pmfs / cdfs (oracles)


def _laplace_cdf(k: NDArray[np.float64], b: float) -> NDArray[np.float64]:
    """P(Y ≤ k) for the discrete Laplace P(y) ∝ exp(-|y|/b) (closed form)."""
    q = math.exp(-1.0 / b)
    return np.where(k >= 0, 1.0 - np.exp(-(k + 1) / b) / (1 + q), np.exp(k / b) / (1 + q))


def _gaussian_cdf(k: NDArray[np.float64], sigma: float) -> NDArray[np.float64]:
    """P(Y ≤ k) for the discrete Gaussian: exact summation (σ ≤ 200) or continuity-corrected."""
    if sigma <= 200:
        support = np.arange(-math.ceil(40 * sigma) - 10, math.ceil(40 * sigma) + 11)
        w = np.exp(-(support.astype(np.float64) ** 2) / (2 * sigma * sigma))
        cdf = np.cumsum(w) / w.sum()
        idx = np.clip(np.searchsorted(support, k, side="right") - 1, -1, support.size - 1)
        return np.where(idx >= 0, cdf[np.maximum(idx, 0)], 0.0)
    return stats.norm.cdf((k + 0.5) / sigma)


def _chi2_pvalue(x: NDArray[np.int64], cdf_at: object, edges: NDArray[np.float64]) -> float:
    """Chi-square GoF p-value of samples ``x`` in bins (-inf, e0], (e0, e1], …, (e_last, inf)."""
    cdf = cdf_at(edges)  # type: ignore[operator]
    probs = np.diff(np.concatenate([[0.0], cdf, [1.0]]))
    counts = np.bincount(np.searchsorted(edges, x, side="left"), minlength=edges.size + 1)
    assert probs.min() * x.size > 5, "bins too small for the chi-square approximation"
    return float(stats.chisquare(counts, probs * x.size).pvalue)


def _edges(scale: float, lo: float, hi: float, count: int) -> NDArray[np.float64]:
    e = np.unique(np.floor(np.linspace(lo, hi, count) * scale))
    return e.astype(np.float64)


# ---------------------------------------------------------------- goodness of fit


@pytest.mark.parametrize("scale", [0.3, 1.0, 2.5, 9.75, 1000.0, 2.0**40 + 12345.5])
def test_discrete_laplace_goodness_of_fit(scale: float) -> None:
    x = _noise(200_000).discrete_laplace(11, scale)
    assert x.dtype == np.int64
    if scale < 3:
        edges = np.arange(-8, 8, dtype=np.float64) if scale > 0.5 else np.array([-2.0, -1, 0, 1])
    else:
        edges = _edges(scale, -6, 6, 60)
    p = _chi2_pvalue(x, lambda k: _laplace_cdf(k, scale), edges)
    assert p > P_MIN, (scale, p)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 1.7, 3.0, 50.0, 2.0**35 + 0.25])
def test_discrete_gaussian_goodness_of_fit(sigma: float) -> None:
    x = _noise(100_000).discrete_gaussian(12, sigma)
    assert x.dtype == np.int64
    if sigma < 4:
        edges = np.arange(-math.ceil(3 * sigma), math.ceil(3 * sigma), dtype=np.float64)
    else:
        edges = _edges(sigma, -3.5, 3.5, 40)
    p = _chi2_pvalue(x, lambda k: _gaussian_cdf(k, sigma), edges)
    assert p > P_MIN, (sigma, p)


@pytest.mark.parametrize("scale", [1.0, 37.5, 2.0**40])
def test_laplace_variance_matches_closed_form(scale: float) -> None:
    n = 500_000
    x = _noise(n).discrete_laplace(21, scale).astype(np.float64)
    var = discrete_laplace_variance(scale)
    # kurtosis of the (discrete) Laplace ≤ 6: sd(sample var)/var ≤ sqrt(5/n)
    assert abs(np.mean(x * x) / var - 1) < 5 * math.sqrt(5 / n)
    assert abs(x.mean()) < 5 * math.sqrt(var / n)


@pytest.mark.parametrize("sigma", [0.8, 10.0, 2.0**30])
def test_gaussian_variance_matches_closed_form(sigma: float) -> None:
    n = 300_000
    x = _noise(n).discrete_gaussian(22, sigma).astype(np.float64)
    var = discrete_gaussian_variance(sigma)
    assert abs(np.mean(x * x) / var - 1) < 5 * math.sqrt(3 / n)


def test_variance_helpers_against_direct_sums() -> None:
    for b in (0.5, 1.0, 4.0):
        k = np.arange(-2000, 2001, dtype=np.float64)
        w = np.exp(-np.abs(k) / b)
        assert discrete_laplace_variance(b) == pytest.approx(float((w * k * k).sum() / w.sum()))
    assert discrete_laplace_variance(2.0**40) == pytest.approx(2 * 2.0**80, rel=1e-9)
    k = np.arange(-200, 201, dtype=np.float64)
    w = np.exp(-k * k / (2 * 0.6**2))
    assert discrete_gaussian_variance(0.6) == pytest.approx(float((w * k * k).sum() / w.sum()))
    assert discrete_gaussian_variance(100.0) == 10_000.0


def test_extreme_scales_do_not_overflow() -> None:
    n = 50_000
    x = _noise(n).discrete_laplace(31, 2.0**50).astype(np.float64)
    assert abs(np.mean(x * x) / discrete_laplace_variance(2.0**50) - 1) < 5 * math.sqrt(5 / n)
    g = _noise(n).discrete_gaussian(32, 2.0**46).astype(np.float64)
    assert abs(np.mean(g * g) / 2.0**92 - 1) < 5 * math.sqrt(3 / n)
    tiny = _noise(n).discrete_laplace(33, 2.0**-8)
    assert np.all(tiny == 0)  # P(Y ≠ 0) ≈ 2e^-256


# ---------------------------------------------------------------- determinism and independence


def test_same_key_same_noise_across_instances_and_calls() -> None:
    a = _noise(5_000).discrete_laplace(7, 123.25)
    b = _noise(5_000).discrete_laplace(7, 123.25)
    c = _noise(5_000)
    assert np.array_equal(a, b)
    assert np.array_equal(c.discrete_laplace(7, 123.25), c.discrete_laplace(7, 123.25))
    g1 = _noise(5_000).discrete_gaussian(7, 12.5)
    g2 = _noise(5_000).discrete_gaussian(7, 12.5)
    assert np.array_equal(g1, g2)


def _assert_independent(x: NDArray[np.int64], y: NDArray[np.int64]) -> None:
    n = x.size
    r = float(np.corrcoef(x.astype(np.float64), y.astype(np.float64))[0, 1])
    assert abs(r) < 5 / math.sqrt(n), r
    qx = np.searchsorted(np.quantile(x, [0.25, 0.5, 0.75]), x, side="right")
    qy = np.searchsorted(np.quantile(y, [0.25, 0.5, 0.75]), y, side="right")
    table = np.zeros((4, 4))
    np.add.at(table, (qx, qy), 1)
    table = table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]
    assert stats.chi2_contingency(table).pvalue > P_MIN
    assert not np.array_equal(x, y)


def test_independent_across_keys_tags_nodes_streams() -> None:
    n = 100_000
    base = _noise(n).discrete_laplace(5, 50.0)
    _assert_independent(base, _noise(n, key=OTHER_KEY).discrete_laplace(5, 50.0))
    _assert_independent(base, _noise(n, tag="other/tag").discrete_laplace(5, 50.0))
    _assert_independent(base, _noise(n).discrete_laplace(6, 50.0))
    _assert_independent(base[:-1], base[1:])  # neighbouring streams
    _assert_independent(base, _noise(n, offset=n).discrete_laplace(5, 50.0))
    g = _noise(n).discrete_gaussian(5, 50.0)  # same node, other sampler: still independent here
    _assert_independent(_noise(n).discrete_gaussian(9, 50.0), g)


def test_other_parameter_or_distribution_gives_independent_noise() -> None:
    """Same key, tag, node: another scale must not give coupled noise (no cancellation)."""
    n = 100_000
    kn = _noise(n)
    a = kn.discrete_laplace(5, 1000.0)
    _assert_independent(a, kn.discrete_laplace(5, 2000.0))
    _assert_independent(a, kn.discrete_laplace(5, 1000.0000000000001))
    _assert_independent(a, kn.discrete_gaussian(5, 1000.0))
    _assert_independent(kn.discrete_gaussian(5, 30.0), kn.discrete_gaussian(5, 60.0))


def test_channel_cache_eviction_keeps_determinism() -> None:
    kn = _noise(50)
    first = kn.discrete_laplace(1, 10.0)
    for k in range(300):  # more distinct parameters than the cache holds
        kn.discrete_laplace(1, 10.0 + k / 7)
    assert np.array_equal(kn.discrete_laplace(1, 10.0), first)


def test_sample_does_not_depend_on_batch_membership_or_order() -> None:
    n = 70_000  # crosses the 2^16 chunk boundary
    ids = np.arange(10**9, 10**9 + n, dtype=np.uint64)
    full = KeyedNoise(KEY, "batch", ids)
    lap = full.discrete_laplace(3, 2.0**30)
    gau = full.discrete_gaussian(4, 3.5)
    rng = np.random.default_rng(5)  # test-side choice of subsets only
    pick = rng.choice(n, size=300, replace=False)
    sub = KeyedNoise(KEY, "batch", ids[pick])
    assert np.array_equal(sub.discrete_laplace(3, 2.0**30), lap[pick])
    assert np.array_equal(sub.discrete_gaussian(4, 3.5), gau[pick])
    alone = KeyedNoise(KEY, "batch", ids[pick[:1]])
    assert alone.discrete_laplace(3, 2.0**30)[0] == lap[pick[0]]
    rev = full.with_streams(ids[::-1])
    assert np.array_equal(rev.discrete_laplace(3, 2.0**30), lap[::-1])


def test_named_streams_are_keyed_by_name() -> None:
    names = [f"shop/{i}" for i in range(1000)]
    a = KeyedNoise(KEY, "named", stream_ids(names)).discrete_laplace(1, 10.0)
    b = KeyedNoise(KEY, "named", stream_ids(names[500:])).discrete_laplace(1, 10.0)
    assert np.array_equal(a[500:], b)


# ---------------------------------------------------------------- exactness of the lazy comparisons


def test_fast_path_and_exact_path_give_bit_identical_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 400
    cases = [("lap", 3.7), ("lap", 2.0**40 + 12345.5), ("gau", 3.3), ("gau", 2.0**35 + 0.25)]
    reference = []
    for kind, param in cases:
        kn = _noise(n, tag="exactness")
        f = kn.discrete_laplace if kind == "lap" else kn.discrete_gaussian
        reference.append(f(77, param))
    before = _exact.exact_calls
    monkeypatch.setattr(_exact, "FLOAT_MARGIN_LOG2", -1)  # float fast path almost never decides
    monkeypatch.setattr(laplace, "GEOMETRIC_WINDOW", 1 << 31)  # nor does the threshold table
    for (kind, param), ref in zip(cases, reference, strict=True):
        kn = _noise(n, tag="exactness")
        f = kn.discrete_laplace if kind == "lap" else kn.discrete_gaussian
        assert np.array_equal(f(77, param), ref), (kind, param)
    assert _exact.exact_calls - before > 2 * n * len(cases)  # the exact paths really ran


def _decimal_exp_neg(gamma: Fraction, prec: int) -> Decimal:
    getcontext().prec = 400
    return (-(Decimal(gamma.numerator) / Decimal(gamma.denominator))).exp() * (Decimal(2) ** prec)


def test_exp_neg_bracket_against_decimal_oracle() -> None:
    rng = np.random.default_rng(1)
    for _ in range(150):
        gamma = Fraction(int(rng.integers(0, 2**40)), int(rng.integers(1, 2**36)))
        if gamma > 60:
            gamma = gamma - int(gamma) + int(rng.integers(0, 60))
        for prec in (8, 53, 200):
            lo, hi = _exact.exp_neg_bracket(gamma, prec)
            exact = _decimal_exp_neg(gamma, prec)
            assert Decimal(lo) <= exact <= Decimal(hi), (gamma, prec)
            assert hi - lo <= 4 or hi <= 1
    assert _exact.exp_neg_bracket(Fraction(0), 10) == (1024, 1024)
    assert _exact.exp_neg_bracket(Fraction(10**6), 64) == (0, 1)


def test_geometric_thresholds_are_exact_floors() -> None:
    for t, j in [(8000, 3), (2**40, 0), (4097, 0)]:
        plan = laplace._plan(t, j)
        getcontext().prec = 100
        for v, lo in enumerate(plan.thresh[::-1].tolist(), start=1):
            val = (-(Decimal(plan.rate.numerator) / Decimal(plan.rate.denominator)) * v).exp()
            assert int(val * (Decimal(2) ** 32)) == lo


# ---------------------------------------------------------------- validation and limits


@pytest.mark.parametrize("scale", [0, -1.0, math.nan, math.inf, 2.0**-9, 2.0**51, "1", True])
def test_laplace_rejects_bad_scale(scale: object) -> None:
    with pytest.raises(ValueError, match=r"scale must be a number in \[2\*\*-8, 2\*\*50\]"):
        _noise(3).discrete_laplace(1, scale)  # type: ignore[arg-type]


@pytest.mark.parametrize("sigma", [0, -1.0, math.nan, math.inf, 2.0**-9, 2.0**47, None])
def test_gaussian_rejects_bad_sigma(sigma: object) -> None:
    with pytest.raises(ValueError, match=r"sigma must be a number in \[2\*\*-8, 2\*\*46\]"):
        _noise(3).discrete_gaussian(1, sigma)  # type: ignore[arg-type]


@pytest.mark.parametrize("node", [-1, 2**48, 1.5, "3", True])
def test_rejects_bad_node(node: object) -> None:
    with pytest.raises(ValueError, match=r"node must be an integer in \[0, 2\*\*48\)"):
        _noise(3).discrete_laplace(node, 1.0)  # type: ignore[arg-type]


def test_rejects_bad_stream_ids() -> None:
    with pytest.raises(ValueError, match="stream_ids"):
        KeyedNoise(KEY, "x", np.array([-1, 2]))
    with pytest.raises(ValueError, match="stream_ids"):
        KeyedNoise(KEY, "x", np.zeros((2, 2), dtype=np.uint64))
    assert KeyedNoise(KEY, "x", []).discrete_laplace(0, 1.0).shape == (0,)


def test_draw_counter_exhaustion_raises() -> None:
    source = _noise(4)._source("laplace", 1.0, 9)
    ids = np.arange(4, dtype=np.uint64)
    source.draw(ids, np.full(4, MAX_DRAWS - 1, dtype=np.uint64))  # the last allowed draw
    with pytest.raises(NoiseExhaustedError, match="exhausted"):
        source.draw(ids, np.full(4, MAX_DRAWS, dtype=np.uint64))


# ---------------------------------------------------------------- the exact paths on their own


def _more_bits(rng: np.random.Generator) -> object:
    def more(r: int) -> int:
        return int(rng.integers(0, 2**64, dtype=np.uint64)) | (
            int(rng.integers(0, 2**64, dtype=np.uint64)) << 64
        )

    return more


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(5, 2), Fraction(40)])
def test_uniform_below_exp_frequency(gamma: Fraction) -> None:
    """Bernoulli(exp(-γ)) from random 8-bit prefixes plus refinement bits: binomial test."""
    rng = np.random.default_rng(17)
    n = 20_000
    more = _more_bits(rng)
    hits = sum(
        _exact.uniform_below_exp(int(rng.integers(0, 256)), 8, gamma, more)  # type: ignore[arg-type]
        for _ in range(n)
    )
    p = math.exp(-float(gamma))
    assert stats.binomtest(hits, n, p).pvalue > P_MIN


def test_geometric_exact_tail_below_the_32_bit_prefix() -> None:
    """W's 32-bit prefix is 0 (probability 2^-32 in production): the tail must still be exact.

    Given W < 2^-32, P(V ≥ v) = min(1, 2^32 e^{-v}) for rate 1, so V ≥ 22 always.
    """
    rng = np.random.default_rng(23)
    more = _more_bits(rng)
    n = 4_000
    v = np.array([_exact.geometric_exact(0, 32, Fraction(1), more) for _ in range(n)])  # type: ignore[arg-type]
    assert v.min() >= 22
    ks = np.arange(22, 30)
    surv = np.minimum(1.0, 2.0**32 * np.exp(-ks.astype(np.float64)))  # P(V ≥ k)
    probs = np.append(-np.diff(surv), surv[-1])
    counts = np.array([np.sum(v == k) for k in ks[:-1]] + [np.sum(v >= ks[-1])])
    keep = probs * n > 5
    rest = counts[~keep].sum(), probs[~keep].sum()
    obs = np.append(counts[keep], rest[0])
    exp = np.append(probs[keep], rest[1]) * n
    assert stats.chisquare(obs, exp).pvalue > P_MIN


def test_geometric_exact_matches_thresholds_for_every_prefix_cell() -> None:
    """Away from the thresholds the exact path must agree with the 32-bit table."""
    plan = laplace._plan(8000, 3)
    rng = np.random.default_rng(29)
    more = _more_bits(rng)
    w = rng.integers(1, 2**32, size=300).astype(np.uint64)
    fast, amb = laplace._geometric_by_search(plan, w, 1)
    for wi, vf, a in zip(w.tolist(), fast.tolist(), amb.tolist(), strict=True):
        if not a:
            assert _exact.geometric_exact(wi, 32, plan.rate, more) == vf  # type: ignore[arg-type]


def test_numpy_exp_error_is_far_inside_the_fast_path_margin() -> None:
    """The fast paths assume float64 exp within a relative 2^-50 (margin: 2^-40); check it here."""
    rng = np.random.default_rng(31)
    x = np.concatenate([-rng.random(20_000) / 8, -rng.random(20_000) * 60])
    approx = np.exp(x)
    getcontext().prec = 60
    worst = 0.0
    for xi, ai in zip(x[::40].tolist(), approx[::40].tolist(), strict=True):
        exact = Decimal(xi).exp()  # Decimal(xi) is the exact binary value of xi
        worst = max(worst, float(abs(Decimal(ai) - exact) / exact))
    assert worst < 2.0**-50
    libm = np.array([math.exp(v) for v in x.tolist()])
    assert float(np.max(np.abs(approx - libm) / libm)) < 2.0**-50
