"""`v2proxy inject` as a process: TLS with a test-made CA (cryptography), AdmissionReview over
HTTPS as the API server sends it, health, errors, certificate reload, a bad start."""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.client
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.deploy.deploytools import schema_errors

ADMISSION = Path(__file__).parent / "admission"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_pki(folder: Path, serial: int = 1) -> Path:
    """A CA (ca.pem) and a server certificate for localhost/127.0.0.1 it signed; the CA path."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("v2proxy-test-ca"))
        .issuer_name(_name("v2proxy-test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(1000 + serial)
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("v2proxy-injector.v2proxy.svc"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    # written whole then renamed, as the kubelet swaps a Secret volume's files
    for name, data in (
        ("tls.crt", cert.public_bytes(serialization.Encoding.PEM)),
        (
            "tls.key",
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        ),
    ):
        (folder / f"{name}.new").write_bytes(data)
        os.replace(folder / f"{name}.new", folder / name)
    return folder / "ca.pem"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Webhook:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ca = make_pki(folder)
        self.port = free_port()
        config = folder / "sidecar.yaml"
        config.write_text("image: registry.example.com/v2proxy:0.1.0\nmode: native\n")
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "v2proxy", "inject"),
                *("--tls-cert", str(folder / "tls.crt"), "--tls-key", str(folder / "tls.key")),
                *("--host", "127.0.0.1", "--port", str(self.port)),
                *("--sidecar-config", str(config), "--sidecar-mode", "classic"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"v2proxy inject exited: {self.proc.stdout.read()}")  # type: ignore[union-attr]
            try:
                if self.request("GET", "/healthz")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        pytest.fail("v2proxy inject did not start")

    def connection(self) -> http.client.HTTPSConnection:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        return http.client.HTTPSConnection("localhost", self.port, context=ctx, timeout=10)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn = self.connection()
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=10)
        assert self.proc.returncode == 0, out
        return out


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[Webhook]:
    hook = Webhook(tmp_path)
    try:
        yield hook
    finally:
        if hook.proc.poll() is None:
            hook.proc.kill()
        hook.proc.communicate()  # reaps it and closes its pipe


def test_admission_review_over_tls(webhook: Webhook) -> None:
    body = json.loads((ADMISSION / "review-triton.json").read_text())
    status, raw = webhook.request("POST", "/mutate", json.dumps(body).encode())
    assert status == 200
    out: dict[str, Any] = json.loads(raw)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    resp = out["response"]
    assert resp["uid"] == body["request"]["uid"] and resp["allowed"] is True
    pod = jsonpatch.apply_patch(
        body["request"]["object"], json.loads(base64.b64decode(resp["patch"]))
    )
    assert schema_errors(pod) == []
    # --sidecar-mode classic overrides the file's native; the file's image is used
    assert [c["name"] for c in pod["spec"]["containers"]] == ["triton", "v2proxy"]
    assert pod["spec"]["containers"][1]["image"] == "registry.example.com/v2proxy:0.1.0"

    plain = json.loads((ADMISSION / "review-plain.json").read_text())
    status, raw = webhook.request("POST", "/mutate", json.dumps(plain).encode())
    assert status == 200
    assert json.loads(raw)["response"] == {"uid": plain["request"]["uid"], "allowed": True}
    log = webhook.stop()
    assert "pod models/triton-7d9f8b6c5-*: patched" in log
    assert "pod default/kserve-sklearn: allowed" in log


def test_errors_and_health(webhook: Webhook) -> None:
    assert webhook.request("GET", "/healthz") == (200, b"ok\n")
    status, raw = webhook.request("POST", "/mutate", b"{not json")
    assert status == 400
    assert json.loads(raw)["error"].startswith("not an AdmissionReview v1 request:")
    status, raw = webhook.request("POST", "/mutate", b'{"kind": "AdmissionReview"}')
    assert (status, json.loads(raw)) == (
        400,
        {"error": "not an AdmissionReview v1 request: not an AdmissionReview request"},
    )
    assert webhook.request("GET", "/mutate")[0] == 405
    assert webhook.request("GET", "/elsewhere")[0] == 404
    assert webhook.request("POST", "/elsewhere", b"{}")[0] == 404
    # a client that is not TLS does not disturb the server
    with socket.create_connection(("127.0.0.1", webhook.port)) as raw_sock:
        raw_sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):
            assert raw_sock.recv(100) == b""  # closed without an answer
    assert webhook.request("GET", "/healthz")[0] == 200


def test_renewed_certificate_served_without_restart(webhook: Webhook) -> None:
    def serial() -> int:
        conn = webhook.connection()
        try:
            conn.connect()
            der = conn.sock.getpeercert(binary_form=True)  # type: ignore[union-attr]
        finally:
            conn.close()
        assert der is not None
        return int(x509.load_der_x509_certificate(der).serial_number)

    assert serial() == 1
    time.sleep(0.05)  # a distinct modification time
    webhook.ca = make_pki(webhook.folder, serial=2)
    assert serial() == 2


def test_bad_certificate_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate\n")
    (tmp_path / "tls.key").write_text("not a key\n")
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "v2proxy", "inject"),
            *("--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("v2proxy inject: ") and proc.stderr.count("\n") == 1


def test_bad_sidecar_config_stops_the_start(tmp_path: Path) -> None:
    make_pki(tmp_path)
    (tmp_path / "sidecar.yaml").write_text("httpPort: 0\n")
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "v2proxy", "inject"),
            *("--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")),
            *("--sidecar-config", str(tmp_path / "sidecar.yaml")),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        f"v2proxy inject: {tmp_path / 'sidecar.yaml'}: sidecar config httpPort: must be an"
        " integer 1..65535 (got 0)\n"
    )
