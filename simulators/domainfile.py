"""The domain a simulator's events need, and its TOML rendering for the worker.

A :class:`DomainSpec` is plain data (no library objects) so the simulators stay independent of
``stream_dp``; :meth:`DomainSpec.to_toml` writes the service's domain file format (read by
``stream_dp.domain.Domain.from_file`` and the worker's settings).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

DomainKind = Literal["flat", "paths", "grid"]


@dataclass(frozen=True)
class LinearConstraint:
    """``matrix @ [count(s) for s in streams] = 0`` at every tick (paper 000's packages)."""

    name: str
    matrix: tuple[tuple[int, ...], ...]
    streams: tuple[str, ...]


@dataclass(frozen=True)
class DomainSpec:
    """Declared streams plus the release settings a simulator suggests.

    ``kind``: ``"flat"`` (``streams``), ``"paths"`` (leaf ``streams`` are ``/``-separated paths;
    internal nodes and the root ``root`` are added by the domain), ``"grid"`` (``attributes``:
    attribute -> categories; event keys ``a1=c1|a2=c2|…``). ``tick_seconds`` is the tick length
    (s), ``p`` the decay per tick, ``epsilon`` the pure-DP budget per event (per stream), ``cap``
    the contribution bound of one event.
    """

    name: str
    kind: DomainKind
    streams: tuple[str, ...] = ()
    attributes: Mapping[str, Sequence[str]] = field(default_factory=dict)
    root: str = "all"
    constraints: tuple[LinearConstraint, ...] = ()
    tick_seconds: float = 1.0
    p: float = 0.9
    epsilon: float = 1.0
    cap: float = 1.0
    strategy: str = "auto"
    comment: str = ""

    def to_toml(self) -> str:
        """The domain file (TOML) in the format of ``stream_dp.domain.Domain.from_file``.

        Linear constraints (e.g. packages) become ``[[constraints]]`` groups.
        """
        q = json.dumps  # TOML basic strings accept JSON string escapes for our names
        lines = [f"# {line}" for line in self.comment.splitlines()] if self.comment else []
        lines += [f"name = {q(self.name)}"]
        if self.kind == "flat":
            lines += ['kind = "flat"', "streams = [" + ", ".join(q(s) for s in self.streams) + "]"]
        elif self.kind == "paths":
            lines += ['kind = "hierarchy"', f"root = {q(self.root)}", 'sep = "/"', "paths = ["]
            lines += [f"  {q(s)}," for s in self.streams]
            lines.append("]")
        else:
            lines += ['kind = "grid"', "", "[attributes]"]
            for attr, cats in self.attributes.items():
                lines.append(f"{q(attr)} = [" + ", ".join(q(c) for c in cats) + "]")
        for c in self.constraints:
            rows = ", ".join("[" + ", ".join(str(v) for v in row) + "]" for row in c.matrix)
            lines += [
                "",
                "[[constraints]]",
                f"name = {q(c.name)}",
                f"matrix = [{rows}]",
                "rows = [[" + ", ".join(q(s) for s in c.streams) + "]]",
            ]
        return "\n".join(lines) + "\n"

    def settings_toml(self, origin: float, domain_file: str) -> str:
        """A worker settings file (``STREAM_DP_CONFIG``) matching this simulation.

        ``origin`` (Unix s) is the start of simulated tick 1; ``domain_file`` is the domain TOML
        path (relative paths are resolved against the settings file's folder).
        """
        q = json.dumps
        return "\n".join(
            [
                f"# Worker settings for the {self.name} simulation (see docs/configuration.md).",
                f"domain_file = {q(domain_file)}",
                f"origin = {origin!r}",
                f"tick_seconds = {float(self.tick_seconds)!r}",
                f"p = {self.p!r}",
                f"epsilon = {self.epsilon!r}",
                f"cap = {self.cap!r}",
                f"strategy = {q(self.strategy)}",
                "# a historical log: ticks close at the close markers `stream-dp replay` writes",
                'schedule = "markers"',
                "",
            ]
        )
