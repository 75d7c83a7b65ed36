"""Process-group helpers for everything that starts child processes (broker, demo, tests)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def terminate_group(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int | None:
    """Stop ``proc``'s process group (it must have been started with ``start_new_session``).

    SIGTERM to the whole group, ``timeout`` seconds' grace, then SIGKILL; then wait until no
    process of the group is left — the group, not just ``proc``, because the noida-db launcher
    can exit before the server it started. Returns ``proc``'s exit code.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)
    if group_alive(proc.pid):
        wait_group_gone(proc.pid, timeout=timeout)
    return proc.returncode


def wait_group_gone(pgid: int, timeout: float = 10.0) -> bool:
    """Wait until no live process is left in group ``pgid``; SIGKILL the rest after ``timeout``.

    (The noida-db launcher exits before the server process it started.)
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    return False


def group_alive(pgid: int) -> bool:
    """Any non-zombie process in group ``pgid`` (Linux /proc; elsewhere ``killpg(pgid, 0)``)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


#: run by :func:`dying_with_parent`: set the parent-death signal, give up if the parent is
#: already gone, then become the command (``exec`` keeps the pid and the signal)
_PDEATHSIG_EXEC = (
    "import os, signal, sys\n"
    "try:\n"  # a Python without ctypes still runs the command, as before this existed
    "    import ctypes\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "except (ImportError, OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def dying_with_parent(cmd: list[str]) -> list[str]:
    """``cmd`` made to get SIGTERM when this process dies, for ``subprocess.Popen``.

    However this process dies — an exception, SIGTERM, or ``kill -9``, which runs no clean-up —
    its children (broker, worker, dashboard) must not outlive it. Linux: the kernel sends the
    signal (``prctl(PR_SET_PDEATHSIG)``, kept across ``exec``), set by a short Python step that
    then execs ``cmd`` (same pid). It fires when the *thread* that called ``Popen`` ends, so
    start long-lived children from the main thread. Elsewhere ``cmd`` unchanged (the callers'
    clean-up handlers still run on every ordinary exit).

    Not a ``preexec_fn``: with one, ``Popen`` runs the interpreter's at-fork hooks in this
    process, and a Ctrl-C landing in one of them (``logging``'s lock release) leaves that lock
    held — the next log line then hangs for ever.
    """
    if not sys.platform.startswith("linux") or not sys.executable:
        return list(cmd)
    return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_EXEC, str(os.getpid()), *cmd]
