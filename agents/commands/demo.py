"""``stream-dp demo``: broker, topics, worker, reconciler and live traffic in one command."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import dataclasses
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from agents.commands import _demo_users
from agents.commands._demo_traffic import AttributeTraffic, Traffic
from agents.kafka.processes import dying_with_parent, terminate_group, wait_group_gone
from stream_dp.cli import EXIT_INTERRUPTED

HELP = "run broker, worker, reconciler and simulator; show live releases"

DESCRIPTION = """\
One command for the whole service on this machine: it starts the embedded Kafka-protocol broker
(noida-db) on a free port of 127.0.0.1, creates the topics, starts a worker (ingest, release,
reconcile side agent, web server with the live dashboard) as a child process, feeds it live
synthetic web traffic over a small site hierarchy, and shows each tick's releases in the
terminal: every stream's released value ± its analytic standard error, and the consistent
(reconciled) value. Raw counts are never shown: the service never sees them outside a worker.

It runs until Ctrl-C / SIGTERM, or for --duration seconds, then stops the simulator, the worker
(which leaves its consumer groups) and the broker, and removes the temporary data directory
(keep it with --data-dir; a later demo in the same folder keeps its key and starts afresh,
since a demo's ticks are bound to its start time). No process is left behind. The dashboard URL
is printed at start.

Exit status: 0 stopped by Ctrl-C / SIGTERM or at the end of --duration, 1 a part failed (or a
data directory that cannot be written), 2 bad usage, 130 interrupted while still starting
(everything started so far is stopped first).

--scenario attributes feeds events with --attributes M yes/no attributes instead (clusters of
dependent attributes, docs/guide.md section 7): the worker chooses which marginal tables to
measure, re-decides them every --epoch-ticks ticks from a charged bootstrap, and the terminal
and the dashboard show the chosen clusters and the consistent tables (ε is then per event for
the whole run, not per stream).

--privacy-unit user runs the traffic with people (--people N, heavy-tailed: most people a few
events, a few people many) into a second, user-level deployment as well (each person's first
--user-max-events K events per --user-period-ticks T ticks counted, ε / K per event, so one
person's bounded contribution to a stream costs what one event costs at event level), and the
table shows each stream at user level (released ± stderr) next to the event-level figure, with
how many events the bound dropped so far: the operator-only metric
stream_dp_user_bounded_events_total of the user-level worker (its /metrics, which the demo
enables for that worker only; docs/privacy.md, "User-level privacy"). With --scenario
attributes the user-level deployment's consistent marginal tables follow the event-level ones,
with its per-person guarantee and the same dropped-events line.

--offline runs the library-only simulation instead (no broker, no Kafka): the exact decayed
counts of a synthetic stream next to their private releases, for each strategy.

examples:
  stream-dp demo                          # until Ctrl-C; open the printed dashboard URL
  stream-dp demo --duration 60 --epsilon 0.5 --p 0.95
  stream-dp demo --tick-seconds 2 --rate 200 --data-dir /tmp/demo   # keep logs and topics
  stream-dp demo --scenario attributes --attributes 16 --epoch-ticks 20
  stream-dp demo --privacy-unit user --people 1000 --user-max-events 10
  stream-dp demo --scenario attributes --privacy-unit user --people 500
  stream-dp demo --offline
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=None,
                        help="stop after this many seconds (default: run until Ctrl-C)")
    parser.add_argument("--tick-seconds", type=float, default=1.0,
                        help="tick length in seconds (default 1)")
    parser.add_argument("--rate", type=float, default=60.0,
                        help="simulated events per tick over all streams (default 60)")
    parser.add_argument("--epsilon", type=float, default=1.0,
                        help="pure-DP epsilon per event, per released stream (default 1)")
    parser.add_argument("--p", type=float, default=0.9, help="decay per tick, (0, 1] (default 0.9)")
    parser.add_argument("--strategy", default="auto", help="release strategy (default auto)")
    parser.add_argument("--seed", type=int, default=0, help="simulator seed (default 0)")
    parser.add_argument("--web-port", type=int, default=0,
                        help="dashboard / metrics port on 127.0.0.1 (default: a free port)")
    parser.add_argument("--broker-port", type=int, default=0,
                        help="broker port on 127.0.0.1 (default: a free port)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="keep broker data, settings and logs here (default: a temporary "
                             "directory, removed on exit)")
    parser.add_argument("--no-table", action="store_true",
                        help="do not draw the live table (logs only)")
    parser.add_argument("--scenario", choices=("web", "attributes"), default="web",
                        help="web: a site hierarchy (default); attributes: events with yes/no "
                             "attributes, a binary-attribute domain")
    parser.add_argument("--attributes", type=int, default=16, metavar="M",
                        help="--scenario attributes: attributes per event, 2..64 (default 16)")
    parser.add_argument("--epoch-ticks", type=int, default=20,
                        help="--scenario attributes: ticks per structure epoch (default 20)")
    parser.add_argument("--offline", action="store_true",
                        help="run the library-only offline simulation, without a broker")
    _demo_users.add_arguments(parser)


# --------------------------------------------------------------------------- child processes
class Children:
    """Child processes, each leading its own process group; all are killed on exit.

    ``atexit`` and the signal handlers call :meth:`kill_all`, so a demo that ends by an exception,
    Ctrl-C or SIGTERM leaves nothing behind.
    """

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        atexit.register(self.kill_all)

    def spawn(self, cmd: list[str], *, log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                dying_with_parent(cmd), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int | None:
        """SIGTERM the process group, wait ``timeout`` s, then SIGKILL."""
        return terminate_group(proc, timeout)

    def kill_all(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc, timeout=10.0)
        self.procs.clear()


def _security(settings: Any) -> dict[str, Any]:
    from agents.config.security import KafkaSecurity

    return KafkaSecurity.from_settings(settings).client_kwargs()


# --------------------------------------------------------------------------- live table
@dataclass
class Board:
    """What the terminal shows: the latest tick's releases and consistent values."""

    names: tuple[str, ...] = ()
    strategy: str = "?"
    counts: dict[int, dict[str, tuple[float, float]]] = field(default_factory=dict)
    shown_tick: int = 0
    histograms: int = 0
    released_ticks: int = 0

    def add_count(self, msg: dict[str, Any]) -> int | None:
        """Record a release; returns its tick when that tick is complete for the domain."""
        tick = int(msg["tick"])
        self.strategy = str(msg.get("strategy", self.strategy))
        row = self.counts.setdefault(tick, {})
        row[str(msg["stream"])] = (float(msg["value"]), float(msg["stderr"]))
        for old in [t for t in self.counts if t < tick - 20]:
            del self.counts[old]
        if self.names and len(row) == len(self.names):
            self.released_ticks = max(self.released_ticks, tick)
            return tick
        return None


def _depth(name: str, names: tuple[str, ...]) -> int:
    return 0 if name == names[0] else name.count("/") + 1


def render(board: Board, tick: int, hist: dict[str, Any] | None, header: str,
           user: Board | None = None, dropped: int | None = None) -> str:
    """The table for ``tick``: stream, released ± stderr, consistent value; with ``user`` (the
    user-level deployment's board) its release ± stderr beside them, and ``dropped``, the
    events its bound dropped so far (the operator's view)."""
    lines = [header, ""]
    lines.append(f"tick {tick}" + ("" if hist else "   (consistent histogram pending)"))
    wide = "" if user is None else f"   {'user level':>10} {'± stderr':>9}"
    lines.append(f"{'stream':<24} {'released':>10} {'± stderr':>9}   {'consistent':>10}{wide}")
    lines.append("-" * (58 if user is None else 81))
    if hist is not None:
        rows = [(n["stream"], n["noisy"], n["stderr"], n["value"]) for n in hist["nodes"]]
    else:
        row = board.counts.get(tick, {})
        rows = [(s, *row[s], None) for s in board.names if s in row]
    for stream, value, stderr, consistent in rows:
        label = ("  " * _depth(stream, board.names) + stream)[:24]
        cons = f"{consistent:10.1f}" if consistent is not None else f"{'…':>10}"
        extra = "" if user is None else _demo_users.user_columns(user.counts.get(tick), stream)
        lines.append(f"{label:<24} {value:10.1f} {'±':>2}{stderr:7.1f}   {cons}{extra}")
    if hist is not None:
        d = hist["diagnostics"]
        lines.append("")
        lines.append(
            f"reconciled in {d['seconds'] * 1000:.2f} ms, {d['iterations']} iteration(s), "
            f"residual {d['residual']:.1e}"
        )
    if user is not None:
        lines.append(_demo_users.dropped_line(dropped))
    return "\n".join(lines)


# --------------------------------------------------------------------------- the demo
class Demo:
    def __init__(self, args: argparse.Namespace, out: TextIO) -> None:
        self.args = args
        self.out = out
        self.children = Children()
        self.tmp: str | None = None
        if args.data_dir is None:
            self.tmp = tempfile.mkdtemp(prefix="stream-dp-demo-")
            self.data_dir = Path(self.tmp)
        else:
            self.data_dir = args.data_dir.expanduser().resolve()
            self.data_dir.mkdir(parents=True, exist_ok=True)
        self.broker: Any = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.stop_event: asyncio.Event | None = None
        self.tty = out.isatty() and not args.no_table
        self.footer = "Ctrl-C to stop"
        #: --privacy-unit user: the user-level deployment's settings file, worker and web port
        self.user_path: Path | None = None
        self.user_worker: subprocess.Popen[bytes] | None = None
        self.user_web_port = 0

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # -- set-up -------------------------------------------------------------------------------
    def _files(self, bootstrap: str, web_port: int) -> tuple[Path, float, Traffic]:
        a = self.args
        tick = float(a.tick_seconds)
        origin = float(math.floor(time.time() / tick) * tick) if tick >= 1 else float(
            math.floor(time.time()))
        ticks = int(max(3600.0, (a.duration or 86_400.0) / tick + 10))
        attributes = a.scenario == "attributes"
        people = a.people if getattr(a, "privacy_unit", "event") == "user" else None
        traffic: Any = (
            AttributeTraffic(origin, tick, a.rate, a.seed, ticks, a.attributes, people=people)
            if attributes
            else Traffic(origin, tick, a.rate, a.seed, ticks, people=people))
        key_path = self.data_dir / "noise.key"
        if not key_path.exists():
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32) + "\n")
        (self.data_dir / "domain.toml").write_text(traffic.domain_toml(), encoding="utf-8")
        settings = {
            "bootstrap": bootstrap,
            "app_id": "stream-dp-demo",
            "worker_id": "demo-worker",
            "domain_file": "domain.toml",
            "key_file": "noise.key",
            "origin": origin,
            "tick_seconds": tick,
            "allowed_lateness_s": min(1.0, tick / 2),
            "close_grace_s": 0.2,
            "p": float(a.p),
            "epsilon": float(a.epsilon),
            "strategy": a.strategy,
            "events_partitions": 2,
            "shards": 2,
            "counts_partitions": 2,
            "web_port": web_port,
            "session_timeout_s": 6.0,
            "log_level": "info",
        }
        if attributes:
            settings |= {"shards": 1, "attribute_epoch_ticks": int(a.epoch_ticks)}
        lines = ["# Settings written by 'stream-dp demo' (see docs/configuration.md)."]
        for k, v in settings.items():
            lines.append(f"{k} = {json.dumps(v)}")
        path = self.data_dir / "stream-dp.toml"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        if people is not None:
            from agents.kafka.embedded_broker import free_port

            self.user_web_port = free_port()
            user = _demo_users.user_settings(settings, a, self.user_web_port)
            self.user_path = self.data_dir / "stream-dp-user.toml"
            self.user_path.write_text("\n".join(
                ["# The user-level deployment of 'stream-dp demo --privacy-unit user'."]
                + [f"{k} = {json.dumps(v)}" for k, v in user.items()]) + "\n", encoding="utf-8")
        return path, origin, traffic

    def _start_afresh(self, broker_dir: Path) -> None:
        """An earlier demo's broker data in this folder cannot be continued: its deployment is
        bound to the earlier run's start time (origin), so the worker would refuse it (exit 4).
        Remove it, unless a broker still runs on it (another demo: refuse in one line)."""
        if not broker_dir.is_dir() or not any(broker_dir.iterdir()):
            return
        from agents.commands.broker import find_brokers

        running = [b for b in find_brokers() if b.data_dir == broker_dir.resolve()]
        if running:
            raise RuntimeError(
                f"a broker (pid {running[0].pid}) runs on {broker_dir}: another demo uses "
                f"{self.data_dir}; stop it, or give this one another --data-dir")
        shutil.rmtree(broker_dir)
        self.say(f"starting afresh: removed the earlier demo's broker data in {broker_dir} (a "
                 "demo's ticks are bound to its start time; an earlier run cannot go on)")

    def start(self) -> tuple[Any, Traffic]:
        # every module the start needs, before the first line a user (or a test) may answer
        # with Ctrl-C: a KeyboardInterrupt inside an import can leave that module's import lock
        # held, and the next import of it (the clean-up's) then waits for ever
        from agents.commands.broker import find_brokers  # noqa: F401
        from agents.commands.topics import create_topics
        from agents.config.settings import Settings
        from agents.kafka.embedded_broker import EmbeddedBroker, free_port

        a = self.args
        self._start_afresh(self.data_dir / "broker")
        self.say("starting the embedded broker (noida-db) …")
        self.broker = EmbeddedBroker(port=a.broker_port or None,
                                     data_dir=self.data_dir / "broker")
        atexit.register(self.broker.stop)  # idempotent; covers exits that skip close()
        self.broker.start()
        web_port = a.web_port or free_port()
        settings_path, _, traffic = self._files(self.broker.bootstrap, web_port)
        settings = Settings.load(settings_path, env={})
        asyncio.run(create_topics(settings))
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
        env["STREAM_DP_CONFIG"] = str(settings_path)
        env["PYTHONUNBUFFERED"] = "1"
        self.worker = self.children.spawn(
            [sys.executable, "-m", "agents.cli", "worker"],
            log_path=self.data_dir / "worker.log", env=env,
        )
        if self.user_path is not None:
            asyncio.run(create_topics(Settings.load(self.user_path, env={})))
            self.user_worker = self.children.spawn(
                [sys.executable, "-m", "agents.cli", "worker"],
                log_path=self.data_dir / "worker-user.log",
                env=env | {"STREAM_DP_CONFIG": str(self.user_path)},
            )
        #: kept under every redraw of the live table: the screen is cleared each tick, and the
        #: broker address and dashboard URL are what guide §1 asks you to copy
        self.footer = (f"broker {self.broker.bootstrap} · dashboard "
                       f"http://127.0.0.1:{web_port}/dashboard/ · Ctrl-C to stop")
        self.say(f"broker     {self.broker.bootstrap}   (data in {self.data_dir})")
        self.say(f"worker     pid {self.worker.pid}, logs {self.data_dir / 'worker.log'}")
        self.say(f"dashboard  http://127.0.0.1:{web_port}/dashboard/")
        self.say(f"metrics    http://127.0.0.1:{web_port}/metrics")
        self.say(f"traffic    {traffic.source}, ~{a.rate:g} events per {a.tick_seconds:g} s tick")
        if self.user_worker is not None:
            self.say(f"user level worker pid {self.user_worker.pid}, logs "
                     f"{self.data_dir / 'worker-user.log'}, {a.people} people, K = "
                     f"{a.user_max_events} per {a.user_period_ticks} ticks, ε / K per event")
        self.say("stop with Ctrl-C" + (f" (or after {a.duration:g} s)" if a.duration else ""))
        self.say("")
        return settings, traffic

    # -- live part ----------------------------------------------------------------------------
    async def live(self, settings: Any, traffic: Traffic) -> int:
        self.stop_event = stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        from agents.config.domain import load_domain

        domain = load_domain(settings.domain_file)
        board = Board(names=tuple(domain.names))
        tasks = [
            asyncio.ensure_future(self._feed(settings, traffic, stop)),
            asyncio.ensure_future(self._watch(settings, board, stop)),
            asyncio.ensure_future(self._guard(stop)),
        ]
        rc = 0
        try:
            if self.args.duration:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.args.duration)
            else:
                await stop.wait()
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        for r in results:
            if isinstance(r, Exception) and not isinstance(r, asyncio.CancelledError):
                self.say(f"demo: {type(r).__name__}: {r}")
                rc = 1
        if any(w is not None and w.poll() is not None for w in (self.worker, self.user_worker)):
            rc = 1
        self.say("")
        self.say(f"released ticks: {board.released_ticks}, consistent histograms: "
                 f"{board.histograms}")
        return rc

    async def _guard(self, stop: asyncio.Event) -> None:
        """Stop the demo if the worker dies."""
        while not stop.is_set():
            for proc, log in ((self.worker, "worker.log"), (self.user_worker, "worker-user.log")):
                if proc is not None and proc.poll() is not None:
                    self.say(f"demo: the worker exited with {proc.returncode}; last log lines:")
                    self.say(_tail(self.data_dir / log, 15))
                    stop.set()
                    return
            await asyncio.sleep(0.5)

    async def _feed(self, settings: Any, traffic: Traffic, stop: asyncio.Event) -> None:
        from aiokafka import AIOKafkaProducer

        from agents.kafka.codec import encode

        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, linger_ms=20,
                                    **_security(settings))
        await producer.start()
        try:
            for ev in traffic.events():
                if stop.is_set():
                    return
                delay = ev.ts - time.time()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if stop.is_set():
                        return
                if self.user_path is None:
                    await producer.send(
                        settings.events_topic, encode(ev.message()), key=ev.record_key,
                    )
                    continue
                # the event-level deployment gets the very events, without the person; the
                # user-level one each keyed by its person (Kafka's default partitioner)
                plain = dataclasses.replace(ev, user=None)
                await producer.send(settings.events_topic, encode(plain.message()),
                                    key=plain.record_key)
                await producer.send(_demo_users.APP_ID + ".events", encode(ev.message()),
                                    key=ev.record_key)
        finally:
            await producer.stop()

    def _budget_headline(self, settings: Any) -> str:
        """The guarantee per event (h × the per-stream ε), as the worker accounts it."""
        from agents.config.domain import load_domain
        from stream_dp.accounting import Accountant

        domain = load_domain(self.data_dir / "domain.toml")
        return Accountant.for_domain(domain, settings.privacy, cap=settings.cap).headline()

    async def _watch(self, settings: Any, board: Board, stop: asyncio.Event) -> None:
        from aiokafka import AIOKafkaConsumer

        from agents.kafka.aborted_transactions import install as install_aborted_transactions

        user_counts = _demo_users.APP_ID + ".counts" if self.user_path is not None else None
        user_marginals = (_demo_users.APP_ID + ".histograms" if self.user_path is not None
                          else None)
        attributes = self.args.scenario == "attributes"
        topics = [settings.counts_topic, settings.histograms_topic]
        if user_counts is not None:
            topics.append(user_marginals if attributes else user_counts)
        user = Board(names=board.names) if user_counts is not None else None
        dropped: list[int | None] = [None]
        install_aborted_transactions()
        consumer = AIOKafkaConsumer(
            *topics,
            bootstrap_servers=settings.bootstrap, group_id=None, **_security(settings),
            auto_offset_reset="earliest", enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await consumer.start()
        #: --scenario attributes at user level: the user-level deployment's latest marginals
        user_tables: list[dict[str, Any] | None] = [None]
        if not attributes:
            header = (f"stream-dp demo · {self._budget_headline(settings)} · "
                      f"p = {self.args.p:g} · tick {self.args.tick_seconds:g} s")
        else:
            from agents.commands._tail_format import format_marginals

            header = (f"stream-dp demo · {self.args.attributes} yes/no attributes · ε = "
                      f"{self.args.epsilon:g} per event (whole run) · p = {self.args.p:g} · "
                      f"tables re-decided every {self.args.epoch_ticks} ticks")
        per_person: dict[str, Any] | None = None

        def table(tick: int, hist: dict[str, Any] | None) -> str:
            head = f"{header} · strategy {board.strategy}"
            if user is not None:
                head += "\n" + _demo_users.header_line(per_person, self.args)
            return render(board, tick, hist, head, user, dropped[0])
        waiting_since: dict[int, float] = {}
        try:
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=300)
                for tp, records in batches.items():
                    for rec in records:
                        try:
                            msg = json.loads(rec.value)
                        except (TypeError, ValueError):
                            continue
                        if attributes:
                            tick = int(msg.get("tick", 0))
                            if tp.topic == user_marginals:
                                if msg.get("schema") == "dp.marginals.v1":
                                    user_tables[0] = msg
                            elif msg.get("schema") == "dp.tables.v1":
                                board.released_ticks = max(board.released_ticks, tick)
                            elif msg.get("schema") == "dp.marginals.v1":
                                board.histograms += 1
                                if tick > board.shown_tick:
                                    board.shown_tick = tick
                                    shown = header + "\n\n" + format_marginals(msg)
                                    if user_marginals is not None:
                                        dropped[0] = await asyncio.to_thread(
                                            _demo_users.bounded_events, self.user_web_port)
                                        shown += "\n\n" + _demo_users.marginals_block(
                                            user_tables[0], self.args, dropped[0])
                                    self._show(shown)
                            continue
                        if user is not None and tp.topic == user_counts:
                            user.add_count(msg)
                            per_person = msg.get("privacy", {}).get("per_person", per_person)
                            continue
                        if tp.topic == settings.histograms_topic:
                            board.histograms += 1
                            tick = int(msg["tick"])
                            if tick > board.shown_tick:
                                board.shown_tick = tick
                                if user is not None:
                                    dropped[0] = await asyncio.to_thread(
                                        _demo_users.bounded_events, self.user_web_port)
                                self._show(table(tick, msg))
                        else:
                            done = board.add_count(msg)
                            if done is not None:
                                waiting_since.setdefault(done, time.monotonic())
                # No histogram within 3 ticks: show the releases alone.
                now = time.monotonic()
                for tick, since in sorted(waiting_since.items()):
                    if tick <= board.shown_tick:
                        del waiting_since[tick]
                    elif now - since > 3 * self.args.tick_seconds:
                        board.shown_tick = tick
                        self._show(table(tick, None))
                        del waiting_since[tick]
        finally:
            await consumer.stop()

    def _show(self, table: str) -> None:
        if self.args.no_table:
            return
        if self.tty:
            self.out.write("\x1b[H\x1b[2J" + table + f"\n\n{self.footer}\n")
            self.out.flush()
        else:
            self.say(table + "\n")

    # -- tear-down ----------------------------------------------------------------------------
    def close(self) -> None:
        if self.user_worker is not None:
            self.children.stop(self.user_worker, timeout=30.0)
        if self.worker is not None:
            rc = self.children.stop(self.worker, timeout=30.0)
            if rc not in (0, None, -signal.SIGTERM):
                self.say(f"worker exited with {rc}; see {self.data_dir / 'worker.log'}")
        self.children.kill_all()
        if self.broker is not None:
            proc = self.broker.proc
            self.broker.stop()
            if proc is not None:
                wait_group_gone(proc.pid)
            self.broker = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        else:
            self.say(f"data kept in {self.data_dir}")


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _offline(args: argparse.Namespace) -> int:
    from stream_dp.commands.demo_offline import run_offline_demo

    try:
        return run_offline_demo(seed=args.seed, out=sys.stdout, p=args.p, epsilon=args.epsilon,
                                strategy=args.strategy)
    except ValueError as exc:
        print(f"stream-dp demo --offline: {exc}", file=sys.stderr)
        return 2


def _validate(args: argparse.Namespace) -> None:
    """Every option, the budget and the strategy, before the broker starts (one-line errors)."""
    from agents.config.settings import _STRATEGIES, Settings
    from stream_dp.budget import PureDP
    from stream_dp.limits import check_parameters
    from stream_dp.planner import check_buildable

    def finite_positive(name: str, value: float, what: str) -> None:
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0 ({what}), got {value}")

    if args.duration is not None:
        finite_positive("--duration", args.duration, "seconds")
    finite_positive("--tick-seconds", args.tick_seconds, "a whole number of milliseconds")
    if round(args.tick_seconds * 1000) != args.tick_seconds * 1000:
        raise ValueError(f"--tick-seconds must be a positive whole number of milliseconds, got "
                         f"{args.tick_seconds}")
    finite_positive("--rate", args.rate, "events per tick")
    if not 2 <= args.attributes <= 64:
        raise ValueError(f"--attributes must be an integer in [2, 64], got {args.attributes}")
    if not 1 <= args.epoch_ticks <= 2**31 - 1:
        raise ValueError(f"--epoch-ticks must be an integer >= 1, got {args.epoch_ticks}")
    for name, port in (("--web-port", args.web_port), ("--broker-port", args.broker_port)):
        if not 0 <= port <= 65535:
            raise ValueError(f"{name} must be an integer in [0, 65535] (0 = any free port), "
                             f"got {port}")
    if not 0 <= args.seed < 2**63:
        raise ValueError(f"--seed must be an integer in [0, 2**63), got {args.seed}")
    check_parameters(p=args.p, epsilon=args.epsilon, names={"p": "--p", "epsilon": "--epsilon"})
    strategies = _STRATEGIES
    if args.strategy not in strategies:
        raise ValueError(f"--strategy must be one of {', '.join(strategies)}, got "
                         f"{args.strategy!r}")
    # the worker's defaults (horizon, cap): the strategy must accept this budget
    horizon, cap = Settings.horizon, Settings.cap  # class attributes: the defaults
    check_buildable(args.strategy, args.p, horizon, PureDP(args.epsilon), cap)
    _demo_users.validate(args)
    if getattr(args, "privacy_unit", "event") == "user":  # the user-level deployment's ε / K must build too
        check_buildable(args.strategy, args.p, horizon,
                        PureDP(args.epsilon / args.user_max_events), cap)


def run(args: argparse.Namespace) -> int:
    try:
        _validate(args)
    except ValueError as exc:
        print(f"stream-dp demo: {exc}", file=sys.stderr)
        return 2
    if args.offline:
        return _offline(args)
    demo = Demo(args, sys.stdout)
    # SIGTERM before the live loop installs its handlers must still clean up.
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    live = False
    try:
        settings, traffic = demo.start()
        live = True
        return asyncio.run(demo.live(settings, traffic))
    except KeyboardInterrupt:
        if live:  # stopping the live demo is its normal end
            return 0
        # interrupted while starting: what was started is stopped below, then the shell learns
        # that the demo did not run (the convention of every command: docs/operations.md)
        print("stream-dp demo: interrupted while starting; stopping what was started",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except RuntimeError as exc:
        print(f"stream-dp demo: {exc}", file=sys.stderr)
        return 1
    finally:
        # Cleanup must not be cut short: further Ctrl-C / SIGTERM only print a note.
        signal.signal(signal.SIGTERM, _note_stopping)
        previous_int = signal.signal(signal.SIGINT, _note_stopping)
        try:
            demo.close()
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _note_stopping(signum: int, frame: object) -> None:
    print("stopping the worker and the broker, please wait …", file=sys.stderr, flush=True)
