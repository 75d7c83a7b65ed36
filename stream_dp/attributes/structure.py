"""Which marginal tables to measure: a Chow–Liu spanning forest cut into capped clusters.

From the noisy bootstrap (:mod:`stream_dp.attributes.dependence`, post-processing only) we run
Kruskal's algorithm on the attribute pairs in decreasing *excess* mutual information (MI above the
noise-only level). Kruskal on MI gives the Chow–Liu tree, the tree-structured distribution closest
to the data in KL divergence (Chow & Liu 1968). We promote its strongest parts to joint tables:

* an edge whose two endpoint clusters together have at most ``max_cluster`` attributes merges them
  into one cluster — its **joint table** (``2**size`` cells) keeps *all* the dependence inside the
  cluster, not only the tree's pairs (the idea of seed 003: tables within clusters of dependent
  attributes);
* an edge that would exceed the cap, between two clusters not yet connected, becomes a
  **bridge** linking the clusters (what seed 003 drops by treating clusters as independent); its
  table holds the edge plus the attributes of the two clusters most dependent on its endpoints
  (up to ``bridge_size`` attributes, never a whole cluster), so it overlaps each cluster in a
  set of attributes, not only one;
* edges with excess MI ≤ 0 (noise-level dependence) never become bridges; they still fill
  clusters that have room (in decreasing MI order), because the budget is per table, not per
  cell: four attributes in one 16-cell table cost a quarter of four 1-way tables.

Every attribute is covered by its cluster's table (a singleton is a 1-way table) unless a bridge
already covers it. Each bridge joins two components of the forest built so far and meets each
of them inside one
cluster (a complete set): the measured cliques are the maximal cliques of a chordal graph, a
**decomposable** model: the maximum-entropy distribution with these marginals has the closed
junction-tree form used by :mod:`stream_dp.attributes.model`.

Why not spectral clustering + k-means++ (seed 003): it needs the number of clusters, has no
guarantee of a decomposable structure, and throws away between-cluster dependence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["Structure", "choose_structure"]


@dataclass(frozen=True)
class Structure:
    """The measured tables: ``clusters`` (joint tables, attribute tuples sorted ascending),
    ``bridges`` (the forest edges ``(i, j)``, ``i < j``, joining two clusters) and
    ``bridge_tables`` (the table measured for each bridge: its two endpoints, possibly extended
    by attributes of the two clusters, sorted; default the edge itself). ``tables`` lists the
    clusters and bridge tables."""

    m: int
    clusters: tuple[tuple[int, ...], ...]
    bridges: tuple[tuple[int, int], ...]
    bridge_tables: tuple[tuple[int, ...], ...] | None = None

    @property
    def tables(self) -> tuple[tuple[int, ...], ...]:
        """Every measured table: clusters (those inside a bridge table omitted), bridge tables."""
        extra = self.bridge_tables if self.bridge_tables is not None else self.bridges
        covering = [set(b) for b in extra]
        kept = tuple(c for c in self.clusters if not any(set(c) <= b for b in covering))
        return kept + tuple(tuple(b) for b in extra)

    def describe(self) -> str:
        """Canonical text of the structure (keys the noise of the tables)."""
        return ";".join(",".join(str(a) for a in t) for t in self.tables)

    @classmethod
    def from_tables(cls, m: int, tables: Sequence[Sequence[int]]) -> Structure:
        """A structure given explicitly (e.g. for tests); every table is kept as a cluster."""
        clusters = tuple(tuple(sorted(t)) for t in tables)
        return cls(m, clusters, ())


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))
        self.size = [1] * n

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.size[ra] < self.size[rb]:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.size[ra] += self.size[rb]


def choose_structure(
    excess: NDArray[np.float64],
    max_cluster: int = 4,
    max_bridges: int | None = None,
    bridge_size: int | None = None,
) -> Structure:
    """Capped Kruskal on the ``(m, m)`` excess-MI matrix (see the module doc).

    ``max_cluster`` ≥ 1 caps the attributes of one joint table (its cells are ``2**max_cluster``);
    ``max_bridges`` caps the number of bridge tables (strongest first; default no cap);
    ``bridge_size`` (default ``max_cluster``, at least 2) caps a bridge table: the edge ``(i, j)``
    is extended by the attributes of the two clusters most dependent on ``i`` (from ``i``'s
    cluster) or ``j`` (from ``j``'s), never a whole cluster of two or more, so the table keeps
    the dependence between the clusters' cores, not only between two attributes.
    Deterministic: ties are broken by the pair's indices.
    """
    m = int(excess.shape[0])
    if excess.shape != (m, m):
        raise ValueError(f"excess must be a square matrix, got shape {excess.shape}")
    if not 1 <= max_cluster <= 16:
        raise ValueError(f"max_cluster must be in [1, 16], got {max_cluster}")
    edges = sorted(
        ((float(excess[i, j]), i, j) for i in range(m) for j in range(i + 1, m)),
        key=lambda e: (-e[0], e[1], e[2]),
    )
    cluster = _UnionFind(m)
    spanning = _UnionFind(m)
    bridges: list[tuple[int, int]] = []
    for score, i, j in edges:
        if spanning.find(i) == spanning.find(j):
            continue  # would close a cycle
        ci, cj = cluster.find(i), cluster.find(j)
        if cluster.size[ci] + cluster.size[cj] <= max_cluster:
            # below the noise level too: packing attributes into joint tables costs nothing
            # (one event touches one cell per table, whatever its size) and needs fewer tables
            cluster.union(i, j)
            spanning.union(i, j)
        elif score > 0 and (max_bridges is None or len(bridges) < max_bridges):
            bridges.append((i, j))
            spanning.union(i, j)
    groups: dict[int, list[int]] = {}
    for a in range(m):
        groups.setdefault(cluster.find(a), []).append(a)
    clusters = tuple(sorted(tuple(g) for g in groups.values()))
    size = max(2, max_cluster if bridge_size is None else bridge_size)
    where = {a: c for c in clusters for a in c}
    tables = []
    for i, j in bridges:
        chosen = {i, j}
        room = {i: len(where[i]) - 1, j: len(where[j]) - 1}  # never swallow a whole cluster
        cands = sorted(
            [(-float(excess[e, x]), x, e) for e in (i, j) for x in where[e] if x != e],
        )
        for _, x, e in cands:
            if len(chosen) >= size:
                break
            side = {a for a in chosen if a in where[e]}
            if len(side) < room[e]:
                chosen.add(x)
        tables.append(tuple(sorted(chosen)))
    return Structure(m, clusters, tuple(bridges), tuple(tables))
