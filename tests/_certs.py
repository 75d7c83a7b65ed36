"""A throw-away certificate authority for the TLS tests (``cryptography``, no openssl CLI)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pki:
    """Paths of a CA, a server certificate for ``server_ip`` and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path  # encrypted with the password in ``client_key_password``
    client_key_password: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> None:
    enc: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password
        else serialization.NoEncryption()
    )
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8, enc))


def make_pki(folder: Path, server_ip: str, ca_name: str = "stream-dp test CA") -> Pki:
    """A CA (valid one day) that signs a server certificate for ``server_ip`` and a client one."""
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder().subject_name(_name(ca_name)).issuer_name(_name(ca_name))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, san: list[x509.GeneralName]) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cert, key

    server, server_key = leaf(server_ip, [x509.IPAddress(ipaddress.ip_address(server_ip))])
    client, client_key = leaf("stream-dp-worker", [x509.DNSName("stream-dp-worker")])
    pki = Pki(folder / "ca.pem", folder / "server.pem", folder / "server.key",
              folder / "client.pem", folder / "client.key", folder / "client.key.password")
    pki.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.server_key, server_key)
    pki.client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    pki.client_key_password.write_text("correct horse battery staple\n")
    _write_key(pki.client_key, client_key, b"correct horse battery staple")
    return pki
