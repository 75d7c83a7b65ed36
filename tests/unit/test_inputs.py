"""Inputs that cannot crash: every bad value gives exit status 2 and one line naming the
parameter and its range, before any broker connection (the bootstrap points at a closed port)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.cli import main
from tests.unit._cli_env import CLOSED, clean_env  # noqa: F401 - autouse fixture

GOOD_KEY = "9c41e7a2d05fb3688e1d4ca7f26b90e53da8c17f4e92b06d15a3f8ce7702b4d9"




def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit status and stderr of ``stream-dp argv`` run in-process (usage errors included)."""
    start = time.monotonic()
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    assert time.monotonic() - start < 30, "took too long: did it try to connect?"
    return rc, capsys.readouterr().err


def _assert_one_line_error(rc: int, err: str, *names: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


PLAN = ["plan", "--p", "0.9", "--horizon", "63"]


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        ([*PLAN, "--epsilon", "1e-300"], ("--epsilon", "[1e-06, 1e+06]")),
        ([*PLAN, "--epsilon", "1e-12"], ("--epsilon", "1e-06")),
        ([*PLAN, "--epsilon", "1e30"], ("--epsilon", "1e+06")),
        ([*PLAN, "--epsilon", "nan"], ("--epsilon",)),
        ([*PLAN, "--epsilon", "1", "--cap", "1e300"], ("--cap", "1e+09")),
        (["plan", "--p", "0.9", "--epsilon", "1", "--horizon", str(2**40)], ("--horizon", "16777215")),
        (["plan", "--p", "1", "--epsilon", "1", "--horizon", str(2**31 - 1)], ("--horizon",)),
        ([*PLAN, "--privacy", "zcdp", "--rho", "1", "--delta", "2"], ("--delta", "(0, 1)")),
        ([*PLAN, "--privacy", "zcdp", "--rho", "1e-300"], ("--rho",)),
        ([*PLAN, "--epsilon", "1", "--integer-counts", "--cap", "1.5"], ("--cap", "whole number")),
        ([*PLAN, "--epsilon", "x"], ("--epsilon",)),
        ([*PLAN, "--epsilon", "1", "--bogus"], ("--bogus",)),
        ([*PLAN, "--epsilon", "1", "--domain", "a\udcff.toml"], ("UTF-8",)),
    ],
)
def test_plan_refuses_with_one_line(
    argv: list[str], names: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, err = _run(argv, capsys)
    _assert_one_line_error(rc, err, *names)


def test_plan_with_a_bad_domain_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "d.toml"
    bad.write_text('kind = "flat"\nstreams = ["a", "b\\ud800"]\n', encoding="utf-8")
    rc, err = _run([*PLAN, "--epsilon", "1", "--domain", str(bad)], capsys)
    _assert_one_line_error(rc, err, "d.toml")
    bad.write_bytes(b'kind = "flat"\nstreams = ["a", "\xff"]\n')
    rc, err = _run([*PLAN, "--epsilon", "1", "--domain", str(bad)], capsys)
    _assert_one_line_error(rc, err, "d.toml")


def test_stream_names_with_surrogates_are_refused() -> None:
    from stream_dp.domain import Domain

    with pytest.raises(ValueError, match=r"names\[1\] must be valid UTF-8") as err:
        Domain.flat(["ok", "bad\udc80"])
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="UTF-8"):
        Domain.from_paths(["eu/fr", "eu/\ud800"])
    with pytest.raises(ValueError, match="control characters"):
        Domain.flat(["a\nb"])


@pytest.mark.parametrize(
    "budget",
    [["--epsilon", e] for e in ("1e-2", "1", "1e2", "1e4", "1e5", "1e6")]
    + [["--privacy", "zcdp", "--rho", r] for r in ("1e-4", "0.5", "1e6", "1e12")],
)
@pytest.mark.parametrize("p", [0.5, 0.9, 0.999, 1.0])
def test_plan_never_reports_an_error_below_its_lower_bound(
    budget: list[str], p: float, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    try:
        rc = main(["plan", "--p", str(p), "--horizon", "255", *budget, "--format", "json"])
    except SystemExit as exc:  # pragma: no cover - reported below
        rc = int(exc.code or 0)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    doc = json.loads(captured.out)
    bound = float(doc["lower_bound"]["mse"])
    assert doc["lower_bound_applies_to"]
    for row in doc["strategies"]:
        assert row["strategy"] in doc["lower_bound_applies_to"]
        assert row["mse"] >= bound, (row, bound)
        assert row["mse"] == row["noise_mse"] + row["rounding_mse"]
        assert row["ratio"] < 1e9, row


def test_integer_strategies_are_compared_with_the_bound_honestly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """naive-int beats the real-valued bound on whole-number counts: the line says so and
    compares the bound with the best real-valued strategy instead."""
    assert main(["plan", "--p", "0.5", "--horizon", "63", "--epsilon", "10",
                 "--integer-counts"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("lower bound"))
    assert "best real-valued strategy (tree) is 1.1" in line
    assert "naive-int adds noise on the integer grid" in out


def test_release_stderr_carries_the_grid_rounding_at_a_huge_budget() -> None:
    from stream_dp.budget import PureDP
    from stream_dp.counters import CounterBank
    from stream_dp.figures import rounding_bias
    from stream_dp.planner import make_mechanism

    mech = make_mechanism("naive", 0.999, 63, PureDP(1e6))
    bank = CounterBank(mech, ["a"], bytes.fromhex(GOOD_KEY))
    bank.step([3.3])
    bias = rounding_bias(mech, 63)
    assert bank.stderr >= bias > 0
    assert bank.stderr == pytest.approx(math.sqrt(mech.variance(1) + bias**2))
    # an ordinary budget: the rounding is negligible and the stderr is the noise's exactly
    calm = CounterBank(make_mechanism("naive", 0.9, 63, PureDP(1.0)), ["a"], bytes(32) + b"x")
    calm.step([3.0])
    assert calm.stderr == math.sqrt(calm.mechanism.variance(1))


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["demo", "--epsilon", "1e-300"], ("--epsilon",)),
        (["demo", "--epsilon", "1e9"], ("--epsilon", "1e+06")),
        (["demo", "--strategy", "nope"], ("--strategy", "auto")),
        (["demo", "--strategy", "sqrt"], ("sqrt",)),
        (["demo", "--p", "1.5"], ("--p", "(0, 1]")),
        (["demo", "--tick-seconds", "inf"], ("--tick-seconds",)),
        (["replay", "log.csv", "--speed", "0"], ("--speed",)),
        (["replay", "log.csv", "--chunk", "0"], ("--chunk",)),
        (["replay", "log.csv", "--retime", "soon"], ("--retime",)),
        (["simulate", "restaurant", "--ticks", "0", "--out", "x.csv"], ("--ticks", "[1,")),
        (["simulate", "census", "--attributes", "99", "--out", "x.csv"], ("--attributes",)),
        (["simulate", "nettrace", "--speed", "0", "--to-topic"], ("--speed",)),
        (["tail", "--from-tick", "-1"], ("--from-tick",)),
        (["broker", "start", "--port", "70000"], ("--port",)),
        (["topics", "create", "--partitions", "0"], ("partitions",)),
    ],
)
def test_commands_refuse_before_connecting(
    argv: list[str], names: tuple[str, ...], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "log.csv").write_text("key,ts,value\na,1,1\n", encoding="utf-8")
    rc, err = _run(argv, capsys)
    _assert_one_line_error(rc, err, *names)


#: a recent origin (a far-away one is refused for its backlog), a good key
WORKER_ENV = {"STREAM_DP_ORIGIN": str(float(int(time.time()) // 60 * 60)), "STREAM_DP_KEY": GOOD_KEY}
USER_ENV = {"STREAM_DP_PRIVACY_UNIT": "user", "STREAM_DP_USER_PERIOD_TICKS": "60",
            "STREAM_DP_USER_MAX_EVENTS": "5"}


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"STREAM_DP_EPSILON": "1e-300"}, ("epsilon",)),
        ({"STREAM_DP_EPSILON": "1e-12"}, ("epsilon",)),
        ({"STREAM_DP_EPSILON": "1e12"}, ("epsilon", "1e+06")),
        ({"STREAM_DP_CAP": "1e300", "STREAM_DP_MAX_EVENT_VALUE": "1e301"}, ("cap",)),
        ({"STREAM_DP_HORIZON": str(2**40)}, ("horizon",)),
        ({"STREAM_DP_STRATEGY": "tree", "STREAM_DP_P": "1",
          "STREAM_DP_HORIZON": str(2**31 - 1)}, ("horizon",)),
        ({"STREAM_DP_HORIZON": str(2**24 - 1), "STREAM_DP_MAX_MEMORY_MB": "64"},
         ("max_memory_mb", "MiB")),
        (dict(USER_ENV, STREAM_DP_USER_EXPECTED_PEOPLE=str(10**8),
              STREAM_DP_MAX_MEMORY_MB="4096"), ("user_expected_people", "MiB")),
        # 10^6 people: 610 MiB on the compact table fit 1024 MiB, 1282 on the pure path's do not
        (dict(USER_ENV, STREAM_DP_USER_MAX_STREAMS="2", STREAM_DP_MAX_MEMORY_MB="1024"),
         ("user_expected_people", "1344 bytes a person")),
        ({"STREAM_DP_KEY": "6b" * 32}, ("low entropy", "token_hex")),
        ({"STREAM_DP_KEY": "0123456789abcdef"}, ("at least 32 bytes",)),
        ({"STREAM_DP_APP_ID": "a\udcff"}, ("app_id", "UTF-8")),
        ({"STREAM_DP_DOMAIN_FILE": "missing.toml"}, ("domain_file",)),
    ],
)
def test_worker_refuses_at_start_up(
    env: dict[str, str], names: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("STREAM_DP_DOMAIN_FILE", str(root / "examples" / "domain.toml"))
    for k, v in {**WORKER_ENV, **env}.items():
        monkeypatch.setenv(k, v)  # a surrogate is how Python shows an undecodable env byte
    rc, err = _run(["worker", "--no-web"], capsys)
    line = _assert_one_line_error(rc, err, *names)
    assert GOOD_KEY not in line and "6b6b6b" not in line


def test_memory_estimate_bounds_a_real_build() -> None:
    """The estimate is an upper bound of what building a bank really allocates."""
    import tracemalloc

    from stream_dp.budget import ZCDP, PureDP
    from stream_dp.counters import CounterBank
    from stream_dp.limits import estimate_memory
    from stream_dp.planner import make_mechanism

    for strategy, privacy, horizon in (
        ("dm", PureDP(1.0), 2**16 - 1), ("tree", PureDP(1.0), 2**16 - 1),
        ("naive", PureDP(1.0), 2**16 - 1), ("tree-ls", PureDP(1.0), 2**12 - 1),
        ("blt", ZCDP(0.5), 2**12 - 1),
    ):
        tracemalloc.start()
        mech = make_mechanism(strategy, 1.0, horizon, privacy)
        bank = CounterBank(mech, [f"s{i}" for i in range(1000)], bytes.fromhex(GOOD_KEY))
        bank.step([1.0] * 1000)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert estimate_memory(strategy, horizon, 1000, privacy.model).total_bytes >= peak, strategy


@pytest.mark.parametrize("leaf_bound", [False, True])
def test_people_reserve_bounds_a_real_table_through_a_period_close(
    leaf_bound: bool, tmp_path: Path
) -> None:
    """The bytes reserved per expected person bound what a user-level table of 10^5 people
    really allocates, at its peak: all counted, one commit's changelog of all, then a period's
    close tombstoning all (on the compact table and, with a leaf bound, the pure path's)."""
    import tracemalloc

    from agents.config.memory import people_bytes
    from agents.config.settings import Settings
    from agents.ingest.users import UserState
    from stream_dp.user_level import Bounder

    n = 100_000
    s = Settings(origin=1_700_000_000.0, events_partitions=1, privacy_unit="user",
                 user_period_ticks=10,
                 user_max_events=5, user_max_streams=2 if leaf_bound else 0,
                 user_expected_people=n)
    tracemalloc.start()
    state = UserState(s, 0, bytes.fromhex(GOOD_KEY))
    state.changelog = True
    for i in range(n):
        state.decide_obj({"key": "a", "ts": 0.0, "user": f"u{i:09d}"}, 1, 0)
    assert len(state.take_changes()) == n
    state.closed_before(25)
    assert len(state.take_changes()) == n
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    compact = type(state.bounder) is not Bounder
    assert compact is not leaf_bound
    assert people_bytes(s, compact) >= peak
    assert people_bytes(s, compact) <= 3 * peak  # a reserve, not a guess far off


def test_people_reserve_refuses_exactly_what_does_not_fit() -> None:
    """Streams plus people at 640 bytes each (compact table): 10^6 fit 1024 MiB and 1.8·10^6
    do not; event level reserves nothing for people whatever the setting says."""
    from agents.config.memory import check_memory
    from agents.config.settings import Settings

    base = {"origin": 1_700_000_000.0, "max_memory_mb": 1024}
    user = {**base, "privacy_unit": "user", "user_period_ticks": 10, "user_max_events": 5}
    check_memory(Settings(**user, user_expected_people=10**6), 100)
    with pytest.raises(ValueError, match="user_expected_people"):
        check_memory(Settings(**user, user_expected_people=1_800_000), 100)
    check_memory(Settings(**base, user_expected_people=10**9), 100)
    check_memory(Settings(**user, user_expected_people=0), 100)


def test_worker_console_script_returns_at_once_on_a_closed_port(tmp_path: Path) -> None:
    """The real console script, a closed bootstrap port: refused in seconds, exit 2, one line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    env.update(WORKER_ENV, STREAM_DP_BOOTSTRAP=CLOSED, STREAM_DP_EPSILON="1e-300")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "agents.cli", "worker", "--no-web"],
                          capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert time.monotonic() - start < 30
    _assert_one_line_error(proc.returncode, proc.stderr, "epsilon")
