"""Output files that are either complete or absent: written under a temporary name in the same
folder and renamed over the target only once everything is written.

An interrupted ``stream-dp simulate --out big.csv`` (Ctrl-C, a full disk) used to leave a
truncated log that looked complete: every line well formed, only the later ticks missing. A
replay of it would publish a different history than the one asked for. With this, the target is
untouched until the rename, and the temporary file is removed on any failure.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

__all__ = ["atomic_text"]


@contextlib.contextmanager
def atomic_text(path: str | Path, *, newline: str | None = None) -> Iterator[TextIO]:
    """Open ``path`` for writing UTF-8 text; it appears (by rename) only if the block succeeds.

    A target that exists and is not a regular file (``/dev/stdout``, a named pipe) is written in
    place: it cannot be replaced by a rename, and a reader is already waiting on it."""
    target = Path(path)
    try:
        with _opened(target, newline) as fh:
            yield fh
    except OSError as exc:
        if exc.filename is not None:
            raise
        # a failed write (a full disk) names no file: name the one the user asked for
        raise OSError(exc.errno, exc.strerror, str(target)) from exc


@contextlib.contextmanager
def _opened(target: Path, newline: str | None) -> Iterator[TextIO]:
    if target.exists() and not target.is_file():
        with open(target, "w", encoding="utf-8", newline=newline) as fh:
            yield fh
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial",
                                   dir=target.parent)
    except OSError as exc:  # name the file the user asked for, not the temporary one
        raise OSError(exc.errno, exc.strerror, str(target)) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as fh:
            yield fh
        # mkstemp creates 0600; a log is as readable as any file the user creates
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
