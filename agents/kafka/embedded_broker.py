"""An embedded Kafka-protocol broker for development, the demo and the tests.

Runs ``noida-db start --only kafka`` (PyPI package ``noida-db``) as a child process in its own
process group on 127.0.0.1, waits until the Kafka port accepts connections, and stops it (SIGTERM,
then SIGKILL) on exit. The broker is the package's native server itself, not its Python launcher
(which does not pass signals on), so that it also dies with its parent when the parent is killed
(``die_with_parent``, Linux). Production deployments use Apache Kafka or Redpanda instead; nothing else
in the service depends on which broker runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from agents.kafka.processes import dying_with_parent, terminate_group


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _noida_binary() -> str:
    """The native server shipped in the ``noida_db`` package; else its launcher script."""
    spec = importlib.util.find_spec("noida_db")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        server = Path(folder) / "noida-db"
        if server.is_file():
            if not os.access(server, os.X_OK):  # what the launcher does before each start
                with contextlib.suppress(OSError):
                    server.chmod(0o755)
            if os.access(server, os.X_OK):
                return str(server)
    found = shutil.which("noida-db")
    if found:
        return found
    candidate = Path(sys.executable).with_name("noida-db")
    if candidate.exists():
        return str(candidate)
    raise RuntimeError(
        "the embedded broker needs the 'noida-db' package: pip install 'stream-dp[service]'"
    )


class EmbeddedBroker:
    """A noida-db Kafka broker on ``127.0.0.1:port`` with its data in ``data_dir``.

    Use as a context manager, or call :meth:`start` / :meth:`stop`. ``bootstrap`` is the address
    for clients. If ``data_dir`` is omitted a temporary directory is used and removed on stop.
    With ``die_with_parent`` (the default) the broker gets SIGTERM when the process — the thread —
    that started it ends, even by ``kill -9`` (Linux); ``stream-dp broker start`` turns it off
    for the broker it leaves running in the background.
    """

    def __init__(
        self,
        port: int | None = None,
        data_dir: str | Path | None = None,
        host: str = "127.0.0.1",
        log_path: str | Path | None = None,
        *,
        die_with_parent: bool = True,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            # The broker may still be flushing files as it exits: never fail teardown on that.
            self._tmp = tempfile.TemporaryDirectory(
                prefix="stream-dp-broker-", ignore_cleanup_errors=True
            )
            data_dir = self._tmp.name
        self.data_dir = Path(data_dir)
        self.log_path = Path(log_path) if log_path else self.data_dir / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.die_with_parent = die_with_parent

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        cmd = [_noida_binary(), "start", "--only", "kafka", "--kafka-port", str(self.port),
               "--host", self.host, "--data-dir", str(self.data_dir)]
        self.proc = subprocess.Popen(
            dying_with_parent(cmd) if self.die_with_parent else cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        try:
            self._wait_listening(timeout)
        except BaseException:  # also Ctrl-C: never leave a broker that nobody knows of
            self.stop()
            raise
        return self

    def _wait_listening(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                # the launcher exited; its server (same process group) may live on, holding the
                # port with nobody knowing its pid: start() stops the whole group
                raise RuntimeError(
                    f"embedded broker exited with {self.proc.returncode}; see {self.log_path}"
                )
            with contextlib.suppress(OSError), socket.create_connection(
                (self.host, self.port), timeout=0.5
            ):
                return
            time.sleep(0.1)
        raise RuntimeError(f"embedded broker did not listen on {self.bootstrap} in {timeout} s")

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            terminate_group(proc, timeout)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
