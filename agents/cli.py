"""The ``stream-dp`` console script: the one place that knows every command of the product.

The command table below composes the library's commands (:data:`stream_dp.cli.LIBRARY_COMMANDS`,
e.g. ``plan``, which needs only the base install) with the service's (``agents/commands``) and
the simulators' (wrapped by :mod:`agents.commands.simulate`, which gives them a Kafka producer).
The arrows point one way: ``agents`` → ``stream_dp`` and ``agents`` → ``simulators``; neither
the library nor the simulators import the service.

To add a subcommand, write a module with ``HELP``, ``DESCRIPTION`` (with an ``examples:``
section), ``add_arguments(parser)`` and ``run(args) -> int`` and add one line to
:data:`COMMANDS` (library commands go to ``stream_dp.cli.LIBRARY_COMMANDS`` and appear here by
themselves).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from stream_dp import cli as _library_cli

__all__ = ["COMMANDS", "build_parser", "main"]

#: subcommand -> (module, one-line help). Order is the order shown in ``stream-dp --help``.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("agents.commands.demo", "run broker, worker, reconciler and simulator; show live releases"),
    **_library_cli.LIBRARY_COMMANDS,
    "worker": ("agents.commands.worker", "run a production worker (broker and settings from env)"),
    "broker": ("agents.commands.broker", "start or stop the embedded development broker"),
    "topics": ("agents.commands.topics", "create the service's topics with explicit partitions"),
    "deployment": ("agents.commands.deployment", "start a new deployment: new app id, topics and key"),
    "tail": ("agents.commands.tail", "subscribe to released counts or consistent histograms"),
    "replay": ("agents.commands.replay", "replay a CSV / JSON-lines event log into the events topic"),
    "simulate": ("agents.commands.simulate", "generate deterministic synthetic event logs or live traffic"),
}


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The ``stream-dp`` parser; only ``selected``'s module is imported to build its arguments."""
    return _library_cli.build_parser(selected, COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stream-dp`` console script."""
    try:
        from agents.kafka.clients import quiet_client_logs

        quiet_client_logs()  # connection problems are reported by the commands, in one line
    except KeyboardInterrupt:  # Ctrl-C while the client library is still loading
        # the command's name as later on (a loaded machine lands here for longer)
        args = list(sys.argv[1:] if argv is None else argv)
        selected = next((a for a in args if not a.startswith("-")), None)
        name = f" {selected}" if selected in COMMANDS else ""
        print(f"stream-dp{name}: interrupted", file=sys.stderr)
        if argv is None:  # this process's entry point (see stream_dp.cli._exit_interrupted)
            _library_cli._exit_interrupted()
        return _library_cli.EXIT_INTERRUPTED
    problem = _environment_problem()
    if problem is not None:
        print(f"stream-dp: error: {problem}", file=sys.stderr)
        return 2
    return _library_cli.main(argv, COMMANDS)


def _environment_problem() -> str | None:
    """Why the ``STREAM_DP_*`` variables cannot be used (a name that is no setting), or None.

    Checked for every command, before anything runs: the tools read the same variables as the
    worker (security settings, topics, the key), and a misspelt one would be ignored."""
    import dataclasses
    import os

    from agents.config.env import check_environment
    from agents.config.settings import Settings
    from agents.config.values import env_var

    try:
        check_environment(os.environ, (env_var(f.name) for f in dataclasses.fields(Settings)))
    except ValueError as exc:
        return str(exc)
    return None


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
