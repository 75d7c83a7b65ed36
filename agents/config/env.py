"""The ``STREAM_DP_*`` environment variables that exist, and the refusal of any other.

A misspelt variable (``STREAM_DP_EPSILOM=2``) used to be ignored: the worker ran at the default
ε while the operator believed otherwise; the same typo in the TOML file was refused. Every
``STREAM_DP_*`` name is now either a setting's variable (``STREAM_DP_<SETTING>``) or one of
:data:`OTHER_VARIABLES` below (documented in docs/configuration.md, "Other environment
variables", which is generated from this table), and anything else is refused with a
did-you-mean, by :meth:`agents.config.settings.Settings.load` and by every ``stream-dp`` command.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

__all__ = ["OTHER_VARIABLES", "PREFIX", "check_environment", "did_you_mean"]

PREFIX = "STREAM_DP_"

#: ``STREAM_DP_*`` variables that are not settings: name -> (used by, meaning). Keep in step
#: with the code that reads them (grep the prefix); docs/configuration.md shows this table.
OTHER_VARIABLES: dict[str, tuple[str, str]] = {
    "STREAM_DP_CONFIG": ("worker, topics", "path of the settings TOML file (instead of `--config`)"),
    "STREAM_DP_KEY": ("worker, replay", "the noise key itself (hex, or raw text), when `key_file` "
                      "is not set"),
    "STREAM_DP_CACHE_DIR": ("library", "cache folder of solved weights, tree plans and blt fits "
                            "(default: the user cache folder)"),
    "STREAM_DP_BROKER_DIR": ("`stream-dp broker`", "data folder of the embedded development "
                             "broker (default `$XDG_DATA_HOME/stream-dp/broker`)"),
    "STREAM_DP_REPLAY_HISTORY": ("replay", "the replay history file (per key, every log content "
                                 "replayed and the deployments it went to; default "
                                 "`$XDG_STATE_HOME/stream-dp/replay-history.json`); "
                                 "`--history-file` overrides it"),
    "STREAM_DP_PURE_INGEST": ("worker", "1: ingest on the pure-Python path instead of the "
                              "compiled extension (identical results, slower; for diagnosis)"),
    "STREAM_DP_TEST_PYTHONS": ("`scripts/test`", "the Python versions to test (default: every "
                               "supported one; README, \"Development\")"),
    "STREAM_DP_TEST_WORKERS": ("`scripts/test`", "pytest-xdist processes per suite (default: "
                               "the CPUs, at most 4; 1: one process)"),
    "STREAM_DP_TEST_ALLOW_PURE": ("`scripts/test`, the test suite", "1: do not fail the test run "
                                  "when a compiled path (the ingest loop, the library's noise "
                                  "kernels `stream_dp._fastnoise`) did not build (platforms "
                                  "without a C compiler)"),
}


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the closest of ``known`` to ``name``, or an empty string."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def check_environment(environ: Mapping[str, str], setting_variables: Iterable[str]) -> None:
    """Raise ``ValueError`` (one line) for the first unknown ``STREAM_DP_*`` name in ``environ``.

    ``setting_variables``: the variables of the settings (``STREAM_DP_<NAME>``)."""
    known = set(setting_variables) | set(OTHER_VARIABLES)
    for name in sorted(environ):
        if name.startswith(PREFIX) and name not in known:
            # compare without the common prefix, which would make every name look close
            guess = difflib.get_close_matches(name[len(PREFIX):],
                                              sorted(k[len(PREFIX):] for k in known), n=1,
                                              cutoff=0.6)
            hint = f" (did you mean {PREFIX}{guess[0]}?)" if guess else ""
            raise ValueError(
                f"unknown environment variable {name}{hint}; every "
                f"{PREFIX}* variable must be a setting or one of docs/configuration.md's "
                "'Other environment variables' (unset it or fix its name)")
