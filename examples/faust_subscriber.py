"""A faust app that subscribes to stream-dp's released counts.

The service publishes one ``dp.counts.v1`` message per (stream, tick). This app's agent reads
them, decodes each with the library's decoder (:func:`stream_dp.releases.decode_count`) and keeps
a table of the latest release per stream (value ± standard error at the newest tick). Reading
needs no transactions: every copy of a (stream, tick) is bit-identical, so duplicates are simply
ignored (the table keeps a tick only if it is newer).

Run it next to a deployment (the settings come from the same variables as the service's)::

    pip install 'faust-streaming==0.15.3'
    STREAM_DP_BOOTSTRAP=127.0.0.1:9092 faust -A examples.faust_subscriber worker -l info

Variables: ``STREAM_DP_BOOTSTRAP`` (default ``127.0.0.1:9092``), ``STREAM_DP_COUNTS_TOPIC``
(``dp.counts.v1``), ``FAUST_SUBSCRIBER_ID`` (the faust app id, ``stream-dp-subscriber``),
``FAUST_SUBSCRIBER_OUT`` (if set, a JSON file rewritten with the table after every update),
``FAUST_SUBSCRIBER_DATADIR`` (faust's data folder), ``STREAM_DP_COUNTS_PARTITIONS`` (``8``: a
faust table's changelog needs the source topic's partition count). The faust web server binds
127.0.0.1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import faust

from stream_dp.releases import decode_count

BOOTSTRAP = os.environ.get("STREAM_DP_BOOTSTRAP", "127.0.0.1:9092")
COUNTS_TOPIC = os.environ.get("STREAM_DP_COUNTS_TOPIC", "dp.counts.v1")
OUT = os.environ.get("FAUST_SUBSCRIBER_OUT")

app = faust.App(
    os.environ.get("FAUST_SUBSCRIBER_ID", "stream-dp-subscriber"),
    broker=[f"kafka://{b}" for b in BOOTSTRAP.split(",")],
    store="memory://",
    web_bind="127.0.0.1",
    web_port=int(os.environ.get("FAUST_SUBSCRIBER_WEB_PORT", "6099")),
    datadir=os.environ.get("FAUST_SUBSCRIBER_DATADIR", "faust-subscriber-data"),
    topic_disable_leader=True,
    consumer_auto_offset_reset="earliest",
)

# raw bytes in, decoded by the library (the JSON schema is published in agents/schemas/)
counts = app.topic(COUNTS_TOPIC, key_type=bytes, value_type=bytes, value_serializer="raw",
                   key_serializer="raw")

#: stream -> {"tick", "value", "stderr", "tick_end"} of its newest release
latest = app.Table("latest-release", default=None,
                   partitions=int(os.environ.get("STREAM_DP_COUNTS_PARTITIONS", "8")))


def _snapshot() -> dict[str, Any]:
    return {str(k): v for k, v in latest.items()}


@app.agent(counts)
async def follow(releases: faust.Stream[bytes]) -> None:
    async for raw in releases:
        try:
            r = decode_count(raw)
        except ValueError:
            continue  # not a count message
        have = latest.get(r.stream)
        if have is not None and have["tick"] >= r.tick:
            continue  # a duplicate or an older tick: every copy of (stream, tick) is identical
        latest[r.stream] = {"tick": r.tick, "value": r.value, "stderr": r.stderr,
                            "tick_end": r.tick_end}
        if OUT:
            tmp = Path(OUT + ".tmp")
            tmp.write_text(json.dumps(_snapshot(), sort_keys=True))
            tmp.replace(OUT)


if __name__ == "__main__":  # pragma: no cover
    app.main()
