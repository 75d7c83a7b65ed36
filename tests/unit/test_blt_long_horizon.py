"""``blt``, issue #36: long horizons at ``p = 1``.

The fit is evaluated over at most ``2**16`` ticks; past that (up to ``2**22``) it gains one
slower buffer, fitted over the whole horizon. Checked here: the extension's exact loss against a
direct sum, the issue's 1.10× target at ``2**20 − 1`` and a real ``CounterBank``'s error there
against the claimed curve.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_dp.budget import ZCDP
from stream_dp.lower_bound import mean_mse_bound
from stream_dp.planner import make_mechanism
from stream_dp.strategies.blt import plan as blt_plan

KEY = b"blt-first-block-key-0123456789ab"


def test_a_long_horizon_at_p1_extends_the_fit_by_a_slower_buffer() -> None:
    """p = 1, horizon 2**17 − 1 > 2**16 (the longest fitted): one buffer slower than the
    2**16 fit's slowest by the ratio of the horizons, its weight searched on the exact loss
    over the whole horizon; the exact loss (the unscaled :func:`mean_factor`, against a direct
    sum of the reconstruction) is lower than the 2**16 fit's there."""
    horizon = (1 << 17) - 1
    base_th, base_w = (np.asarray(v) for v in blt_plan.fit(1.0, 1 << 16))
    th, w = (np.asarray(v) for v in blt_plan.fit(1.0, horizon))
    assert len(th) == len(base_th) + 1 <= blt_plan.BUFFERS
    assert 1.0 - th[0] == pytest.approx((1.0 - base_th[0]) * (1 << 16) / horizon, rel=0.01)
    np.testing.assert_array_equal(th[1:], base_th)

    def direct(t: np.ndarray, v: np.ndarray) -> float:
        c = blt_plan.coefficients(t, v, horizon)
        b = np.cumsum(blt_plan.inverse_coefficients(t, v, horizon))  # W_1·C⁻¹: running sums
        return math.fsum((c * c).tolist()) * float(np.cumsum(b * b).mean())

    assert direct(th, w) == pytest.approx(blt_plan.mean_factor(1.0, horizon, th, w), rel=1e-9)
    assert direct(th, w) < 0.99 * direct(base_th, base_w)


def test_issue_36_blt_at_p1_over_a_million_ticks() -> None:
    """p = 1, horizon 2**20 − 1 (packaged fit): ≤ 1.10× the lower bound (issue #36; 2.16× with
    the 2**16 fit), and a real CounterBank's error matches the claimed curve."""
    from stream_dp.figures import rounding_bias
    from tests.unit._montecarlo import empirical_mse_curve, mse_slack

    horizon = (1 << 20) - 1
    mech = make_mechanism("blt", 1.0, horizon, ZCDP(0.5))
    assert len(mech.theta) == blt_plan.BUFFERS
    bound = mean_mse_bound(horizon, 1.0, ZCDP(0.5))
    assert float(mech.mse_curve(horizon).mean()) <= 1.10 * bound
    n_streams, ticks = 3000, 300
    rng = np.random.default_rng(20)
    sq, _ = empirical_mse_curve(mech, KEY, n_streams, ticks,
                                lambda t: rng.uniform(0.0, 3.0, size=n_streams))
    exact = mech.mse_curve(ticks)
    slack = mse_slack(exact, n_streams, rounding_bias(mech, ticks))
    for t in (1, 2, 10, 100, ticks):
        assert abs(sq[t - 1] - exact[t - 1]) <= slack[t - 1], (t, sq[t - 1], exact[t - 1])
    assert abs(sq.mean() - exact.mean()) <= slack.mean()
