"""A small command-line dispatcher, and the library's own commands (``plan``).

The ``stream-dp`` console script belongs to the layer that knows every part of the product: the
service composes its command table from :data:`LIBRARY_COMMANDS` and its own commands, and calls
:func:`main` with it. This module knows only the library: it never names a service module.

A command table maps a subcommand to ``(module name, one-line help)``. Each module exposes
``HELP`` (one line), ``DESCRIPTION`` (paragraphs, with examples), ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported only when their subcommand runs, so ``stream-dp plan``
never imports Kafka clients.

Usage errors (unknown option, a value that does not parse, an argument that is not valid UTF-8
text) print **one line** to stderr,
``stream-dp COMMAND: error: ...``, and exit with status 2 (argparse's default prints the whole
usage block first).

A reader that goes away (``stream-dp plan ... | head``) ends the command quietly with status
141 (as SIGPIPE would); a command whose dependencies are not installed (the Kafka client of the
``service`` extra) says which extra to install, in one line, exit status 1.

Ctrl-C (SIGINT) that interrupts a command before it finished its work prints one line,
``stream-dp COMMAND: interrupted``, and exits with status 130, wherever it lands (also while
the command's modules are still being imported); commands that clean up first (``replay``,
``demo``) do so, then say the same. A file that cannot be written (a read-only or full disk, no
permission) is one line naming the path and the fix, exit status 1. Commands whose normal end
is a stop signal (``worker``, a live ``demo``, ``broker start --foreground``, ``tail``) exit
with their own documented status (0) instead.

``python -m stream_dp.cli plan ...`` runs the library's commands with only the base install.
For any other subcommand it hands over to the installed ``stream-dp`` console script (whichever
package provides it), so older invocations keep working.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import NoReturn

__all__ = ["COMMANDS", "EXIT_INTERRUPTED", "LIBRARY_COMMANDS", "CommandTable", "OneLineParser", "build_parser", "main"]

#: subcommand -> (module, one-line help)
CommandTable = Mapping[str, tuple[str, str]]

#: The library's commands (need nothing beyond the base install). Order = order in ``--help``.
LIBRARY_COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("stream_dp.commands.plan", "compare strategies' exact error for (p, horizon, privacy)"),
    "marginals": ("stream_dp.commands.marginals", "DP decayed α-way marginals of binary-attribute events"),
}

#: Commands this module runs by itself (``python -m stream_dp.cli``).
COMMANDS: CommandTable = LIBRARY_COMMANDS

_DESCRIPTION = "Differentially private decayed running counts over Kafka streams."


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        text = " ".join(str(message).split()).encode("utf-8", "backslashreplace").decode("utf-8")
        self.exit(2, f"{self.prog}: error: {text} (see '{self.prog} --help')\n")


def _load(name: str, commands: CommandTable) -> ModuleType:
    module_name, _ = commands[name]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on installed extras
        missing = exc.name or "?"
        raise SystemExit(
            f"stream-dp {name}: missing dependency {missing!r}; "
            "install the service extra: pip install 'stream-dp[service]'"
        ) from exc


def build_parser(
    selected: str | None = None,
    commands: CommandTable | None = None,
    *,
    prog: str = "stream-dp",
    description: str = _DESCRIPTION,
) -> argparse.ArgumentParser:
    """The top-level parser; only ``selected``'s module is imported to build its arguments."""
    table = COMMANDS if commands is None else commands
    parser = OneLineParser(
        prog=prog,
        description=description,
        epilog=f"Run '{prog} COMMAND --help' for a command's options and examples.",
    )
    parser.add_argument("--version", action="version", version=f"{prog} {installed_version()}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, (_, help_line) in table.items():
        if name == selected:
            module = _load(name, table)
            cmd = sub.add_parser(
                name,
                help=help_line,
                description=getattr(module, "DESCRIPTION", help_line),
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
            module.add_arguments(cmd)
        else:
            sub.add_parser(name, help=help_line)
    return parser


def installed_version() -> str:
    """The installed distribution's version (``stream-dp --version``), else ``__version__``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stream-dp")
    except PackageNotFoundError:  # pragma: no cover - a source tree without install
        from stream_dp import __version__

        return __version__


def _console_script() -> object | None:
    """The installed ``stream-dp`` console script's function, unless it is this module's."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="console_scripts", name="stream-dp"):
        if ep.value.split(":")[0].strip() == __name__:
            return None
        try:
            loaded: object = ep.load()
        except ImportError:
            return None
        return loaded
    return None


#: BLAS thread variables set to 1 unless the user set them (see :func:`_single_threaded_blas`)
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _single_threaded_blas() -> None:
    """One BLAS thread unless the environment says otherwise; before NumPy is imported.

    The plan search factorises matrices of up to 4096² (Cholesky, triangular solves). OpenBLAS's
    worker threads busy-wait for each other, and on a host whose cores are busy (the broker, the
    event producer, other workers) that turned a 0.5 s plan into 13.5 s of wall and CPU time —
    measured: ``build_mechanism`` for the demo's settings with both cores of this 2-core machine
    loaded. The worker's own numerics are element-wise, so one thread loses nothing there."""
    for name in BLAS_THREAD_VARIABLES:
        os.environ.setdefault(name, "1")


def main(argv: Sequence[str] | None = None, commands: CommandTable | None = None) -> int:
    """Parse ``argv`` against ``commands`` (default: the library's) and run the subcommand."""
    _single_threaded_blas()
    args_list = list(sys.argv[1:] if argv is None else argv)
    table = COMMANDS if commands is None else commands
    for arg in args_list:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            # undecodable bytes in argv (lone surrogates): stream names, topics and paths are text
            print(f"stream-dp: error: argument {arg!r} is not valid UTF-8 text (stream names, "
                  "topics, times and paths must be)", file=sys.stderr)
            return 2
    selected = next((a for a in args_list if not a.startswith("-")), None)
    if commands is None and selected is not None and selected not in table:
        delegate = _console_script()
        if callable(delegate):
            result: int = delegate(args_list)
            return result
    if selected not in table:
        selected = None
    name = selected or "?"
    try:
        parser = build_parser(selected, table)
        args = parser.parse_args(args_list)
        if args.command is None:
            parser.print_help()
            return 2
        name = args.command
        module = _load(args.command, table)
        code: int = module.run(args)
        sys.stdout.flush()
        if code == EXIT_INTERRUPTED and argv is None:
            # a command that handled Ctrl-C itself (the demo stopping what it started): the
            # interrupt may still have set CPython's exit-by-SIGINT flag (_exit_interrupted)
            _exit_interrupted()
    except BrokenPipeError:
        # the reader went away (``stream-dp plan ... | head``): stop quietly, like any Unix
        # tool killed by SIGPIPE; stdout is redirected so the interpreter's final flush cannot
        # raise again
        _silence_stdout()
        return 141
    except KeyboardInterrupt:
        # Ctrl-C (or SIGINT) before the command finished its work, also while it was still
        # importing: one line, the shell's status for an interrupted command, no traceback
        print(f"stream-dp {name}: interrupted", file=sys.stderr)
        if argv is None:  # this process's entry point
            _exit_interrupted()
        return EXIT_INTERRUPTED
    except OSError as exc:
        if exc.errno not in _FILE_ERRNOS:
            raise
        print(f"stream-dp {name}: {file_problem(exc)}", file=sys.stderr)
        return 1
    except ImportError as exc:
        if not _interrupted_import(exc):
            if not isinstance(exc, ModuleNotFoundError):
                raise
            missing = (exc.name or "?").split(".")[0]
            print(f"stream-dp {name}: missing dependency {missing!r}: this command needs "
                  "the service extra: pip install 'stream-dp[service]'", file=sys.stderr)
            return 1
        # Ctrl-C while a pybind11 extension (SciPy's) initialised: it re-raises the
        # KeyboardInterrupt as ImportError("initialization failed") from it
        print(f"stream-dp {name}: interrupted", file=sys.stderr)
        if argv is None:
            _exit_interrupted()
        return EXIT_INTERRUPTED
    return code


def _interrupted_import(exc: BaseException) -> bool:
    """Whether an import failed because of a KeyboardInterrupt (in its cause or context)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


#: exit status of a command interrupted by Ctrl-C / SIGINT before it finished (128 + SIGINT)
EXIT_INTERRUPTED = 130

#: errors of the file system that the user fixes by choosing another place or freeing space
_FILE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                          errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EFBIG})


def file_problem(exc: OSError) -> str:
    """One line for a file-system error: what failed, on which path, and what to do."""
    where = f" {exc.filename!r}" if exc.filename is not None else ""
    if exc.filename2 is not None:
        where += f" -> {exc.filename2!r}"
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        fix = "free some space or write to another disk"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        fix = "choose a writable place (e.g. another --data-dir or --out)"
    else:
        fix = "check the path"
    return f"cannot write{where}: {reason}; {fix}"


def _exit_interrupted() -> NoReturn:
    """End the process with status 130 now.

    CPython 3.11 remembers, in a process-wide flag that nothing resets, that a KeyboardInterrupt
    once left code run by ``PyRun_*`` (which some extension modules' imports use); at exit it
    then kills the process with SIGINT (status -2 to a parent) although the interrupt was
    handled here and 130 returned. Seen with Ctrl-C 0.3 s into ``stream-dp plan``. Exit
    handlers still run first; buffered output is flushed."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream
            stream.flush()
    os._exit(EXIT_INTERRUPTED)


def _silence_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # pragma: no cover - stdout without a file descriptor
        pass


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
