"""Tree family: sparse hierarchical trees, ``tree`` (searched plan) and ``binary-tree``.

:mod:`.plan` holds the maths (level sets, weights, exact variance, plan search; moved from
``stream_dp/tree_plan.py``), :mod:`.mechanism` the mechanisms (moved from
``stream_dp/strategies/tree.py``; importing it registers both names) and :mod:`._oracle` the
dense-matrix oracle used by the tests.
"""

from __future__ import annotations

from stream_dp.strategies.tree.mechanism import (
    MAX_MEASURED_UNITS,
    SLACK_UNITS,
    BinaryTreeMechanism,
    TreeMechanism,
    make,
    make_binary,
)

__all__ = [
    "MAX_MEASURED_UNITS",
    "SLACK_UNITS",
    "BinaryTreeMechanism", "TreeMechanism", "make", "make_binary"]
