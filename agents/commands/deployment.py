"""``stream-dp deployment new``: start a new deployment — the one way to change the settings
bound into a deployment (ε, p, the strategy, the schedule, the domain, partition counts…),
rotate the noise key, or take up a version whose CHANGELOG.md says "new deployment"."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

HELP = "start a new deployment: new app id, topics and noise key (prints them)"

DESCRIPTION = """\
A deployment is one app id with its topics, its noise key and the settings bound into it (every
setting that decides what a tick contains: ε/ρ, p, strategy, horizon, cap, the schedule, the
domain, partition counts, `epoch`, …; docs/configuration.md). They never change on a running
deployment: a worker started with another value is refused (exit status 4, naming the setting).
To change any of them, start a new deployment next to the old one; this command does it:

  1. reads the current settings (--config / STREAM_DP_CONFIG and STREAM_DP_* variables) and
     applies --set NAME=VALUE changes;
  2. gives them a new app id (--app-id, default <old app id>-<UTC date and time>), its own
     internal topics (<app_id>.…), new output topics (<app_id>.counts.v1, .histograms.v1, .dlq;
     the events topic stays: the new deployment counts the same input), and, on the clock
     schedule, an origin at the next whole tick from now;
  3. writes a new noise key (--key-file, mode 0600; never reuse the old one) and the settings
     file (--out) that names it;
  4. creates the new topics (unless --no-topics) and prints the app id, the topics, the key
     file, the settings file and the budget note.

Then start the new workers with STREAM_DP_CONFIG=<the new file>, move subscribers to the new
output topics, and stop the old deployment (docs/runbooks.md, "Start a new deployment").

Exit status: 0 done, 1 the broker could not create the topics (the files are written: run
'stream-dp topics create --config FILE' later), 2 bad usage or settings (also: --out or
--key-file exists already).

examples:
  stream-dp deployment new --config prod.toml --set epsilon=0.5
  stream-dp deployment new --config prod.toml --app-id shop-2025 --out shop-2025.toml \\
      --key-file /run/secrets/shop-2025.key
  stream-dp deployment new --set p=0.95 --no-topics        # files only; topics later
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("new",), help="what to do")
    parser.add_argument("--config", type=Path, default=None,
                        help="the current settings TOML file (default: $STREAM_DP_CONFIG)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the new deployment (repeatable), e.g. epsilon=0.5")
    parser.add_argument("--app-id", default=None,
                        help="the new app id (default: <old app id>-<UTC YYYYmmddHHMM>)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the new settings file (default: ./<app_id>.toml); never overwritten")
    parser.add_argument("--key-file", type=Path, default=None,
                        help="the new noise key file (default: ./<app_id>.noise.key); never "
                             "overwritten")
    parser.add_argument("--bootstrap", default=None,
                        help="Kafka bootstrap servers (default: settings / STREAM_DP_BOOTSTRAP)")
    parser.add_argument("--no-topics", action="store_true",
                        help="write the files only; create the topics later with 'stream-dp "
                             "topics create --config FILE'")


#: output topics a new deployment gets under its own name (the events topic is kept)
_OUTPUT_TOPICS = {"counts_topic": "counts.v1", "histograms_topic": "histograms.v1",
                  "dlq_topic": "dlq"}


def _parse_sets(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--set takes NAME=VALUE, got {item!r}")
        out[name.strip()] = value.strip()
    return out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write {value!r} to TOML")
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def settings_toml(settings: Any, header: str) -> str:
    """``settings`` as a flat TOML table: every setting that differs from its default, plus the
    deployment's identity (app id, topics, key file, origin) always."""
    from agents.config.settings import Settings

    always = {"app_id", "origin", "events_topic", "schedule", "key_file", "domain_file",
              *_OUTPUT_TOPICS}
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for f in dataclasses.fields(Settings):
        value = getattr(settings, f.name)
        if f.name not in always and value == f.default:
            continue
        if f.name == "worker_id":
            continue  # per worker, never per deployment
        lines.append(f"{f.name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _new_app_id(old: str) -> str:
    base = re.sub(r"-\d{12}$", "", old)
    return f"{base}-{time.strftime('%Y%m%d%H%M', time.gmtime())}"


def new_settings(args: argparse.Namespace) -> tuple[Any, Any, dict[str, str]]:
    """(old settings, new settings, STREAM_DP_* variables that would override the new file)."""
    from agents.config.settings import Settings
    from agents.config.values import _coerce, env_var

    fields = {f.name: f for f in dataclasses.fields(Settings)}
    changes: dict[str, Any] = {}
    for name, raw in _parse_sets(args.set).items():
        if name not in fields:
            from agents.config.env import did_you_mean

            raise ValueError(f"--set: unknown setting {name!r}{did_you_mean(name, fields)}")
        if name in ("app_id", "key_file"):
            raise ValueError(f"--set: give {name} with --{name.replace('_', '-')}")
        changes[name] = _coerce(name, fields[name].type, raw)
    overrides: dict[str, Any] = {}
    if args.bootstrap:
        overrides["bootstrap"] = args.bootstrap
    try:
        old = Settings.load(args.config, **overrides)
    except ValueError as exc:
        if "origin" not in str(exc):
            raise
        old = Settings.load(args.config, origin=float(math.floor(time.time())), **overrides)
    app_id = args.app_id or _new_app_id(old.app_id)
    if app_id == old.app_id:
        raise ValueError(f"--app-id {app_id!r} is the current deployment's; a new deployment "
                         "needs a new one")
    changes["app_id"] = app_id
    for name, suffix in _OUTPUT_TOPICS.items():
        changes.setdefault(name, f"{app_id}.{suffix}")
    if old.compact_topic and "compact_topic" not in changes:
        changes["compact_topic"] = f"{app_id}.compact.v1"
    schedule = changes.get("schedule", old.schedule)
    if schedule == "clock" and "origin" not in changes:
        tick = float(changes.get("tick_seconds", old.tick_seconds))
        changes["origin"] = float(math.ceil(time.time() / tick) * tick)
    changes["domain_file"] = str(Path(changes.get("domain_file", old.domain_file)).resolve())
    key_file = (args.key_file or Path(f"{app_id}.noise.key")).resolve()
    changes["key_file"] = str(key_file)
    new = old.replace(**changes)
    shadowed = {env_var(n): os.environ[env_var(n)] for n in changes
                if env_var(n) in os.environ and n != "bootstrap"}
    return old, new, shadowed


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def run(args: argparse.Namespace) -> int:
    try:
        old, new, shadowed = new_settings(args)
        out = (args.out or Path(f"{new.app_id}.toml")).resolve()
        key_file = Path(new.key_file)
        for path, what in ((out, "--out"), (key_file, "--key-file")):
            if path.exists():
                raise ValueError(f"{what} {str(path)!r} exists already; a new deployment gets "
                                 "new files (choose another path)")
    except ValueError as exc:
        print(f"stream-dp deployment: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    _write_new(key_file, (secrets.token_hex(32) + "\n").encode(), 0o600)
    header = (f"stream-dp deployment {new.app_id}, created "
              f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} by 'stream-dp deployment "
              f"new'\nfrom deployment {old.app_id}. Its bound settings never change: a change "
              "is another\nnew deployment (docs/runbooks.md).")
    _write_new(out, settings_toml(new, header).encode(), 0o644)
    created: list[str] | None = None
    if not args.no_topics:
        from agents.commands.topics import create_topics

        try:
            created = asyncio.run(create_topics(new))
        except Exception as exc:
            from agents.kafka.clients import connection_problem

            _report(old, new, out, key_file, created, shadowed)
            print(f"stream-dp deployment: the files are written, the topics are not: "
                  f"{connection_problem(exc, new.bootstrap)}; create them with: stream-dp "
                  f"topics create --config {out}", file=sys.stderr)
            return 1
    _report(old, new, out, key_file, created, shadowed)
    return 0


def _report(old: Any, new: Any, out: Path, key_file: Path, created: list[str] | None,
            shadowed: dict[str, str]) -> None:
    budget = (f"epsilon = {new.epsilon:g} per event and stream" if new.privacy_model == "pure"
              else f"rho = {new.rho:g} per event and stream")
    topics = ", ".join([new.events_topic, new.counts_topic, new.histograms_topic, new.dlq_topic,
                        new.partials_topic, new.ingest_checkpoints_topic,
                        new.release_checkpoints_topic, new.schedule_topic, new.leader_topic])
    print(f"new deployment  {new.app_id}  (from {old.app_id})")
    print(f"settings file   {out}")
    print(f"noise key file  {key_file}  (mode 0600; keep it as long as you may reproduce "
          "its releases)")
    print(f"topics          {topics}"
          + ("" if created is None else f"  ({len(created)} created)"))
    if new.schedule == "clock":
        print(f"origin          {new.origin:.0f} "
              f"({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(new.origin))}): tick 1 "
              "starts there")
    print(f"budget          a new budget ({budget}; docs/budget.md): events that both this and "
          f"the old deployment ({old.app_id}) count pay in both; stop the old one once "
          "subscribers have moved")
    print(f"start workers   STREAM_DP_CONFIG={out} stream-dp worker")
    if shadowed:
        print(f"note: unset {', '.join(sorted(shadowed))}: the environment overrides the "
              "settings file", file=sys.stderr)
