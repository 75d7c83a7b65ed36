"""Fenwick family: weighted Fenwick-tree factorisations ``dm``, ``dmfda`` and ``fenwick-opt``.

:mod:`.plan` holds the tree maths (query paths, column sums, dense matrices; moved from
``stream_dp/fenwick.py``), :mod:`.dmfda_weights` the DMFDA weights (from
``stream_dp/dmfda.py``), :mod:`.opt_weights` the optimised weights (from
``stream_dp/fenwick_opt.py``), :mod:`.base` the shared mechanism (from
``stream_dp/strategies/_fenwick_base.py``), :mod:`.dm`, :mod:`.dmfda`, :mod:`.fenwick_opt` the
three mechanisms, and :mod:`._oracle` the dense-matrix oracle used by the tests.
"""

from __future__ import annotations
