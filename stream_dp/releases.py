"""Decoding the service's published messages, for subscribers (no Kafka imports).

A subscriber reads ``dp.counts.v1`` / ``dp.histograms.v1`` with any Kafka client and hands each
message value to :func:`decode_count` or :func:`decode_histogram`. A ``(stream, tick)`` may be
delivered more than once (at-least-once readers, re-publication after a crash); every copy is
bit-identical, so keep the first (:class:`LatestReleases` does).

>>> raw = (b'{"stream":"eu","tick":3,"tick_start":0.0,"tick_end":60.0,"value":12.5,'
...        b'"stderr":1.4,"strategy":"naive","p":0.9,"privacy":{"model":"pure","epsilon":1.0},'
...        b'"cap":1.0,"horizon":4095,"schema":"dp.counts.v1"}')
>>> r = decode_count(raw)
>>> (r.stream, r.tick, r.value, r.stderr)
('eu', 3, 12.5, 1.4)
>>> latest = LatestReleases()
>>> latest.add(r), latest.add(r)
(True, False)
>>> latest["eu"].value
12.5
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CountRelease", "HistogramNode", "HistogramRelease", "LatestReleases",
           "decode_count", "decode_histogram"]


@dataclass(frozen=True)
class CountRelease:
    """One ``dp.counts.v1`` message: a stream's noisy decayed count at a tick.

    ``value`` ± ``stderr`` (the exact standard deviation of the noise, same units as counts);
    ``tick_start``/``tick_end`` in Unix seconds; ``privacy`` as published (``model`` and
    ``epsilon`` or ``rho`` per event and stream).
    """

    stream: str
    tick: int
    tick_start: float
    tick_end: float
    value: float
    stderr: float
    strategy: str
    p: float
    privacy: Mapping[str, Any]
    cap: float
    horizon: int


@dataclass(frozen=True)
class HistogramNode:
    stream: str
    value: float  # consistent (reconciled) value
    noisy: float  # the release it came from
    stderr: float


@dataclass(frozen=True)
class HistogramRelease:
    """One ``dp.histograms.v1`` message: a tick's consistent histogram of the whole domain."""

    tick: int
    tick_end: float
    nodes: tuple[HistogramNode, ...]
    domain: str

    def values(self) -> dict[str, float]:
        return {n.stream: n.value for n in self.nodes}


#: What a message of another schema is and how to read it (for the error of a decoder that
#: was handed one: a binary-attribute deployment publishes tables on the counts topic).
OTHER_SCHEMAS: dict[str, str] = {
    "dp.counts.v1": "one stream's release: decode_count, or 'stream-dp tail counts'",
    "dp.histograms.v1": "a consistent histogram: decode_histogram, or 'stream-dp tail histograms'",
    "dp.tables.v1": (
        "a noisy table of a binary-attribute domain (kind = \"binary\"), whose releases are "
        "tables, not per-stream counts: read them with 'stream-dp tail tables', or the "
        "consistent tables with 'stream-dp tail marginals'"
    ),
    "dp.marginals.v1": (
        "the consistent tables of a binary-attribute domain (kind = \"binary\"): read them with "
        "'stream-dp tail marginals' (--query A,B answers), in code with "
        "stream_dp.attributes.query.model_from_marginals"
    ),
}


def _obj(raw: bytes | str | Mapping[str, Any], schema: str) -> Mapping[str, Any]:
    obj = raw if isinstance(raw, Mapping) else json.loads(raw)
    got = obj.get("schema") if isinstance(obj, Mapping) else None
    if got != schema:
        hint = OTHER_SCHEMAS.get(got) if isinstance(got, str) else None
        raise ValueError(f"not a {schema} message" + (f": a {got} message is {hint}" if hint else ""))
    return obj


def _num(obj: Mapping[str, Any], name: str) -> float:
    v = obj[name]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    return float(v)


def decode_count(raw: bytes | str | Mapping[str, Any]) -> CountRelease:
    """Decode and check a ``dp.counts.v1`` message value (``ValueError`` if it is not one)."""
    o = _obj(raw, "dp.counts.v1")
    try:
        return CountRelease(
            stream=str(o["stream"]), tick=int(o["tick"]), tick_start=_num(o, "tick_start"),
            tick_end=_num(o, "tick_end"), value=_num(o, "value"), stderr=_num(o, "stderr"),
            strategy=str(o["strategy"]), p=_num(o, "p"), privacy=dict(o["privacy"]),
            cap=_num(o, "cap"), horizon=int(o["horizon"]),
        )
    except KeyError as exc:
        raise ValueError(f"dp.counts.v1 message without {exc.args[0]!r}") from None


def decode_histogram(raw: bytes | str | Mapping[str, Any]) -> HistogramRelease:
    """Decode a ``dp.histograms.v1`` message value (uncompressed JSON)."""
    o = _obj(raw, "dp.histograms.v1")
    nodes = tuple(HistogramNode(str(n["stream"]), _num(n, "value"), _num(n, "noisy"),
                                _num(n, "stderr")) for n in o["nodes"])
    return HistogramRelease(int(o["tick"]), _num(o, "tick_end"), nodes, str(o.get("domain", "")))


class LatestReleases(Mapping[str, CountRelease]):
    """The newest release of every stream, de-duplicated by ``(stream, tick)``."""

    def __init__(self) -> None:
        self._latest: dict[str, CountRelease] = {}

    def add(self, release: CountRelease) -> bool:
        """Keep ``release`` if it is newer than the stream's latest; True if it was."""
        have = self._latest.get(release.stream)
        if have is not None and have.tick >= release.tick:
            return False
        self._latest[release.stream] = release
        return True

    def __getitem__(self, stream: str) -> CountRelease:
        return self._latest[stream]

    def __iter__(self) -> Iterator[str]:
        return iter(self._latest)

    def __len__(self) -> int:
        return len(self._latest)
