"""Static validation of deploy/ (no Docker engine or cluster here): structure, names, wiring."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.config.settings import Settings
from agents.config.values import env_var
from agents.telemetry.metrics import Metrics
from stream_dp.domain import Domain

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SETTINGS_VARS = {env_var(f) for f in Settings.__dataclass_fields__}
EXTRA_VARS = {"STREAM_DP_CONFIG", "STREAM_DP_KEY"}  # config file path; key (never a setting value)


def _yaml_docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = _yaml_docs(DEPLOY / "compose.yaml")[0]
    assert isinstance(doc, dict)
    return doc


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def test_every_yaml_and_json_file_parses() -> None:
    files = [*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]
    assert len(files) >= 10
    for path in files:
        assert _yaml_docs(path), path
    for path in DEPLOY.rglob("*.json"):
        json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------- compose
def test_compose_has_three_kraft_brokers_with_one_controller_quorum(compose: dict[str, Any]) -> None:
    services = compose["services"]
    brokers = {n: s for n, s in services.items() if n.startswith("kafka-")}
    assert len(brokers) == 3
    assert {s["image"].split(":")[0] for s in brokers.values()} == {"apache/kafka"}
    envs = {n: _env(s) for n, s in brokers.items()}
    node_ids = {n: e["KAFKA_NODE_ID"] for n, e in envs.items()}
    assert sorted(node_ids.values()) == ["1", "2", "3"]
    voters = {e["KAFKA_CONTROLLER_QUORUM_VOTERS"] for e in envs.values()}
    assert len(voters) == 1
    controller_port = None
    for e in envs.values():
        listeners = dict(reversed(x.split("://")) for x in e["KAFKA_LISTENERS"].split(","))
        ctl = e["KAFKA_CONTROLLER_LISTENER_NAMES"]
        controller_port = next(addr for addr, name in listeners.items() if name == ctl).lstrip(":")
        assert set(e["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
        assert f"{ctl}:PLAINTEXT" in e["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
        assert e["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert e["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3"
        assert e["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert e["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # topics are created explicitly
    expected = {f"{node_ids[n]}@{n}:{controller_port}" for n in brokers}
    assert set(voters.pop().split(",")) == expected
    assert len({e["CLUSTER_ID"] for e in envs.values()}) == 1
    for n, e in envs.items():
        assert e["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{n}:9092"
        assert any(str(v).endswith(":/var/lib/kafka/data") for v in brokers[n]["volumes"])


def test_compose_workers_match_settings_and_use_static_membership(compose: dict[str, Any]) -> None:
    services = compose["services"]
    workers = {n: s for n, s in services.items() if n.startswith("worker-")}
    assert len(workers) >= 3
    ids, ports = set(), set()
    bootstrap_hosts = {f"{n}:9092" for n in services if n.startswith("kafka-")}
    for name, svc in workers.items():
        env = _env(svc)
        unknown = set(env) - SETTINGS_VARS - EXTRA_VARS
        assert not unknown, f"{name}: not settings variables: {unknown}"
        assert "STREAM_DP_KEY" not in env  # the key comes from a secret file, never inline
        ids.add(env["STREAM_DP_WORKER_ID"])
        assert set(env["STREAM_DP_BOOTSTRAP"].split(",")) == bootstrap_hosts
        assert env["STREAM_DP_WEB_HOST"] == "0.0.0.0"
        assert svc["command"] == ["worker"]
        assert svc["depends_on"]["topics"]["condition"] == "service_completed_successfully"
        assert "/readyz" in " ".join(svc["healthcheck"]["test"])
        (published,) = svc["ports"]
        host, hport, cport = published.split(":")
        assert host == "127.0.0.1" and cport == env["STREAM_DP_WEB_PORT"]
        ports.add(hport)
        assert env["STREAM_DP_KEY_FILE"] == "/run/secrets/noise_key"
        assert "noise_key" in svc["secrets"]
    assert len(ids) == len(workers) and len(ports) == len(workers)
    assert compose["secrets"]["noise_key"]["file"] == "./secrets/noise.key"
    topics = services["topics"]
    assert topics["command"] == ["topics", "create"]
    assert _env(topics)["STREAM_DP_REPLICATION_FACTOR"] == "3"


def test_compose_config_files_load_as_settings_and_domain(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    worker = compose["services"]["worker-1"]
    mounts = dict(v.rsplit(":", 2)[:2] for v in worker["volumes"])  # host -> container
    config_dir = next(DEPLOY / h for h, c in mounts.items() if c == "/etc/stream-dp")
    env = _env(worker)
    config = config_dir / Path(env["STREAM_DP_CONFIG"]).relative_to("/etc/stream-dp")
    env["STREAM_DP_ORIGIN"] = "1767225600"  # required from the operator (compose ${...:?})
    env.pop("STREAM_DP_KEY_FILE")
    s = Settings.load(config, env=env)
    assert s.replication_factor == 3 and s.worker_id == "worker-1"
    assert s.events_partitions >= len([n for n in compose["services"] if n.startswith("worker-")])
    domain = Domain.from_file(s.domain_file)
    assert domain.size > 1
    assert "${STREAM_DP_ORIGIN:?" in (DEPLOY / "compose.yaml").read_text()


def test_prometheus_scrapes_every_worker(compose: dict[str, Any]) -> None:
    prom = _yaml_docs(DEPLOY / "prometheus" / "prometheus.yml")[0]
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "stream-dp-workers")
    assert job["metrics_path"] == "/metrics"
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    workers = {f"{n}:{_env(s)['STREAM_DP_WEB_PORT']}" for n, s in compose["services"].items()
               if n.startswith("worker-")}
    assert targets == workers
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


# ---------------------------------------------------------------------------------- grafana
def _exposed_metric_names() -> set[str]:
    """Every series name a worker's /metrics can show (labelled families may have no sample yet)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("_sum", "_count")}
    names: set[str] = set()
    for fam in Metrics().registry.collect():
        names.add(fam.name)
        names.update(fam.name + sfx for sfx in suffixes.get(fam.type, ()))
        names.update(sample.name for sample in fam.samples)
    return names


def test_grafana_dashboard_uses_only_existing_metrics(compose: dict[str, Any]) -> None:
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "stream-dp.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"]]
    assert len(exprs) >= 15
    used = {name for e in exprs for name in re.findall(r"\b((?:stream_dp|process)_[a-z0-9_]+)", e)}
    exposed = _exposed_metric_names()
    missing = used - exposed
    assert not missing, f"dashboard refers to metrics the worker does not export: {missing}"
    # the dashboard covers the service's own metrics broadly
    families = {n for n in exposed if n.startswith("stream_dp_")}
    covered = {n for n in families if any(u == n or u.startswith(n + "_") for u in used)}
    assert len(covered) >= 12
    # datasource wiring: the panels' datasource uid is the provisioned one
    ds = _yaml_docs(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")[0]
    uids = {d["uid"] for d in ds["datasources"]}
    assert {p["datasource"]["uid"] for p in dash["panels"]} <= uids
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    # the provider reads the folder where compose mounts the dashboards
    prov = _yaml_docs(DEPLOY / "grafana" / "provisioning" / "dashboards" / "stream-dp.yaml")[0]
    path = prov["providers"][0]["options"]["path"]
    assert f"./grafana/dashboards:{path}:ro" in compose["services"]["grafana"]["volumes"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


# ---------------------------------------------------------------------------------- kubernetes
@pytest.fixture(scope="module")
def k8s() -> dict[tuple[str, str], dict[str, Any]]:
    kust = _yaml_docs(DEPLOY / "k8s" / "kustomization.yaml")[0]
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for res in kust["resources"]:
        for doc in _yaml_docs(DEPLOY / "k8s" / res):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def test_k8s_kinds(k8s: dict[tuple[str, str], dict[str, Any]]) -> None:
    kinds = {k for k, _ in k8s}
    assert kinds == {"Namespace", "ConfigMap", "Job", "Service", "StatefulSet",
                     "PodDisruptionBudget"}
    for doc in k8s.values():
        assert doc["apiVersion"] in {"v1", "apps/v1", "batch/v1", "policy/v1"}


def test_k8s_statefulset_probes_identity_config_and_secret(
    k8s: dict[tuple[str, str], dict[str, Any]],
) -> None:
    sts = k8s[("StatefulSet", "stream-dp-worker")]
    spec = sts["spec"]
    assert spec["replicas"] >= 3
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert ("Service", spec["serviceName"]) in k8s
    assert k8s[("Service", spec["serviceName"])]["spec"]["clusterIP"] == "None"
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    env = {e["name"]: e for e in c["env"]}
    unknown = set(env) - SETTINGS_VARS - EXTRA_VARS
    assert not unknown, unknown
    assert "STREAM_DP_KEY" not in env
    assert env["STREAM_DP_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert int(env["STREAM_DP_WEB_PORT"]["value"]) == ports["http"]
    assert env["STREAM_DP_WEB_HOST"]["value"] == "0.0.0.0"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    key_file = Path(env["STREAM_DP_KEY_FILE"]["value"])
    secret_vol = next(n for n, p in mounts.items() if Path(p) == key_file.parent)
    assert volumes[secret_vol]["secret"]["secretName"] == "stream-dp-noise-key"
    assert volumes[secret_vol]["secret"]["defaultMode"] == 0o400
    config_vol = next(n for n, p in mounts.items()
                      if Path(p) == Path(env["STREAM_DP_CONFIG"]["value"]).parent)
    assert ("ConfigMap", volumes[config_vol]["configMap"]["name"]) in k8s
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["terminationGracePeriodSeconds"] >= 30  # graceful SIGTERM: leave the group
    for svc in (d for (k, _), d in k8s.items() if k == "Service"):
        assert svc["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= set(ports)


def test_k8s_configmap_loads_and_example_secret_cannot_be_used(
    k8s: dict[tuple[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    cm = k8s[("ConfigMap", "stream-dp-config")]["data"]
    for name, text in cm.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    s = Settings.load(tmp_path / "stream-dp.toml", env={})
    assert Domain.from_file(s.domain_file).size > 1
    kust = _yaml_docs(DEPLOY / "k8s" / "kustomization.yaml")[0]
    assert not any("secret" in r for r in kust["resources"])  # never overwrite the real key
    (secret,) = _yaml_docs(DEPLOY / "k8s" / "secret.example.yaml")
    assert secret["metadata"]["name"] == "stream-dp-noise-key"
    placeholder = secret["stringData"]["noise.key"]
    (tmp_path / "key").write_text(placeholder)
    (tmp_path / "key").chmod(0o600)  # a key file open to others is refused for that alone
    from stream_dp.noise.keys import load_key

    with pytest.raises(ValueError):
        load_key(tmp_path / "key")


def test_dockerfile_runs_the_worker_as_non_root() -> None:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11", text, re.M)
    assert re.search(r"^USER (?!root|0\b)\S+", text, re.M)
    assert 'ENTRYPOINT ["stream-dp"]' in text and 'CMD ["worker"]' in text
    assert "STREAM_DP_WEB_HOST=0.0.0.0" in text
    root = DEPLOY.parent
    for src in re.findall(r"^COPY (\S+)", text, re.M):
        assert (root / src).exists(), src


def test_k8s_mounts_kafka_credentials_as_files_and_the_example_names_them() -> None:
    """Secured clusters: credentials are files from a Secret, never environment values."""
    sts = yaml.safe_load((DEPLOY / "k8s" / "statefulset.yaml").read_text())
    pod = sts["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["kafka-credentials"]["secret"]["secretName"] == "stream-dp-kafka-credentials"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["kafka-credentials"]["readOnly"] is True
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert not any("PASSWORD" in e and not e.endswith("_FILE") for e in env)
    example = yaml.safe_load((DEPLOY / "k8s" / "secret.kafka.example.yaml").read_text())
    assert example["kind"] == "Secret" and example["metadata"]["name"] == "stream-dp-kafka-credentials"
    cm = yaml.safe_load((DEPLOY / "k8s" / "configmap.yaml").read_text())
    for name in ("security_protocol", "ssl_cafile", "sasl_password_file"):
        assert f"# {name} = " in cm["data"]["stream-dp.toml"]
