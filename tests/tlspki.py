"""Certificates made by the tests (the ``cryptography`` package): a CA, a server certificate for
``localhost``/``127.0.0.1``/``::1`` and a client certificate signed by it, and a second,
unrelated CA with its own server certificate (a wrong trust anchor), all written as PEM files.
EC P-256 keys: quick to make."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    folder: Path
    ca: Path  #: the CA every good certificate chains to
    server: Pair  #: localhost, 127.0.0.1, ::1 (server auth)
    client: Pair  #: CN=v2proxy-test-client (client auth)
    other_ca: Path  #: a CA nothing here is signed by
    other_server: Pair  #: localhost/127.0.0.1, signed by other_ca
    wrong_name: Pair  #: signed by ca, but for other.example only


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + _DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    cn: str,
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate],
    names: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca[1].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + _DAY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca[0].public_key()), critical=False
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(ca[0], hashes.SHA256())


def _save(
    folder: Path, stem: str, pair: tuple[ec.EllipticCurvePrivateKey, x509.Certificate]
) -> Pair:
    return Pair(
        _write_cert(pair[1], folder / f"{stem}.pem"), _write_key(pair[0], folder / f"{stem}.key")
    )


LOCAL = [
    x509.DNSName("localhost"),
    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    x509.IPAddress(ipaddress.ip_address("::1")),
]


def make_pki(folder: Path) -> Pki:
    """Every certificate and key of :class:`Pki`, written into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca("v2proxy test CA")
    other = _ca("another CA")
    server_auth, client_auth = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
    return Pki(
        folder=folder,
        ca=_write_cert(ca[1], folder / "ca.pem"),
        server=_save(folder, "server", _leaf("localhost", ca, LOCAL, server_auth)),
        client=_save(folder, "client", _leaf("v2proxy-test-client", ca, [], client_auth)),
        other_ca=_write_cert(other[1], folder / "other-ca.pem"),
        other_server=_save(folder, "other-server", _leaf("localhost", other, LOCAL, server_auth)),
        wrong_name=_save(
            folder,
            "wrong-name",
            _leaf("other.example", ca, [x509.DNSName("other.example")], server_auth),
        ),
    )
