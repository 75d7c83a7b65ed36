"""Least-squares tree family: ``tree-ls``, a two-level tree decoded non-causally and exactly.

:mod:`.plan` holds the maths (coefficients, exact variance, plan search), :mod:`.mechanism` the
mechanism (importing it registers ``tree-ls``) and :mod:`._oracle` the dense-matrix oracle.
"""

from __future__ import annotations

from stream_dp.strategies.ls_tree.mechanism import LsTreeMechanism, make

__all__ = ["LsTreeMechanism", "make"]
