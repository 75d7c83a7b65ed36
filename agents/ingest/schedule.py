"""Closing points of the ingest schedule: :class:`Close`, :class:`ScheduleEntry` (an applied
closing point as persisted on the schedule topic) and :class:`ScheduleMismatch`.

The closing rules are in :mod:`agents.ingest.ticks`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any


class ScheduleMismatch(RuntimeError):
    """The log no longer matches the closing points persisted for it: refuse to release.

    Raised when a persisted closing point (schedule topic) covers records whose digest differs
    from the records now in the events topic (a changed, added or removed record, or records
    deleted by retention), or when the schedule topic holds closing points of another schedule.
    Reusing the noise key on a different log would publish the exact difference, so the worker
    stops instead (DESIGN.md §2.5).
    """


@dataclass(frozen=True)
class Close:
    """A closing point: every tick ``≤ through`` closes before the record at ``offset``.

    ``rule`` says what decided it: ``clock`` (end offset read after the deadline),
    ``log_append_time`` (first broker timestamp past the deadline), ``marker`` (a close marker of
    ``stream-dp replay``) or ``persisted`` (a closing point read back from the schedule topic).
    """

    through: int
    offset: int
    rule: str
    decided_at: float = 0.0


@dataclass(frozen=True)
class ScheduleEntry:
    """One applied closing point, as persisted on the schedule topic (JSON, see :meth:`encode`).

    Ticks ``first..through`` closed before ``close_offset``; ``digest`` covers the records of
    offsets ``[start_offset, close_offset)``. ``decided_at`` is the Unix time at which the rule
    fired (the clock reading for the clock rule).
    """

    app_id: str
    events_topic: str
    partition: int
    first: int
    through: int
    start_offset: int
    close_offset: int
    digest: str
    rule: str
    decided_at: float
    schedule: tuple[str, float, float, float]

    def _doc(self) -> dict[str, Any]:
        mode, origin, tick_seconds, lateness = self.schedule
        return {"v": 2, "app_id": self.app_id, "events_topic": self.events_topic,
                "partition": self.partition, "first_tick": self.first,
                "through_tick": self.through, "start_offset": self.start_offset,
                "close_offset": self.close_offset, "digest": self.digest, "rule": self.rule,
                "decided_at": self.decided_at,
                "schedule": {"mode": mode, "origin": origin, "tick_seconds": tick_seconds,
                             "allowed_lateness_s": lateness}}

    def encode(self, mac_key: bytes) -> bytes:
        """JSON with an HMAC-SHA256 (``mac``) under ``mac_key`` (:func:`entry_key`) over the
        canonical JSON of every other field: a forged or edited closing point is refused."""
        from stream_dp.mechanism import canonical_json

        doc = self._doc()
        doc["mac"] = hmac.new(mac_key, canonical_json(doc), hashlib.sha256).hexdigest()
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def decode(cls, raw: bytes, mac_key: bytes) -> ScheduleEntry:
        """The entry of :meth:`encode`; :class:`ScheduleMismatch` for an entry of an older
        version (unkeyed digests) or whose MAC does not verify, ``ValueError`` if malformed."""
        from stream_dp.mechanism import canonical_json

        d = json.loads(raw)
        if not isinstance(d, dict):
            raise ValueError("schedule entry is not a JSON object")
        if d.get("v") == 1:
            raise ScheduleMismatch(
                "the schedule topic holds closing points of an older version (unkeyed "
                "digests, which a forger can match): start a new deployment with its "
                "own schedule_topic (stream-dp deployment new; docs/operations.md, 'Changing the "
                "configuration')")
        if d.get("v") != 2:
            raise ValueError("schedule entry of an unknown version")
        mac = d.pop("mac", None)
        want = hmac.new(mac_key, canonical_json(d), hashlib.sha256).hexdigest()
        if not isinstance(mac, str) or not hmac.compare_digest(mac, want):
            raise ScheduleMismatch(
                "a closing point on the schedule topic does not verify under this deployment's "
                "key (forged, edited, or written under another key)")
        sch = d["schedule"]
        return cls(
            str(d["app_id"]), str(d["events_topic"]), int(d["partition"]), int(d["first_tick"]),
            int(d["through_tick"]), int(d["start_offset"]), int(d["close_offset"]),
            str(d["digest"]), str(d["rule"]), float(d["decided_at"]),
            (str(sch["mode"]), float(sch["origin"]), float(sch["tick_seconds"]),
             float(sch["allowed_lateness_s"])),
        )
