"""The ``stream-dp`` command line: a thin dispatcher over one module per subcommand.

Each subcommand lives in its own module exposing ``HELP`` (one line), ``DESCRIPTION`` (paragraphs,
with examples), ``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported only when
their subcommand runs, so ``stream-dp plan`` never imports Kafka clients and the library
(``stream_dp``) stays free of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

#: subcommand -> (module, one-line help). Order is the order shown in ``stream-dp --help``.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("agents.commands.demo", "run broker, worker, reconciler and simulator; show live releases"),
    "plan": ("stream_dp.commands.plan", "compare strategies' exact error for (p, horizon, privacy)"),
    "marginals": ("stream_dp.commands.marginals", "DP decayed α-way marginals of binary-attribute events"),
    "worker": ("agents.commands.worker", "run a production worker (broker and settings from env)"),
    "broker": ("agents.commands.broker", "start or stop the embedded development broker"),
    "topics": ("agents.commands.topics", "create the service's topics with explicit partitions"),
    "tail": ("agents.commands.tail", "subscribe to released counts or consistent histograms"),
    "replay": ("agents.commands.replay", "replay a CSV / JSON-lines event log into the events topic"),
    "simulate": ("simulators.cli", "generate deterministic synthetic event logs or live traffic"),
}


def _load(name: str) -> ModuleType:
    module_name, _ = COMMANDS[name]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on installed extras
        missing = exc.name or "?"
        raise SystemExit(
            f"stream-dp {name}: missing dependency {missing!r}; "
            "install the service extra: pip install 'stream-dp[service]'"
        ) from exc


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; only ``selected``'s module is imported to build its arguments."""
    parser = argparse.ArgumentParser(
        prog="stream-dp",
        description="Differentially private decayed running counts over Kafka streams.",
        epilog="Run 'stream-dp COMMAND --help' for a command's options and examples.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_line) in COMMANDS.items():
        if name == selected:
            module = _load(name)
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


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in args_list if not a.startswith("-")), None)
    if selected not in COMMANDS:
        selected = None
    parser = build_parser(selected)
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 2
    module = _load(args.command)
    result: int = module.run(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
