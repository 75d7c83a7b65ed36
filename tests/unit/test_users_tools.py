"""Units of the users' tools without a broker: formatting, state files, fingerprints, dashboard."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
from collections import deque
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agents.commands._progress import ProgressBar
from agents.commands._replay_send import encode_event
from agents.commands._replay_state import ReplayState, key_fingerprint, log_digest, state_path
from agents.commands._tail_format import COUNTS_HEADER, format_count_row, format_histogram
from agents.commands.tail import _Printer
from agents.dashboard.app import STATE_KEY, DashboardConfig, make_dashboard_app
from agents.dashboard.state import DashboardState, StreamSeries
from simulators.logfile import Event


def _count(stream: str, tick: int, value: float = 1.5) -> dict[str, object]:
    return {"stream": stream, "tick": tick, "tick_start": 0.0, "tick_end": 60.0 * tick,
            "value": value, "stderr": 0.25, "strategy": "dmfda", "p": 0.95,
            "privacy": {"model": "zcdp", "rho": 0.125}, "cap": 1.0, "horizon": 4095,
            "schema": "dp.counts.v1"}


# ---------------------------------------------------------------------------------- tail
def test_count_row_lines_up_with_the_header() -> None:
    row = format_count_row(_count("a/very/long/stream/name/that/does/not/fit/in/thirty", 7))
    assert len(row.split("  ")[0]) == len(COUNTS_HEADER.split("  ")[0])
    assert "ρ=0.125" in row and "dmfda" in row and "1.500" in row and "0.250" in row
    assert "…" in row  # long names are cut from the left, keeping the leaf
    assert "1970-01-01 00:07:00" in row


def test_histogram_block_indents_by_depth_and_filters_by_prefix() -> None:
    msg = {"tick": 3, "tick_end": 180.0, "consistent": True,
           "nodes": [{"stream": s, "value": 1.0, "noisy": 2.0, "stderr": 0.5}
                     for s in ("all", "eu", "eu/fr", "us")],
           "diagnostics": {"iterations": 2, "residual": 1e-13, "seconds": 0.001}}
    text = format_histogram(msg).splitlines()
    assert "4 nodes, consistent, 2 iterations" in text[0]
    assert text[1].startswith("  all") and text[2].startswith("    eu") and text[3].startswith("      eu/fr")
    assert len(format_histogram(msg, "eu").splitlines()) == 3


def test_printer_filters_and_limits() -> None:
    args = argparse.Namespace(what="counts", prefix="b", json=True, from_tick=2, max_messages=2)
    out = io.StringIO()
    p = _Printer(args, out)
    for raw in [_count("a", 5), _count("b", 1), _count("b", 2), _count("bb", 3)]:
        p.show(json.dumps(raw).encode())
    p.show(b"not json")
    assert [json.loads(x)["tick"] for x in out.getvalue().splitlines()] == [2, 3]
    assert p.done


# ---------------------------------------------------------------------------------- replay
def test_state_file_round_trip_is_atomic_and_next_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "x.csv"
    log.write_text("ts,key\n1,a\n")
    path = state_path(log, None)
    assert path == tmp_path / "x.csv.replay.json"
    st = ReplayState(log=str(log), log_sha256=log_digest(log), topic="t", run_id="r",
                     records_acked=1, scan_from={"0": 5}, delivered=[3])
    st.save(path)
    assert ReplayState.load(path) == st
    assert not list(tmp_path.glob("*.tmp"))
    other = state_path(log, str(tmp_path / "s"))
    assert other.parent == tmp_path / "s" and other.name.startswith("x.csv-")


def test_key_fingerprint_is_stable_distinct_and_not_the_key() -> None:
    a, b = bytes(range(32)), bytes(range(1, 33))
    assert key_fingerprint(a) == key_fingerprint(a)
    assert key_fingerprint(a) != key_fingerprint(b)
    assert len(key_fingerprint(a)) == 64 and a.hex()[:16] not in key_fingerprint(a)


def test_event_encoding_is_the_contract_shape() -> None:
    assert json.loads(encode_event(Event("www/x", 1704067200.25, 2.0))) == {
        "key": "www/x", "ts": 1704067200.25, "value": 2.0}


def test_progress_bar_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    bar = ProgressBar(1000, stream=out)
    for i in range(0, 1001, 50):
        bar.advance_to(i, i // 10)
    bar.close()
    lines = out.getvalue().splitlines()
    assert 10 <= len(lines) <= 11 and "100.0%" in lines[-1] and "100 records" in lines[-1]
    assert "\r" not in out.getvalue()


# ---------------------------------------------------------------------------------- dashboard
def test_series_keeps_ticks_ordered_unique_and_bounded() -> None:
    s = StreamSeries({}, deque(maxlen=4))
    for t in (1, 2, 4, 3, 4, 5, 6, 0):
        s.add(t, [t, 0.0, float(t), 1.0])
    assert [p[0] for p in s.points] == [3, 4, 5, 6]


def test_state_ignores_malformed_counts_and_filters_snapshots() -> None:
    st = DashboardState(history=10)
    rows = st.add_counts([_count("a/x", 1), {"stream": "bad"}, _count("b", 1, 2.0)])
    assert [r[0] for r in rows] == ["a/x", "b"]
    snap = st.snapshot("a/")
    assert list(snap["streams"]) == ["a/x"]
    assert snap["streams"]["a/x"]["meta"]["privacy"] == {"model": "zcdp", "rho": 0.125}


def test_config_validates() -> None:
    with pytest.raises(ValueError, match="history"):
        DashboardConfig("127.0.0.1:1", history=0)
    with pytest.raises(ValueError, match="bootstrap"):
        DashboardConfig("")


async def test_page_assets_snapshot_and_server_sent_events() -> None:
    # an address where no broker listens: the consumer keeps retrying in the background
    app = make_dashboard_app(config=DashboardConfig("127.0.0.1:9", "c", "h"))
    async with TestClient(TestServer(app)) as client:
        page = await client.get("/")
        html = await page.text()
        assert page.status == 200 and 'src="static/app.js"' in html and "http" not in html.split(
            "<body>")[1].split("</footer>")[0]  # no external assets
        for asset in ("static/app.js", "static/style.css"):
            r = await client.get("/" + asset)
            assert r.status == 200 and len(await r.read()) > 1000
        state = app[STATE_KEY]
        state.add_counts([_count("x", 1)])
        snap = await (await client.get("/api/snapshot")).json()
        assert snap["streams"]["x"]["points"] == [[1, 60.0, 1.5, 0.25]]

        resp = await client.get("/events?prefix=x")
        assert resp.headers["Content-Type"].startswith("text/event-stream")

        async def next_event() -> tuple[str, object]:
            kind, data = "", ""
            while True:
                line = (await resp.content.readline()).decode().rstrip("\n")
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    data = line[6:]
                elif line == "" and kind:
                    return kind, json.loads(data)

        kind, snapshot = await asyncio.wait_for(next_event(), 5)
        assert kind == "snapshot" and list(snapshot["streams"]) == ["x"]  # type: ignore[index]
        state.broadcast("counts", state.add_counts([_count("y", 2), _count("x", 2, 9.0)]))
        kind, rows = await asyncio.wait_for(next_event(), 5)
        assert kind == "counts" and rows == [["x", 2, 120.0, 9.0, 0.25]]  # prefix filtered
        resp.close()


def test_memory_stays_bounded_with_many_streams() -> None:
    st = DashboardState(history=600, max_points=1000)
    for tick in range(1, 4):
        st.add_counts([_count(f"s{i}", tick) for i in range(2000)])
    total = sum(len(s.points) for s in st.series.values())
    assert total <= 2 * 2000  # at least 2 points per stream, never 600
    few = DashboardState(history=600, max_points=1000)
    for tick in range(1, 50):
        few.add_counts([_count(f"s{i}", tick) for i in range(10)])
    assert {len(s.points) for s in few.series.values()} == {49}  # 10 streams: full history
    assert few.per_stream_cap() == 100
