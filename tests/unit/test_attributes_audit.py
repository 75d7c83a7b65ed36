"""Empirical privacy audit of the attribute bootstrap (the only new noise path of issue #13;
the tables go through ``CounterBank``, audited per strategy in test_privacy_audit.py).

Worst-case neighbours: D, and D plus one event with every attribute 1 (k = m > K ones, the
down-weighted case, L1 change 1 + m·w₁ + C(m,2)·w₂ ≈ the sensitivity). Many keyed trials of
:func:`noisy_cooccurrence` on each; the optimal test for Laplace noise thresholds the
log-likelihood ratio ``Σ (|y − a| − |y − b|)/scale``. The Clopper–Pearson lower bound on ε (95 %,
Bonferroni over three thresholds fixed in advance) must stay ≤ the declared ε₀, and the same
audit must exceed ε₀ for a control whose noise scale is halved.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta

from stream_dp.attributes.dependence import (
    WEIGHT_GRID,
    cooccurrence_sensitivity,
    cooccurrence_vector,
    noisy_cooccurrence,
)

pytestmark = pytest.mark.slow

EPS0 = 1.0
K = 2
TRIALS = 4000
KEY = b"audit-key-attributes-0123456789ab"


def _llr_samples(
    sample_from: np.ndarray, d: np.ndarray, d_plus: np.ndarray, tag: str, weaken: float
) -> np.ndarray:
    """``log p(y | D_plus) − log p(y | D)`` (declared scale) for ``y`` drawn from ``sample_from``."""
    a = cooccurrence_vector(d, K) / WEIGHT_GRID
    b = cooccurrence_vector(d_plus, K) / WEIGHT_GRID
    scale = cooccurrence_sensitivity(K) / WEIGHT_GRID / EPS0
    out = np.empty(TRIALS)
    for i in range(TRIALS):
        y, _ = noisy_cooccurrence(sample_from, EPS0, KEY, f"{tag}/{i}", K, _weaken=weaken)
        y = y / WEIGHT_GRID
        out[i] = (np.abs(y - a).sum() - np.abs(y - b).sum()) / scale
    return out


def _audited_epsilon(weaken: float) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    m = 4
    d = (rng.random((20, m)) < 0.3).astype(np.uint8)
    d_plus = np.vstack([d, np.ones((1, m), dtype=np.uint8)])
    change = np.abs(cooccurrence_vector(d_plus, K) - cooccurrence_vector(d, K)).sum()
    assert change <= cooccurrence_sensitivity(K)
    on_plus = _llr_samples(d_plus, d, d_plus, f"plus/{weaken}", weaken)
    on_minus = _llr_samples(d, d, d_plus, f"minus/{weaken}", weaken)
    best = 0.0
    top = change / cooccurrence_sensitivity(K) * EPS0
    alpha = 0.05 / 3
    for c in (0.5 * top, 0.7 * top, 0.85 * top):
        tp = int((on_plus >= c).sum())
        fp = int((on_minus >= c).sum())
        tp_low = beta.ppf(alpha / 2, tp, TRIALS - tp + 1) if tp > 0 else 0.0
        fp_high = beta.ppf(1 - alpha / 2, fp + 1, TRIALS - fp) if fp < TRIALS else 1.0
        if tp_low > 0:
            best = max(best, math.log(tp_low / fp_high))
    return best, top


def test_bootstrap_audited_epsilon_within_declared() -> None:
    audited, _ = _audited_epsilon(1.0)
    assert audited <= EPS0, audited
    assert audited > 0.2 * EPS0  # the audit has power: it sees most of the loss


def test_audit_catches_a_halved_noise_scale() -> None:
    audited, _ = _audited_epsilon(2.0)
    assert audited > EPS0, audited
