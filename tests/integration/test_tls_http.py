"""TLS on v2proxy's own HTTP/1.1 server and client (v2proxy.http with the contexts of
v2proxy.ops.tls), on uvloop and plain asyncio: the SNI and Host header the client sends, bodies of
several MiB both ways through the TLS transports' flow control, keep-alive, verification of the
server's certificate (CA, host name), mutual TLS, and the handshake deadline."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from tests.tlspki import Pki, make_pki
from v2proxy.http.client import HttpClient
from v2proxy.http.client_errors import ConnectFailed, HttpClientError
from v2proxy.http.request import HttpRequest, ServerLimits
from v2proxy.http.response import HttpResponse
from v2proxy.http.server import HttpServer
from v2proxy.ops.tls import BackendTls, ListenerTls, client_context, server_context

# the loop is what is tested: on uvloop and plain asyncio (tests/conftest.py)
pytestmark = pytest.mark.both_loops


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


class Seen:
    def __init__(self) -> None:
        self.sni: list[str | None] = []


async def echo(req: HttpRequest, resp: HttpResponse) -> None:
    body = await req.read()
    if req.path == "/big":
        await resp.send(200, [], bytes(body) * 2)
        return
    answer = {
        "host": (req.header(b"host") or b"").decode(),
        "length": len(body),
        "sha": hashlib.sha256(body).hexdigest(),
    }
    await resp.send(200, [(b"content-type", b"application/json")], json.dumps(answer).encode())


Start = Callable[..., Awaitable[tuple[HttpServer, Seen]]]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    servers: list[HttpServer] = []

    async def factory(
        tls: ListenerTls, limits: ServerLimits | None = None
    ) -> tuple[HttpServer, Seen]:
        seen = Seen()
        ctx = server_context(tls)
        ctx.sni_callback = lambda _obj, name, _ctx: seen.sni.append(name)
        server = HttpServer(echo, limits or ServerLimits(), ssl_context=ctx)
        await server.start("127.0.0.1", 0)
        servers.append(server)
        return server, seen

    yield factory
    for server in servers:
        await server.close(1.0)


def _listener(pki: Pki, client_ca: Path | None = None) -> ListenerTls:
    return ListenerTls(
        str(pki.server.cert), str(pki.server.key), str(client_ca) if client_ca else None
    )


async def _get(client: HttpClient, target: str = "/", body: bytes = b"") -> tuple[int, bytes]:
    resp = await client.request("POST", target, [], [body] if body else None, call_timeout=30)
    return resp.status, bytes(await resp.read())


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
async def test_sni_and_host_header(start: Start, pki: Pki, host: str) -> None:
    """The client sends the URL's host as SNI when it is a name (none for an address, RFC 6066
    §3) and as the Host header with the port; the certificate is checked for that host."""
    server, seen = await start(_listener(pki))
    client = HttpClient(host, server.port, ssl=client_context(BackendTls(str(pki.ca))))
    status, body = await _get(client, "/", b"hello")
    assert status == 200
    answer = json.loads(body)
    assert answer["host"] == f"{host}:{server.port}"
    assert answer["length"] == 5
    assert seen.sni == (["localhost"] if host == "localhost" else [None])
    await client.close()


async def test_big_bodies_and_keep_alive(start: Start, pki: Pki) -> None:
    """6 MiB up and 12 MiB down through the TLS transports (reading paused and resumed on both
    sides), then small requests on the same connection."""
    server, seen = await start(_listener(pki))
    client = HttpClient("localhost", server.port, ssl=client_context(BackendTls(str(pki.ca))))
    big = bytes(range(256)) * (6 * 4096)
    status, body = await _get(client, "/big", big)
    assert status == 200
    assert len(body) == 2 * len(big)
    assert body[: len(big)] == big and body[len(big) :] == big
    for i in range(3):
        status, body = await _get(client, "/", b"x" * i)
        assert status == 200 and json.loads(body)["length"] == i
    assert len(seen.sni) == 1  # one TLS connection for all four requests
    await client.close()


@pytest.mark.parametrize(
    ("which", "reason"),
    [
        ("other_ca", "unable to get local issuer certificate"),
        ("wrong_name", "IP address mismatch, certificate is not valid for '127.0.0.1'."),
    ],
)
async def test_server_certificate_verified(start: Start, pki: Pki, which: str, reason: str) -> None:
    """A certificate of another CA, or one for another name: the connection is refused with a
    message naming TLS verification and why."""
    if which == "other_ca":
        tls = ListenerTls(str(pki.other_server.cert), str(pki.other_server.key))
    else:
        tls = ListenerTls(str(pki.wrong_name.cert), str(pki.wrong_name.key))
    server, _ = await start(tls)
    client = HttpClient("127.0.0.1", server.port, ssl=client_context(BackendTls(str(pki.ca))))
    with pytest.raises(ConnectFailed) as info:
        await _get(client)
    assert str(info.value) == (
        f"TLS verification of https://127.0.0.1:{server.port}'s certificate failed: {reason}"
    )
    await client.close()


async def test_mutual_tls(start: Start, pki: Pki) -> None:
    """With a client CA the server refuses a client without a certificate (in the handshake, or
    right after it under TLS 1.3) and serves one with a certificate of that CA."""
    server, _ = await start(_listener(pki, pki.ca))
    bare = HttpClient("localhost", server.port, ssl=client_context(BackendTls(str(pki.ca))))
    with pytest.raises(HttpClientError):
        await _get(bare)
    await bare.close()
    ctx = client_context(BackendTls(str(pki.ca), str(pki.client.cert), str(pki.client.key)))
    client = HttpClient("localhost", server.port, ssl=ctx)
    status, body = await _get(client, "/", b"ok")
    assert status == 200 and json.loads(body)["length"] == 2
    await client.close()


async def test_handshake_deadline_and_plain_http(start: Start, pki: Pki) -> None:
    """A connection that never starts its handshake is closed after the header timeout; plain
    HTTP on the TLS port gets no HTTP answer."""
    server, _ = await start(_listener(pki), ServerLimits(header_timeout=0.3))
    loop = asyncio.get_running_loop()
    for payload in (b"", b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n"):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.setblocking(False)
        try:
            if payload:
                await loop.sock_sendall(sock, payload)
            got = b""
            async with asyncio.timeout(10):
                while chunk := await _recv(loop, sock):
                    got += chunk
            assert not got.startswith(b"HTTP/")
        finally:
            sock.close()


async def _recv(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    try:
        return await loop.sock_recv(sock, 65536)
    except ConnectionResetError:
        return b""


def test_contexts_verify_by_default(pki: Pki) -> None:
    ctx = client_context(BackendTls())
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.get_ca_certs() or ctx.cert_store_stats()["x509_ca"] >= 0  # the system's store
    server = server_context(_listener(pki, pki.ca))
    assert server.verify_mode == ssl.CERT_REQUIRED
    assert server.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server_context(_listener(pki)).verify_mode == ssl.CERT_NONE


def _send_too_much(port: int, ca: Path) -> bytes:
    """A blocking TLS client that announces 8 MiB, keeps sending while it may, then reads."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as s,
    ):
        size = 8 << 20
        s.sendall(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % size)
        chunk = b"x" * 65536
        try:
            for _ in range(size // len(chunk)):
                s.sendall(chunk)
        except OSError:
            pass  # the server closed its side: what it answered is still to be read
        got = b""
        try:
            while data := s.recv(65536):
                got += data
        except OSError:
            pass
        return got


async def test_refusal_reaches_a_client_still_sending(start: Start, pki: Pki) -> None:
    """413 for a body over the limit, answered while the client is still sending it: the
    client reads the answer (the TLS close drops its input instead of resetting it)."""
    server, _ = await start(_listener(pki), ServerLimits(max_body_size=1 << 20))
    got = await asyncio.to_thread(_send_too_much, server.port, pki.ca)
    assert got.startswith(b"HTTP/1.1 413 ")
    assert got.endswith(b'{"error": "request body larger than 1048576 bytes"}')
