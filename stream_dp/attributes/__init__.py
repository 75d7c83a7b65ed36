"""High-dimensional binary-attribute streams: which marginals to measure, and answers from them.

Modules (small, one job each):

* :mod:`~stream_dp.attributes.domain` — ``m ≤ 64`` named binary attributes, event encoding;
* :mod:`~stream_dp.attributes.tables` — marginal tables: cell order, exact counts, marginalising;
* :mod:`~stream_dp.attributes.dependence` — the charged bootstrap (noisy pair tables) and
  mutual information with its noise-only level;
* :mod:`~stream_dp.attributes.structure` — capped Chow–Liu clusters + bridges (decomposable);
* :mod:`~stream_dp.attributes.consistency` — GLS consistency of overlapping tables (seed 000);
* :mod:`~stream_dp.attributes.model` — the junction-tree / maximum-entropy estimator;
* :mod:`~stream_dp.attributes.release` — the pipeline and its accounting (``stream-dp marginals``);
* :mod:`~stream_dp.attributes.live` — the service's live release: tables re-decided per
  structure epoch from that epoch's charged bootstrap;
* :mod:`~stream_dp.attributes.query` — the query helper (names, labelled cells, standard errors).
"""

from __future__ import annotations

from stream_dp.attributes.domain import BinaryDomain
from stream_dp.attributes.live import LiveConfig, LiveMarginals, LiveTick
from stream_dp.attributes.model import JunctionTreeModel
from stream_dp.attributes.query import QueryAnswer, answer, answer_all, model_from_marginals
from stream_dp.attributes.release import (
    BudgetSplit,
    MarginalRelease,
    OfflineResult,
    run_offline,
    split_budget,
)
from stream_dp.attributes.structure import Structure, choose_structure

__all__ = [
    "BinaryDomain",
    "BudgetSplit",
    "JunctionTreeModel",
    "LiveConfig",
    "LiveMarginals",
    "LiveTick",
    "MarginalRelease",
    "OfflineResult",
    "QueryAnswer",
    "Structure",
    "answer",
    "answer_all",
    "choose_structure",
    "model_from_marginals",
    "run_offline",
    "split_budget",
]
