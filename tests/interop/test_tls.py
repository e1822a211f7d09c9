"""TLS end to end with real clients and certificates made by the test (tests/tlspki.py):

- tritonclient.http (``ssl=True``) and tritonclient.grpc (``ssl=True``) through
  ``v2proxy serve --tls-cert --tls-key`` in front of the builtin models, on uvloop and asyncio;
- mutual TLS (``--tls-client-ca``): a client without a certificate is refused on both ports, one
  with a certificate of that CA is served;
- v2proxy in front of a TLS backend (a second v2proxy with TLS in front of the builtin models,
  since the reference server speaks no TLS): ``--backend https://...`` and ``grpcs://...`` with
  ``--backend-ca``; a wrong CA or a certificate for another name gives 503 naming the TLS
  verification; a client certificate presented to a backend that requires one."""

from __future__ import annotations

import contextlib
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent.ssl
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from geventhttpclient.response import HTTPConnectionClosed
from peers.launch import _free_ports, _stop
from peers.mindie_sim import tokens
from procs import Proc, https_status, v2proxy
from simple_io import assert_simple, grpc_inputs, http_inputs
from tritonclient.utils import InferenceServerException

from tests.tlspki import Pki, make_pki

#: 4 MiB of FP32 through identity_fp32: many TLS records, flow control on every hop
BIG = np.random.default_rng(5).standard_normal((1 << 20,), dtype=np.float32)
_PLAIN = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _client_ctx(pki: Pki, cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert:
        ctx.load_cert_chain(str(pki.client.cert), str(pki.client.key))
    return ctx


@contextlib.contextmanager
def tls_v2proxy(pki: Pki, *args: str, mutual: bool = False, name: str = "tls") -> Iterator[Proc]:
    """``v2proxy serve --tls-cert --tls-key ARGS`` on free loopback ports (``mutual``: with
    ``--tls-client-ca``), until the block ends; ready once its HTTPS liveness answers 200."""
    tls = ["--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)]
    if mutual:
        tls += ["--tls-client-ca", str(pki.ca)]
    with v2proxy("serve", *tls, *args, name=name, tls=_client_ctx(pki, cert=mutual)) as p:
        yield p


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def tls_proxy(request: pytest.FixtureRequest, pki: Pki) -> Iterator[Proc]:
    with tls_v2proxy(pki, "--event-loop", request.param, name=f"tls-{request.param}") as p:
        yield p


@pytest.fixture(scope="module")
def mtls_proxy(pki: Pki) -> Iterator[Proc]:
    with tls_v2proxy(pki, mutual=True, name="mtls") as p:
        yield p


# --------------------------------------------------------------------------- clients


def http_client(proxy: Proc, pki: Pki, cert: bool = False) -> httpclient.InferenceServerClient:
    options: dict[str, Any] = {"ca_certs": str(pki.ca)}
    if cert:
        options |= {"certfile": str(pki.client.cert), "keyfile": str(pki.client.key)}
    return httpclient.InferenceServerClient(
        f"localhost:{proxy.port}",
        ssl=True,
        ssl_options=options,
        ssl_context_factory=gevent.ssl.create_default_context,
        connection_timeout=10,
        network_timeout=30,
    )


def grpc_client(proxy: Proc, pki: Pki, cert: bool = False) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(
        f"localhost:{proxy.grpc_port}",
        ssl=True,
        root_certificates=str(pki.ca),
        private_key=str(pki.client.key) if cert else None,
        certificate_chain=str(pki.client.cert) if cert else None,
    )


def http_roundtrips(client: httpclient.InferenceServerClient) -> None:
    """Health, metadata, simple in JSON and binary, and 4 MiB through identity_fp32."""
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.get_model_metadata("simple")["inputs"][0]["name"] == "INPUT0"
    for binary in (False, True):
        outputs = [
            httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
        ]
        assert_simple(client.infer("simple", http_inputs(binary), outputs=outputs))
    big = httpclient.InferInput("INPUT0", [BIG.size], "FP32")
    big.set_data_from_numpy(BIG, binary_data=True)
    out = client.infer(
        "identity_fp32", [big], outputs=[httpclient.InferRequestedOutput("OUTPUT0", True)]
    ).as_numpy("OUTPUT0")
    assert out is not None and out.dtype == np.float32
    assert out.tobytes() == BIG.tobytes()


def grpc_roundtrips(client: grpcclient.InferenceServerClient) -> None:
    """Health, metadata, simple unary and over ModelStreamInfer, and 4 MiB through
    identity_fp32."""
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_model_metadata("simple").inputs[0].name == "INPUT0"
    assert_simple(client.infer("simple", grpc_inputs()))
    results: list[Any] = []
    client.start_stream(callback=lambda result, error: results.append((result, error)))
    for _ in range(2):
        client.async_stream_infer("simple", grpc_inputs())
    client.stop_stream()
    assert len(results) == 2
    for result, error in results:
        assert error is None
        assert_simple(result)
    big = grpcclient.InferInput("INPUT0", [BIG.size], "FP32")
    big.set_data_from_numpy(BIG)
    out = client.infer("identity_fp32", [big]).as_numpy("OUTPUT0")
    assert out is not None and out.tobytes() == BIG.tobytes()


# --------------------------------------------------------------------------- TLS listeners


def test_tritonclient_http_ssl(tls_proxy: Proc, pki: Pki) -> None:
    client = http_client(tls_proxy, pki)
    try:
        http_roundtrips(client)
    finally:
        client.close()


def test_tritonclient_grpc_ssl(tls_proxy: Proc, pki: Pki) -> None:
    client = grpc_client(tls_proxy, pki)
    try:
        grpc_roundtrips(client)
    finally:
        client.close()


def test_plain_clients_get_no_answer(tls_proxy: Proc, pki: Pki) -> None:
    """Plain HTTP and plaintext gRPC on the TLS ports are not served."""
    with pytest.raises((urllib.error.URLError, OSError)):
        _PLAIN.open(f"http://127.0.0.1:{tls_proxy.port}/v2/health/live", timeout=10)
    plain = grpcclient.InferenceServerClient(tls_proxy.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            plain.is_server_live(client_timeout=10)
        assert info.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
    finally:
        plain.close()


def test_mutual_tls_http(mtls_proxy: Proc, pki: Pki) -> None:
    """Without a client certificate the handshake (or the first read, under TLS 1.3) fails;
    with one signed by --tls-client-ca the client is served."""
    bare = http_client(mtls_proxy, pki)
    try:
        with pytest.raises(Exception) as info:
            bare.is_server_live()
        assert isinstance(info.value, ssl.SSLError | OSError | HTTPConnectionClosed)
    finally:
        bare.close()
    client = http_client(mtls_proxy, pki, cert=True)
    try:
        assert client.is_server_live()
        outputs = [
            httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")
        ]
        assert_simple(client.infer("simple", http_inputs(True), outputs=outputs))
    finally:
        client.close()


def test_mutual_tls_grpc(mtls_proxy: Proc, pki: Pki) -> None:
    bare = grpc_client(mtls_proxy, pki)
    try:
        with pytest.raises(InferenceServerException) as info:
            bare.is_server_live(client_timeout=10)
        assert info.value.status() == "StatusCode.UNAVAILABLE"
    finally:
        bare.close()
    client = grpc_client(mtls_proxy, pki, cert=True)
    try:
        assert client.is_server_live()
        assert_simple(client.infer("simple", grpc_inputs()))
    finally:
        client.close()


# --------------------------------------------------------------------------- TLS backends


@pytest.fixture(scope="module")
def tls_backend(pki: Pki) -> Iterator[Proc]:
    """The TLS backend: v2proxy with TLS in front of the builtin models."""
    with tls_v2proxy(pki, name="tls-backend") as p:
        yield p


def _backend_url(scheme: str, backend: Proc, host: str = "localhost") -> str:
    return f"{scheme}://{host}:{backend.port if scheme == 'https' else backend.grpc_port}"


@pytest.mark.parametrize(
    ("scheme", "loop"), [("https", "uvloop"), ("https", "asyncio"), ("grpcs", "uvloop")]
)
def test_proxy_to_tls_backend(tls_backend: Proc, pki: Pki, scheme: str, loop: str) -> None:
    """Plain clients through v2proxy to a TLS backend: every answer element by element."""
    url = _backend_url(scheme, tls_backend)
    with v2proxy(
        "serve", "--backend", url, "--backend-ca", str(pki.ca), "--event-loop", loop
    ) as front:
        client = httpclient.InferenceServerClient(front.url, network_timeout=30)
        try:
            http_roundtrips(client)
        finally:
            client.close()
        gclient = grpcclient.InferenceServerClient(front.grpc_url)
        try:
            grpc_roundtrips(gclient)
        finally:
            gclient.close()


def _infer_error(front: Proc) -> tuple[int, str]:
    body = json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                for n in ("INPUT0", "INPUT1")
            ]
        }
    ).encode()
    req = urllib.request.Request(f"{front.base_url}/v2/models/simple/infer", body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        _PLAIN.open(req, timeout=30)
    return info.value.code, json.loads(info.value.read())["error"]


@pytest.mark.parametrize("scheme", ["https", "grpcs"])
def test_wrong_ca(tls_backend: Proc, pki: Pki, scheme: str) -> None:
    """--backend-ca of another CA: 503 naming the failed TLS verification, REST and gRPC."""
    url = _backend_url(scheme, tls_backend)
    with v2proxy("serve", "--backend", url, "--backend-ca", str(pki.other_ca)) as front:
        status, message = _infer_error(front)
        assert status == 503
        if scheme == "https":
            assert message == (
                f"backend at {url} is unavailable for inference: TLS verification of"
                f" {url}'s certificate failed: unable to get local issuer certificate"
            )
        else:
            assert message.startswith(
                f"backend at localhost:{tls_backend.grpc_port} is unavailable"
            )
            assert "CERTIFICATE_VERIFY_FAILED" in message
        gclient = grpcclient.InferenceServerClient(front.grpc_url)
        try:
            with pytest.raises(InferenceServerException) as info:
                gclient.infer("simple", grpc_inputs())
            assert info.value.status() == "StatusCode.UNAVAILABLE"
            assert "certificate" in str(info.value).lower() or "CERTIFICATE" in str(info.value)
        finally:
            gclient.close()


@pytest.mark.parametrize("scheme", ["https", "grpcs"])
def test_backend_host_name_checked(pki: Pki, scheme: str) -> None:
    """A backend whose certificate (of the trusted CA) is for another name is refused."""
    wrong = ("--tls-cert", str(pki.wrong_name.cert), "--tls-key", str(pki.wrong_name.key))
    with (
        _raw_tls_backend(wrong) as backend,
        v2proxy(
            "serve",
            "--backend",
            _backend_url(scheme, backend, "127.0.0.1"),
            "--backend-ca",
            str(pki.ca),
        ) as front,
    ):
        status, message = _infer_error(front)
        assert status == 503
        if scheme == "https":
            assert message.endswith(
                "certificate failed: IP address mismatch, certificate is not valid for '127.0.0.1'."
            )
        else:
            assert "Hostname Verification Check failed" in message


@contextlib.contextmanager
def _raw_tls_backend(tls: tuple[str, ...]) -> Iterator[Proc]:
    """v2proxy serve with the TLS options ``tls`` (a certificate the test's CA cannot verify for
    its address), ready once its port accepts a TLS handshake with verification off."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with v2proxy("serve", *tls, name="raw-tls", tls=ctx) as p:
        yield p


@pytest.mark.parametrize("scheme", ["https", "grpcs"])
def test_client_certificate_to_backend(mtls_proxy: Proc, pki: Pki, scheme: str) -> None:
    """A backend that requires client certificates serves v2proxy with --backend-cert and
    --backend-key, and refuses it without (502 or 503, never a hang or a 200)."""
    url = _backend_url(scheme, mtls_proxy)
    cert = ("--backend-cert", str(pki.client.cert), "--backend-key", str(pki.client.key))
    with v2proxy("serve", "--backend", url, "--backend-ca", str(pki.ca), *cert) as front:
        client = httpclient.InferenceServerClient(front.url, network_timeout=30)
        try:
            outputs = [httpclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
            assert_simple(client.infer("simple", http_inputs(False), outputs=outputs))
        finally:
            client.close()
    with v2proxy("serve", "--backend", url, "--backend-ca", str(pki.ca)) as front:
        status, message = _infer_error(front)
        assert status in (502, 503)
        assert f"backend at {url if scheme == 'https' else url[8:]}" in message


@contextlib.contextmanager
def _tls_mindie(pki: Pki) -> Iterator[int]:
    """The MindIE simulator serving HTTPS, as a MindIE server does by default."""
    (port,) = _free_ports(1)
    sim = Path(__file__).resolve().parent / "peers" / "mindie_sim.py"
    proc = subprocess.Popen(
        [sys.executable, str(sim), "--port", str(port), "--tls-cert", str(pki.server.cert),
         "--tls-key", str(pki.server.key)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while https_status(f"https://localhost:{port}/health", _client_ctx(pki)) != 200:
            assert proc.poll() is None and time.monotonic() < deadline, "no MindIE simulator"
            time.sleep(0.05)
        yield port
    finally:
        _stop(proc)


def test_proxy_to_mindie_over_tls(pki: Pki) -> None:
    """mindies://: v2 clients reach a MindIE server over HTTPS (its default), verified against
    --backend-ca; another CA gives 503 naming the TLS verification."""
    with _tls_mindie(pki) as port:
        url = f"mindies://localhost:{port}"
        with v2proxy("serve", "--backend", url, "--backend-ca", str(pki.ca)) as front:
            client = httpclient.InferenceServerClient(front.url)
            try:
                prompt = httpclient.InferInput("text_input", [1], "BYTES")
                prompt.set_data_from_numpy(np.array([b"hello world"], dtype=object))
                result = client.infer("llm", [prompt])
                text = result.as_numpy("text_output")
                words = "".join(t for _, t in tokens(["hello", "world"], 20))  # the sim's 20
                assert text is not None and text.tolist() == [words.encode()]
            finally:
                client.close()
        with v2proxy("serve", "--backend", url, "--backend-ca", str(pki.other_ca)) as front:
            client = httpclient.InferenceServerClient(front.url)
            try:
                prompt = httpclient.InferInput("text_input", [1], "BYTES")
                prompt.set_data_from_numpy(np.array([b"hello"], dtype=object))
                with pytest.raises(InferenceServerException) as info:
                    client.infer("llm", [prompt])
                assert info.value.status() == "503"
                assert "TLS verification of" in str(info.value)
                assert "certificate failed: unable to get local issuer certificate" in str(
                    info.value
                )
            finally:
                client.close()
