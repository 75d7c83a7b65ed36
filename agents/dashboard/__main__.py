"""Run the dashboard alone: ``python -m agents.dashboard [--bootstrap B] [--port 8080]``.

Useful on a laptop next to a remote cluster: it only reads the user-facing output topics.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from aiohttp import web

from agents.commands._client import bootstrap_from, default_topic
from agents.dashboard.app import DEFAULT_HISTORY, DashboardConfig, make_dashboard_app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.dashboard", description=__doc__)
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default $STREAM_DP_BOOTSTRAP)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    parser.add_argument("--history", type=int, default=DEFAULT_HISTORY, help="ticks kept per stream")
    args = parser.parse_args(argv)
    config = DashboardConfig(
        bootstrap=bootstrap_from(args.bootstrap),
        counts_topic=default_topic("counts"),
        histograms_topic=default_topic("histograms"),
        history=args.history,
    )

    async def serve() -> None:
        # the same layout as a worker's web server: /dashboard/, with / redirecting there
        root = web.Application()

        async def to_dashboard(request: web.Request) -> web.StreamResponse:
            raise web.HTTPFound("/dashboard/")

        root.router.add_get("/", to_dashboard)
        root.add_subapp("/dashboard/", make_dashboard_app(config=config))
        runner = web.AppRunner(root, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        print(f"dashboard on http://{args.host}:{args.port}/dashboard/ (Ctrl-C to stop)",
              flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
