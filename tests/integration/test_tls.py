"""TLS end to end: a worker, `stream-dp topics` and `stream-dp tail` against a TLS listener.

The embedded broker speaks plaintext and advertises the address it binds, so the layout puts
the broker in a network namespace the test creates, bound to 127.0.0.2 there, and a TLS
terminator (``tests/integration/_relay.py``, a self-signed CA made by the test) on 127.0.0.2 in
the test's own namespace: every address a client learns from the broker's metadata is the TLS
one. A plain relay inside the namespace carries the decrypted bytes from a veth address to the
broker. Needs root (``ip netns``), which CI has on this machine kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._certs import Pki, make_pki

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.2"


@dataclass(frozen=True)
class TlsBroker:
    bootstrap: str
    pki: Pki
    tmp: Path


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def _wait_ready(proc: subprocess.Popen[str], what: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "ready" not in line:
        raise RuntimeError(f"{what} did not start: {line!r}")


def _wait_port(host: str, port: int, timeout: float = 30.0, netns: str | None = None) -> None:
    probe = f"import socket; socket.create_connection(('{host}', {port}), 1).close()"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cmd = [sys.executable, "-c", probe]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        if subprocess.run(cmd, capture_output=True).returncode == 0:
            return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on {host}:{port}")


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    from agents.kafka.embedded_broker import free_port

    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.fail("the TLS test needs root and iproute2 (ip netns) to build its layout")
    tmp = tmp_path_factory.mktemp("tls")
    pki = make_pki(tmp / "pki", HOST)
    tag = os.getpid() % 50000
    ns, veth_out, veth_in = f"sdptls{tag}", f"sdpo{tag}", f"sdpi{tag}"
    net = f"10.{200 + tag % 50}.{tag % 250}"
    outer, inner = f"{net}.1", f"{net}.2"
    port = free_port(HOST)
    relay_port = 39000 + tag % 1000
    procs: list[subprocess.Popen[str]] = []
    try:
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", veth_out, "type", "veth", "peer", "name", veth_in)
        _sh("ip", "link", "set", veth_in, "netns", ns)
        _sh("ip", "addr", "add", f"{outer}/30", "dev", veth_out)
        _sh("ip", "link", "set", veth_out, "up")
        _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{inner}/30", "dev", veth_in)
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", veth_in, "up")
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        noida = Path(sys.executable).with_name("noida-db")
        broker_log = open(tmp / "broker.log", "w")  # noqa: SIM115 - owned by the child
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, str(noida), "start", "--only", "kafka", "--kafka-port",
             str(port), "--host", HOST, "--data-dir", str(tmp / "data")],
            stdout=broker_log, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        _wait_port(HOST, port, netns=ns)
        relay = [sys.executable, "-m", "tests.integration._relay"]
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, *relay, f"{inner}:{relay_port}", f"{HOST}:{port}"],
            stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True))
        _wait_ready(procs[-1], "the relay in the namespace")
        procs.append(subprocess.Popen(
            [*relay, f"{HOST}:{port}", f"{inner}:{relay_port}", str(pki.server_cert),
             str(pki.server_key)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
            start_new_session=True))
        _wait_ready(procs[-1], "the TLS terminator")
        yield TlsBroker(f"{HOST}:{port}", pki, tmp)
    finally:
        for p in reversed(procs):
            with contextlib.suppress(Exception):
                os.killpg(p.pid, 15)
                p.wait(10)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", veth_out], capture_output=True)


def _env(b: TlsBroker, name: str, ca: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    key = b.tmp / "noise.key"
    key.write_text("7c41d9e2a05f8b36c17e4a92f0d3b68e5a2c71f94b0e3d86a5c2f17e9b40d3a6")  # 32 random bytes
    key.chmod(0o600)  # key files open to group or others are refused
    domain = b.tmp / "domain.toml"
    domain.write_text('name = "shop"\nkind = "hierarchy"\nroot = "all"\n'
                      'paths = ["eu/fr", "eu/de", "us/ny"]\n')
    env.update({
        "STREAM_DP_BOOTSTRAP": b.bootstrap, "STREAM_DP_SECURITY_PROTOCOL": "SSL",
        "STREAM_DP_SSL_CAFILE": str(ca), "STREAM_DP_APP_ID": name, "STREAM_DP_WORKER_ID": "w1",
        "STREAM_DP_KEY_FILE": str(key), "STREAM_DP_DOMAIN_FILE": str(domain),
        "STREAM_DP_TICK_SECONDS": "1", "STREAM_DP_ALLOWED_LATENESS_S": "0.5",
        "STREAM_DP_CLOSE_GRACE_S": "0.2", "STREAM_DP_EVENTS_PARTITIONS": "2",
        "STREAM_DP_SHARDS": "2", "STREAM_DP_COUNTS_PARTITIONS": "2", "STREAM_DP_P": "0.9",
        "STREAM_DP_STRATEGY": "naive", "STREAM_DP_EPSILON": "10000",
        "STREAM_DP_SESSION_TIMEOUT_S": "6", "PYTHONUNBUFFERED": "1",
    })
    for t in ("events", "counts", "histograms", "dlq", "partials", "schedule", "leader"):
        env[f"STREAM_DP_{t.upper()}_TOPIC"] = f"{name}.{t}"
    env["STREAM_DP_INGEST_CHECKPOINTS_TOPIC"] = f"{name}.ckpt-ingest"
    env["STREAM_DP_RELEASE_CHECKPOINTS_TOPIC"] = f"{name}.ckpt-release"
    env.update(extra)
    return env


def _cli(env: dict[str, str], *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stream_dp.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


async def _produce_tls(b: TlsBroker, topic: str, n: int) -> None:
    from aiokafka import AIOKafkaProducer

    from agents.config.security import KafkaSecurity

    sec = KafkaSecurity(security_protocol="SSL", ssl_cafile=str(b.pki.ca))
    prod = AIOKafkaProducer(bootstrap_servers=b.bootstrap, **sec.client_kwargs())
    await prod.start()
    try:
        for i in range(n):
            key = ("eu/fr", "eu/de", "us/ny")[i % 3]
            await prod.send(topic, json.dumps({"key": key, "ts": time.time()}).encode(),
                            key=key.encode())
        await prod.flush()
    finally:
        await prod.stop()


def test_worker_topics_and_tail_over_tls_and_a_wrong_ca_is_a_clear_error(
    tls_broker: TlsBroker, unique_name: str
) -> None:
    b = tls_broker
    env = _env(b, unique_name, b.pki.ca, STREAM_DP_ORIGIN=str(float(int(time.time())) + 3))
    created = _cli(env, "topics", "create")
    assert created.returncode == 0, created.stderr
    assert f"created {unique_name}.events" in created.stdout
    log = open(b.tmp / f"{unique_name}-worker.log", "w")  # noqa: SIM115 - owned by the child
    worker = subprocess.Popen([sys.executable, "-m", "stream_dp.cli", "worker", "--no-web"],
                              env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        time.sleep(4)
        asyncio.run(_produce_tls(b, f"{unique_name}.events", 30))
        time.sleep(3)
        tail = _cli(env, "tail", "counts", "--from-beginning", "--json", "--timeout", "20",
                    "--max-messages", "36")
        assert tail.returncode == 0, tail.stderr
        msgs = [json.loads(x) for x in tail.stdout.splitlines()]
        assert len(msgs) == 36 and {m["stream"] for m in msgs} == {
            "all", "eu", "us", "eu/fr", "eu/de", "us/ny"}
        assert worker.poll() is None, (b.tmp / f"{unique_name}-worker.log").read_text()[-2000:]
        # every event was counted, over TLS end to end (ε = 10^4: values are exact to ~1e-3)
        deadline = time.monotonic() + 30
        total = 0.0
        while time.monotonic() < deadline and total <= 29:
            tail = _cli(env, "tail", "counts", "--from-beginning", "--to-end", "--json",
                        "--prefix", "all")
            assert tail.returncode == 0, tail.stderr
            total = max((json.loads(x)["value"] for x in tail.stdout.splitlines()), default=0.0)
            time.sleep(1)
        assert 29 < total <= 30.01
    finally:
        os.killpg(worker.pid, 15)
        assert worker.wait(60) == 0, (b.tmp / f"{unique_name}-worker.log").read_text()[-2000:]

    # a CA that did not sign the broker's certificate: a clear one-line error, no traceback
    other = make_pki(b.tmp / "other-pki", HOST, ca_name="someone else's CA")
    bad = _env(b, unique_name, other.ca)
    t0 = time.monotonic()
    proc = _cli(bad, "tail", "counts", "--from-beginning", "--timeout", "5", timeout=120)
    assert proc.returncode != 0
    assert "certificate" in proc.stderr.lower() and "Traceback" not in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 100
    topics = _cli(bad, "topics", "list", timeout=120)
    assert topics.returncode != 0 and "certificate" in topics.stderr.lower(), topics.stderr
