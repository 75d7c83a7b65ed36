"""The resumable state of ``stream-dp replay``: the state file (:class:`ReplayState`, where it
lives), the log's SHA-256 and the noise key's fingerprint, and how earlier versions' state
files are read into the replay history.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agents.commands.replay_history import Content

STATE_VERSION = 2


_FINGERPRINT_LABEL = b"stream-dp/noise-key-fingerprint/v1"


# ---------------------------------------------------------------------------------- state file
@dataclass
class ReplayState:
    """Progress of one replay of one log; stored as JSON (never holds the key or the data)."""

    log: str
    log_sha256: str
    topic: str
    run_id: str
    records_acked: int = 0
    byte_offset: int = 0
    complete: bool = False
    key_fingerprint: str | None = None
    #: partition -> offset from which a resume scans for this run's unacknowledged messages
    scan_from: dict[str, int] = field(default_factory=dict)
    #: record numbers > records_acked known to be in the topic already (found by a resume scan)
    delivered: list[int] = field(default_factory=list)
    #: seconds added to every event time (``--retime``); 0 keeps the original times
    time_offset: float = 0.0
    #: largest (retimed) event time sent so far (informative; never a close marker's time)
    max_ts: float | None = None
    #: (key check value, log SHA-256) pairs of earlier versions, which kept the guard per path:
    #: merged into the replay history (:mod:`agents.commands.replay_history`) when read, never written
    history: list[list[str]] = field(default_factory=list)
    started: str = ""
    updated: str = ""
    version: int = STATE_VERSION
    #: user-level deployments: the event field whose identifier keys every record (a resume
    #: must key the rest alike); None (not written) for event-level replays
    user_field: str | None = None

    @classmethod
    def load(cls, path: Path) -> ReplayState | None:
        if not path.exists():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"{path}: unsupported replay state version {data.get('version')!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def save(self, path: Path) -> None:
        """Atomic write (temporary file + rename), so a crash never leaves a torn state file."""
        self.updated = _now_iso()
        tmp = path.with_name(path.name + ".tmp")
        doc = dataclasses.asdict(self)
        if doc["user_field"] is None:  # event level: the state file as before
            del doc["user_field"]
        tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)


def state_path(log: Path, state_dir: str | None) -> Path:
    """``LOG.replay.json`` next to the log, or ``DIR/<name>-<hash of path>.replay.json``."""
    if state_dir is None:
        return log.with_name(log.name + ".replay.json")
    digest = hashlib.sha256(str(log.resolve()).encode()).hexdigest()[:12]
    directory = Path(state_dir).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{log.name}-{digest}.replay.json"


def log_digest(log: Path) -> str:
    """SHA-256 of the whole log file: any changed, added or removed byte changes it."""
    h = hashlib.sha256()
    with open(log, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def key_fingerprint(key: bytes) -> str:
    """Key check value kept in the state file (HMAC-SHA256 of a fixed label; never printed)."""
    return hmac.new(key, _FINGERPRINT_LABEL, hashlib.sha256).hexdigest()


def load_key_for_fingerprint(key_file: str | None) -> bytes | None:
    """The noise key as the worker loads it (:func:`stream_dp.noise.load_key`: length, entropy
    and file permissions checked), or ``None`` if no key is configured here."""
    from stream_dp.noise.keys import load_key

    key_file = key_file or os.environ.get("STREAM_DP_KEY_FILE") or None
    if key_file is None and not os.environ.get("STREAM_DP_KEY"):
        return None
    key: bytes = load_key(key_file, env="STREAM_DP_KEY")
    return key


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _imported(previous: ReplayState | None) -> list[tuple[str, Content]]:
    """The (key, content) pairs a state file of an earlier version guarded per path."""
    if previous is None:
        return []
    pairs: list[tuple[str, Content]] = []
    if previous.key_fingerprint:
        pairs.append((previous.key_fingerprint,
                      Content(previous.log_sha256, previous.time_offset)))
    for item in previous.history:
        if len(item) == 2:
            fp, digest = item
            offset = previous.time_offset if digest == previous.log_sha256 else 0.0
            pairs.append((fp, Content(digest, offset)))
    return pairs


def _describe(entry: dict[str, Any]) -> str:
    shift = float(entry.get("time_offset", 0.0))
    where = ", ".join(entry.get("paths", [])[:3]) or "an earlier version's state file"
    topics = ", ".join(t.get("topic", "?") for t in entry.get("targets", [])[:3])
    return (f"SHA-256 {str(entry.get('log_sha256'))[:16]}…"
            + (f", retimed {shift:+.3f} s" if shift else "")
            + f", read from {where}" + (f", into {topics}" if topics else ""))
