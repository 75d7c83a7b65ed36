"""The readers of per-stream releases on a binary-attribute deployment (issue 32 item 8): its
counts topic holds ``dp.tables.v1`` records and its histograms topic ``dp.marginals.v1``.
``stream-dp tail counts`` printed rows of ``?``, ``tail histograms`` "0 nodes" and
``examples/subscribe.py`` crashed; each now says, in one line, what to read them with.

The records are the service's own (its attribute release state and reconcile message code, as
in the browser test), published on a real broker; the tools run as a user runs them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "agents.cli"]
ORIGIN, TICK_S, P = 1_704_067_200.0, 60.0, 0.9


def _attribute_releases(tmp_path: Path) -> tuple[list[bytes], bytes]:
    """Six ticks of ``dp.tables.v1`` records and the last tick's ``dp.marginals.v1``."""
    import numpy as np

    from agents.config.domain import load_domain
    from agents.config.settings import Settings
    from agents.ingest.routing import Partial, Router
    from agents.reconcile.tables import TableTick, decode_table_record, marginals_message
    from agents.release.attributes import AttributeReleaseState, new_live

    names = ["milk", "bread", "eggs", "tea"]
    dom_file = tmp_path / "d.toml"
    dom_file.write_text('name = "basket"\nkind = "binary"\nattributes = ['
                        + ", ".join(json.dumps(n) for n in names) + "]\n", encoding="utf-8")
    s = Settings(origin=ORIGIN, tick_seconds=TICK_S, domain_file=str(dom_file),
                 events_partitions=1, shards=1, epsilon=5.0, p=P, attribute_epoch_ticks=4,
                 attribute_max_cluster=3)
    dom = load_domain(dom_file)
    key = b"binary-tools-test-key-0123456789"
    rel = AttributeReleaseState(s, Router(dom, 1), 0, new_live(s, dom, key), key=key)
    rng = np.random.default_rng(1)
    for t in range(1, 7):
        bits = rng.random((60, len(names))) < 0.4
        pats, counts = np.unique(
            (bits.astype(np.uint64) << np.arange(len(names), dtype=np.uint64)).sum(1),
            return_counts=True)
        rel.add(t, Partial(t, 0, 0, tuple(int(p) for p in pats),
                           tuple(float(c) for c in counts), 0.0))
    releases = [rel.step() for _ in range(6)]
    records = [v for r in releases for _, v in r.messages(s, s.privacy.as_dict())]
    last = releases[-1]
    tick = TableTick(last.tick, last.tick_end, tuple(
        decode_table_record(v) for _, v in last.messages(s, s.privacy.as_dict())))
    msg, _ = marginals_message(tick, dom.names, "basket")
    return records, json.dumps(msg).encode()


@pytest.fixture()
def binary_topics(kafka_broker: str, unique_name: str, tmp_path: Path) -> dict[str, str]:
    """Counts and histograms topics holding a binary-attribute deployment's releases; the
    environment a user's tools read them with."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    counts, hists = f"{unique_name}.counts", f"{unique_name}.histograms"
    tables, marginals = _attribute_releases(tmp_path)

    async def publish() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(counts, 1, 1), NewTopic(hists, 1, 1)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker, acks="all")
        await producer.start()
        try:
            for v in tables:
                await producer.send(counts, v, key=b"basket/tables")
            await producer.send_and_wait(hists, marginals, key=b"basket")
        finally:
            await producer.stop()

    asyncio.run(publish())
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    env.update(STREAM_DP_BOOTSTRAP=kafka_broker, STREAM_DP_COUNTS_TOPIC=counts,
               STREAM_DP_HISTOGRAMS_TOPIC=hists)
    return env


def _errors(stderr: str) -> list[str]:
    # tail's progress note ("following …") is not an error line
    return [ln for ln in stderr.splitlines()
            if ln.strip() and not ln.startswith("stream-dp tail: following")]


@pytest.mark.parametrize(("what", "schema"), [("counts", "dp.tables.v1"),
                                              ("histograms", "dp.marginals.v1")])
def test_tail_of_per_stream_releases_names_the_tools_for_tables(
    binary_topics: dict[str, str], what: str, schema: str
) -> None:
    proc = subprocess.run([*CLI, "tail", what, "--from-beginning", "--timeout", "30"],
                          env=binary_topics, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    errors = _errors(proc.stderr)
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in (schema, "binary attributes", "stream-dp tail tables",
                   "stream-dp tail marginals"):
        assert needle in errors[0], errors[0]
    assert proc.stdout == ""  # no rows of '?', no "0 nodes"


def test_subscribe_example_names_the_tools_for_tables(binary_topics: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "subscribe.py"),
                           "--from-beginning", "--ticks", "2"],
                          env=binary_topics, capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("subscribe.py: not a dp.counts.v1 message: a dp.tables.v1")
    assert "stream-dp tail tables" in lines[0]
    assert proc.stdout == ""
