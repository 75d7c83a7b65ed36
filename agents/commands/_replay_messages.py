"""What ``stream-dp replay`` tells its user: the notes on the noise key and the privacy budget
(:data:`_KEY_NOTES`, :data:`NO_KEY`), the human lines and the ``--json`` outcome object
(:class:`_Out`), and the wording of a ``--retime`` shift.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from agents.commands._replay_send import _retime_offset
from simulators.logfile import read_log


def _say(out: TextIO, text: str) -> None:
    print(text, file=out, flush=True)


_KEY_NOTES = {
    "new": "first replay of this log under this noise key: its SHA-256 is recorded in the "
           "replay history, and this key may from now on replay only this very log into this "
           "deployment (this events topic on this cluster; another deployment has its own "
           "noise).",
    "same": "same noise key and the very same log as an earlier replay: a fresh deployment "
            "with the same identity (app id, events and schedule topics) and settings "
            "reproduces the original releases bit for bit and spends no new privacy budget; "
            "any other deployment draws fresh noise and spends it again.",
    "same_elsewhere": "same noise key and the very same log as an earlier replay, but into "
                      "another deployment: this one draws its own noise, so these releases are "
                      "new and the privacy budget for these events is spent AGAIN.",
    "different": "WARNING: these events were replayed before under another noise key: the "
                 "releases will differ from the original ones and the privacy budget for these "
                 "events is spent AGAIN.",
}

NO_KEY = ("no noise key: replay needs the deployment's key (--key-file FILE, $STREAM_DP_KEY_FILE "
          "or $STREAM_DP_KEY) to sign its close markers and to refuse a changed log under the "
          "same key")


class _Out:
    """Human messages (stderr, like the progress bar) and the --json outcome object (the only
    thing on stdout: ``replay ... --json | jq`` reads nothing else)."""

    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode
        self.stream: TextIO = sys.stderr
        self.result: dict[str, Any] = {"schema": "stream-dp.replay.v1"}

    def say(self, text: str) -> None:
        _say(self.stream, text)

    def finish(self, status: str, code: int, **fields: Any) -> int:
        self.result.update(fields)
        self.result["status"] = status
        self.result["exit_status"] = code
        if self.json_mode:
            print(json.dumps(self.result, sort_keys=True), flush=True)
        return code


def _shift_text(shift: float, none: str = "") -> str:
    """``retimed +3.000 s`` for a ``--retime`` shift, ``none`` for no shift."""
    return f"retimed {shift:+.3f} s" if shift else none


def _shift_request(retime: str | None, wanted: float) -> str:
    if retime == "now":
        return f"--retime now asks for a new shift ({wanted:+.3f} s; 'now' always gives a new one)"
    return (f"--retime {retime} asks for the shift {wanted:+.3f} s" if retime is not None
            else "without --retime the times are not shifted")


def _retime_argument(log: Path, fmt: Any, shift: float) -> str:
    """``--retime T`` that gives exactly ``shift`` again (``""`` for no shift or none found);
    ``fmt`` is the log's :data:`simulators.logfile.LogFormat`."""
    if not shift:
        return "no --retime"
    first = next(iter(read_log(log, fmt)), None)
    if first is None:
        return ""
    for digits in (3, 6, 9):
        text = f"{first.event.ts + shift:.{digits}f}"
        if _retime_offset(log, fmt, text) == shift:
            return f"--retime {text}"
    return ""
