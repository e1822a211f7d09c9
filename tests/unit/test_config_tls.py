"""TLS settings: https:// and grpcs:// backends parsed, the files checked once at start-up with
one clear line naming the option (command line, environment or file) at fault."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.tlspki import Pki, make_pki
from v2proxy.ops.config import BackendTarget, load_settings, parse_backend
from v2proxy.ops.config_sections import ConfigError
from v2proxy.ops.tls import BackendTls, ListenerTls


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("https://model:8443", BackendTarget("https", "https://model:8443", True)),
        ("https://model:8443/prefix/", BackendTarget("https", "https://model:8443/prefix", True)),
        ("grpcs://model:8001", BackendTarget("grpc", "model:8001", True)),
        ("grpc://model:8001", BackendTarget("grpc", "model:8001", False)),
        ("http://model:8000", BackendTarget("http", "http://model:8000", False)),
    ],
)
def test_backend_urls(url: str, target: BackendTarget) -> None:
    assert parse_backend(url) == target


def test_listener_and_backend_tls(pki: Pki) -> None:
    s = load_settings(
        {
            "tls_cert": str(pki.server.cert),
            "tls_key": str(pki.server.key),
            "tls_client_ca": str(pki.ca),
            "backend": "grpcs://localhost:8001",
            "backend_ca": str(pki.ca),
            "backend_cert": str(pki.client.cert),
            "backend_key": str(pki.client.key),
        },
        None,
        env={},
    )
    assert s.tls == ListenerTls(str(pki.server.cert), str(pki.server.key), str(pki.ca))
    assert s.backend_tls == BackendTls(str(pki.ca), str(pki.client.cert), str(pki.client.key))
    plain = load_settings({}, None, env={})
    assert (plain.tls, plain.backend_tls) == (None, BackendTls())


def test_env_and_file(pki: Pki, tmp_path: Path) -> None:
    env = {"V2PROXY_TLS_CERT": str(pki.server.cert), "V2PROXY_TLS_KEY": str(pki.server.key)}
    assert load_settings({}, None, env=env).tls == ListenerTls(
        str(pki.server.cert), str(pki.server.key)
    )
    conf = tmp_path / "c.yaml"
    conf.write_text(f"backend: https://localhost:9\nbackend_ca: {pki.ca}\n")
    assert load_settings({}, str(conf), env={}).backend_tls == BackendTls(str(pki.ca))


def _error(cli: dict[str, str], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(cli, None, env=env or {})
    return str(info.value)


def test_errors_name_the_option(pki: Pki, tmp_path: Path) -> None:
    cert, key = str(pki.server.cert), str(pki.server.key)
    missing = str(tmp_path / "nope.pem")
    assert _error({"tls_cert": missing, "tls_key": key}) == (
        f"--tls-cert={missing}: cannot read {missing}: No such file or directory"
    )
    assert _error({"tls_cert": cert, "tls_key": str(pki.client.key)}) == (
        f"--tls-key={pki.client.key}: the key in {pki.client.key} does not match the"
        f" certificate in {cert}"
    )
    assert _error({"tls_cert": key, "tls_key": key}) == (
        f"--tls-cert={key}: {key} holds no PEM certificate"
    )
    assert _error({"tls_cert": cert, "tls_key": cert}) == (
        f"--tls-key={cert}: {cert} holds no PEM private key"
    )
    assert _error({"tls_cert": cert}) == f"--tls-cert={cert}: 'tls_cert' needs 'tls_key' too"
    assert _error({}, {"V2PROXY_TLS_KEY": key}) == (
        f"V2PROXY_TLS_KEY={key}: 'tls_key' needs 'tls_cert' too"
    )
    assert _error({"tls_client_ca": str(pki.ca)}) == (
        f"--tls-client-ca={pki.ca}: 'tls_client_ca' needs 'tls_cert' and 'tls_key'"
    )
    assert _error({"tls_cert": cert, "tls_key": key, "tls_client_ca": key}) == (
        f"--tls-client-ca={key}: {key} holds no PEM certificate"
    )
    assert _error({"backend": "http://m:8000", "backend_ca": str(pki.ca)}) == (
        f"--backend-ca={pki.ca}: 'backend_ca' needs an https:// or grpcs:// backend"
    )
    assert _error({"backend": "https://m:8443", "backend_ca": missing}) == (
        f"--backend-ca={missing}: cannot read {missing}: No such file or directory"
    )
    assert _error(
        {"backend": "grpcs://m:1", "backend_cert": str(pki.client.cert), "backend_key": key}
    ) == (
        f"--backend-key={key}: the key in {key} does not match the certificate in {pki.client.cert}"
    )


def test_encrypted_key_refused_without_a_prompt(pki: Pki, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.server.key.read_bytes(), None)
    enc = tmp_path / "enc.key"
    enc.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    assert _error({"tls_cert": str(pki.server.cert), "tls_key": str(enc)}) == (
        f"--tls-key={enc}: {enc} is encrypted: give a key without a passphrase"
    )


def test_serve_exits_with_one_line(pki: Pki) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "v2proxy", "serve", "--tls-cert", str(pki.server.cert)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr == f"v2proxy: --tls-cert={pki.server.cert}: 'tls_cert' needs 'tls_key' too\n"
