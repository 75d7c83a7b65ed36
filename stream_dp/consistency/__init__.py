"""Optimal consistent releases of hierarchical and multi-attribute histograms (seeds 000, 002).

Public API: :func:`reconcile` (per tick, over a :class:`~stream_dp.domain.Domain`),
:func:`consistent_tree` / :func:`consistent_trees` (exact GLS on trees), :func:`fgmc_project`
(seed 002's 3-level attribute trees), :func:`approximate` (seed 000's approximation method) and
:func:`general_solution` / :func:`weighted_general_solution` (the O(n³) oracle and baseline).
"""

from __future__ import annotations

from stream_dp.consistency.approx import (
    ApproxResult,
    GridBlock,
    GridTreeBlock,
    GroupBlock,
    SubProblem,
    TreeBlock,
    approximate,
)
from stream_dp.consistency.fgmc import GridProjector, fgmc_paper, fgmc_project
from stream_dp.consistency.general import general_solution, weighted_general_solution
from stream_dp.consistency.reconcile import ReconcileResult, reconcile
from stream_dp.consistency.tree import TreePlan, consistent_tree, consistent_trees

__all__ = [
    "ApproxResult",
    "GridBlock",
    "GridProjector",
    "GridTreeBlock",
    "GroupBlock",
    "ReconcileResult",
    "SubProblem",
    "TreeBlock",
    "TreePlan",
    "approximate",
    "consistent_tree",
    "consistent_trees",
    "fgmc_paper",
    "fgmc_project",
    "general_solution",
    "reconcile",
    "weighted_general_solution",
]
