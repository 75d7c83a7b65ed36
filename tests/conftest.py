"""Shared fixtures: a real Kafka-protocol broker (noida-db) started by the tests themselves."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from hypothesis import settings

# Property tests check behaviour, not speed: on a shared 2-core CI machine a single example can
# take longer than hypothesis' default 200 ms deadline while a broker test runs beside it.
settings.register_profile("stream-dp", deadline=None)
settings.load_profile("stream-dp")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stress", type=int, default=0, metavar="N",
        help="stress mode: run every test marked 'crash' or 'stress' N times (tests marked "
             "'stress' run only in this mode); keep the logs of failures with --basetemp DIR")


#: Opt-out of the check below, for platforms without a C compiler (docs: README, "Development")
ALLOW_PURE_ENV = "STREAM_DP_TEST_ALLOW_PURE"


def pytest_configure(config: pytest.Config) -> None:
    """Take Ctrl-C back if the run inherited it ignored: a background job of a non-interactive
    shell (``./scripts/test &`` in a script) starts with SIGINT ignored, every process it starts
    inherits that, and the tests that press Ctrl-C on a real ``stream-dp`` would see it do
    nothing (four failed so). A handler, unlike an ignored signal, is not inherited across exec:
    the children then start with the default and install Python's own."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Fail the run when a compiled path (the ingest loop, the library's noise kernels) is
    missing: ``pip install`` goes on without them (they are optional) and the tests comparing
    them with the pure path would only be skipped, so a build broken by a compiler or a Python
    version would pass unnoticed (issues 38 and 35)."""
    if os.environ.get(ALLOW_PURE_ENV, "") not in ("", "0"):
        return
    from agents.ingest.records import FAST_PATH_STATUS, _fastingest
    from stream_dp.noise import _fast

    for status, missing in ((FAST_PATH_STATUS, _fastingest is None),
                            (_fast.FAST_PATH_STATUS, _fast.kernels is None)):
        if missing:
            raise pytest.UsageError(
                f"{status}; the compiled-vs-pure tests need it: rebuild with "
                f"`pip install -v -e .` to see the compiler's error, or set {ALLOW_PURE_ENV}=1 "
                "where no C compiler is expected")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    rounds = int(metafunc.config.getoption("stress") or 0)
    definition = metafunc.definition
    if rounds and (definition.get_closest_marker("crash") or definition.get_closest_marker(
            "stress")):
        metafunc.fixturenames.append("stress_round")
        metafunc.parametrize("stress_round", range(rounds), ids=lambda i: f"round{i}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("stress"):
        return
    skip = pytest.mark.skip(reason="stress test: run with --stress N")
    for item in items:
        if item.get_closest_marker("stress"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[str]:
    """Bootstrap address of an embedded broker shared by the whole test session.

    Tests must use their own uniquely named topics / consumer groups (see ``unique_name``).
    The tests' own ``read_committed`` readers read as the service's do: past the stale aborted
    transactions this broker lists (:mod:`agents.kafka.aborted_transactions`).
    """
    from agents.kafka.aborted_transactions import install
    from agents.kafka.embedded_broker import EmbeddedBroker

    install()

    with EmbeddedBroker() as broker:
        yield broker.bootstrap


@pytest.fixture()
def unique_name(request: pytest.FixtureRequest) -> str:
    """A topic/group-safe name unique to this test."""
    import re
    import uuid

    base = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name)[:40]
    return f"t-{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def _own_replay_history(tmp_path_factory: pytest.TempPathFactory,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own ``stream-dp replay`` history (children inherit the variable):
    tests reuse a few noise keys on many logs, and nothing is written into the user's home."""
    path = tmp_path_factory.mktemp("replay-history") / "replay-history.json"
    monkeypatch.setenv("STREAM_DP_REPLAY_HISTORY", str(path))
