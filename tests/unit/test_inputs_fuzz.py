"""Fuzzing every command-line and configuration parser (hypothesis): whatever the input, the
outcome is success, or exit status 2 / ``ValueError`` with one line; never a traceback.

Commands that would start something on success (demo, broker, worker, topics, tail, replay,
simulate --to-topic) are fuzzed through their parser and their pre-connection validation only;
``plan`` and ``simulate`` (small logs) run to the end.
"""

from __future__ import annotations

import argparse
import math
import os
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.cli import build_parser, main
from tests.unit._cli_env import CLOSED, clean_env  # noqa: F401 - autouse fixture

FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

#: Awkward numbers as the command line spells them.
NUMBERS = st.one_of(
    st.sampled_from([
        "0", "-0", "1", "-1", "0.5", "1.5", "2", "1e-300", "1e-12", "1e-6", "1e6", "1e12", "1e300",
        "1e400", "-1e400", "nan", "inf", "-inf", "4095", str(2**24), str(2**31 - 1), str(2**40),
        str(2**64), "0x10", "", " ", "1_000", "٣",
    ]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)
#: Awkward text, surrogates included (what undecodable argv bytes become).
TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "-", "--", "a\udcff", "\ud800", "now", "x.csv", "a\nb", "é/ü", "🙂"]),
)
VALUES = st.one_of(NUMBERS, TEXT)




def _options(command: str) -> list[tuple[str, bool]]:
    """(option string, takes a value) of ``command``'s parser."""
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = []
    for action in sub.choices[command]._actions:
        for opt in action.option_strings:
            if opt not in ("-h", "--help"):
                out.append((opt, action.nargs != 0))
    return out


def _argv(command: str, positional: list[str]) -> st.SearchStrategy[list[str]]:
    opts = _options(command)

    @st.composite
    def build(draw: st.DrawFn) -> list[str]:
        argv = [command, *positional]
        for opt, takes in draw(st.lists(st.sampled_from(opts), max_size=5)):
            argv.append(opt)
            if takes:
                argv.append(draw(VALUES))
        if draw(st.booleans()):
            argv.append(draw(VALUES))
        return argv

    return build()


def _outcome(call: object, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        rc = call()  # type: ignore[operator]
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    return rc, capsys.readouterr().err


def _assert_clean(rc: int, err: str) -> None:
    assert "Traceback" not in err, err
    if rc != 0:
        assert rc == 2, (rc, err)
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1, err


def _assert_value_error(exc: ValueError) -> None:
    text = str(exc)
    assert text and "\n" not in text, repr(text)


@FUZZ
@given(argv=st.one_of(
    _argv("plan", []),
    st.builds(
        lambda p, e, h, cap, extra: ["plan", "--p", p, "--epsilon", e, "--horizon", h,
                                     "--cap", cap, *extra],
        NUMBERS, NUMBERS, st.sampled_from(["1", "7", "63", "255", "0", "-3", str(2**40), "x"]),
        NUMBERS,
        st.sampled_from([[], ["--integer-counts"], ["--format", "json"],
                         ["--privacy", "zcdp"], ["--delta", "2"], ["--delta", "nan"]]),
    ),
))
def test_plan_never_crashes(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _assert_clean(*_outcome(lambda: main(argv), capsys))


@FUZZ
@given(argv=_argv("simulate", ["restaurant"]))
def test_simulate_never_crashes(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser("simulate")
    rc, err = _outcome(lambda: parser.parse_args(argv) and 0, capsys)
    _assert_clean(rc, err)
    if rc:
        return
    args = parser.parse_args(argv)
    from simulators.cli import build_simulator, validate_args

    try:
        validate_args(args)
        if args.ticks is None or args.ticks > 50:
            return  # would generate a long log: validation is what is fuzzed here
        build_simulator(args)
    except ValueError as exc:
        _assert_value_error(exc)
        return
    if args.to_topic:
        return  # would connect
    args.out = "out.csv" if args.out is not None else None
    args.domain_out = "d.toml" if args.domain_out is not None else None
    args.settings_out = "s.toml" if args.settings_out is not None else None
    args.format = None
    from agents.commands.simulate import run

    _assert_clean(*_outcome(lambda: run(args), capsys))


def _validated(command: str, validate: object, argv: list[str],
               capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser(command)
    rc, err = _outcome(lambda: parser.parse_args(argv) and 0, capsys)
    _assert_clean(rc, err)
    if rc:
        return
    try:
        validate(parser.parse_args(argv))  # type: ignore[operator]
    except ValueError as exc:
        _assert_value_error(exc)


@FUZZ
@given(argv=_argv("demo", []))
def test_demo_validation_never_crashes(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from agents.commands.demo import _validate

    _validated("demo", _validate, argv, capsys)


@FUZZ
@given(argv=_argv("replay", ["log.csv"]))
def test_replay_validation_never_crashes(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from agents.commands._replay_checks import validate_args

    _validated("replay", validate_args, argv, capsys)


@FUZZ
@given(argv=_argv("broker", ["status"]))
def test_broker_validation_never_crashes(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from agents.commands.broker import validate_args

    _validated("broker", validate_args, argv, capsys)


@FUZZ
@given(argv=st.one_of(_argv("tail", []), _argv("topics", ["list"]), _argv("worker", [])))
def test_service_parsers_never_crash(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser(argv[0])
    _assert_clean(*_outcome(lambda: parser.parse_args(argv) and 0, capsys))


@FUZZ
@given(argv=st.lists(VALUES, max_size=4))
def test_top_level_never_crashes(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    if argv and argv[0] in ("demo", "worker", "broker", "topics", "tail", "replay", "simulate"):
        argv = ["plan", *argv[1:]]
    rc, err = _outcome(lambda: main(argv), capsys)
    assert "Traceback" not in err
    assert rc in (0, 2)


# ----------------------------------------------------------------------------- settings
SETTING_NAMES = st.sampled_from([
    "epsilon", "rho", "cap", "p", "horizon", "strategy", "privacy_model", "tick_seconds",
    "origin", "max_event_value", "web_port", "shards", "app_id", "events_topic", "log_level",
    "max_memory_mb", "allowed_lateness_s", "schedule", "events_start", "max_batch", "bogus",
])


@FUZZ
@given(env=st.dictionaries(SETTING_NAMES, VALUES, max_size=5))
def test_settings_from_the_environment_never_crash(env: dict[str, str]) -> None:
    from agents.config.settings import Settings

    environ = {"STREAM_DP_ORIGIN": "1700000000"}
    environ.update({f"STREAM_DP_{k.upper()}": v for k, v in env.items()})
    try:
        Settings.load(env=environ)
    except ValueError as exc:
        _assert_value_error(exc)


TOML_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**63), 2**63 - 1),
    st.booleans(), st.text(max_size=8), st.lists(st.integers(), max_size=2),
)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf
                                            else repr(v))
    if isinstance(v, str):
        return '"' + "".join(c if c.isalnum() or c in " ._-/" else f"\\u{ord(c):04x}"
                             for c in v if ord(c) < 0x10000) + '"'
    return repr(v)


@FUZZ
@given(table=st.dictionaries(SETTING_NAMES, TOML_VALUES, max_size=5), raw=st.binary(max_size=40))
def test_settings_from_toml_never_crash(table: dict[str, object], raw: bytes, tmp_path: Path) -> None:
    from agents.config.settings import Settings

    path = tmp_path / "s.toml"
    body = "origin = 1700000000\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in table.items()
                                              if k != "origin")
    for content in (body.encode(), raw):
        path.write_bytes(content)
        try:
            Settings.load(path, env={})
        except ValueError as exc:
            _assert_value_error(exc)


DOMAIN_TOML = st.one_of(
    st.builds(lambda names: 'kind = "flat"\nstreams = [' + ", ".join(
        _toml_value(n) for n in names) + "]\n", st.lists(st.text(max_size=6), max_size=4)),
    st.builds(lambda paths: 'kind = "hierarchy"\npaths = [' + ", ".join(
        _toml_value(n) for n in paths) + "]\n", st.lists(st.text(max_size=8), max_size=4)),
    st.builds(lambda cats: 'kind = "grid"\n[attributes]\nage = [' + ", ".join(
        _toml_value(c) for c in cats) + "]\n", st.lists(st.text(max_size=5), max_size=3)),
    st.binary(max_size=60).map(lambda b: b.decode("latin-1")),
    st.sampled_from(['kind = "flat"\nstreams = ["a", "b\\ud800"]\n', "kind = 5\n", "[domain]\n",
                     'domain = 3\n', 'kind = "hierarchy"\nstreams = ["a"]\nparents = ["b"]\n']),
)


@FUZZ
@given(text=DOMAIN_TOML)
def test_domain_files_never_crash(text: str, tmp_path: Path) -> None:
    from stream_dp.domain import Domain

    path = tmp_path / "d.toml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    try:
        Domain.from_file(path)
    except ValueError as exc:
        _assert_value_error(exc)


def test_toml_fuzz_helper_writes_valid_toml() -> None:
    quoted = _toml_value('a"b')
    assert tomllib.loads("x = " + quoted + "\n")["x"] == 'a"b'
    assert tomllib.loads(f"x = {_toml_value(float('nan'))}\n")["x"] != 0
