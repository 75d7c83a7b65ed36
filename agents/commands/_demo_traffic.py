"""The live traffic of ``stream-dp demo``: web-traffic events (:class:`Traffic`, the simulators'
generator or a built-in one) or events with yes/no attributes (:class:`AttributeTraffic`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: Site hierarchy of the built-in generator (used when the simulators package is absent).
FALLBACK_PATHS = (
    "www/home", "www/news", "www/shop", "api/v1", "api/v2", "cdn/img", "cdn/js",
)


@dataclass(frozen=True)
class DemoEvent:
    key: str
    ts: float
    value: float = 1.0
    attrs: str | None = None
    #: the person who caused it (``people``), in the field ``user_field``; else None
    user: str | None = None
    user_field: str = "user"

    def message(self) -> dict[str, Any]:
        """The ``dp.events.v1`` value of this event."""
        out: dict[str, Any] = ({"ts": self.ts, "attrs": self.attrs} if self.attrs is not None
                               else {"key": self.key, "ts": self.ts, "value": self.value})
        if self.user is not None:
            out[self.user_field] = self.user
        return out

    @property
    def record_key(self) -> bytes:
        """The Kafka record key: the person's identifier (UTF-8) when there is one, so that
        Kafka's default partitioner puts all of a person's events on one partition; else the
        event key."""
        return (self.key if self.user is None else self.user).encode("utf-8")


def _people(people: int | None, seed: int, exponent: float | None,
            user_field: str | None) -> Any:
    """The :class:`simulators.people.People` of ``people`` (None: events without a person)."""
    if people is None:
        return None
    from simulators.people import DEFAULT_EXPONENT, DEFAULT_USER_FIELD, People

    return People(people, DEFAULT_EXPONENT if exponent is None else exponent, seed=seed,
                  user_field=DEFAULT_USER_FIELD if user_field is None else user_field)


def _with_people(events: Iterator[DemoEvent], crowd: Any) -> Iterator[DemoEvent]:
    """``events`` with each one's person drawn by ``crowd`` (the simulators' law, the same
    person sequence as ``stream-dp simulate --people`` with the same seed)."""
    if crowd is None:
        yield from events
        return
    for ev, rank in zip(events, crowd.ranks(), strict=False):
        yield DemoEvent(ev.key, ev.ts, ev.value, ev.attrs, crowd.name(rank), crowd.user_field)


class Traffic:
    """Live events in event-time order: the web-traffic simulator, else a built-in one."""

    def __init__(self, origin: float, tick_seconds: float, rate: float, seed: int,
                 ticks: int, *, people: int | None = None, people_exponent: float | None = None,
                 user_field: str | None = None) -> None:
        """``people``: give each event one of that many people (:mod:`simulators.people`,
        Zipf with ``people_exponent``, in ``user_field``); None: events without a person."""
        self.origin, self.tick_seconds, self.rate, self.seed = origin, tick_seconds, rate, seed
        self.ticks = ticks
        self._people = _people(people, seed, people_exponent, user_field)
        self._sim: Any = None
        try:
            from simulators.base import TimeAxis
            from simulators.web_traffic import WebTraffic

            axis = TimeAxis(ticks=ticks, tick_seconds=tick_seconds, start=origin)
            self._sim = WebTraffic(axis, seed, rate=rate)
        except (ImportError, ValueError, TypeError):
            self._sim = None

    @property
    def source(self) -> str:
        return "simulators.web_traffic" if self._sim is not None else "built-in generator"

    def domain_toml(self) -> str:
        if self._sim is not None:
            text: str = self._sim.domain().to_toml()
            return text
        paths = ", ".join(json.dumps(p) for p in FALLBACK_PATHS)
        return f'name = "demo-site"\nkind = "hierarchy"\nroot = "all"\nsep = "/"\npaths = [{paths}]\n'

    def events(self) -> Iterator[DemoEvent]:
        return _with_people(self._events(), self._people)

    def _events(self) -> Iterator[DemoEvent]:
        if self._sim is not None:
            for ev in self._sim.events():
                yield DemoEvent(ev.key, ev.ts, ev.value)
            return
        rng = random.Random(self.seed)
        weights = [1.0 / (i + 1) for i in range(len(FALLBACK_PATHS))]
        t = self.origin
        end = self.origin + self.ticks * self.tick_seconds
        mean_gap = self.tick_seconds / self.rate
        while t < end:
            t += rng.expovariate(1.0 / mean_gap)
            key = rng.choices(FALLBACK_PATHS, weights)[0]
            yield DemoEvent(key, round(t, 3))


class AttributeTraffic:
    """Live events with yes/no attributes (:class:`simulators.attributes.AttributeEvents`)."""

    def __init__(self, origin: float, tick_seconds: float, rate: float, seed: int, ticks: int,
                 m: int, *, people: int | None = None, people_exponent: float | None = None,
                 user_field: str | None = None) -> None:
        from simulators.attributes import AttributeEvents

        self.m = m
        self._people = _people(people, seed, people_exponent, user_field)
        self._sim = AttributeEvents(m=m, ticks=ticks, rate=rate, seed=seed,
                                    tick_seconds=tick_seconds, start=origin)

    @property
    def source(self) -> str:
        return f"simulators.attributes ({self.m} attributes a0..a{self.m - 1})"

    def domain_toml(self) -> str:
        from simulators.attributes import attribute_domain_toml

        return attribute_domain_toml(self.m, "demo-attributes")

    def events(self) -> Iterator[DemoEvent]:
        return _with_people(
            (DemoEvent(ev.attrs, ev.ts, 1.0, ev.attrs) for ev in self._sim.log_events()),
            self._people)
