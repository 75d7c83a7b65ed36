"""Query helper: α-way answers (α ≤ 8) by attribute index or name, with labelled cells.

>>> import numpy as np
>>> from stream_dp.attributes.model import JunctionTreeModel
>>> from stream_dp.attributes.domain import BinaryDomain
>>> d = BinaryDomain(["milk", "bread"])
>>> m = JunctionTreeModel([(0, 1)], [np.array([5.0, 1.0, 3.0, 1.0])], [0.25])
>>> a = answer(m, ["bread", "milk"], d)
>>> a.counts.tolist(), a.cell({"bread": 0, "milk": 1})
([5.0, 3.0, 1.0, 1.0], 3.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.attributes.domain import BinaryDomain
from stream_dp.attributes.model import JunctionTreeModel

__all__ = ["MAX_ALPHA", "QueryAnswer", "answer", "answer_all", "model_from_marginals"]

#: Largest number of attributes of one query.
MAX_ALPHA = 8


@dataclass(frozen=True)
class QueryAnswer:
    """Decayed counts of the ``2**α`` cells of one query (cell index = the attributes' values as
    a binary number, first attribute most significant) and the standard-error bound, if any."""

    attributes: tuple[int, ...]
    names: tuple[str, ...]
    counts: NDArray[np.float64]
    stderr: float | None

    def cell(self, values: Mapping[str | int, int]) -> float:
        """The count of the cell where each queried attribute (name or index) has ``values[a]``."""
        idx = 0
        for a, name in zip(self.attributes, self.names, strict=True):
            v = values[name] if name in values else values[a]
            if v not in (0, 1):
                raise ValueError(f"attribute values are 0 or 1, got {v!r} for {name}")
            idx = idx * 2 + int(v)
        return float(self.counts[idx])

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: attributes, names, counts, stderr bound (``None`` if none)."""
        return {
            "attributes": list(self.attributes),
            "names": list(self.names),
            "counts": [float(c) for c in self.counts],
            "stderr_bound": self.stderr,
        }


def answer(
    model: JunctionTreeModel,
    query: Sequence[int | str],
    domain: BinaryDomain | None = None,
) -> QueryAnswer:
    """Answer one query given by attribute indices or (with ``domain``) names."""
    if isinstance(query, (str, bytes)):
        raise ValueError("a query is a list of attributes, not one string")
    idx: list[int] = []
    for a in query:
        if isinstance(a, str):
            if domain is None:
                raise ValueError(f"attribute name {a!r} needs a domain")
            idx.append(domain.index(a))
        else:
            idx.append(a)
    if domain is not None:
        q = domain.check_query(idx, MAX_ALPHA)
        names = tuple(domain.names[i] for i in q)
    else:
        q = tuple(int(a) for a in idx)
        if not 1 <= len(q) <= MAX_ALPHA or len(set(q)) != len(q):
            raise ValueError(f"a query has 1..{MAX_ALPHA} distinct attributes, got {list(q)}")
        names = tuple(f"a{i}" for i in q)
    return QueryAnswer(q, names, model.answer(q), model.stderr(q))


def answer_all(
    model: JunctionTreeModel,
    queries: Sequence[Sequence[int | str]],
    domain: BinaryDomain | None = None,
) -> list[QueryAnswer]:
    """:func:`answer` for each query."""
    return [answer(model, q, domain) for q in queries]


def model_from_marginals(message: Mapping[str, Any]) -> tuple[JunctionTreeModel, BinaryDomain]:
    """The estimator and the domain of one ``dp.marginals.v1`` message (the service's
    consistent tables at one tick, from the histograms topic), ready for :func:`answer`.

    Standard errors use each table's published ``stderr`` (noise only; see the message's
    ``carried_from_model`` flags).

    >>> msg = {"attributes": ["milk", "bread"], "domain": "basket", "tables": [
    ...     {"attributes": [0, 1], "cells": [5.0, 1.0, 3.0, 1.0], "stderr": 0.5}]}
    >>> model, dom = model_from_marginals(msg)
    >>> answer(model, ["milk"], dom).counts.tolist()
    [6.0, 4.0]
    """
    try:
        names = [str(n) for n in message["attributes"]]
        tables = [tuple(int(a) for a in t["attributes"]) for t in message["tables"]]
        values = [np.asarray(t["cells"], dtype=np.float64) for t in message["tables"]]
        variances = [float(t["stderr"]) ** 2 for t in message["tables"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a dp.marginals.v1 message: {exc!r}") from None
    domain = BinaryDomain(names, str(message.get("domain") or "attributes"))
    return JunctionTreeModel(tables, values, variances), domain
