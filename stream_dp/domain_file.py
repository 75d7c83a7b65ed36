"""Reading a domain file: a TOML file or its ``[domain]`` table into a
:class:`stream_dp.domain.Domain` (the format is in the docstring of :mod:`stream_dp.domain`).

:meth:`Domain.from_toml <stream_dp.domain.Domain.from_toml>` and :meth:`Domain.from_file
<stream_dp.domain.Domain.from_file>` are the public API and delegate here, passing their class:
this module builds through the class's constructors and never imports :mod:`stream_dp.domain`
(which imports it: no import circle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

from numpy.typing import ArrayLike

from stream_dp import _toml

__all__ = ["domain_from_file", "domain_from_toml"]

#: the kinds of a domain (:data:`stream_dp.domain.Kind`), as a domain file names them
_KINDS = ("flat", "hierarchy", "grid")


class _Constructors(Protocol):
    """The constructors of :class:`stream_dp.domain.Domain` a domain table is built with."""

    @classmethod
    def flat(cls, names: Sequence[str], *, name: str = ...) -> Self: ...

    @classmethod
    def from_parent(cls, names: Sequence[str], parent: ArrayLike, *, name: str = ...) -> Self: ...

    @classmethod
    def from_paths(
        cls, paths: Sequence[str], sep: str = ..., root: str | None = ..., *, name: str = ...
    ) -> Self: ...

    @classmethod
    def grid(cls, attributes: Mapping[str, Sequence[str]], *, name: str = ...) -> Self: ...

    def with_constraints(
        self, group_name: str, matrix: ArrayLike, rows: Sequence[Sequence[str | int]]
    ) -> Self: ...


_D = TypeVar("_D", bound=_Constructors)


def _parent_cycle(names: Sequence[str], parent: Sequence[int]) -> list[str]:
    """The names along the first cycle of the ``parent`` links (first name repeated at the
    end), or ``[]`` when every chain ends at a root (-1). O(n)."""
    state = [0] * len(parent)  # 0 unseen, 1 on the current walk, 2 reaches a root
    for start in range(len(parent)):
        walk: list[int] = []
        node = start
        while node >= 0 and state[node] == 0:
            state[node] = 1
            walk.append(node)
            node = parent[node]
        if node >= 0 and state[node] == 1:  # came back to this walk: a cycle
            loop = walk[walk.index(node):]
            return [names[i] for i in (*loop, node)]
        for i in walk:
            state[i] = 2
    return []


def domain_from_toml(cls: type[_D], section: Mapping[str, Any]) -> _D:
    """Build a ``cls`` (:class:`stream_dp.domain.Domain`) from a domain file's table (format in
    the docstring of :mod:`stream_dp.domain`)."""
    known = {
        "name",
        "kind",
        "streams",
        "paths",
        "sep",
        "root",
        "parents",
        "attributes",
        "constraints",
    }
    unknown = set(section) - known
    if unknown:
        raise ValueError(
            f"unknown domain keys: {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(known))})"
        )
    kind = section.get("kind")
    name = str(section.get("name", "default"))
    if kind == "flat":
        dom = cls.flat(_str_list(section, "streams"), name=name)
    elif kind == "hierarchy":
        if "paths" in section:
            root = section.get("root", "all")
            dom = cls.from_paths(
                _str_list(section, "paths"),
                sep=str(section.get("sep", "/")),
                root=str(root) or None,
                name=name,
            )
        else:
            streams = _str_list(section, "streams")
            parents = [str(p) for p in section.get("parents", [])]
            if len(parents) != len(streams):
                raise ValueError(
                    "hierarchy: parents must list one parent name per stream ('' for a root)"
                )
            pos = {s: i for i, s in enumerate(streams)}
            try:
                par = [pos[p] if p else -1 for p in parents]
            except KeyError as e:
                raise ValueError(f"hierarchy: unknown parent {e.args[0]!r}") from None
            cycle = _parent_cycle(streams, par)
            if cycle:
                raise ValueError(
                    f"hierarchy: the parents form a cycle ({' -> '.join(cycle)}); every "
                    "chain of parents must end at a root: give one stream the parent ''"
                )
            dom = cls.from_parent(streams, par, name=name)
    elif kind == "grid":
        attrs = section.get("attributes")
        if not isinstance(attrs, Mapping):
            raise ValueError("grid: [attributes] must be a table {attribute = [categories]}")
        dom = cls.grid(attrs, name=name)
    elif kind is None:
        raise ValueError(
            "no kind: a domain file declares its streams with kind = \"flat\", "
            "\"hierarchy\", \"grid\" or \"binary\" and their names (see "
            "docs/configuration.md)"
        )
    elif kind == "binary":
        raise ValueError(
            "kind = \"binary\" declares yes/no attributes, not streams: it is read by the "
            "worker and 'stream-dp marginals' (stream_dp.attributes.BinaryDomain.from_file)"
        )
    else:
        raise ValueError(
            f"kind must be one of {', '.join(_KINDS)}, binary; got {kind!r}"
        )
    for i, c in enumerate(section.get("constraints", [])):
        if not isinstance(c, Mapping) or "matrix" not in c or "rows" not in c:
            raise ValueError(f"constraints[{i}] must be a table with 'matrix' and 'rows'")
        dom = dom.with_constraints(str(c.get("name", f"group{i}")), c["matrix"], c["rows"])
    return dom


def domain_from_file(cls: type[_D], path: str | Path) -> _D:
    """Read a TOML domain file (its ``[domain]`` table if present, else the top level) into a
    ``cls`` (:class:`stream_dp.domain.Domain`)."""
    with open(path, "rb") as f:
        raw = f.read()
    from stream_dp._text import decode_utf8

    text = decode_utf8(raw, f"domain file {str(path)!r}")
    try:
        data = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        msg = " ".join(str(exc).split())
        raise ValueError(f"domain file {str(path)!r} is not valid TOML: {msg}") from None
    section = data.get("domain", data)
    try:
        if not isinstance(section, Mapping):
            raise ValueError("[domain] must be a table")
        return domain_from_toml(cls, section)
    except ValueError as exc:  # name the file: "duplicate path: 'a/b'" alone is no help
        raise ValueError(f"domain file {str(path)!r}: {exc}") from None


def _str_list(section: Mapping[str, Any], key: str) -> list[str]:
    value = section.get(key)
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise ValueError(f"{key} must be a list of strings")
    return value
