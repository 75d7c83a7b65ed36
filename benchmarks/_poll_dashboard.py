"""Dashboard poller for the scale benchmark (a subprocess: its CPU is not the worker's).

Polls ``URL`` (the dashboard's ``/api/snapshot?prefix=…``) every ``INTERVAL`` seconds and prints
one JSON line per poll: ``{"t": unix seconds, "bytes": body size, "get_s": seconds of the GET,
"ticks": [count ticks seen], "histogram": tick of the histogram or null}``. Decoding the
snapshot here, not in the benchmark process, keeps the benchmark process's CPU the worker's own.

    python benchmarks/_poll_dashboard.py URL [INTERVAL]
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import ClientSession


async def main(url: str, interval: float) -> None:
    async with ClientSession() as http:
        while True:
            t_req = time.perf_counter()
            try:
                async with http.get(url) as resp:
                    body = await resp.read()
            except OSError:  # the worker is stopping (or not serving yet)
                await asyncio.sleep(interval)
                continue
            get_s = time.perf_counter() - t_req
            snap = json.loads(body)
            ticks = sorted({int(pt[0]) for series in (snap.get("streams") or {}).values()
                            for pt in series.get("points") or ()})
            hist = snap.get("histogram")
            print(json.dumps({"t": time.time(), "bytes": len(body), "get_s": get_s,
                              "ticks": ticks, "histogram": int(hist["tick"]) if hist else None}),
                  flush=True)
            await asyncio.sleep(interval)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.5))
