"""TLS / SASL settings: validation, client construction for every mechanism, secret hygiene."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.config.security import MECHANISMS, KafkaSecurity, client_kwargs
from agents.config.settings import Settings
from tests._certs import make_pki

ROOT = Path(__file__).resolve().parents[4]
SECRET = "s3cr3t-Pa55w0rd-never-shown"


def _file(tmp: Path, name: str, text: str) -> str:
    p = tmp / name
    p.write_text(text + "\n", encoding="utf-8")
    return str(p)


def test_plaintext_is_the_default_and_adds_nothing() -> None:
    assert KafkaSecurity().client_kwargs() == {"security_protocol": "PLAINTEXT"}
    assert KafkaSecurity.from_env({}) == KafkaSecurity()


@pytest.mark.parametrize("mechanism", [m for m in MECHANISMS if m != "OAUTHBEARER"])
@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_sasl_user_password_mechanisms(tmp_path: Path, mechanism: str, protocol: str) -> None:
    pki = make_pki(tmp_path / "pki", "127.0.0.2")
    sec = KafkaSecurity(
        security_protocol=protocol, sasl_mechanism=mechanism, sasl_username="svc-dp",
        sasl_password_file=_file(tmp_path, "pw", SECRET),
        ssl_cafile=str(pki.ca) if protocol == "SASL_SSL" else "",
    )
    kw = sec.client_kwargs()
    assert kw["security_protocol"] == protocol and kw["sasl_mechanism"] == mechanism
    assert kw["sasl_plain_username"] == "svc-dp" and kw["sasl_plain_password"] == SECRET
    assert isinstance(kw.get("ssl_context"), ssl.SSLContext) == (protocol == "SASL_SSL")
    assert SECRET not in repr(sec)
    # aiokafka accepts the arguments for every kind of client (no connection is made)
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient

    async def build() -> None:
        AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", **kw)
        AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", **sec.client_kwargs())
        AIOKafkaAdminClient(bootstrap_servers="127.0.0.1:1", **sec.client_kwargs())

    asyncio.run(build())


def test_oauthbearer_from_a_file_rereads_it_and_from_a_command(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    sec = KafkaSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                        sasl_oauth_token_file=str(token))
    provider = sec.client_kwargs()["sasl_oauth_token_provider"]
    assert asyncio.run(provider.token()) == "tok-1"
    token.write_text("tok-2\n")  # rotated in place
    assert asyncio.run(provider.token()) == "tok-2"
    cmd = KafkaSecurity(security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                        sasl_oauth_token_command=f"{sys.executable} -c \"print('tok-cmd')\"")
    kw = cmd.client_kwargs()
    assert asyncio.run(kw["sasl_oauth_token_provider"].token()) == "tok-cmd"
    assert "tok-cmd" not in repr(cmd) and "print" not in repr(cmd)
    from aiokafka import AIOKafkaConsumer

    async def build() -> None:
        AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", **kw)

    asyncio.run(build())
    failing = KafkaSecurity(security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                            sasl_oauth_token_command=f"{sys.executable} -c 'import sys; sys.exit(3)'")
    with pytest.raises(RuntimeError, match="status 3"):
        asyncio.run(failing.client_kwargs()["sasl_oauth_token_provider"].token())


def test_tls_context_verifies_with_the_ca_and_loads_an_encrypted_client_key(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, "127.0.0.2")
    sec = KafkaSecurity(security_protocol="SSL", ssl_cafile=str(pki.ca),
                        ssl_certfile=str(pki.client_cert), ssl_keyfile=str(pki.client_key),
                        ssl_key_password_file=str(pki.client_key_password))
    ctx = sec.client_kwargs()["ssl_context"]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert not KafkaSecurity(security_protocol="SSL", ssl_cafile=str(pki.ca),
                             ssl_check_hostname=False).ssl_context().check_hostname
    wrong = tmp_path / "wrong"
    wrong.write_text("not the password\n")
    bad = KafkaSecurity(security_protocol="SSL", ssl_cafile=str(pki.ca),
                        ssl_certfile=str(pki.client_cert), ssl_keyfile=str(pki.client_key),
                        ssl_key_password_file=str(wrong))
    with pytest.raises(ValueError, match="ssl_certfile / ssl_keyfile") as err:
        bad.client_kwargs()
    assert "not the password" not in str(err.value)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"security_protocol": "TLS"}, "security_protocol"),
        ({"security_protocol": "PLAINTEXT", "ssl_cafile": "ca.pem"}, "ssl_cafile"),
        ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"}, "ssl_cafile"),
        ({"security_protocol": "SSL", "ssl_certfile": "@cert"}, "ssl_certfile and ssl_keyfile"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "sasl_mechanism"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}, "sasl_username"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256",
          "sasl_username": "u"}, "sasl_password_file"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
          "sasl_username": "u", "sasl_password_file": "/nonexistent/pw"}, "sasl_password_file"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"},
         "sasl_oauth_token_file and sasl_oauth_token_command"),
        ({"security_protocol": "PLAINTEXT", "sasl_mechanism": "PLAIN"}, "sasl_mechanism"),
    ],
)
def test_settings_that_cannot_work_are_one_line_errors(tmp_path: Path, fields: dict[str, str],
                                                       named: str) -> None:
    fields = {k: (str(tmp_path / "c.pem") if v == "@cert" else v) for k, v in fields.items()}
    if fields.get("ssl_certfile"):
        Path(fields["ssl_certfile"]).write_text("x")
    with pytest.raises(ValueError) as err:
        KafkaSecurity(**fields).validate()  # type: ignore[arg-type]
    assert named in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match=named.split()[0]):
        Settings(origin=1000.0, **fields)  # type: ignore[arg-type]


def test_environment_and_toml_load_the_settings(tmp_path: Path) -> None:
    pw = _file(tmp_path, "pw", SECRET)
    env = {"STREAM_DP_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "STREAM_DP_SASL_MECHANISM": "PLAIN",
           "STREAM_DP_SASL_USERNAME": "u", "STREAM_DP_SASL_PASSWORD_FILE": pw,
           "STREAM_DP_SSL_CHECK_HOSTNAME": "false", "STREAM_DP_ORIGIN": "1000"}
    sec = KafkaSecurity.from_env(env)
    assert sec.sasl_username == "u" and sec.ssl_check_hostname is False
    s = Settings.load(env=env)
    assert KafkaSecurity.from_settings(s) == sec
    assert SECRET not in repr(s) and SECRET not in repr(sec)
    toml = tmp_path / "s.toml"
    toml.write_text('origin = 1000.0\nsecurity_protocol = "SASL_SSL"\nsasl_mechanism = "PLAIN"\n'
                    'sasl_username = "u"\nsasl_password_file = "pw"\nssl_check_hostname = false\n')
    s = Settings.load(toml, env={})
    assert s.sasl_password_file == pw  # relative to the TOML file's folder
    assert s.ssl_check_hostname is False
    with pytest.raises(ValueError, match="ssl_check_hostname"):
        Settings.load(env={"STREAM_DP_ORIGIN": "1", "STREAM_DP_SSL_CHECK_HOSTNAME": "maybe"})


def test_default_client_kwargs_follow_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setenv("STREAM_DP_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("STREAM_DP_SASL_MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("STREAM_DP_SASL_USERNAME", "u")
    monkeypatch.setenv("STREAM_DP_SASL_PASSWORD_FILE", _file(tmp_path, "pw", SECRET))
    assert client_kwargs()["sasl_mechanism"] == "SCRAM-SHA-256"


@pytest.mark.parametrize("command", [
    ["worker", "--no-web"],
    ["tail", "counts", "--timeout", "1"],
    ["replay", "LOG", "--until", "2024-01-01T00:00:00Z"],
])
def test_commands_refuse_bad_security_before_connecting(tmp_path: Path, command: list[str]) -> None:
    log = tmp_path / "x.csv"
    log.write_text("ts,key\n1,a\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DP_")}
    env.update({"STREAM_DP_BOOTSTRAP": "127.0.0.1:1", "STREAM_DP_ORIGIN": str(time.time()),
                "STREAM_DP_KEY": "ab53e19c07f4d2a86b1e5c93a0f7d24e8c61b3f09a2e7d54c1b8f36a0e9d27c5", "STREAM_DP_SECURITY_PROTOCOL": "SSL",
                "STREAM_DP_SSL_CAFILE": str(tmp_path / "missing-ca.pem"),
                "STREAM_DP_DOMAIN_FILE": str(ROOT / "examples" / "domain.toml")})
    argv = [str(log) if a == "LOG" else a for a in command]
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "stream_dp.cli", *argv], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "ssl_cafile" in lines[0] and "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 20
