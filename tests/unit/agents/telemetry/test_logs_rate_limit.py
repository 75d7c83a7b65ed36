"""Repeated log lines are rate-limited (issue #24: a broker outage logged ~90 aiokafka lines a
second, a tick backlog 16,528 'dropping a tick without a histogram' lines in 20 s)."""

from __future__ import annotations

import io
import json
import logging

from agents.telemetry.logs import RateLimitFilter, make_handler


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _logger(name: str, handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


def _handler(clock: _Clock) -> tuple[logging.Handler, io.StringIO]:
    out = io.StringIO()
    handler = make_handler(out, json_lines=True, rate_limit=False)
    handler.filters.insert(0, RateLimitFilter(clock=clock))
    return handler, out


def _records(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_repeated_warning_prints_a_burst_then_one_line_per_interval_with_a_count() -> None:
    clock = _Clock()
    handler, out = _handler(clock)
    log = _logger("agents.test_rate", handler)
    for tick in range(10_000):  # one simulated second: a backlog warning per tick
        log.warning("dropping a tick without a histogram", extra={"tick": tick})
    got = _records(out)
    assert [r["tick"] for r in got] == [0, 1, 2]
    clock.now += 10.0
    log.warning("dropping a tick without a histogram", extra={"tick": 10_000})
    last = _records(out)[-1]
    assert last["tick"] == 10_000 and last["suppressed"] == 9_997


def test_info_lines_and_distinct_templates_are_not_limited() -> None:
    clock = _Clock()
    handler, out = _handler(clock)
    log = _logger("agents.test_rate_info", handler)
    for p in range(50):
        log.info("ingest partition %d restored", p)
    for i in range(5):
        log.warning(f"distinct problem {i}")
    assert len(_records(out)) == 55


def test_client_library_lines_share_one_budget_per_second() -> None:
    clock = _Clock()
    handler, out = _handler(clock)
    conn = _logger("aiokafka.conn", handler)
    coord = _logger("aiokafka.consumer.group_coordinator", handler)
    for second in range(15):  # a 15 s outage: 90 lines a second over several templates
        for i in range(30):
            conn.error("Unable connect to %r: %s", "127.0.0.1:9092", i)
            coord.error("Heartbeat failed for group %s: %s", "g", i)
            coord.warning("Marking the coordinator dead (node %s) for group %s.", 1, "g")
        clock.now += 1.0
        del second
    lines = _records(out)
    assert len(lines) <= 5 + 15  # burst + about one a second
    assert sum(int(r.get("suppressed", 0)) for r in lines) > 0
