"""Run the dashboard alone: ``python -m agents.dashboard [--bootstrap B] [--port 8080]``.

Useful on a laptop next to a remote cluster: it only reads the user-facing output topics. For a
large deployment it is also the way to keep the dashboard off the workers: run them with
``stream-dp worker --no-dashboard`` and this process beside them, with ``--compact-topic`` (the
deployment's ``compact_topic``: counts from the compact records, the first 20 000 streams
followed) and ``--compact-histograms`` (histograms from the chunk records; for
``histograms_json = 0``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal

from aiohttp import web

from agents.dashboard.app import DashboardConfig, budget_units, make_dashboard_app
from agents.dashboard.state import DEFAULT_HISTORY
from agents.kafka.clients import bootstrap_argument, bootstrap_from, default_topic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.dashboard", description=__doc__)
    parser.add_argument("--bootstrap", type=bootstrap_argument,
                        help="Kafka bootstrap servers (default $STREAM_DP_BOOTSTRAP)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    parser.add_argument("--history", type=int, default=DEFAULT_HISTORY, help="ticks kept per stream")
    parser.add_argument("--compact-topic", default=default_topic("compact"),
                        help="read counts from this compact topic (default "
                             "$STREAM_DP_COMPACT_TOPIC; empty: the per-stream JSON)")
    parser.add_argument("--shards", type=int, default=int(os.environ.get("STREAM_DP_SHARDS", "1")),
                        help="release shards of the deployment (default $STREAM_DP_SHARDS or 1)")
    parser.add_argument("--compact-histograms", action="store_true",
                        default=os.environ.get("STREAM_DP_HISTOGRAMS_JSON", "1") == "0",
                        help="read histograms from <compact-topic>.histograms (default: when "
                             "$STREAM_DP_HISTOGRAMS_JSON is 0)")
    parser.add_argument("--domain", default=os.environ.get("STREAM_DP_DOMAIN_FILE") or None,
                        metavar="FILE",
                        help="the deployment's domain file (default $STREAM_DP_DOMAIN_FILE): "
                             "charts then show the budget per event, not only per stream")
    args = parser.parse_args(argv)
    units: tuple[tuple[str, int], ...] = ()
    if args.domain:
        from agents.config.domain import load_domain

        try:
            domain = load_domain(args.domain)
        except ValueError as exc:
            parser.exit(2, f"{parser.prog}: error: {exc}\n")
        units = budget_units(domain)
    if args.compact_histograms and not args.compact_topic:
        parser.error("--compact-histograms needs --compact-topic")
    config = DashboardConfig(
        bootstrap=bootstrap_from(args.bootstrap),
        counts_topic=default_topic("counts"),
        histograms_topic=default_topic("histograms"),
        history=args.history,
        compact_topic=args.compact_topic,
        shards=max(1, args.shards),
        histogram_blocks_topic=(f"{args.compact_topic}.histograms" if args.compact_histograms
                                else ""),
        budget_units=units,
    )

    from agents.kafka.fetch_backoff import install_from_env

    install_from_env()

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
