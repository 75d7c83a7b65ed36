"""The worker's web server, over real HTTP on 127.0.0.1: health, readiness, metrics, dashboard."""

from __future__ import annotations

import sys
import types
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from agents.telemetry.metrics import Metrics
from agents.worker.web import WebServer, make_app


class Flag:
    def __init__(self) -> None:
        self.value = False

    def __call__(self) -> bool:
        return self.value


@pytest.fixture()
async def served() -> AsyncIterator[tuple[WebServer, Metrics, Flag]]:
    metrics, ready = Metrics(process=False), Flag()
    server = WebServer(make_app(metrics, ready, dashboard=False), "127.0.0.1", 0)
    await server.start()
    try:
        yield server, metrics, ready
    finally:
        await server.stop()


async def _get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as s, s.get(url, allow_redirects=False) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


async def test_binds_loopback_and_reports_real_port(
    served: tuple[WebServer, Metrics, Flag],
) -> None:
    server, _, _ = served
    assert server.host == "127.0.0.1" and server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"


async def test_healthz(served: tuple[WebServer, Metrics, Flag]) -> None:
    server, _, _ = served
    status, ctype, body = await _get(server.url + "/healthz")
    assert status == 200 and "json" in ctype and '"ok"' in body


async def test_readyz_follows_readiness_and_sets_gauge(
    served: tuple[WebServer, Metrics, Flag],
) -> None:
    server, _, ready = served
    status, _, body = await _get(server.url + "/readyz")
    assert status == 503 and "false" in body
    ready.value = True
    status, _, body = await _get(server.url + "/readyz")
    assert status == 200 and "true" in body
    _, _, text = await _get(server.url + "/metrics")
    assert "stream_dp_ready 1.0" in text


async def test_failing_probe_is_not_ready() -> None:
    def broken() -> bool:
        raise RuntimeError("recovery state unknown")

    async with WebServer(make_app(Metrics(process=False), broken, dashboard=False),
                         "127.0.0.1", 0) as server:
        status, _, _ = await _get(server.url + "/readyz")
    assert status == 503


async def test_metrics_exposition(served: tuple[WebServer, Metrics, Flag]) -> None:
    server, metrics, _ = served
    metrics.event_accepted(17)
    status, ctype, text = await _get(server.url + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert 'stream_dp_events_total{result="accepted"} 17.0' in text


async def test_no_dashboard_when_disabled(served: tuple[WebServer, Metrics, Flag]) -> None:
    server, _, _ = served
    status, _, _ = await _get(server.url + "/dashboard/")
    assert status == 404


async def test_dashboard_subapp_mounted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module providing ``make_dashboard_app(settings)`` is mounted at /dashboard/."""
    seen: list[object] = []

    def make_dashboard_app(settings: object) -> web.Application:
        seen.append(settings)
        sub = web.Application()

        async def index(request: web.Request) -> web.Response:
            return web.Response(text="dashboard index")

        sub.router.add_get("/", index)
        return sub

    module = types.ModuleType("agents.dashboard")
    module.make_dashboard_app = make_dashboard_app  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "agents.dashboard", module)
    settings = object()
    async with WebServer(make_app(Metrics(process=False), lambda: True, settings=settings),
                         "127.0.0.1", 0) as server:
        status, _, body = await _get(server.url + "/dashboard/")
        root_status, _, _ = await _get(server.url + "/")
    assert (status, body) == (200, "dashboard index")
    assert root_status == 302
    assert seen == [settings]


def test_port_validated() -> None:
    factory: Callable[[], bool] = lambda: True  # noqa: E731
    with pytest.raises(ValueError, match="port must be in"):
        WebServer(make_app(Metrics(process=False), factory, dashboard=False), "127.0.0.1", 70000)


async def test_broken_dashboard_is_skipped_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    def make_dashboard_app(settings: object) -> web.Application:
        raise RuntimeError("no broker configured")

    module = types.ModuleType("agents.dashboard")
    module.make_dashboard_app = make_dashboard_app  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "agents.dashboard", module)
    async with WebServer(make_app(Metrics(process=False), lambda: True), "127.0.0.1", 0) as server:
        assert (await _get(server.url + "/healthz"))[0] == 200
        assert (await _get(server.url + "/dashboard/"))[0] == 404
