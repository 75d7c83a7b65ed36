"""``stream-dp broker start|stop|status``: the embedded development broker (noida-db)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HELP = "start or stop the embedded development broker"

DESCRIPTION = """\
Start, stop or inspect the embedded Kafka-protocol development broker (noida-db, installed with
the 'service' extra) on 127.0.0.1. It is for development, the demo and the tests; production
deployments use Apache Kafka or Redpanda (see deploy/).

'start' runs the broker in the background and returns once it accepts connections, recording
its process id, host and port in DATA_DIR/broker.pid; with --foreground it stays attached and
stops the broker on Ctrl-C / SIGTERM (and on Linux the broker also ends if this command is
killed with -9). 'stop' sends SIGTERM (then SIGKILL after --timeout
seconds) to the broker's process group and removes the pid file. 'status' prints the state and
exits 0 if the broker runs, 3 if it does not (and names the broker of another data directory,
pid and folder, that holds --port, if one does). A start that fails half-way (the port held by
another broker, which it names; a pid file it cannot write; Ctrl-C) stops what it started:
exit status 1 (130 for Ctrl-C), nothing left running. 'stop' and 'status' find a broker of the
data directory by its command line even when its pid file is missing.

The data directory defaults to $STREAM_DP_BROKER_DIR, else $XDG_DATA_HOME/stream-dp/broker
(~/.local/share/stream-dp/broker). It is kept by 'stop': a broker started again on it has
the earlier topics and records (start says so); a fresh run wants a fresh --data-dir.
Durability: a development broker keeps every record in memory and rewrites its whole data
file on each write; killed with kill -9 (or a machine crash) it can lose records it had
acknowledged. Use Apache Kafka or Redpanda where data matters. The default port 9092 matches
the worker's default STREAM_DP_BOOTSTRAP=127.0.0.1:9092.

examples:
  stream-dp broker start                       # background, 127.0.0.1:9092
  stream-dp broker start --port 19092 --data-dir /tmp/dev-broker
  stream-dp broker status --data-dir /tmp/dev-broker
  stream-dp broker stop --data-dir /tmp/dev-broker
  stream-dp broker start --foreground          # Ctrl-C stops it
"""

PID_FILE = "broker.pid"


def default_data_dir() -> Path:
    """``$STREAM_DP_BROKER_DIR``, else ``$XDG_DATA_HOME/stream-dp/broker``."""
    explicit = os.environ.get("STREAM_DP_BROKER_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "stream-dp" / "broker"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "stop", "status"), help="what to do")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="broker data directory (default: see above)")
    parser.add_argument("--port", type=int, default=9092, help="Kafka port (default 9092)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--foreground", action="store_true",
                        help="'start': stay attached; Ctrl-C / SIGTERM stops the broker")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds to wait for start-up or shutdown (default 30)")


def read_pid_file(data_dir: Path) -> dict[str, Any] | None:
    """The recorded broker ``{"pid", "host", "port"}``, or ``None``."""
    try:
        info = json.loads((data_dir / PID_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
        return None
    return info


def _is_broker_process(pid: int) -> bool:
    """Alive and really a noida-db process (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True  # no /proc (not Linux): trust the pid file
    return b"noida-db" in cmdline


@dataclass(frozen=True)
class RunningBroker:
    """A development broker process found on this host: its process group leader's ``pid``,
    Kafka ``port`` and data directory (from its command line)."""

    pid: int
    port: int | None
    data_dir: Path | None


def find_brokers() -> list[RunningBroker]:
    """Every noida-db broker process group on this host (Linux /proc; elsewhere none).

    Found by command line, not by pid file, so that a broker whose pid file is missing (a
    start that failed half-way in an older version, a deleted file) is still found."""
    found: dict[int, RunningBroker] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode("utf-8", "replace")
                    for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            pgid = os.getpgid(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
        if "start" not in argv or not any(Path(a).name == "noida-db" for a in argv[:2]):
            continue
        if pgid in found:
            continue
        port = _option(argv, "--kafka-port")
        data = _option(argv, "--data-dir")
        found[pgid] = RunningBroker(
            pid=pgid, port=int(port) if port and port.isdigit() else None,
            data_dir=Path(data).resolve() if data else None)
    return sorted(found.values(), key=lambda b: b.pid)


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _holder(port: int, data_dir: Path) -> str:
    """Who holds ``port``: another data directory's broker (pid, dir) or another program."""
    for broker in find_brokers():
        if broker.port == port and broker.data_dir != data_dir:
            return (f"the development broker of another data directory holds it (pid "
                    f"{broker.pid}, data {broker.data_dir}); stop it with: stream-dp broker stop "
                    f"--data-dir {broker.data_dir}, or use --port")
    return "another program holds it; stop it or use --port"


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _start(args: argparse.Namespace, data_dir: Path) -> int:
    from agents.kafka.embedded_broker import EmbeddedBroker

    info = read_pid_file(data_dir)
    if info and _is_broker_process(info["pid"]):
        print(f"broker already running: pid {info['pid']} on {info['host']}:{info['port']}")
        return 0 if not args.foreground else 1
    orphan = next((b for b in find_brokers() if b.data_dir == data_dir), None)
    if orphan is not None:  # running without (a valid) pid file: adopt it
        _write_pid_file(data_dir, orphan.pid, args.host, orphan.port or args.port)
        print(f"broker already running: pid {orphan.pid} on {args.host}:{orphan.port}")
        return 0 if not args.foreground else 1
    if _listening(args.host, args.port):
        print(f"stream-dp broker: port {args.host}:{args.port} is already in use: "
              f"{_holder(args.port, data_dir)}", file=sys.stderr)
        return 1
    reused = (data_dir / "kafka.json").is_file()
    # in the background the broker outlives this command by design; in the foreground it must
    # not outlive it, even when the command is killed with -9
    broker = EmbeddedBroker(port=args.port, data_dir=data_dir, host=args.host,
                            die_with_parent=bool(args.foreground))
    pid_path = data_dir / PID_FILE
    try:
        broker.start(timeout=args.timeout)
        proc = broker.proc
        assert proc is not None
        _write_pid_file(data_dir, proc.pid, args.host, args.port)
    except BaseException:
        # a start that fails half-way (pid file not writable, Ctrl-C, a broker that exits)
        # must not leave a broker running that 'broker stop' cannot find
        broker.stop(timeout=args.timeout)
        with contextlib.suppress(OSError):
            pid_path.unlink()
        raise
    print(f"broker running on {broker.bootstrap} (pid {proc.pid}, data {data_dir})")
    print(f"  export STREAM_DP_BOOTSTRAP={broker.bootstrap}")
    if reused:
        # the quickstart run a second time finds the first run's topics and checkpoints
        print(f"note: reusing the topics and records of an earlier run kept in {data_dir}; for "
              "an empty broker: stream-dp broker stop, then start with --data-dir NEW_DIR "
              f"(or delete {data_dir})", file=sys.stderr)
    if not args.foreground:
        print(f"  stop it with: stream-dp broker stop --data-dir {data_dir}")
        return 0
    stopping = False

    def _on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        sys.stdout.flush()
        while not stopping and proc.poll() is None:
            time.sleep(0.2)
    finally:
        broker.stop(timeout=args.timeout)
        from agents.kafka.processes import wait_group_gone

        wait_group_gone(proc.pid, timeout=args.timeout)
        with contextlib.suppress(FileNotFoundError):
            pid_path.unlink()
        for s, handler in old.items():
            signal.signal(s, handler)
    print("broker stopped")
    return 0


def _write_pid_file(data_dir: Path, pid: int, host: str, port: int) -> None:
    (data_dir / PID_FILE).write_text(json.dumps({"pid": pid, "host": host, "port": port}),
                                     encoding="utf-8")


def stop_broker(data_dir: Path, timeout: float = 30.0) -> bool:
    """Stop the broker of ``data_dir`` (by its pid file, else found by its command line);
    ``True`` if one was running."""
    info = read_pid_file(data_dir)
    pid_path = data_dir / PID_FILE
    if not info or not _is_broker_process(info["pid"]):
        with contextlib.suppress(FileNotFoundError):
            pid_path.unlink()
        orphan = next((b for b in find_brokers() if b.data_dir == data_dir.resolve()), None)
        if orphan is None:
            return False
        info = {"pid": orphan.pid}
    pid = info["pid"]
    # The broker leads its own process group (EmbeddedBroker starts it in a new session).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _is_broker_process(pid):
        _reap(pid)
        time.sleep(0.1)
    if _is_broker_process(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        while _is_broker_process(pid) and time.monotonic() < deadline + 5:
            _reap(pid)
            time.sleep(0.1)
    # The launcher exits first; wait for the server process it started (same group).
    from agents.kafka.processes import wait_group_gone

    wait_group_gone(pid, timeout=max(1.0, deadline + 5 - time.monotonic()))
    with contextlib.suppress(FileNotFoundError):
        pid_path.unlink()
    return True


def _reap(pid: int) -> None:
    """Collect a zombie if the broker happens to be our own child."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def validate_args(args: argparse.Namespace) -> None:
    """Options in range before anything starts (one-line ``ValueError``)."""
    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port must be an integer in [1, 65535], got {args.port}")
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= 3600):
        raise ValueError(f"--timeout must be a number of seconds in (0, 3600], got {args.timeout}")
    if not args.host or any(c.isspace() for c in args.host):
        raise ValueError(f"--host must be a host name or address, got {args.host!r}")


def run(args: argparse.Namespace) -> int:
    try:
        validate_args(args)
    except ValueError as exc:
        print(f"stream-dp broker: {exc}", file=sys.stderr)
        return 2
    data_dir: Path = (args.data_dir or default_data_dir()).expanduser().resolve()
    if args.action == "start":
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            return _start(args, data_dir)
        except RuntimeError as exc:
            print(f"stream-dp broker: {exc}", file=sys.stderr)
            return 1
    if args.action == "stop":
        if stop_broker(data_dir, args.timeout):
            print("broker stopped")
        else:
            print(f"no broker running for {data_dir}")
        return 0
    info = read_pid_file(data_dir)
    if info and _is_broker_process(info["pid"]):
        up = _listening(info["host"], info["port"])
        state = "running" if up else "starting (port not yet open)"
        print(f"broker {state}: pid {info['pid']} on {info['host']}:{info['port']} ({data_dir})")
        return 0
    orphan = next((b for b in find_brokers() if b.data_dir == data_dir), None)
    if orphan is not None:
        print(f"broker running without its pid file: pid {orphan.pid} on port {orphan.port} "
              f"({data_dir})")
        return 0
    other = ""
    if _listening(args.host, args.port):
        other = f"; port {args.host}:{args.port} is in use: {_holder(args.port, data_dir)}"
    print(f"no broker running for {data_dir}{other}")
    return 3
