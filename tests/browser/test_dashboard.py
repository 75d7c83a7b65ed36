"""The live dashboard in real headless Chromium, fed with new ticks through the real broker.

Chromium is Debian's (/usr/bin/chromium, installed by scripts/test), driven by playwright-python
without `playwright install`. Two tests: the dashboard served by a running `stream-dp worker`
(events replayed from a simulated log; screenshot test-artifacts/dashboard.png), and the
standalone dashboard fed contract-shaped messages (test-artifacts/dashboard-contract.png).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

LEAVES = ["www/home", "www/news", "www/shop", "api/v1", "api/v2"]
NODES = ["all", "www", "api", *LEAVES]
P, EPS, ORIGIN, TICK_S = 0.9, 1.0, 1_704_067_200.0, 60.0


@contextlib.asynccontextmanager
async def _dashboard_page(url: str, *, wait_connected: bool) -> AsyncIterator[tuple[Any, list[str]]]:
    """Headless Debian Chromium (empty profile) on ``url``; yields the page and its JS errors."""
    from playwright.async_api import async_playwright

    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        async with async_playwright() as pw:
            # an empty --user-data-dir, passed the way playwright requires
            browser = await pw.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                viewport={"width": 1400, "height": 900},
            )
            try:
                page = await browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                await page.goto(url)
                if wait_connected:
                    await page.wait_for_function(
                        "document.getElementById('status').textContent.includes('connected')"
                        " || document.getElementById('status').dataset.state === 'live'"
                    )
                else:
                    await page.wait_for_selector("#status")
                yield page, errors
            finally:
                await browser.close()


def _counts_message(stream: str, tick: int, value: float, stderr: float) -> dict[str, Any]:
    return {
        "stream": stream, "tick": tick, "tick_start": ORIGIN + (tick - 1) * TICK_S,
        "tick_end": ORIGIN + tick * TICK_S, "value": value, "stderr": stderr,
        "strategy": "naive", "p": P, "privacy": {"model": "pure", "epsilon": EPS}, "cap": 1.0,
        "horizon": 4095, "schema": "dp.counts.v1",
    }


class FakeRelease:
    """Contract-shaped releases of a small hierarchy (deterministic values, not DP output)."""

    def __init__(self) -> None:
        self.s = {n: 0.0 for n in LEAVES}

    def tick(self, t: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        stderr = math.sqrt(2 / (EPS**2 * (1 - P**2)))
        for i, leaf in enumerate(LEAVES):
            arrivals = 5 + 4 * math.sin(t / 3 + i) + (12 if i == 1 and 8 <= t <= 12 else 0)
            self.s[leaf] = P * self.s[leaf] + arrivals
        true = dict(self.s)
        true["www"] = sum(v for k, v in self.s.items() if k.startswith("www/"))
        true["api"] = sum(v for k, v in self.s.items() if k.startswith("api/"))
        true["all"] = true["www"] + true["api"]
        noisy = {n: true[n] + 3 * math.sin(7 * t + 13 * j) for j, n in enumerate(NODES)}
        counts = [_counts_message(n, t, noisy[n], stderr) for n in NODES]
        hist = {
            "tick": t, "tick_end": ORIGIN + t * TICK_S, "consistent": True,
            "nodes": [{"stream": n, "value": true[n], "noisy": noisy[n], "stderr": stderr}
                      for n in NODES],
            "diagnostics": {"iterations": 1, "residual": 0.0, "seconds": 0.0004},
            "schema": "dp.histograms.v1",
        }
        return counts, hist


async def _create_topics(bootstrap: str, names: list[str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, 2, 1) for n in names])
    finally:
        await admin.close()


@pytest.fixture()
async def dashboard(kafka_broker: str, unique_name: str) -> AsyncIterator[tuple[str, str, str]]:
    """A standalone dashboard on a free port; yields (url, counts topic, histograms topic)."""
    from aiohttp import ClientSession, web

    from agents.dashboard.app import DashboardConfig, make_dashboard_app
    from agents.kafka.embedded_broker import free_port

    counts, hists = f"{unique_name}-counts", f"{unique_name}-hist"
    await _create_topics(kafka_broker, [counts, hists])
    failed: list[str] = []

    @web.middleware
    async def record_failures(request: web.Request, handler: Any) -> web.StreamResponse:
        # every request a browser makes must answer: Chromium asks the origin for
        # /favicon.ico unless the page declares an icon (a 404 on every load: issue 32)
        try:
            resp: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:
            if exc.status >= 400:
                failed.append(f"{exc.status} {request.path}")
            raise
        if resp.status >= 400:
            failed.append(f"{resp.status} {request.path}")
        return resp

    # mounted as a worker mounts it: under /dashboard/ of an app that owns the origin's root
    root = web.Application(middlewares=[record_failures])
    root.add_subapp("/dashboard/", make_dashboard_app(
        config=DashboardConfig(kafka_broker, counts, hists)))
    runner = web.AppRunner(root, handle_signals=False)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}/dashboard/"
    try:
        async with ClientSession() as http:
            for _ in range(200):  # until the consumer sits at the topics' ends
                async with http.get(url + "api/snapshot") as resp:
                    if (await resp.json())["status"]["connected"]:
                        break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("dashboard consumer never connected")
        yield url, counts, hists
    finally:
        await runner.cleanup()
    assert failed == [], failed


async def _publish(bootstrap: str, counts_topic: str, hist_topic: str, fake: FakeRelease,
                   ticks: range) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for t in ticks:
            counts, hist = fake.tick(t)
            for m in counts:
                await producer.send(counts_topic, json.dumps(m).encode(), key=m["stream"].encode())
            await producer.send_and_wait(hist_topic, json.dumps(hist).encode(), key=b"web")
    finally:
        await producer.stop()


async def test_dashboard_chart_updates_with_new_ticks(
    dashboard: tuple[str, str, str], kafka_broker: str
) -> None:
    url, counts_topic, hist_topic = dashboard
    fake = FakeRelease()
    ARTIFACTS.mkdir(exist_ok=True)
    async with _dashboard_page(url, wait_connected=True) as (page, errors):
        await _publish(kafka_broker, counts_topic, hist_topic, fake, range(1, 6))
        chart = page.locator('.chart[data-stream="all"]')
        await page.wait_for_function(
            "document.querySelector('.chart[data-stream=\"all\"]')?.dataset.lastTick === '5'"
        )
        assert await chart.get_attribute("data-points") == "5"
        path_before = await chart.locator("path.line").get_attribute("d")
        band_before = await chart.locator("polygon.band").get_attribute("points")

        await _publish(kafka_broker, counts_topic, hist_topic, fake, range(6, 21))
        await page.wait_for_function(
            "document.querySelector('.chart[data-stream=\"all\"]')?.dataset.lastTick === '20'"
        )
        assert await chart.get_attribute("data-points") == "20"
        path_after = await chart.locator("path.line").get_attribute("d")
        assert path_after != path_before
        assert path_after is not None and path_after.count("L") == 19  # one vertex per tick
        band_after = await chart.locator("polygon.band").get_attribute("points")
        assert band_after is not None and band_before is not None
        assert len(band_after.split()) == 40  # ±stderr band: 20 upper + 20 lower vertices
        latest = await chart.locator(".latest").inner_text()
        assert "tick 20" in latest
        # no domain known: the records' budget, labelled as what it is (per stream)
        assert latest.endswith(f"ε={EPS:g} per stream"), latest

        await page.wait_for_function(
            "document.getElementById('histogram').dataset.tick === '20'"
        )
        rows = page.locator("#histogram .hist-row")
        assert await rows.count() == len(NODES)
        assert "consistent" in await page.locator("#hist-meta").inner_text()
        # four default charts (shortest names first), each with 20 points
        assert await page.locator(".chart").count() == 4
        await page.screenshot(path=str(ARTIFACTS / "dashboard-contract.png"), full_page=True)
        assert errors == []
    assert (ARTIFACTS / "dashboard-contract.png").stat().st_size > 10_000


async def test_worker_serves_the_dashboard_and_it_follows_replayed_ticks(
    kafka_broker: str, unique_name: str, tmp_path: Path
) -> None:
    """simulate -> replay (paced) -> `stream-dp worker` -> its /dashboard/ in Chromium."""
    import os
    import signal
    import subprocess
    import sys

    from aiohttp import ClientSession

    from agents.config.domain import load_domain
    from agents.config.settings import Settings
    from agents.kafka.embedded_broker import free_port
    from agents.kafka.topics import ensure_topics
    from tests.integration.pipeline_support import settings_env

    log = tmp_path / "web.csv"
    sim = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agents.cli", "simulate", "searchlogs", "--seed", "3",
        "--ticks", "20", "--tick-seconds", "2", "--rate", "30", "--out", str(log),
        "--domain-out", str(tmp_path / "domain.toml"),
        "--settings-out", str(tmp_path / "stream-dp.toml"), cwd=ROOT)
    assert await sim.wait() == 0
    (tmp_path / "key").write_text("5a1e8c3f72b94d06e15a7c2f9b30d48e6c1f7a92b3d05e84c6a1f27b9e30d5c8")
    (tmp_path / "key").chmod(0o600)  # key files open to group or others are refused
    n = unique_name
    s = Settings.load(tmp_path / "stream-dp.toml", env={}).replace(
        bootstrap=kafka_broker, app_id=n, worker_id="w0", events_topic=f"{n}.events",
        counts_topic=f"{n}.counts", histograms_topic=f"{n}.histograms", dlq_topic=f"{n}.dlq",
        partials_topic=f"{n}.partials", ingest_checkpoints_topic=f"{n}.ckpt.ingest",
        release_checkpoints_topic=f"{n}.ckpt.release", events_partitions=2, shards=2,
        counts_partitions=2, key_file=str(tmp_path / "key"), strategy="naive", horizon=255,
        allowed_lateness_s=0.5, max_future_skew_s=1e9, schedule_topic=f"{n}.schedule",
        leader_topic=f"{n}.leader",
        session_timeout_s=6.0, transaction_timeout_s=10.0, commit_interval_s=0.5,
        web_host="127.0.0.1", web_port=free_port(),
    )
    await ensure_topics(kafka_broker, s)
    worker_log = open(tmp_path / "worker.log", "ab")  # noqa: SIM115 - owned by the child
    worker = subprocess.Popen([sys.executable, "-m", "agents.cli", "worker"],
                              env=settings_env(s), cwd=ROOT, stdout=worker_log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    worker_log.close()
    url = f"http://127.0.0.1:{s.web_port}/dashboard/"
    replay: asyncio.subprocess.Process | None = None
    try:
        async with ClientSession() as http:
            for _ in range(300):
                try:
                    async with http.get(url + "api/snapshot") as resp:
                        if resp.status == 200 and (await resp.json())["status"]["connected"]:
                            break
                except OSError:
                    pass
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
                await asyncio.sleep(0.2)
            else:
                pytest.fail("the worker's dashboard never connected to the topics")
        async with _dashboard_page(url, wait_connected=False) as (page, errors):
            # 20 ticks of 2 s at speed 4: about 10 s of releases arriving tick by tick
            replay = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agents.cli", "replay", str(log),
                "--bootstrap", kafka_broker, "--topic", s.events_topic, "--speed", "4",
                "--no-progress", "--key-file", str(tmp_path / "key"), "--marker-every", "2",
                "--until", str(1704067200 + 2 * 20 - 1),  # in tick 20: the log's public end
                cwd=ROOT, stdout=asyncio.subprocess.DEVNULL)
            last = "document.querySelector('.chart[data-stream=\"all\"]')?.dataset.lastTick"
            await page.wait_for_function(f"Number({last}) >= 3", timeout=120_000)
            chart = page.locator('.chart[data-stream="all"]')
            first_tick = int(await chart.get_attribute("data-last-tick") or 0)
            first_path = await chart.locator("path.line").get_attribute("d")
            await page.wait_for_function(f"Number({last}) >= {first_tick + 5}",
                                         timeout=120_000)
            assert await chart.locator("path.line").get_attribute("d") != first_path
            # the budget per event, not only the per-stream ε (issue 32 item 7)
            h = load_domain(tmp_path / "domain.toml").touches
            assert h > 1
            latest = await chart.locator(".latest").inner_text()
            assert latest.endswith(f"ε={s.epsilon:g} per stream · ε={h * s.epsilon:g} per event"), latest
            points = int(await chart.get_attribute("data-points") or 0)
            assert points >= 6
            await page.wait_for_function(
                "Number(document.getElementById('histogram').dataset.tick) >= 1",
                timeout=120_000)
            assert await page.locator("#histogram .hist-row").count() >= 10
            await page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
            assert errors == []
        assert replay is not None and await replay.wait() == 0
        # a markers replay of a 2024 log: latency from each tick's close, not from its end in
        # 2024 (10^8 s; issue 32 item 10)
        async with ClientSession() as http, http.get(
                f"http://127.0.0.1:{s.web_port}/metrics") as resp:
            metrics = await resp.text()
        count = float(re.search(r"^stream_dp_tick_latency_seconds_count (\S+)$", metrics,
                                re.M).group(1))  # type: ignore[union-attr]
        total = float(re.search(r"^stream_dp_tick_latency_seconds_sum (\S+)$", metrics,
                                re.M).group(1))  # type: ignore[union-attr]
        assert count > 0 and total / count < 60, (count, total)
    finally:
        if replay is not None and replay.returncode is None:
            replay.kill()
            await replay.wait()
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(10)
    assert worker.returncode == 0


async def test_grid_histogram_shows_marginals_and_cell_table(
    dashboard: tuple[str, str, str], kafka_broker: str
) -> None:
    """A census-like grid (paper 002): total, per-attribute marginals, a cell table."""
    from aiokafka import AIOKafkaProducer

    url, counts_topic, hist_topic = dashboard
    attrs = {"age": ["young", "old"], "tenure": ["own", "rent", "free"]}
    cells = {f"age={a}|tenure={t}": 1.0 + i + 2 * j
             for i, a in enumerate(attrs["age"]) for j, t in enumerate(attrs["tenure"])}
    nodes = {"total": sum(cells.values())}
    for attr, cats in attrs.items():
        for c in cats:
            nodes[f"{attr}={c}"] = sum(v for k, v in cells.items() if f"{attr}={c}" in k.split("|"))
    nodes.update(cells)
    hist = {"tick": 7, "tick_end": ORIGIN + 7 * TICK_S, "consistent": True,
            "nodes": [{"stream": k, "value": v, "noisy": v + 0.3, "stderr": 1.0}
                      for k, v in nodes.items()],
            "diagnostics": {"iterations": 1, "residual": 0.0, "seconds": 0.001},
            "schema": "dp.histograms.v1"}
    async with _dashboard_page(url, wait_connected=True) as (page, errors):
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(hist_topic, json.dumps(hist).encode(), key=b"c")
            for k, v in nodes.items():
                m = _counts_message(k, 7, v, 1.0)
                await producer.send_and_wait(counts_topic, json.dumps(m).encode())
        finally:
            await producer.stop()
        await page.wait_for_function(
            "document.getElementById('histogram').dataset.tick === '7'"
        )
        assert await page.locator("#histogram .attr").count() == 2
        assert await page.locator('#histogram .hist-row[data-node="tenure=free"]').count() == 1
        table = page.locator("#histogram .grid-table")
        assert await table.locator("tr").count() == 1 + len(attrs["age"])
        # the cell age=old, tenure=free: 1 + 1 + 2*2 = 6
        assert (await table.locator("tr").nth(2).locator("td").nth(2).inner_text()) == "6.00"
        await page.wait_for_selector('.chart[data-stream="total"]')
        await page.screenshot(path=str(ARTIFACTS / "dashboard-grid.png"), full_page=True)
        assert errors == []


async def test_attribute_domain_shows_clusters_and_tables(
    dashboard: tuple[str, str, str], kafka_broker: str, tmp_path: Path
) -> None:
    """A binary-attribute domain: dp.tables.v1 records (one chart series per table cell) and the
    reconciled dp.marginals.v1 (chosen clusters, bridges, every consistent table), all built by
    the service's own code from live releases of a small domain."""
    import numpy as np
    from aiokafka import AIOKafkaProducer

    from agents.config.domain import load_domain
    from agents.config.settings import Settings
    from agents.ingest.routing import Partial, Router
    from agents.reconcile.tables import TableTick, decode_table_record, marginals_message
    from agents.release.attributes import AttributeReleaseState, new_live

    url, counts_topic, hist_topic = dashboard
    names = ["milk", "bread", "eggs", "tea", "jam", "salt"]
    dom_file = tmp_path / "d.toml"
    dom_file.write_text('name = "basket"\nkind = "binary"\nattributes = ['
                        + ", ".join(json.dumps(n) for n in names) + "]\n", encoding="utf-8")
    s = Settings(origin=ORIGIN, tick_seconds=TICK_S, domain_file=str(dom_file),
                 events_partitions=1, shards=1, epsilon=5.0, p=P, attribute_epoch_ticks=4,
                 attribute_max_cluster=3)
    dom = load_domain(dom_file)
    key = b"dashboard-attributes-key-0123456"
    rel = AttributeReleaseState(s, Router(dom, 1), 0, new_live(s, dom, key), key=key)
    rng = np.random.default_rng(0)
    for t in range(1, 7):
        z = rng.random(80) < 0.5
        bits = np.where(z[:, None], rng.random((80, 6)) < 0.8, rng.random((80, 6)) < 0.1)
        pats, counts = np.unique((bits.astype(np.uint64) << np.arange(6, dtype=np.uint64)).sum(1),
                                 return_counts=True)
        rel.add(t, Partial(t, 0, 0, tuple(int(p) for p in pats), tuple(float(c) for c in counts),
                           0.0))
    releases = [rel.step() for _ in range(6)]
    records = [v for r in releases for _, v in r.messages(s, s.privacy.as_dict())]
    last = releases[-1]
    tick = TableTick(last.tick, last.tick_end,
                     tuple(decode_table_record(v) for _, v in last.messages(s, s.privacy.as_dict())))
    msg, _ = marginals_message(tick, dom.names, "basket")
    async with _dashboard_page(url, wait_connected=True) as (page, errors):
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker, acks="all")
        await producer.start()
        try:
            for v in records:
                await producer.send(counts_topic, v, key=b"basket/tables")
            await producer.send_and_wait(hist_topic, json.dumps(msg).encode(), key=b"basket")
        finally:
            await producer.stop()
        await page.wait_for_function("document.getElementById('histogram').dataset.tick === '6'")
        assert await page.locator("#histogram .attr-table").count() == len(msg["tables"])
        chips = page.locator("#histogram .cluster-chip")
        assert await chips.count() == len(msg["clusters"]) + len(msg["bridges"])
        first = msg["tables"][0]
        block = page.locator(f'#histogram .attr-table[data-attrs="{",".join(map(str, first["attributes"]))}"]')
        assert await block.locator(".hist-row").count() == len(first["cells"])
        label = ",".join(f"{n}=0" for n in first["names"])
        cell = block.locator(f'.hist-row[data-node="{label}"] .num')
        shown = await cell.inner_text()
        assert shown.replace("−", "-") in {f"{first['cells'][0]:.1f}", f"{first['cells'][0]:.2f}",
                                           f"{first['cells'][0]:.3f}"}
        assert "epoch" in await page.locator("#hist-meta").inner_text()
        # issue 32 item 8: the preselected charts are cells of the tables still released (not
        # an earlier epoch's), their names shown whole, and the status counts the messages
        epochs = {json.loads(v)["epoch"] for v in records}
        assert len(epochs) >= 2, epochs  # the tables changed at least once
        await page.wait_for_function("document.querySelectorAll('.chart').length > 0")
        charts = page.locator(".chart")
        for i in range(await charts.count()):
            assert await charts.nth(i).get_attribute("data-last-tick") == "6"
            title = charts.nth(i).locator(".title b")
            assert await title.evaluate("b => b.scrollWidth <= b.clientWidth"), (
                await title.inner_text())
        status = await page.locator("#status").inner_text()
        got = re.search(r"(\d+) messages", status)
        assert got and int(got.group(1)) >= len(records), status
        # opened after the releases (as a user opens the demo's URL): it said "0 messages"
        await page.reload()
        await page.wait_for_function("document.getElementById('histogram').dataset.tick === '6'")
        await page.wait_for_function(
            "/[1-9]\\d* messages/.test(document.getElementById('status').textContent)")
        status = await page.locator("#status").inner_text()
        got = re.search(r"(\d+) messages", status)
        assert got and int(got.group(1)) >= len(records), status
        # every table cell became a series named by its attribute values; tick one to chart it
        box = page.locator(f'#stream-list input[data-stream="{label}"]')
        await box.check()
        chart = page.locator(f'.chart[data-stream="{label}"]')
        await page.wait_for_function(
            f"document.querySelector('.chart[data-stream=\"{label}\"]')?.dataset.lastTick === '6'")
        ticks_with = sum(1 for v in records if json.loads(v)["names"] == first["names"])
        assert await chart.get_attribute("data-points") == str(ticks_with)
        await page.screenshot(path=str(ARTIFACTS / "dashboard-attributes.png"), full_page=True)
        assert errors == []
