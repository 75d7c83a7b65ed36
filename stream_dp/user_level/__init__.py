"""User-level privacy (issue #34): a person as the unit, bounded before the noise.

Holds the maths of the person as unit of privacy, and nothing of Kafka or of the service:

* :mod:`.bounds` — :class:`UserBounds`, the public per-period bounds (K, L, k, b, the period);
* :mod:`.bounding` — :class:`Bounder`, which of a person's events count, in log order, from that
  person's own records only (the authoritative rule, applied per events partition);
* :mod:`.sensitivity` — how far one bounded person moves a measurement matrix: the pure-DP and
  zCDP factors over the per-event budget, exact where a closed form exists, brute force as the
  test oracle;
* :mod:`.trees` — the zCDP factor of the tree strategies at a minimum separation: a program
  over the nested blocks, exact at ``p = 1``;
* :mod:`.group` — :class:`GroupBudget`, a person's budget where one event costs one pure ε over
  every output (the binary-attribute tables and ``stream-dp marginals``): ``K·ε`` per period;
* :mod:`.accounting` — :func:`stream_factor` of a configured mechanism and
  :class:`UserAccountant`, the per-person budget per stream, per period in total and over a
  year (the lines ``stream-dp plan`` will print).

May import: numpy and the library's budgets, accountant and domain (the tests build mechanisms
through the planner; the package itself takes configured mechanisms as arguments); must not import
the planner or the analysis. The design, including what is not built yet, is in
docs/design/user-level.md.
"""

from __future__ import annotations

from stream_dp.user_level.accounting import (
    UserAccountant,
    UserFactor,
    layer_leaves,
    stream_factor,
    year_periods,
)
from stream_dp.user_level.bounding import Bounder, keep_mask
from stream_dp.user_level.bounds import UserBounds
from stream_dp.user_level.group import GroupBudget, float_up, format_up
from stream_dp.user_level.sensitivity import (
    brute_force_norm_sq,
    gram_upper_bound_sq,
    max_spaced_sum,
    pure_factor,
    toeplitz_spaced_norm_sq,
    zcdp_factor,
)
from stream_dp.user_level.trees import tree_norm_sq, tree_period_norm_sq

__all__ = [
    "Bounder",
    "GroupBudget",
    "UserAccountant",
    "UserBounds",
    "UserFactor",
    "brute_force_norm_sq",
    "float_up",
    "format_up",
    "gram_upper_bound_sq",
    "keep_mask",
    "layer_leaves",
    "max_spaced_sum",
    "pure_factor",
    "stream_factor",
    "toeplitz_spaced_norm_sq",
    "tree_norm_sq",
    "tree_period_norm_sq",
    "year_periods",
    "zcdp_factor",
]
