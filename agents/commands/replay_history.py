"""What ``stream-dp replay`` has sent under each noise key: the guard against a changed log.

Noise is a deterministic function of the key and the tick (DESIGN.md §2.5): two publications of
*different* data under the same key and settings share their noise, and their difference is the
exact difference of the data. Replay therefore keeps, **per key** (its key check value, an
HMAC-SHA256 of a fixed label under the noise key, never the key) every *content* it ever sent
under that key: the SHA-256 of the whole log file and the constant added to every event time
(``--retime``). The store does not depend on the log's path or name, so a renamed copy, a
prefix followed by the full log, an extended or edited log are all the same case: another
content under a key that already published one.

* same key, identical content (bit for bit, same time shift): allowed — the releases are
  reproduced exactly and spend no new budget;
* same key, any other content: refused (:class:`Verdict` ``refused``);
* a key with no content yet: allowed and recorded *before* anything is sent, so an interrupted
  or failed replay still binds the key to its log.

One JSON file holds every key's record (default ``$XDG_STATE_HOME/stream-dp/replay-history.json``,
else ``~/.local/state/stream-dp/replay-history.json``; ``$STREAM_DP_REPLAY_HISTORY`` or
``--history-file`` name another). Its path never depends on a key, so printing it reveals
nothing. Readers and writers take an exclusive ``flock`` on ``FILE.lock``, so two replays started
at once cannot both record a first content. The file holds no key, no data and no event: only
check values, digests, paths and target topics. A store on one machine cannot see replays made
from another one: keep it on a volume every replaying machine shares.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["HISTORY_ENV", "Content", "ReplayHistory", "Verdict", "default_history_path"]

#: environment variable naming the history file
HISTORY_ENV = "STREAM_DP_REPLAY_HISTORY"
_VERSION = 1


def default_history_path(env: dict[str, str] | None = None) -> Path:
    """``$STREAM_DP_REPLAY_HISTORY``, else ``$XDG_STATE_HOME/stream-dp/replay-history.json``,
    else ``~/.local/state/stream-dp/replay-history.json``."""
    env = dict(os.environ) if env is None else env
    if env.get(HISTORY_ENV):
        return Path(env[HISTORY_ENV]).expanduser()
    state_home = env.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(state_home) / "stream-dp" / "replay-history.json"


@dataclass(frozen=True)
class Content:
    """What was sent: the SHA-256 of the whole log file and the shift added to every event time
    (``--retime``; 0 keeps the original times). Two replays publish the same data exactly when
    both are equal."""

    log_sha256: str
    time_offset: float = 0.0

    def same_as(self, entry: dict[str, Any]) -> bool:
        return bool(entry.get("log_sha256") == self.log_sha256
                    and float(entry.get("time_offset", 0.0)) == float(self.time_offset))


@dataclass(frozen=True)
class Verdict:
    """The outcome of :meth:`ReplayHistory.check_and_record`.

    ``key``: ``new`` (nothing replayed under this key yet, nor this content under another),
    ``same`` (this very content replayed under this key before: bit-identical, no new budget),
    ``different`` (first content of this key, but this content was replayed under another key:
    new releases, the budget is spent again). ``refused``: this key already published another
    content (``previous`` is that record: digest, shift, the paths it was read from, targets).
    """

    key: str
    refused: bool = False
    previous: dict[str, Any] | None = None


class ReplayHistory:
    """The replay history file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_history_path()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """The parsed file under an exclusive lock; changes to the dict are written back."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = self._read()
            before = json.dumps(data, sort_keys=True)
            yield data
            if json.dumps(data, sort_keys=True) != before:
                self._write(data)
        finally:
            os.close(fd)  # releases the lock

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"version": _VERSION, "keys": {}}
        try:
            data = json.loads(text)
        except ValueError:
            raise ValueError(f"replay history {self.path} is not valid JSON; restore it from a "
                             "backup (deleting it forgets which log each key published)") from None
        if not isinstance(data, dict) or data.get("version") != _VERSION \
                or not isinstance(data.get("keys"), dict):
            raise ValueError(f"replay history {self.path}: unsupported format or version")
        return data

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def entries(self, fingerprint: str) -> list[dict[str, Any]]:
        """Every content recorded under the key of ``fingerprint`` (read-only)."""
        with self._locked() as data:
            return [dict(e) for e in _entries_of(data, fingerprint)]

    def lookup(self, fingerprint: str, content: Content) -> Verdict:
        """:meth:`check_and_record` without recording anything."""
        with self._locked() as data:
            return _verdict(data, fingerprint, content)

    def check_and_record(self, fingerprint: str, content: Content, *, log: str,
                         target: dict[str, str],
                         imported: Iterable[tuple[str, Content]] = ()) -> Verdict:
        """Decide whether ``content`` may be sent under the key of ``fingerprint`` and, if so,
        record it (with the log's path and the target) before anything is sent.

        ``imported``: ``(fingerprint, content)`` pairs known from elsewhere (the per-log state
        file of an earlier version) merged into the store first, so they are never forgotten.
        """
        now = datetime.now(UTC).isoformat(timespec="seconds")
        with self._locked() as data:
            for fp, old in imported:
                if not any(old.same_as(e) for e in _entries_of(data, fp)):
                    data["keys"].setdefault(fp, []).append(
                        {"log_sha256": old.log_sha256, "time_offset": old.time_offset,
                         "paths": [], "targets": [], "first": now, "last": now})
            verdict = _verdict(data, fingerprint, content)
            if verdict.refused:
                return verdict
            mine = data["keys"].setdefault(fingerprint, [])
            entry = next((e for e in mine if content.same_as(e)), None)
            if entry is None:
                entry = {"log_sha256": content.log_sha256, "time_offset": content.time_offset,
                         "paths": [], "targets": [], "first": now}
                mine.append(entry)
            entry["last"] = now
            if log not in entry["paths"]:
                entry["paths"].append(log)
            if target not in entry["targets"]:
                entry["targets"].append(target)
            return verdict


    def add(self, fingerprint: str, content: Content, *, log: str,
            target: dict[str, str]) -> None:
        """Record ``content`` under the key of ``fingerprint`` whatever is recorded already: for
        what was *sent* although it was not what was checked (a log that changed while it was
        being replayed). The key then holds two contents and refuses every later replay."""
        now = datetime.now(UTC).isoformat(timespec="seconds")
        with self._locked() as data:
            mine = data["keys"].setdefault(fingerprint, [])
            if not any(content.same_as(e) for e in mine):
                mine.append({"log_sha256": content.log_sha256, "time_offset": content.time_offset,
                             "paths": [log], "targets": [target], "first": now, "last": now})


def _entries_of(data: dict[str, Any], fingerprint: str) -> list[dict[str, Any]]:
    for fp, entries in data["keys"].items():
        if hmac.compare_digest(fp, fingerprint):
            return list(entries)
    return []


def _verdict(data: dict[str, Any], fingerprint: str, content: Content) -> Verdict:
    mine = _entries_of(data, fingerprint)
    other = next((e for e in mine if not content.same_as(e)), None)
    if other is not None:
        return Verdict("same" if any(content.same_as(e) for e in mine) else "new", refused=True,
                       previous=dict(other))
    if mine:
        return Verdict("same")
    elsewhere = any(content.same_as(e) for fp, entries in data["keys"].items()
                    if not hmac.compare_digest(fp, fingerprint) for e in entries)
    return Verdict("different" if elsewhere else "new")
