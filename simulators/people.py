"""People behind the simulated events: a person identifier per event, heavy-tailed.

``stream-dp simulate --people N`` (and the demo's traffic) attach to every event the identifier
of the person who caused it, for user-level privacy (docs/design/user-level.md). The model is
the usual one for visitors of a site: a **Zipf law over N people**. The person of rank
``r = 1 … N`` causes each event independently with probability

    p_r = r^(−s) / H(N, s),        H(N, s) = Σ_{i=1..N} i^(−s),

``s`` being the exponent (``--people-exponent``, default 1). With E events person ``r`` has
``E·p_r`` of them on average: at ``s = 1`` and E = 100 000 events over N = 10 000 people, person
``u1`` has about 10 200, person ``u100`` about 100, and half of the people (the ranks above
5 000) about 1.4 each; the number of people with at least c events falls like ``c^(−1/s)``. ``s = 0`` is the uniform law (every person alike, a light tail).

Identifiers are ``u<rank>`` (``u1`` the most active), whose UTF-8 bytes are the record key
producers use (:mod:`agents.kafka.partitioner`). The person of the i-th event depends only on
(seed, N, s, i), drawn from a random stream of its own: the events themselves (keys, times,
values) are exactly those of the same simulation without people. Synthetic *input* data; privacy
noise never comes from here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from simulators.logfile import Event

__all__ = ["DEFAULT_EXPONENT", "DEFAULT_USER_FIELD", "MAX_EXPONENT", "MAX_PEOPLE", "People",
           "check_user_field"]

#: the most people one simulation may draw from (the law's table takes 8 bytes per person)
MAX_PEOPLE = 10_000_000
#: the Zipf exponent s when none is given: the classic law of visitors and page views
DEFAULT_EXPONENT = 1.0
#: the largest exponent accepted (s = 4 already gives person u1 over 90 % of the events)
MAX_EXPONENT = 4.0
#: the JSON field (and CSV column) holding the identifier when none is named
DEFAULT_USER_FIELD = "user"
#: the fields an event already has: the identifier cannot take their place
RESERVED_FIELDS = frozenset({"ts", "key", "value", "attrs"})
_FIELD_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: uniform draws taken from the stream at a time (a fixed size: event i's person does not depend
#: on how the events are consumed)
_BLOCK = 4096
#: the random stream of people: (seed, 34) — 34 for the issue that added them; the events' own
#: streams are seed, (seed, 1), (seed, 2) and (seed, 13 … 16)
_STREAM = 34


def check_user_field(name: str) -> str:
    """``name`` if it can hold the identifier (1–64 characters ``A-Z a-z 0-9 _ . -``, not one
    of the event's own fields), else a one-line ``ValueError``."""
    if not _FIELD_NAME.fullmatch(name):
        raise ValueError(f"--user-field must be 1-64 characters A-Z a-z 0-9 _ . -, got {name!r}")
    if name in RESERVED_FIELDS:
        raise ValueError(f"--user-field cannot be {name!r}: events already have "
                         f"{', '.join(sorted(RESERVED_FIELDS))}; pick another name")
    return name


@dataclass(frozen=True)
class People:
    """``count`` people with Zipf(``exponent``) activity; :meth:`attach` names each event's person."""

    count: int
    exponent: float = DEFAULT_EXPONENT
    seed: int = 0
    user_field: str = DEFAULT_USER_FIELD
    _cdf: NDArray[np.float64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_PEOPLE:
            raise ValueError(f"--people must be an integer in [1, {MAX_PEOPLE}], got {self.count}")
        if not 0 <= self.exponent <= MAX_EXPONENT:
            raise ValueError(f"--people-exponent must be a number in [0, {MAX_EXPONENT:g}], "
                             f"got {self.exponent}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed}")
        check_user_field(self.user_field)
        object.__setattr__(self, "_cdf", np.cumsum(self.weights()))

    def weights(self) -> NDArray[np.float64]:
        """Unnormalised ``r^(−s)`` for ranks ``r = 1 … count``."""
        w: NDArray[np.float64] = np.arange(1, self.count + 1, dtype=np.float64) ** -float(
            self.exponent)
        return w

    def probabilities(self) -> NDArray[np.float64]:
        """``p_r`` for ranks ``1 … count`` (sums to 1): the chance that an event is person r's."""
        w = self.weights()
        p: NDArray[np.float64] = w / w.sum()
        return p

    @staticmethod
    def name(rank: int) -> str:
        """The identifier of the person of rank ``rank`` (1-based)."""
        return f"u{rank}"

    def ranks(self) -> Iterator[int]:
        """The rank (1-based) of the person of each event, for ever: the same sequence for the
        same (seed, count, exponent)."""
        rng = np.random.default_rng([self.seed, _STREAM])
        cdf = self._cdf
        last = self.count - 1
        while True:
            u = rng.random(_BLOCK) * cdf[-1]
            idx = np.minimum(np.searchsorted(cdf, u, side="right"), last)
            yield from (idx + 1).tolist()

    def attach(self, events: Iterable[Event]) -> Iterator[Event]:
        """``events`` with each one's person (in :attr:`user_field`), in the same order."""
        user_field = self.user_field
        for e, rank in zip(events, self.ranks(), strict=False):
            # the constructor, not dataclasses.replace: a third of the time per event
            yield Event(e.key, e.ts, e.value, e.attrs, f"u{rank}", user_field)

    def describe(self) -> str:
        """One line for the command's report."""
        return (f"{self.count} people (Zipf exponent {self.exponent:g}, "
                f"field {self.user_field!r})")
