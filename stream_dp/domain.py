"""Declared streams: a flat list, a hierarchy (forest), or a multi-attribute grid.

A :class:`Domain` lists every released node (one stream each) in a fixed order, says which
nodes one event feeds (:meth:`Domain.nodes_for_event`, :attr:`Domain.touches`), and carries the
linear constraints the true values satisfy at every tick, for the consistency engine
(:mod:`stream_dp.consistency`). Domains are immutable and validated on construction.

Kinds:

* ``flat`` — independent streams, no constraints (unless extra groups are declared);
* ``hierarchy`` — a forest given by a parent array; ``parent value = Σ children`` at every
  internal node. Events name a **leaf** and feed the leaf and all its ancestors;
* ``grid`` — k attributes with their categories (seed 002): nodes ``total``, one node
  ``attr=cat`` per category (attributes in declaration order), and one cell per combination,
  ``a1=c1|a2=c2|…`` (declaration order, last attribute varying fastest). Constraints: for every
  attribute, ``total = Σ its categories`` and each category = Σ of its cells (k 3-level trees).
  Events name a cell (attributes in any order) and feed the total, one category per attribute
  and the cell: ``touches = k + 2``.

Extra constraint groups (:class:`ConstraintGroup`, any kind): ``matrix @ values[row] = 0`` for
every row of node indices, rows pairwise disjoint (e.g. seed 000's per-day package constraints
``B v_t = 0`` across the items' leaves of day t). They must hold for the true values; declaring
constraints implied by the others (e.g. the same package constraint on every interval node,
not only on the leaves) does not change the optimum and can make the solver converge much faster.

Domain file format (TOML; :meth:`Domain.from_file` reads the ``[domain]`` table if present,
else the top level; :meth:`Domain.from_toml` takes that table as a dict)::

    [domain]
    name = "shops"                    # optional, default "default"
    kind = "hierarchy"                # "flat" | "hierarchy" | "grid"

    # kind = "flat"
    streams = ["a", "b", "c"]

    # kind = "hierarchy", either from paths (internal nodes and the root are added) ...
    paths = ["eu/fr/paris", "eu/fr/lyon", "eu/de/berlin"]
    sep = "/"                         # optional, default "/"
    root = "all"                      # optional, default "all"; "" for no common root (forest)
    # ... or from explicit parents ("" = a root):
    # streams = ["all", "eu", "us"]
    # parents = ["", "all", "all"]

    # kind = "grid"
    [domain.attributes]               # declaration order is the attribute order
    region = ["north", "south"]
    product = ["a", "b", "c"]

    # optional extra constraint groups, any kind
    [[domain.constraints]]
    name = "packages"
    matrix = [[1, -5, 3, 4, 0], [-1, -1, 1, 0, 2]]
    rows = [["cola/d1", "burger/d1", "wings/d1", "fries/d1", "nuggets/d1"]]
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike, NDArray

from stream_dp.consistency.tree import TreePlan, validate_parent
from stream_dp.domain_file import _KINDS, domain_from_file, domain_from_toml

Float64Array = NDArray[np.float64]
Int64Array = NDArray[np.int64]
Kind = Literal["flat", "hierarchy", "grid"]

__all__ = ["ConstraintGroup", "Domain", "Kind"]

_TOTAL = "total"


@dataclass(frozen=True, eq=False)
class ConstraintGroup:
    """``matrix @ values[rows[g]] = 0`` for every row ``g`` (node indices, pairwise disjoint).

    ``matrix``: shape ``(r, c)``, finite; ``rows``: shape ``(G, c)``, int64 node indices.
    """

    name: str
    matrix: Float64Array
    rows: Int64Array

    def __post_init__(self) -> None:
        m = np.array(self.matrix, dtype=np.float64)
        if m.ndim != 2 or m.size == 0 or not np.all(np.isfinite(m)):
            raise ValueError(
                f"constraint group {self.name!r}: matrix must be a finite, non-empty 2-D array"
            )
        r = np.array(self.rows)
        if r.ndim != 2 or r.shape[1] != m.shape[1] or r.shape[0] == 0:
            raise ValueError(
                f"constraint group {self.name!r}: rows must have shape (groups ≥ 1, {m.shape[1]}), got {r.shape}"
            )
        r = r.astype(np.int64)
        flat = r.reshape(-1)
        if np.unique(flat).size != flat.size:
            raise ValueError(
                f"constraint group {self.name!r}: rows must use pairwise disjoint nodes"
            )
        m.setflags(write=False)
        r.setflags(write=False)
        object.__setattr__(self, "matrix", m)
        object.__setattr__(self, "rows", r)


def _check_names(
    names: Sequence[str], what: str = "names"
) -> tuple[tuple[str, ...], dict[str, int]]:
    """Validated names and their positions (``ValueError``: empty, non-string, duplicate)."""
    out = tuple(names)
    if not out:
        raise ValueError(f"a domain needs at least one stream: {what} is empty")
    try:
        index = dict(zip(out, range(len(out)), strict=True))
    except TypeError:
        index = {}
    if index and len(index) != len(out):
        seen: set[str] = set()
        dup = next(s for s in out if s in seen or seen.add(s))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate stream name in {what}: {dup!r}")
    if not index or "" in index or not all(type(s) is str for s in index):
        i, bad = next((i, s) for i, s in enumerate(out) if not (isinstance(s, str) and s))
        raise ValueError(f"{what}[{i}] must be a non-empty string, got {bad!r}")
    # one scan of 65 536 names at a time (at 10^7 names a check per name was most of a
    # start-up); the per-name check then names the first bad one
    for start in range(0, len(out), 65536):
        if _NOT_TEXT.search("".join(out[start : start + 65536])) is not None:
            for i in range(start, len(out)):
                check_text(out[i], f"{what}[{i}]")
    return out, index


#: a control character, or a lone surrogate (what UTF-8 cannot encode: undecodable bytes)
_NOT_TEXT = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def check_text(value: str, what: str) -> str:
    """``value`` if it is valid Unicode text that names a stream on the wire: UTF-8 encodable
    (no lone surrogates, e.g. from undecodable bytes) and free of control characters."""
    if _NOT_TEXT.search(value) is None:
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{what} must be valid UTF-8 text (no lone surrogates or undecodable bytes), "
            f"got {value!r}"
        ) from None
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{what} must not contain control characters, got {value!r}")
    return value


@dataclass(frozen=True, eq=False)
class Domain:
    """The declared streams of one service (see the module docstring for the kinds).

    Use the constructors (:meth:`flat`, :meth:`from_paths`, :meth:`from_parent`, :meth:`grid`,
    :meth:`from_toml`, :meth:`from_file`) rather than the raw fields.
    """

    kind: Kind
    names: tuple[str, ...]
    parent: Int64Array | None = None
    attributes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    groups: tuple[ConstraintGroup, ...] = ()
    name: str = "default"
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {', '.join(_KINDS)}; got {self.kind!r}")
        names, index = _check_names(self.names)
        object.__setattr__(self, "names", names)
        if not isinstance(self.name, str):
            raise ValueError(f"name must be a string, got {self.name!r}")
        check_text(self.name, "name")
        n = len(names)
        if self.kind == "hierarchy":
            if self.parent is None:
                raise ValueError("a hierarchy needs a parent array")
            par = validate_parent(self.parent).copy()
            if par.size != n:
                raise ValueError(f"parent must have one entry per name ({n}), got {par.size}")
            plan = TreePlan(par)  # raises ValueError on cycles
            par.setflags(write=False)
            object.__setattr__(self, "parent", par)
            self.__dict__["_plan"] = plan  # fills the cached property below
        elif self.parent is not None:
            raise ValueError(f"a {self.kind} domain has no parent array")
        if self.kind == "grid":
            if not self.attributes:
                raise ValueError("a grid needs at least one attribute")
            expected = (
                1
                + sum(len(c) for _, c in self.attributes)
                + math.prod(len(c) for _, c in self.attributes)
            )
            if expected != n:
                raise ValueError(
                    f"a grid with these attributes has {expected} nodes, got {n} names"
                )
        for g in self.groups:
            if g.rows.size and (g.rows.min() < 0 or g.rows.max() >= n):
                raise ValueError(f"constraint group {g.name!r}: node index outside [0, {n - 1}]")
        object.__setattr__(self, "_index", index)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def flat(cls, names: Sequence[str], *, name: str = "default") -> Domain:
        """Independent streams, in the given order."""
        return cls("flat", tuple(names), name=name)

    @classmethod
    def from_parent(
        cls, names: Sequence[str], parent: ArrayLike, *, name: str = "default"
    ) -> Domain:
        """A forest: ``parent[i]`` is the index of node i's parent, ``-1`` for a root."""
        return cls("hierarchy", tuple(names), np.asarray(parent), name=name)

    @classmethod
    def from_paths(
        cls,
        paths: Sequence[str],
        sep: str = "/",
        root: str | None = "all",
        *,
        name: str = "default",
    ) -> Domain:
        """A hierarchy from leaf paths like ``"eu/fr/paris"``; internal nodes are added.

        Node names are the path prefixes (``"eu"``, ``"eu/fr"``, ``"eu/fr/paris"``); ``root``
        names a common root above the top-level nodes (``None`` or ``""``: a forest). Nodes are
        ordered breadth-first (root first), children in order of first appearance.
        """
        if not sep:
            raise ValueError("sep must be a non-empty string")
        leaves = list(paths)
        if not leaves:
            raise ValueError("a domain needs at least one stream: paths is empty")
        double = sep + sep
        for i, path in enumerate(leaves):
            if not isinstance(path, str) or not path:
                raise ValueError(f"paths[{i}] must be a non-empty string, got {path!r}")
            if path.startswith(sep) or path.endswith(sep) or double in path:
                raise ValueError(f"paths[{i}] = {path!r} has an empty component (sep {sep!r})")
        index = dict(zip(leaves, range(len(leaves)), strict=True))
        if len(index) != len(leaves):
            seen: set[str] = set()
            dup = next(p for p in leaves if p in seen or seen.add(p))  # type: ignore[func-returns-value]
            raise ValueError(f"duplicate path: {dup!r}")
        # add the missing prefixes, one level up at a time (each node's parent is its prefix)
        names = leaves
        parent_names = [p.rpartition(sep)[0] for p in leaves]
        todo = parent_names
        while True:
            new = [q for q in dict.fromkeys(todo) if q and q not in index]
            if not new:
                break
            for q in new:
                index[q] = len(names)
                names.append(q)
            todo = [q.rpartition(sep)[0] for q in new]
            parent_names.extend(todo)
        if root:
            if root in index:
                raise ValueError(f"a path collides with the root name {root!r}")
            top = len(names)
            names.append(root)
            parent_names.append("")
            par = np.fromiter(
                (index[q] if q else top for q in parent_names), dtype=np.int64, count=len(names)
            )
            par[top] = -1
        else:
            par = np.fromiter(
                (index[q] if q else -1 for q in parent_names), dtype=np.int64, count=len(names)
            )
        # breadth-first order, siblings in order of first appearance in ``paths``
        plan = TreePlan(par)
        first = np.full(len(names), len(leaves), dtype=np.int64)
        first[: len(leaves)] = np.arange(len(leaves))
        offs = plan.level_offsets
        for d in range(plan.depth - 1, 0, -1):
            lvl = plan.order[offs[d] : offs[d + 1]]
            np.minimum.at(first, par[lvl], first[lvl])
        order_parts: list[Int64Array] = []
        new_pos = np.empty(len(names), dtype=np.int64)
        placed = 0
        for d in range(plan.depth):
            lvl = plan.order[offs[d] : offs[d + 1]]
            key_parent = (
                new_pos[np.maximum(par[lvl], 0)] if d else np.zeros(lvl.size, dtype=np.int64)
            )
            lvl = lvl[np.lexsort((first[lvl], key_parent))]
            new_pos[lvl] = placed + np.arange(lvl.size)
            placed += lvl.size
            order_parts.append(lvl)
        order = np.concatenate(order_parts)
        new_par = np.where(par[order] >= 0, new_pos[np.maximum(par[order], 0)], -1)
        return cls("hierarchy", tuple(names[i] for i in order), new_par, name=name)

    @classmethod
    def grid(cls, attributes: Mapping[str, Sequence[str]], *, name: str = "default") -> Domain:
        """Attribute grid (seed 002): ``total``, ``attr=cat`` per category, then the cells."""
        if not attributes:
            raise ValueError("a grid needs at least one attribute: attributes is empty")
        attrs: list[tuple[str, tuple[str, ...]]] = []
        for a, cats in attributes.items():
            if not isinstance(a, str) or not a or "=" in a or "|" in a:
                raise ValueError(
                    f"attribute name must be a non-empty string without '=' or '|', got {a!r}"
                )
            if isinstance(cats, str):
                raise ValueError(f"categories of {a!r} must be a list of strings, got a string")
            cs, _ = _check_names(list(cats), what=f"categories of {a!r}")
            for c in cs:
                if "=" in c or "|" in c:
                    raise ValueError(f"category {c!r} of {a!r} must not contain '=' or '|'")
            attrs.append((a, cs))
        if len(attrs) < 2:
            raise ValueError(
                "a grid needs at least 2 attributes (its cells would repeat the categories); "
                "use a hierarchy for a single attribute"
            )
        names = [_TOTAL]
        for a, cs in attrs:
            names += [f"{a}={c}" for c in cs]
        labels = [[f"{a}={c}" for c in cs] for a, cs in attrs]
        cells = ["|".join(t) for t in itertools.product(*labels)]
        names += cells
        return cls("grid", tuple(names), attributes=tuple(attrs), name=name)

    def with_constraints(
        self, group_name: str, matrix: ArrayLike, rows: Sequence[Sequence[str | int]]
    ) -> Domain:
        """A copy with one more constraint group; ``rows`` name nodes (or give indices)."""
        idx = (
            np.array(
                [[self._node(r) if isinstance(r, str) else int(r) for r in row] for row in rows],
                dtype=np.int64,
            )
            if rows
            else np.zeros((0, np.shape(matrix)[-1]), dtype=np.int64)
        )
        group = ConstraintGroup(group_name, np.asarray(matrix, dtype=np.float64), idx)
        return Domain(
            self.kind, self.names, self.parent, self.attributes, (*self.groups, group), self.name
        )

    @classmethod
    def from_toml(cls, section: Mapping[str, Any]) -> Domain:
        """Build from a domain file's table (format in the module docstring; reading in
        :mod:`stream_dp.domain_file`)."""
        return domain_from_toml(cls, section)

    @classmethod
    def from_file(cls, path: str | Path) -> Domain:
        """Read a TOML domain file (its ``[domain]`` table if present, else the top level)."""
        return domain_from_file(cls, path)

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.names)

    @property
    def size(self) -> int:
        """Number of released nodes (streams)."""
        return len(self.names)

    def digest(self) -> str:
        """SHA-256 (hex) of a canonical description of the whole domain: name, kind, node names
        in order, parents, attributes and constraint groups (exact bytes).

        The service binds its noise and checkpoints to it (``CounterBank(domain_id=...)``):
        two deployments with one key and different domains draw unrelated noise, and a changed
        domain file refuses the old checkpoints (change it with a new ``epoch``).
        """
        from stream_dp.mechanism import canonical_json

        desc: dict[str, object] = {
            "domain_version": 1,
            "name": self.name,
            "kind": self.kind,
            "names": list(self.names),
            "parent": None if self.parent is None else self.parent.tolist(),
            "attributes": [[a, list(c)] for a, c in self.attributes],
            "groups": [
                {"name": g.name, "matrix": np.asarray(g.matrix), "rows": np.asarray(g.rows)}
                for g in self.groups
            ],
        }
        return hashlib.sha256(canonical_json(desc)).hexdigest()

    @property
    def positions(self) -> Mapping[str, int]:
        """Every node name → its position, read-only (the domain's own index: no copy of 10^7
        names for a caller that looks many of them up)."""
        return MappingProxyType(self._index)

    def index(self, stream: str) -> int:
        """Position of a node name; ``KeyError`` if undeclared."""
        return self._node(stream)

    def leaf_keys(self) -> dict[str, int]:
        """Flat and hierarchy domains: every valid event key (a flat stream, a hierarchy leaf)
        → its node index, a new dict (the event's nodes are that node and its ancestors,
        :meth:`nodes_for_event`). ``ValueError`` for a grid (its keys are cell descriptions).

        >>> Domain.from_paths(["a/x", "a/y", "b"]).leaf_keys()
        {'b': 2, 'a/x': 3, 'a/y': 4}
        """
        if self.kind == "flat":
            return dict(self._index)
        if self.kind != "hierarchy":
            raise ValueError(f"a {self.kind} domain has no leaf keys")
        names = self.names
        keys = [names[i] for i in np.flatnonzero(self._is_leaf).tolist()]  # node order
        # the index's own int objects (new ones would cost 28 bytes a leaf)
        return dict(zip(keys, map(self._index.__getitem__, keys), strict=True))

    def _node(self, stream: str) -> int:
        try:
            return self._index[stream]
        except KeyError:
            raise KeyError(f"undeclared stream {stream!r}") from None

    @cached_property
    def cell_shape(self) -> tuple[int, ...]:
        """Grid only: number of categories per attribute (declaration order)."""
        return tuple(len(c) for _, c in self.attributes)

    @cached_property
    def _category_index(self) -> dict[str, tuple[int, dict[str, int]]]:
        return {
            a: (i, {c: j for j, c in enumerate(cs)}) for i, (a, cs) in enumerate(self.attributes)
        }

    @cached_property
    def _plan(self) -> TreePlan:
        assert self.parent is not None
        return TreePlan(self.parent)

    @cached_property
    def _is_leaf(self) -> NDArray[np.bool_]:
        assert self.parent is not None
        has_child = np.zeros(self.size, dtype=bool)
        has_child[self.parent[self.parent >= 0]] = True
        return ~has_child

    @cached_property
    def touches(self) -> int:
        """Nodes one event feeds (the accountant multiplies the per-node budget by this).

        flat: 1; hierarchy: the number of levels (longest root-to-leaf path); grid: k + 2.
        """
        if self.kind == "hierarchy":
            return self._plan.depth
        if self.kind == "grid":
            return len(self.attributes) + 2
        return 1

    def nodes_for_event(self, key: str) -> Int64Array:
        """Indices of the nodes one event with this key feeds (``KeyError`` if undeclared).

        flat: the stream itself; hierarchy: the leaf and its ancestors (leaf first; an internal
        node is not a valid event key); grid: total, one category per attribute (declaration
        order), then the cell. Grid keys are ``a1=c1|a2=c2|…`` with the attributes in any order.
        """
        if self.kind == "grid":
            return self._grid_nodes(key)
        i = self._node(key)
        if self.kind == "flat":
            return np.array([i], dtype=np.int64)
        assert self.parent is not None
        if not self._is_leaf[i]:
            raise KeyError(f"stream {key!r} is an internal node; events must name a leaf")
        path = [i]
        while self.parent[path[-1]] >= 0:
            path.append(int(self.parent[path[-1]]))
        return np.array(path, dtype=np.int64)

    def _grid_nodes(self, key: str) -> Int64Array:
        cats = self._category_index
        coords = [-1] * len(self.attributes)
        for part in key.split("|"):
            a, eq, c = part.partition("=")
            if not eq or a not in cats:
                raise KeyError(f"undeclared grid cell {key!r}: unknown attribute in {part!r}")
            i, lookup = cats[a]
            if coords[i] != -1:
                raise KeyError(f"undeclared grid cell {key!r}: attribute {a!r} given twice")
            j = lookup.get(c)
            if j is None:
                raise KeyError(f"undeclared grid cell {key!r}: unknown category {c!r} of {a!r}")
            coords[i] = j
        if -1 in coords:
            raise KeyError(f"undeclared grid cell {key!r}: every attribute needs a category")
        out = np.empty(len(coords) + 2, dtype=np.int64)
        out[0] = 0
        off = 1
        for i, (_, cs) in enumerate(self.attributes):
            out[1 + i] = off + coords[i]
            off += len(cs)
        out[-1] = off + int(np.ravel_multi_index(tuple(coords), self.cell_shape))
        return out

    @cached_property
    def n_constraints(self) -> int:
        """Number of (linearly independent for trees/grids) constraint rows ``M x = 0``."""
        return int(self.constraint_matrix().shape[0])

    def constraint_matrix(self) -> sp.csr_matrix:
        """Sparse ``M`` with ``M x = 0`` for the true values (oracle and residual checks).

        hierarchy: one row per internal node; grid: ``total − Σ categories`` for the first
        attribute only (the others' are implied by the category rows) and one row per category;
        then the rows of every constraint group.
        """
        n = self.size
        rows: list[Int64Array] = []
        cols: list[Int64Array] = []
        vals: list[Float64Array] = []
        m = 0
        if self.kind == "hierarchy":
            assert self.parent is not None
            child = np.flatnonzero(self.parent >= 0)
            internal = np.flatnonzero(~self._is_leaf)
            row_of = np.full(n, -1, dtype=np.int64)
            row_of[internal] = np.arange(internal.size)
            rows += [row_of[internal], row_of[self.parent[child]]]
            cols += [internal, child]
            vals += [np.ones(internal.size), -np.ones(child.size)]
            m = internal.size
        elif self.kind == "grid":
            shape = self.cell_shape
            n0 = shape[0]
            rows += [np.zeros(1 + n0, dtype=np.int64)]
            cols += [np.arange(1 + n0, dtype=np.int64)]
            vals += [np.r_[1.0, -np.ones(n0)]]
            m = 1
            cell_off = 1 + sum(shape)
            cell_ids = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
            off = 1
            for i, ni in enumerate(shape):
                cat = np.broadcast_to(
                    np.arange(ni, dtype=np.int64).reshape(
                        [ni if a == i else 1 for a in range(len(shape))]
                    ),
                    shape,
                ).reshape(-1)
                rows += [m + np.arange(ni, dtype=np.int64), m + cat]
                cols += [off + np.arange(ni, dtype=np.int64), cell_off + cell_ids.reshape(-1)]
                vals += [np.ones(ni), -np.ones(cell_ids.size)]
                m += ni
                off += ni
        for g in self.groups:
            r, c = g.matrix.shape
            G = g.rows.shape[0]
            rr = m + (np.arange(G)[:, None, None] * r + np.arange(r)[None, :, None])
            rr = np.broadcast_to(rr, (G, r, c))
            cc = np.broadcast_to(g.rows[:, None, :], (G, r, c))
            vv = np.broadcast_to(g.matrix[None, :, :], (G, r, c))
            keep = vv != 0
            rows.append(rr[keep])
            cols.append(cc[keep])
            vals.append(vv[keep])
            m += G * r
        if not rows:
            return sp.csr_matrix((0, n))
        return sp.csr_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(m, n)
        )
