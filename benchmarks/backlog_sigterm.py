"""SIGTERM during a huge backlog: seconds from the signal to the worker's exit (issue #24).

Guide §6's example (``examples/stream-dp.toml``: origin 2026-01-01, 60 s ticks, 8 events
partitions, 8 shards) starts a fresh deployment ~474 000 ticks behind. A real ``stream-dp
worker`` is started on an embedded broker with an origin ``--ticks`` ticks of 60 s in the past,
left ``--wait`` seconds into its backlog, then sent SIGTERM; printed: its exit status, seconds
from SIGTERM to exit, stderr lines and whether one is a traceback or the forced-exit line.

    python benchmarks/backlog_sigterm.py --ticks 474000 --wait 10
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEY_HEX = "8d3a61f0c47e25b9a1e6d0937f4c28b5e0a9173dc62f8b4e5d17a0c39b6e2f84"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ticks", type=int, default=474_000)
    ap.add_argument("--wait", type=float, default=10.0, help="seconds after the start-up line")
    args = ap.parse_args()
    from agents.kafka.embedded_broker import EmbeddedBroker

    print(f"command: python benchmarks/backlog_sigterm.py --ticks {args.ticks} --wait {args.wait:g}")
    print(f"machine: {platform.node()}, nproc {os.cpu_count()}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit "
          + subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip(), flush=True)
    with tempfile.TemporaryDirectory() as d, EmbeddedBroker() as broker:
        tmp = Path(d)
        (tmp / "domain.toml").write_text('name = "shop"\nkind = "hierarchy"\nroot = "all"\n'
                                         'paths = ["eu/fr", "eu/de", "us/ny"]\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
        name = f"backlog-{int(time.time())}"
        env.update({
            "STREAM_DP_BOOTSTRAP": broker.bootstrap, "STREAM_DP_APP_ID": name,
            "STREAM_DP_WORKER_ID": "w1", "STREAM_DP_DOMAIN_FILE": str(tmp / "domain.toml"),
            "STREAM_DP_KEY": KEY_HEX, "STREAM_DP_WEB_PORT": "0",
            "STREAM_DP_ORIGIN": str(float(int(time.time()) - args.ticks * 60)),
            "STREAM_DP_TICK_SECONDS": "60", "STREAM_DP_EVENTS_PARTITIONS": "8",
            "STREAM_DP_SHARDS": "8", "STREAM_DP_STRATEGY": "naive", "STREAM_DP_P": "0.9",
            "STREAM_DP_REPLAY_HISTORY": str(tmp / "history.json"),
        })
        for t in ("events", "counts", "histograms", "dlq", "partials", "schedule", "leader"):
            env[f"STREAM_DP_{t.upper()}_TOPIC"] = f"{name}.{t}"
        env["STREAM_DP_INGEST_CHECKPOINTS_TOPIC"] = f"{name}.ckpt-ingest"
        env["STREAM_DP_RELEASE_CHECKPOINTS_TOPIC"] = f"{name}.ckpt-release"
        cli = [sys.executable, "-m", "agents.cli"]
        subprocess.run([*cli, "topics", "create"], env=env, check=True, capture_output=True)
        log = tmp / "w.log"
        with open(log, "wb") as f:
            w = subprocess.Popen([*cli, "worker"], env=env, stdout=subprocess.DEVNULL, stderr=f)
        try:
            while "ticks are due on the clock schedule" not in log.read_text(errors="replace"):
                if w.poll() is not None:
                    raise SystemExit(log.read_text()[-3000:])
                time.sleep(0.2)
            time.sleep(args.wait)
            t = time.monotonic()
            w.send_signal(signal.SIGTERM)
            code = w.wait(120)
            took = time.monotonic() - t
        finally:
            if w.poll() is None:
                w.kill()
                w.wait()
        text = log.read_text(errors="replace")
        left = [x for x in text.splitlines() if "handing over closed ticks:" in x]
        print(f"exit status {code}, {took:.2f} s from SIGTERM to exit; {len(text.splitlines())} "
              f"stderr lines, traceback: {'Traceback' in text}, forced exit: "
              f"{'did not stop within' in text}; hand-over lines: {len(left)}"
              + (f", last: {left[-1][-120:]}" if left else ""))


if __name__ == "__main__":
    main()
