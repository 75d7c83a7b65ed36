"""Connection security of every Kafka client the service creates: TLS and SASL.

One frozen :class:`KafkaSecurity` holds the settings (named after aiokafka's parameters with the
project's ``STREAM_DP_`` prefix; the worker reads them from its :class:`agents.config.settings.Settings`,
the command-line tools from the environment). :meth:`KafkaSecurity.client_kwargs` turns them into
keyword arguments for ``AIOKafkaConsumer`` / ``AIOKafkaProducer`` / ``AIOKafkaAdminClient`` /
``AIOKafkaClient``.

Secrets (TLS key password, SASL password, OAuth token) are read from **files** (or, for OAuth, a
command that prints a token), only when a client is built; they never appear in ``repr``, logs,
error messages or metrics. :meth:`KafkaSecurity.validate` checks everything that can be checked
before connecting (protocol and mechanism names, files present and readable, combinations that
cannot work) and raises ``ValueError`` with one line naming the setting.

| setting | variable | meaning |
|---|---|---|
| ``security_protocol`` | ``STREAM_DP_SECURITY_PROTOCOL`` | PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL |
| ``ssl_cafile`` | ``STREAM_DP_SSL_CAFILE`` | CA bundle (PEM) to verify the brokers; empty: system CAs |
| ``ssl_certfile`` / ``ssl_keyfile`` | ``STREAM_DP_SSL_CERTFILE`` / ``..._KEYFILE`` | client certificate and key (mutual TLS) |
| ``ssl_key_password_file`` | ``STREAM_DP_SSL_KEY_PASSWORD_FILE`` | file holding the key's password |
| ``ssl_check_hostname`` | ``STREAM_DP_SSL_CHECK_HOSTNAME`` | verify the broker's name (default true) |
| ``sasl_mechanism`` | ``STREAM_DP_SASL_MECHANISM`` | PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER |
| ``sasl_username`` | ``STREAM_DP_SASL_USERNAME`` | user for PLAIN / SCRAM |
| ``sasl_password_file`` | ``STREAM_DP_SASL_PASSWORD_FILE`` | file holding the password |
| ``sasl_oauth_token_file`` | ``STREAM_DP_SASL_OAUTH_TOKEN_FILE`` | file holding a bearer token (re-read on every connect) |
| ``sasl_oauth_token_command`` | ``STREAM_DP_SASL_OAUTH_TOKEN_COMMAND`` | command printing a bearer token |
"""

from __future__ import annotations

import asyncio
import os
import shlex
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["MECHANISMS", "PROTOCOLS", "KafkaSecurity", "client_kwargs", "parse_bool"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _read_secret(path: str, setting: str) -> str:
    """The first line of a secret file, stripped (never echoed in errors)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{setting}: cannot read {path!r} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{setting}: {path!r} is not UTF-8 text") from None
    value = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not value:
        raise ValueError(f"{setting}: {path!r} is empty")
    return value


class _FileTokenProvider:
    """OAUTHBEARER tokens from a file (re-read on every connect, so rotation just works)."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def token(self) -> str:
        return _read_secret(self.path, "sasl_oauth_token_file")

    def extensions(self) -> dict[str, str]:
        return {}

    def __repr__(self) -> str:
        return f"_FileTokenProvider(path={self.path!r})"


class _CommandTokenProvider:
    """OAUTHBEARER tokens printed by a command (run on every connect; 30 s time limit)."""

    def __init__(self, command: str) -> None:
        self.command = command

    async def token(self) -> str:
        proc = await asyncio.create_subprocess_exec(
            *shlex.split(self.command), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
        except TimeoutError:
            proc.kill()
            raise RuntimeError("sasl_oauth_token_command took more than 30 s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"sasl_oauth_token_command exited with status {proc.returncode}")
        token = out.decode("utf-8", "replace").strip()
        if not token:
            raise RuntimeError("sasl_oauth_token_command printed no token")
        return token

    def extensions(self) -> dict[str, str]:
        return {}

    def __repr__(self) -> str:
        return "_CommandTokenProvider(command=<hidden>)"


@dataclass(frozen=True)
class KafkaSecurity:
    """TLS / SASL settings of the Kafka clients (see the module docstring). Immutable."""

    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_key_password_file: str = ""
    ssl_check_hostname: bool = True
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password_file: str = ""
    sasl_oauth_token_file: str = ""
    sasl_oauth_token_command: str = ""

    def __repr__(self) -> str:  # file paths are not secret; a command line might be
        def shown(name: str) -> str:
            value = getattr(self, name)
            return "<hidden>" if name == "sasl_oauth_token_command" and value else repr(value)

        return "KafkaSecurity(" + ", ".join(f"{f.name}={shown(f.name)}" for f in fields(self)) + ")"

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_settings(cls, settings: Any) -> KafkaSecurity:
        """The security settings of an :class:`agents.config.settings.Settings`."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KafkaSecurity:
        """From ``STREAM_DP_<SETTING>`` variables (the command-line tools without settings)."""
        environ: Mapping[str, str] = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            var = "STREAM_DP_" + f.name.upper()
            if var in environ:
                raw = environ[var]
                values[f.name] = parse_bool(f.name, raw) if f.name == "ssl_check_hostname" else raw
        return cls(**values)

    # ------------------------------------------------------------------ validation
    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def validate(self) -> None:
        """Raise ``ValueError`` (one line, naming the setting) for settings that cannot work."""
        if self.security_protocol not in PROTOCOLS:
            raise ValueError(f"security_protocol must be one of {', '.join(PROTOCOLS)}, got "
                             f"{self.security_protocol!r}")
        ssl_files = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_key_password_file")
        if not self.uses_ssl:
            for name in ssl_files:
                if getattr(self, name):
                    raise ValueError(f"{name} is set but security_protocol is "
                                     f"{self.security_protocol} (use SSL or SASL_SSL)")
        for name in ssl_files:
            path = getattr(self, name)
            if path and not os.access(path, os.R_OK):
                raise ValueError(f"{name}: cannot read {path!r}")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ValueError("ssl_certfile and ssl_keyfile go together (mutual TLS needs both)")
        if self.ssl_key_password_file and not self.ssl_keyfile:
            raise ValueError("ssl_key_password_file is set but ssl_keyfile is not")
        sasl = ("sasl_mechanism", "sasl_username", "sasl_password_file", "sasl_oauth_token_file",
                "sasl_oauth_token_command")
        if not self.uses_sasl:
            for name in sasl:
                if getattr(self, name):
                    raise ValueError(f"{name} is set but security_protocol is "
                                     f"{self.security_protocol} (use SASL_PLAINTEXT or SASL_SSL)")
            return
        if self.sasl_mechanism not in MECHANISMS:
            raise ValueError(f"sasl_mechanism must be one of {', '.join(MECHANISMS)} with "
                             f"security_protocol {self.security_protocol}, got "
                             f"{self.sasl_mechanism!r}")
        if self.sasl_mechanism == "OAUTHBEARER":
            if bool(self.sasl_oauth_token_file) == bool(self.sasl_oauth_token_command):
                raise ValueError("sasl_mechanism OAUTHBEARER needs exactly one of "
                                 "sasl_oauth_token_file and sasl_oauth_token_command")
            if self.sasl_oauth_token_file and not os.access(self.sasl_oauth_token_file, os.R_OK):
                raise ValueError(f"sasl_oauth_token_file: cannot read "
                                 f"{self.sasl_oauth_token_file!r}")
            if self.sasl_oauth_token_command:
                try:
                    argv = shlex.split(self.sasl_oauth_token_command)
                except ValueError:
                    raise ValueError("sasl_oauth_token_command: not a valid command line") from None
                if not argv:
                    raise ValueError("sasl_oauth_token_command is empty")
            if self.sasl_username or self.sasl_password_file:
                raise ValueError("sasl_username / sasl_password_file do not apply to OAUTHBEARER")
            return
        if not self.sasl_username:
            raise ValueError(f"sasl_mechanism {self.sasl_mechanism} needs sasl_username")
        if not self.sasl_password_file:
            raise ValueError(f"sasl_mechanism {self.sasl_mechanism} needs sasl_password_file")
        if not os.access(self.sasl_password_file, os.R_OK):
            raise ValueError(f"sasl_password_file: cannot read {self.sasl_password_file!r}")
        if self.sasl_oauth_token_file or self.sasl_oauth_token_command:
            raise ValueError(f"sasl_oauth_token_* do not apply to {self.sasl_mechanism}")

    # ------------------------------------------------------------------ clients
    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context: the CA bundle (or the system's), the client certificate if any."""
        try:
            ctx = ssl.create_default_context(cafile=self.ssl_cafile or None)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"ssl_cafile: cannot load {self.ssl_cafile!r} as PEM "
                             f"certificates ({type(exc).__name__})") from None
        ctx.check_hostname = bool(self.ssl_check_hostname)  # the chain is verified either way
        if self.ssl_certfile:
            password = (_read_secret(self.ssl_key_password_file, "ssl_key_password_file")
                        if self.ssl_key_password_file else None)
            try:
                ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password=password)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"ssl_certfile / ssl_keyfile: cannot load the client "
                                 f"certificate and key ({type(exc).__name__}; wrong password "
                                 "or not PEM?)") from None
        return ctx

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka's clients (validated; secrets read from files now)."""
        self.validate()
        kw: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.uses_ssl:
            kw["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            kw["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "OAUTHBEARER":
                kw["sasl_oauth_token_provider"] = (
                    _FileTokenProvider(self.sasl_oauth_token_file)
                    if self.sasl_oauth_token_file
                    else _CommandTokenProvider(self.sasl_oauth_token_command)
                )
            else:
                kw["sasl_plain_username"] = self.sasl_username
                kw["sasl_plain_password"] = _read_secret(self.sasl_password_file,
                                                         "sasl_password_file")
        return kw


def parse_bool(name: str, raw: object) -> bool:
    """``true/false/1/0/yes/no/on/off`` (or a bool) as a bool; ``ValueError`` naming ``name``."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name} must be true or false, got {raw!r}")


def client_kwargs(security: KafkaSecurity | None = None) -> dict[str, Any]:
    """Keyword arguments for an aiokafka client: ``security``, or else the ``STREAM_DP_*``
    environment's (what the command-line tools use)."""
    return (security if security is not None else KafkaSecurity.from_env()).client_kwargs()
