"""What ``stream-dp replay`` has sent under each noise key into each deployment: the guard
against a changed log.

Noise is a deterministic function of the key, the deployment and the tick (DESIGN.md §2.5,
§2.7): two publications of *different* data under the same key into the same deployment share
their noise, and their difference is the exact difference of the data. Replay therefore keeps,
**per key** (its key check value, an HMAC-SHA256 of a fixed label under the noise key, never the
key) every *content* it ever sent under that key — the SHA-256 of the whole log file and the
constant added to every event time (``--retime``) — with the **deployments** it went to. The
store does not depend on the log's path or name, so a renamed copy, a prefix followed by the
full log, an extended or edited log are all the same case: another content under a key that
already published one into that deployment.

A deployment, as replay can tell it (:class:`Deployment`): the Kafka cluster's id (as its
brokers report it, whatever address reaches them) and the events topic. The worker's noise is
bound to the events topic's name and to the deployment nonce on that cluster's schedule topic
(:mod:`agents.deployment`, :mod:`agents.nonce`), so two different deployments in this sense
never share noise; two deployments that replay cannot tell apart (the same events topic read by
two app ids, topics deleted and created anew) count as one, which only refuses more.

* same key, identical content (bit for bit, same time shift): allowed — into the same
  deployment the releases are reproduced exactly and spend no new budget;
* same key, any other content into a deployment that already got one: refused
  (:class:`Verdict` ``refused``); into another deployment: allowed (its noise is its own);
* a key with no content yet in this deployment: allowed and recorded *before* anything is sent,
  so an interrupted or failed replay still binds the key and the deployment to its log.

Entries of version-1 files (keyed by the key alone) are read as going to their events topics on
*any* cluster (``"*"``), or to every deployment when no target was recorded: they refuse at
least what they refused before.

One JSON file holds every key's record (default ``$XDG_STATE_HOME/stream-dp/replay-history.json``,
else ``~/.local/state/stream-dp/replay-history.json``; ``$STREAM_DP_REPLAY_HISTORY`` or
``--history-file`` name another). Its path never depends on a key, so printing it reveals
nothing. Readers and writers take an exclusive ``flock`` on ``FILE.lock``, so two replays started
at once cannot both record a first content. The file holds no key, no data and no event: only
check values, digests, paths, cluster ids and target topics. A store on one machine cannot see
replays made from another one: keep it on a volume every replaying machine shares.
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

__all__ = ["ANY", "HISTORY_ENV", "Content", "Deployment", "ReplayHistory", "Verdict",
           "default_history_path"]

#: environment variable naming the history file
HISTORY_ENV = "STREAM_DP_REPLAY_HISTORY"
_VERSION = 2
#: a cluster or topic of an entry recorded without it (version 1): matches every one
ANY = "*"


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
class Deployment:
    """Where a replay sends its events, as far as replay can tell a deployment: the Kafka
    cluster's id (``""`` if the brokers report none) and the events topic. :data:`ANY` in
    either matches every value (entries of version-1 files; a query that does not know it)."""

    cluster: str
    topic: str

    def as_dict(self) -> dict[str, str]:
        return {"cluster": self.cluster, "topic": self.topic}

    def matches(self, entry: dict[str, Any]) -> bool:
        """True if ``entry`` (one of an entry's ``deployments``) may be this deployment."""
        cluster, topic = str(entry.get("cluster", ANY)), str(entry.get("topic", ANY))
        return (ANY in (cluster, self.cluster) or cluster == self.cluster) and (
            ANY in (topic, self.topic) or topic == self.topic)


@dataclass(frozen=True)
class Verdict:
    """The outcome of :meth:`ReplayHistory.check_and_record`.

    ``key``: ``new`` (nothing replayed under this key yet, nor this content under another),
    ``same`` (this very content replayed under this key before: bit-identical, no new budget),
    ``different`` (first content of this key, but this content was replayed under another key:
    new releases, the budget is spent again). ``refused``: this key already published another
    content into this deployment (``previous`` is that record: digest, shift, the paths it was
    read from, targets, deployments).
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
        if not isinstance(data, dict) or data.get("version") not in (1, _VERSION) \
                or not isinstance(data.get("keys"), dict):
            raise ValueError(f"replay history {self.path}: unsupported format or version "
                             f"(this stream-dp reads versions 1 and {_VERSION}; a newer "
                             "stream-dp wrote it?)")
        if data["version"] == 1:
            _upgrade_v1(data)
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

    def lookup(self, fingerprint: str, content: Content, deployment: Deployment) -> Verdict:
        """:meth:`check_and_record` without recording anything."""
        with self._locked() as data:
            return _verdict(data, fingerprint, content, deployment)

    def check_and_record(self, fingerprint: str, content: Content, *, log: str,
                         target: dict[str, str], deployment: Deployment,
                         imported: Iterable[tuple[str, Content]] = ()) -> Verdict:
        """Decide whether ``content`` may be sent under the key of ``fingerprint`` into
        ``deployment`` and, if so, record it (with the log's path, the target and the
        deployment) before anything is sent.

        ``imported``: ``(fingerprint, content)`` pairs known from elsewhere (the per-log state
        file of an earlier version, which names no deployment: they count for every one)
        merged into the store first, so they are never forgotten.
        """
        now = datetime.now(UTC).isoformat(timespec="seconds")
        with self._locked() as data:
            for fp, old in imported:
                if not any(old.same_as(e) for e in _entries_of(data, fp)):
                    data["keys"].setdefault(fp, []).append(
                        {"log_sha256": old.log_sha256, "time_offset": old.time_offset,
                         "paths": [], "targets": [], "first": now, "last": now,
                         "deployments": [Deployment(ANY, ANY).as_dict()]})
            verdict = _verdict(data, fingerprint, content, deployment)
            if verdict.refused:
                return verdict
            _record(data, fingerprint, content, log, target, deployment, now)
            return verdict


    def add(self, fingerprint: str, content: Content, *, log: str,
            target: dict[str, str], deployment: Deployment) -> None:
        """Record ``content`` under the key of ``fingerprint`` into ``deployment`` whatever is
        recorded already: for what was *sent* although it was not what was checked (a log that
        changed while it was being replayed). The key then holds two contents for that
        deployment and refuses every later replay into it."""
        now = datetime.now(UTC).isoformat(timespec="seconds")
        with self._locked() as data:
            _record(data, fingerprint, content, log, target, deployment, now)


def _record(data: dict[str, Any], fingerprint: str, content: Content, log: str,
            target: dict[str, str], deployment: Deployment, now: str) -> None:
    """Add ``content`` (its path, target and deployment) to the key's entries."""
    mine = data["keys"].setdefault(fingerprint, [])
    entry = next((e for e in mine if content.same_as(e)), None)
    if entry is None:
        entry = {"log_sha256": content.log_sha256, "time_offset": content.time_offset,
                 "paths": [], "targets": [], "deployments": [], "first": now}
        mine.append(entry)
    entry["last"] = now
    if log not in entry["paths"]:
        entry["paths"].append(log)
    if target not in entry["targets"]:
        entry["targets"].append(target)
    where = entry.setdefault("deployments", [])
    if deployment.as_dict() not in where:
        where.append(deployment.as_dict())


def _upgrade_v1(data: dict[str, Any]) -> None:
    """Version 1 recorded no cluster: each entry went to its target topics on any cluster, or,
    with no target recorded, to any deployment (it refuses at least what it refused)."""
    for entries in data["keys"].values():
        for e in entries:
            topics = sorted({str(t.get("topic")) for t in e.get("targets", ())
                             if isinstance(t, dict) and t.get("topic")})
            e["deployments"] = [Deployment(ANY, t).as_dict() for t in topics] or [
                Deployment(ANY, ANY).as_dict()]
    data["version"] = _VERSION


def _entries_of(data: dict[str, Any], fingerprint: str) -> list[dict[str, Any]]:
    for fp, entries in data["keys"].items():
        if hmac.compare_digest(fp, fingerprint):
            return list(entries)
    return []


def _went_to(entry: dict[str, Any], deployment: Deployment) -> bool:
    where = entry.get("deployments")
    if not isinstance(where, list) or not where:  # no deployment recorded: every one
        return True
    return any(isinstance(d, dict) and deployment.matches(d) for d in where)


def _verdict(data: dict[str, Any], fingerprint: str, content: Content,
             deployment: Deployment) -> Verdict:
    mine = _entries_of(data, fingerprint)
    other = next((e for e in mine if not content.same_as(e) and _went_to(e, deployment)), None)
    if other is not None:
        return Verdict("same" if any(content.same_as(e) for e in mine) else "new", refused=True,
                       previous=dict(other))
    if any(content.same_as(e) for e in mine):
        return Verdict("same")
    elsewhere = any(content.same_as(e) for fp, entries in data["keys"].items()
                    if not hmac.compare_digest(fp, fingerprint) for e in entries)
    return Verdict("different" if elsewhere else "new")
