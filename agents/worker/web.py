"""The worker's HTTP server: health, readiness, Prometheus metrics and the live dashboard.

Routes:

* ``GET /healthz`` — 200 ``{"status": "ok"}`` while the process's event loop answers (liveness).
* ``GET /readyz`` — 200 ``{"ready": true}`` once state is restored for every assigned partition
  and no rebalance is in progress; 503 ``{"ready": false}`` otherwise (readiness).
* ``GET /metrics`` — the worker's :class:`~agents.telemetry.metrics.Metrics` in the Prometheus text format.
* ``/dashboard/`` — the live dashboard sub-application, mounted when ``agents.dashboard`` provides
  ``make_dashboard_app(settings)``; ``GET /`` then redirects there.

The server binds to ``127.0.0.1`` unless configured otherwise (DESIGN.md §4).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Final, Protocol

from aiohttp import web

from agents.telemetry.metrics import Metrics

log = logging.getLogger("agents.web")



class ReadyProbe(Protocol):
    """``/readyz``'s source: True once state is restored and no rebalance is in progress."""

    def __call__(self) -> bool: ...


#: Application keys (aiohttp's typed app storage).
METRICS_KEY: Final = web.AppKey("metrics", Metrics)
READY_KEY: Final = web.AppKey("ready", ReadyProbe)

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 6066


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    ready_fn = request.app[READY_KEY]
    try:
        ready = bool(ready_fn())
    except Exception:  # a failing probe means "not ready", never a 500
        log.exception("readiness probe failed")
        ready = False
    metrics = request.app[METRICS_KEY]
    metrics.set_ready(ready)
    return web.json_response({"ready": ready}, status=200 if ready else 503)


async def _metrics(request: web.Request) -> web.Response:
    metrics = request.app[METRICS_KEY]
    body = metrics.exposition()
    resp = web.Response(body=body)
    resp.content_type = "text/plain"
    resp.charset = "utf-8"
    resp.headers["Content-Type"] = metrics.CONTENT_TYPE
    return resp


async def _root(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/dashboard/")


def load_dashboard(settings: Any, domain: Any = None) -> web.Application | None:
    """The dashboard sub-application, or ``None`` when ``agents.dashboard`` is absent.

    A dashboard that fails to load is logged and skipped: health, readiness and metrics (what
    orchestrators and alerts rely on) must not depend on it.
    """
    try:
        module = importlib.import_module("agents.dashboard")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("agents.dashboard"):
            log.info("dashboard not installed; serving health and metrics only")
            return None
        log.exception("dashboard cannot be imported; serving health and metrics only")
        return None
    factory = getattr(module, "make_dashboard_app", None)
    if factory is None:
        log.warning("agents.dashboard has no make_dashboard_app; dashboard not mounted")
        return None
    try:
        app = factory(settings) if domain is None else factory(settings, domain=domain)
    except Exception:
        log.exception("dashboard failed to start; serving health and metrics only")
        return None
    if not isinstance(app, web.Application):
        log.error("agents.dashboard.make_dashboard_app did not return an aiohttp Application")
        return None
    return app


def make_app(
    metrics: Metrics,
    ready: ReadyProbe,
    *,
    settings: Any = None,
    dashboard: bool = True,
    domain: Any = None,
) -> web.Application:
    """The aiohttp application; the dashboard is mounted at ``/dashboard/`` when available
    (``domain``: the loaded domain, for the budget per event its charts show)."""
    app = web.Application()
    app[METRICS_KEY] = metrics
    app[READY_KEY] = ready
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    sub = load_dashboard(settings, domain) if dashboard else None
    if sub is not None:
        app.add_subapp("/dashboard/", sub)
        app.router.add_get("/", _root)
    return app


class WebServer:
    """Runs an application on ``host:port`` (port 0 picks a free port; see :attr:`port`)."""

    def __init__(self, app: web.Application, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT):
        if not 0 <= int(port) <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {port!r}")
        self.app = app
        self.host = host
        self.port = int(port)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> WebServer:
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        await site.start()
        self._runner = runner
        if self.port == 0:
            server = site._server
            sockets = getattr(server, "sockets", None) or []
            if sockets:
                self.port = int(sockets[0].getsockname()[1])
        log.info("web server listening", extra={"url": self.url})
        return self

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> WebServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
