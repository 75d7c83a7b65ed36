"""Process-group helpers for the commands that start child processes (demo, broker)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


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
