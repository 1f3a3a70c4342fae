"""Certificates made at test time (cryptography): a CA, a server certificate
for 127.0.0.1/localhost, client certificates, and a second, untrusted CA."""
from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key, path: Path) -> str:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return str(path)


def _write_cert(cert, path: Path) -> str:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


class CA:
    def __init__(self, name: str) -> None:
        self.key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.timezone.utc)
        self.name = subject
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(minutes=5))
                     .not_valid_after(now + dt.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(True, False, False, False, False, True, True,
                                                  False, False), critical=True)
                     .sign(self.key, hashes.SHA256()))

    def issue(self, cn: str, *, server: bool) -> tuple:
        key = _key()
        now = dt.datetime.now(dt.timezone.utc)
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
             .issuer_name(self.name).public_key(key.public_key())
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5))
             .not_valid_after(now + dt.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage(
                 [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                 critical=False))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
        return key, b.sign(self.key, hashes.SHA256())


@dataclass
class TestPKI:
    ca: str  # trusted CA certificate
    server_cert: str
    server_key: str
    client_cert: str  # signed by the trusted CA
    client_key: str
    rogue_ca: str  # a CA nobody trusts
    rogue_client_cert: str  # signed by the rogue CA
    rogue_client_key: str


def make_pki(d: Path) -> TestPKI:
    d.mkdir(parents=True, exist_ok=True)
    ca, rogue = CA("dspark test CA"), CA("rogue CA")
    sk, sc = ca.issue("dspark-service", server=True)
    ck, cc = ca.issue("dspark-client", server=False)
    rk, rc = rogue.issue("intruder", server=False)
    return TestPKI(
        ca=_write_cert(ca.cert, d / "ca.pem"),
        server_cert=_write_cert(sc, d / "server.pem"), server_key=_write_key(sk, d / "server.key"),
        client_cert=_write_cert(cc, d / "client.pem"), client_key=_write_key(ck, d / "client.key"),
        rogue_ca=_write_cert(rogue.cert, d / "rogue-ca.pem"),
        rogue_client_cert=_write_cert(rc, d / "rogue.pem"),
        rogue_client_key=_write_key(rk, d / "rogue.key"))
