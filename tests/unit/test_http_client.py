"""v2proxy.http.client against tiny loopback servers that write canned bytes.

One conformance table (in the manner of h11's): the raw answer a server sends to a request, and
what the client must make of it (status, headers, body or exception, and whether the connection
is used again for the next request: counted by the server's accepts). Every case runs with the
answer delivered as it was written and cut into 1-byte and 7-byte pieces. Then behaviour:
retries, expiry, request bytes, timeouts, limits, flow control both ways.
"""

from __future__ import annotations

import array
import asyncio
import hashlib
import random
import socket
import ssl
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from v2proxy.http import client_conn
from v2proxy.http.client import HttpClient, StreamBody
from v2proxy.http.client_errors import (
    ConnectFailed,
    ConnectTimeout,
    Http2Answer,
    HttpClientError,
    ProtocolError,
    ReadTimeout,
    RemoteClosed,
)

# the loop is what is tested: on uvloop and plain asyncio (tests/conftest.py)
pytestmark = pytest.mark.both_loops

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class Server:
    port: int
    accepts: int = 0
    requests: list[bytes] = field(default_factory=list)  # each request's head and body


async def read_request(reader: asyncio.StreamReader, server: Server) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    body = await reader.readexactly(length)
    server.requests.append(head + body)
    return head, body


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    """serve(handler(reader, writer, server), host=...) -> a Server; its connections are
    closed when the handler returns, and cancelled at the end of the test."""
    servers: list[asyncio.Server] = []
    tasks: set[asyncio.Task[Any]] = set()

    async def start(handler: Callable[..., Awaitable[None]], host: str = "127.0.0.1") -> Server:
        srv = Server(0)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            srv.accepts += 1
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                await handler(reader, writer, srv)
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()
                tasks.discard(task)

        server = await asyncio.start_server(handle, host, 0)
        servers.append(server)
        srv.port = server.sockets[0].getsockname()[1]
        return srv

    yield start
    for task in list(tasks):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in servers:
        s.close()
        await s.wait_closed()


def echo_server(status: bytes = b"200 OK") -> Callable[..., Awaitable[None]]:
    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        while True:
            _, body = await read_request(reader, srv)
            writer.write(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body))
            await writer.drain()

    return handler


# ------------------------------------------------------------------------- conformance table


@dataclass
class Case:
    raw: bytes  # what the server writes in answer to the request
    status: int = 200
    headers: dict[bytes, bytes] = field(default_factory=dict)  # expected among the headers
    absent: tuple[bytes, ...] = ()  # expected not among the headers (a trailer's fields)
    body: bytes = b""
    error: type[HttpClientError] | None = None
    reused: bool = True  # the next request goes on the same connection
    method: str = "GET"
    close: bool = False  # the server closes the connection after writing `raw`


CL_BODY = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello"
CASES: dict[str, Case] = {
    "content-length": Case(CL_BODY, headers={b"x-a": b"b"}, body=b"hello"),
    "content-length-0": Case(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
    "no-reason-phrase": Case(b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", body=b"ok"),
    "chunked-extension-trailer": Case(
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'3\r\nabc\r\n4;ext=1;q="x"\r\ndefg\r\nA\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n',
        status=201,
        body=b"abcdefg0123456789",
        absent=(b"x-trailer",),
    ),
    "chunked-any-case": Case(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n", body=b"z"
    ),
    "read-to-close": Case(
        b"HTTP/1.1 200 OK\r\n\r\nuntil the end", body=b"until the end", reused=False, close=True
    ),
    "http10-not-pooled": Case(
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", body=b"ok", reused=False
    ),
    "http10-keep-alive": Case(
        b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok", body=b"ok"
    ),
    "connection-token-list": Case(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, CLOSE\r\nContent-Length: 2\r\n\r\nok",
        body=b"ok",
        reused=False,
    ),
    "te-gzip-chunked": Case(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n",
        error=ProtocolError,
        reused=False,
    ),
    "te-in-http10": Case(
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n",
        error=ProtocolError,
        reused=False,
    ),
    "204-no-body": Case(
        b"HTTP/1.1 204 No Content\r\nX-A: b\r\n\r\n", status=204, headers={b"x-a": b"b"}
    ),
    "304-no-body": Case(b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n", status=304),
    "head-content-length": Case(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
        headers={b"content-length": b"100"},
        method="HEAD",
    ),
    "head-chunked": Case(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", method="HEAD"),
    "head-then-stray-bytes": Case(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        headers={b"content-length": b"5"},
        method="HEAD",
        reused=False,
    ),
    "4xx-reused": Case(
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno", status=404, body=b"no"
    ),
    # a server's error handler often closes right after a 5xx without saying so (uvicorn)
    "5xx-not-reused": Case(
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\nno",
        status=500,
        body=b"no",
        reused=False,
    ),
    "5xx-keep-alive-not-reused": Case(
        b"HTTP/1.1 503 Service Unavailable\r\nConnection: keep-alive\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\nno\r\n0\r\n\r\n",
        status=503,
        body=b"no",
        reused=False,
    ),
    "head-5xx-not-reused": Case(
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 100\r\n\r\n",
        status=502,
        headers={b"content-length": b"100"},
        method="HEAD",
        reused=False,
    ),
    "100-continue-then-200": Case(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", body=b"ok"
    ),
    "103-early-hints-then-200": Case(
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nX-A: b\r\n"
        b"Content-Length: 2\r\n\r\nok",
        headers={b"x-a": b"b"},
        body=b"ok",
    ),
    "status-999": Case(
        b"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n", error=ProtocolError, reused=False
    ),
    "status-099": Case(
        b"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n", error=ProtocolError, reused=False
    ),
    "101-not-asked": Case(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
        error=ProtocolError,
        reused=False,
    ),
    "http2-version": Case(
        b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", error=ProtocolError, reused=False
    ),
    "200-this-is-not-http": Case(
        b"200 this is not http\r\n\r\n", error=ProtocolError, reused=False
    ),
    "garbage": Case(b"\x00\x01\xffgarbage\r\n\r\n", error=ProtocolError, reused=False),
    "bare-lf": Case(b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", error=ProtocolError, reused=False),
    "header-without-colon": Case(
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", error=ProtocolError, reused=False
    ),
    "content-length-and-chunked": Case(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"1\r\nz\r\n0\r\n\r\n",
        error=ProtocolError,
        reused=False,
    ),
    "content-length-differing": Case(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        error=ProtocolError,
        reused=False,
    ),
    # RFC 9110 §8.6 allows either; llhttp (and so this client) rejects equal duplicates too
    "content-length-duplicate-equal": Case(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
        error=ProtocolError,
        reused=False,
    ),
    "content-length-invalid": Case(
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", error=ProtocolError, reused=False
    ),
    "chunk-size-invalid": Case(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
        error=ProtocolError,
        reused=False,
    ),
    "chunk-size-negative": Case(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nab\r\n0\r\n\r\n",
        error=ProtocolError,
        reused=False,
    ),
    "chunk-longer-than-its-size": Case(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc\r\n0\r\n\r\n",
        error=ProtocolError,
        reused=False,
    ),
    "content-length-not-a-number": Case(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n1", error=ProtocolError, reused=False
    ),
    "body-shorter-than-length": Case(
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234",
        error=RemoteClosed,
        reused=False,
        close=True,
    ),
    "chunked-cut-short": Case(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n",
        error=RemoteClosed,
        reused=False,
        close=True,
    ),
    "closed-without-answer": Case(b"", error=RemoteClosed, reused=False, close=True),
    "head-too-large": Case(
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (70 * 1024) + b"\r\nContent-Length: 0\r\n\r\n",
        error=ProtocolError,
        reused=False,
    ),
    "bytes-past-the-answer": Case(
        CL_BODY + b"STRAY", headers={b"x-a": b"b"}, body=b"hello", reused=False
    ),
    "header-bytes-raw": Case(
        b"HTTP/1.1 200 OK\r\nX-Euro: \xe2\x82\xac\xff\r\nContent-Length: 0\r\n\r\n",
        headers={b"x-euro": b"\xe2\x82\xac\xff"},
    ),
}


#: what a gRPC server (grpc-core) sends first on a connection: its SETTINGS frame
HTTP2_SETTINGS = bytes.fromhex("000018040000000000000400400000000500400000000600004000fe0300000001")


@pytest.mark.parametrize("first", [True, False], ids=["on-accept", "after-the-request"])
async def test_an_http2_port_is_named_as_such(serve, first: bool) -> None:  # type: ignore[no-untyped-def]
    """A gRPC port sends its SETTINGS frame on accept (seen while the connection is idle, then it
    closes) or, as a test server here, after the request (llhttp: "Expected HTTP/"): either way
    Http2Answer, which the REST backend turns into "this port speaks gRPC"."""

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        if first:
            writer.write(HTTP2_SETTINGS)
        await read_request(reader, srv)
        if not first:
            writer.write(HTTP2_SETTINGS)
        await writer.drain()

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    with pytest.raises(Http2Answer) as failed:
        resp = await client.request("GET", "/v2/health/ready", [])
        await resp.read()
    assert str(failed.value) == "invalid HTTP/1.1 answer: the server sent HTTP/2 frames"
    await client.close()


@pytest.mark.parametrize("piece", [0, 1, 7], ids=["whole", "1-byte", "7-byte"])
@pytest.mark.parametrize("name", list(CASES))
async def test_conformance(serve, monkeypatch: pytest.MonkeyPatch, name: str, piece: int) -> None:  # type: ignore[no-untyped-def]
    case = CASES[name]
    if piece:
        deliver = client_conn.ClientConnection.data_received

        def in_pieces(self: client_conn.ClientConnection, data: bytes) -> None:
            for i in range(0, len(data), piece):
                deliver(self, data[i : i + piece])

        monkeypatch.setattr(client_conn.ClientConnection, "data_received", in_pieces)

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        while True:
            head, _ = await read_request(reader, srv)
            writer.write(OK if head.startswith(b"GET /next ") else case.raw)
            await writer.drain()
            if case.close:
                return

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    if case.error is not None:
        with pytest.raises(case.error):
            resp = await client.request(case.method, "/case", [])
            await resp.read()
    else:
        resp = await client.request(case.method, "/case", [])
        assert resp.status == case.status
        for k, v in case.headers.items():
            assert resp.header(k) == v
        assert await resp.read() == case.body
        for k in case.absent:
            assert resp.header(k) is None, k
        assert resp.keep_alive == (
            case.reused or name in ("bytes-past-the-answer", "head-then-stray-bytes")
        )
    resp = await client.request("GET", "/next", [])
    assert await resp.read() == b"ok"
    assert srv.accepts == (1 if case.reused else 2)
    assert client._slots._value == 100
    await client.close()


async def test_many_answers_on_one_connection_randomly_split(
    serve, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The keep-alive cases of the table one after another on one connection, delivered in
    pieces of random sizes: each answer is exact and the connection is kept throughout."""
    rng = random.Random(1234)
    kept = [name for name, c in CASES.items() if c.reused and c.error is None]
    deliver = client_conn.ClientConnection.data_received

    def randomly(self: client_conn.ClientConnection, data: bytes) -> None:
        i = 0
        while i < len(data):
            n = rng.choice([1, 2, 3, 5, 13, 100, 4096])
            deliver(self, data[i : i + n])
            i += n

    monkeypatch.setattr(client_conn.ClientConnection, "data_received", randomly)

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        while True:
            head, _ = await read_request(reader, srv)
            writer.write(CASES[head.split(b" ")[1][1:].decode()].raw)
            await writer.drain()

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    for _ in range(5):
        for name in kept:
            resp = await client.request(CASES[name].method, "/" + name, [])
            assert resp.status == CASES[name].status
            if rng.random() < 0.5:
                assert await resp.read() == CASES[name].body
            else:
                assert b"".join([c async for c in resp.iter_chunks()]) == CASES[name].body
    assert srv.accepts == 1
    await client.close()


# ------------------------------------------------------------------------- retries


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER on, 0 s), not a FIN."""
    writer.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
    )
    writer.transport.abort()


@pytest.mark.parametrize("rst", [False, True], ids=["close", "reset"])
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
async def test_post_on_a_dropped_reused_connection_is_never_resent(  # type: ignore[no-untyped-def]
    serve, method: str, rst: bool
) -> None:
    """The kept connection ends after the server read the request, before a byte of answer:
    the server may have acted on it (an inference that ran), so it is not sent again, though
    its body is in memory. Only GET, HEAD and OPTIONS are resent."""

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        await read_request(reader, srv)
        writer.write(OK)
        await writer.drain()
        await read_request(reader, srv)  # read the request, then end without answering
        if rst:
            _reset(writer)

    srv = await serve(handler)
    retries: list[int] = []
    client = HttpClient("127.0.0.1", srv.port, on_retry=lambda: retries.append(1))
    assert await (await client.request("GET", "/", [])).read() == b"ok"
    with pytest.raises(RemoteClosed, match="before the answer's head") as info:
        await client.request(method, "/post", [(b"x-a", b"1")], [b"pay", memoryview(b"load")])
    assert info.value.request_sent
    assert [r.split(b" ", 1)[0] for r in srv.requests] == [b"GET", method.encode()]
    assert srv.requests[1].endswith(b"\r\n\r\npayload")
    await asyncio.sleep(0.05)  # a resend would have reached the server by now
    assert len(srv.requests) == 2 and srv.accepts == 1 and retries == []
    assert client._slots._value == 100 and not client._idle
    await client.close()


@pytest.mark.parametrize(
    ("status", "delay", "rst"),
    [
        (500, None, False),
        (500, None, True),
        (500, 0.02, False),
        (500, 0.02, True),
        (200, None, False),
        (200, None, True),
    ],
    ids=[
        "500-close-at-once",
        "500-reset-at-once",
        "500-close-racing",
        "500-reset-racing",
        "200-close-at-once",
        "200-reset-at-once",
    ],
)
async def test_answer_then_close_without_connection_close(  # type: ignore[no-untyped-def]
    serve, status: int, delay: float | None, rst: bool
) -> None:
    """uvicorn after a 500 (MLServer, KServe): a whole answer, keep-alive by its head, then the
    connection closed, at once or a little later (the traceback is logged first: racing the
    next request). A 5xx's connection is never reused, so the next request always goes on a
    new one and nothing is resent. A 200 then a close at once: the end is on the socket when
    the next request comes, and the look before reuse (:meth:`ClientConnection.alive`) keeps
    that connection from being handed out (a POST on it would fail, never resent). Every POST
    is answered once."""

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        _, body = await read_request(reader, srv)
        writer.write(b"HTTP/1.1 %d Whatever\r\nContent-Length: %d\r\n\r\n" % (status, len(body)))
        writer.write(body)
        await writer.drain()
        if delay is not None:
            await asyncio.sleep(delay)  # the client's next request would be on its way by then
        if rst:
            _reset(writer)

    srv = await serve(handler)
    retries: list[int] = []
    client = HttpClient("127.0.0.1", srv.port, on_retry=lambda: retries.append(1))
    for i in range(5):
        resp = await client.request("POST", "/v2/models/m/infer", [], [b"request %d" % i])
        assert (resp.status, await resp.read()) == (status, b"request %d" % i)
    assert srv.accepts == 5  # one connection per answer
    assert [r.rsplit(b" ", 1)[1] for r in srv.requests] == [b"0", b"1", b"2", b"3", b"4"]
    assert retries == []  # each request went out once, on a new connection
    assert client._slots._value == 100
    await client.close()


async def test_idle_connection_whose_end_the_loop_has_not_read_is_not_used() -> None:
    """The server's FIN is on the socket but the loop has not run since: the pooled connection
    is looked at before reuse and not handed out, so even a body that cannot be sent again
    (a stream) goes out once, on a new connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    port = listener.getsockname()[1]
    seen: list[bytes] = []

    def run() -> None:  # answers each connection's first request, then closes it
        for _ in range(2):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data or not data.endswith((b"0", b"1")):
                    data += conn.recv(65536)
                seen.append(data)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"body 1"

    retries: list[int] = []
    client = HttpClient("127.0.0.1", port, on_retry=lambda: retries.append(1))
    try:
        assert await (await client.request("POST", "/", [], [b"body 0"])).read() == b"ok"
        time.sleep(0.2)  # noqa: ASYNC251 (on purpose: the FIN comes, the loop does not read it)
        assert client._idle and client._idle[0].reusable  # not seen by the loop yet
        resp = await client.request("POST", "/", [], StreamBody(6, chunks()))
        assert await resp.read() == b"ok"
        assert [d.rsplit(b"\n", 1)[1] for d in seen] == [b"body 0", b"body 1"]
        assert retries == []
    finally:
        await client.close()
        listener.close()
        thread.join(5)


async def test_no_retry_when_the_answer_had_begun_then_reset(serve) -> None:  # type: ignore[no-untyped-def]
    """Part of the head came, then an RST: the server has the request; even a GET is not
    resent."""

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        await read_request(reader, srv)
        writer.write(OK)
        await writer.drain()
        await read_request(reader, srv)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Le")
        await writer.drain()
        await asyncio.sleep(0.05)  # the client has read those bytes
        _reset(writer)

    srv = await serve(handler)
    retries: list[int] = []
    client = HttpClient("127.0.0.1", srv.port, on_retry=lambda: retries.append(1))
    assert await (await client.request("GET", "/", [])).read() == b"ok"
    with pytest.raises(RemoteClosed, match="before the answer's head"):
        await client.request("GET", "/half", [])
    assert len(srv.requests) == 2 and srv.accepts == 1 and retries == []
    assert client._slots._value == 100 and not client._idle
    await client.close()


async def test_partly_sent_streamed_body_is_not_resent(serve) -> None:  # type: ignore[no-untyped-def]
    """The kept connection is reset while a streamed body goes out: its first part is gone
    (a GET: what may be resent)."""
    pulled: list[int] = []

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        await read_request(reader, srv)
        writer.write(OK)
        await writer.drain()
        srv.requests.append(await reader.readuntil(b"\r\n\r\n") + await reader.readexactly(4))
        _reset(writer)

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(3):
            pulled.append(i)
            yield b"part"
            await asyncio.sleep(0.05)

    srv = await serve(handler)
    retries: list[int] = []
    client = HttpClient("127.0.0.1", srv.port, on_retry=lambda: retries.append(1))
    assert await (await client.request("GET", "/", [])).read() == b"ok"
    with pytest.raises(RemoteClosed):
        await client.request("GET", "/", [], StreamBody(12, chunks()))
    assert srv.accepts == 1 and retries == [] and len(srv.requests) == 2
    assert 1 <= len(pulled) < 3
    await client.close()


async def test_resent_once_only_and_never_from_a_new_connection(serve) -> None:  # type: ignore[no-untyped-def]
    """A GET: a new connection that ends before a byte of answer fails the request (the server
    may have it), whether it was the first try or the one resend. A POST in the same place is
    not resent at all."""

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        while True:
            head, _ = await read_request(reader, srv)
            if not head.startswith(b"GET / "):
                return  # dropped without a byte of answer
            writer.write(OK)
            await writer.drain()

    srv = await serve(handler)
    retries: list[int] = []
    client = HttpClient("127.0.0.1", srv.port, on_retry=lambda: retries.append(1))

    def seen() -> list[bytes]:
        return [r.split(b" HTTP/", 1)[0] for r in srv.requests]

    assert await (await client.request("GET", "/", [])).read() == b"ok"
    with pytest.raises(RemoteClosed) as info:  # kept connection, then its one resend: dropped
        await client.request("GET", "/a", [])
    assert info.value.request_sent
    assert seen() == [b"GET /", b"GET /a", b"GET /a"]
    assert srv.accepts == 2 and retries == [1]
    with pytest.raises(RemoteClosed) as info:  # a new connection from the start: never resent
        await client.request("GET", "/b", [])
    assert info.value.request_sent
    assert seen()[3:] == [b"GET /b"] and srv.accepts == 3 and retries == [1]
    # the same with a POST on a kept connection: dropped once, never resent
    assert await (await client.request("GET", "/", [])).read() == b"ok"
    with pytest.raises(RemoteClosed) as info:
        await client.request("POST", "/c", [], [b"c"])
    assert info.value.request_sent
    await asyncio.sleep(0.05)  # a resend would have reached the server by now
    assert seen()[4:] == [b"GET /", b"POST /c"] and srv.accepts == 4 and retries == [1]
    assert client._slots._value == 100 and not client._idle
    await client.close()


@pytest.mark.parametrize("which", ["read_timeout", "call_timeout"])
async def test_timeout_on_a_kept_connection_is_not_resent(serve, which: str) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        await read_request(reader, srv)
        writer.write(OK)
        await writer.drain()
        await stall_after(reader, writer, srv, b"")

    srv = await serve(handler)
    retries: list[int] = []
    client = HttpClient("127.0.0.1", srv.port, on_retry=lambda: retries.append(1))
    assert await (await client.request("GET", "/", [])).read() == b"ok"
    with pytest.raises(ReadTimeout):  # a GET, which a dropped connection would resend
        await client.request("GET", "/", [], **{which: 0.2})
    assert srv.accepts == 1 and len(srv.requests) == 2 and retries == []
    await client.close()


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_resend_goes_on_a_new_connection_within_the_limit(serve, method: str) -> None:  # type: ignore[no-untyped-def]
    """Two kept connections; a GET dropped on one is resent on a new one, not on the other
    kept one, whose place it takes (at most ``limit`` open). A POST dropped there is not
    resent: it fails, and the other kept connection stays."""
    open_now = most = 0
    dropped = False

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        nonlocal open_now, most, dropped
        open_now += 1
        most = max(most, open_now)
        try:
            n = 0
            while True:
                await read_request(reader, srv)
                n += 1
                if n == 2 and not dropped:
                    dropped = True
                    return
                await asyncio.sleep(0.05 if n == 1 else 0)
                writer.write(OK)
                await writer.drain()
        finally:
            open_now -= 1

    srv = await serve(handler)
    retries: list[int] = []
    client = HttpClient("127.0.0.1", srv.port, limit=2, on_retry=lambda: retries.append(1))

    async def call(target: bytes) -> bytes | bytearray:
        body = None if method == "GET" else [target]
        return await (await client.request(method, target.decode(), [], body)).read()

    assert list(await asyncio.gather(call(b"/1"), call(b"/2"))) == [b"ok", b"ok"]
    assert len(client._idle) == 2
    if method == "GET":
        assert await call(b"/3") == b"ok"
        assert srv.accepts == 3 and retries == [1] and most <= 2
    else:
        with pytest.raises(RemoteClosed):
            await call(b"/3")
        await asyncio.sleep(0.05)  # a resend would have reached the server by now
        assert srv.accepts == 2 and retries == [] and most <= 2
    targets = [r.split(b" ", 2)[1] for r in srv.requests]
    assert sorted(targets[:2]) == [b"/1", b"/2"]
    assert targets[2:] == ([b"/3", b"/3"] if method == "GET" else [b"/3"])
    assert len(client._idle) == 1 and client._slots._value == 2
    await client.close()


async def test_get_on_a_dropped_reused_connection_is_retried_once(serve) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        first = srv.accepts == 1
        while True:
            head, _ = await read_request(reader, srv)
            if first and head.startswith(b"GET /again"):
                return  # dropped without a byte of answer
            writer.write(OK)
            await writer.drain()

    srv = await serve(handler)
    retries: list[int] = []
    client = HttpClient("127.0.0.1", srv.port, on_retry=lambda: retries.append(1))
    assert await (await client.request("GET", "/", [])).read() == b"ok"
    assert await (await client.request("GET", "/again", [])).read() == b"ok"
    assert [r.split(b"\r\n", 1)[0] for r in srv.requests] == [
        b"GET / HTTP/1.1",
        b"GET /again HTTP/1.1",
        b"GET /again HTTP/1.1",
    ]
    assert srv.accepts == 2
    assert retries == [1]  # counted (v2proxy_backend_retries_total)
    await client.close()


async def test_streamed_body_is_never_sent_twice(serve) -> None:  # type: ignore[no-untyped-def]
    """Even a GET: a body still arriving cannot be replayed."""

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        await read_request(reader, srv)
        writer.write(OK)
        await writer.drain()
        await read_request(reader, srv)  # then closed without answering

    async def chunks() -> AsyncIterator[bytes]:
        yield b"drop"
        yield b"-streamed"

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    assert await (await client.request("GET", "/", [])).read() == b"ok"
    with pytest.raises(RemoteClosed):
        await client.request("GET", "/", [], StreamBody(13, chunks()))
    assert len(srv.requests) == 2 and srv.requests[1].endswith(b"drop-streamed")
    assert srv.accepts == 1 and client._slots._value == 100
    await client.close()


@pytest.mark.parametrize(
    ("raw", "arrived"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 300_000, b"x" * 300_000),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n5\r\n56", b"0123456"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n0\r\nX-T: 1\r\n",
            b"01234",
        ),
    ],
    ids=["long-length", "chunk-data", "trailers"],
)
async def test_answer_ending_early_while_streamed(serve, raw: bytes, arrived: bytes) -> None:  # type: ignore[no-untyped-def]
    """What arrived is handed out, then RemoteClosed; the slot is given back."""

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        await read_request(reader, srv)
        writer.write(raw)
        await writer.drain()

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    resp = await client.request("GET", "/", [])
    got: list[bytes] = []
    with pytest.raises(RemoteClosed):
        async for chunk in resp.iter_chunks():
            got.append(chunk)
    assert b"".join(got) == arrived
    assert client._slots._value == 100 and not client._idle
    await client.close()


async def test_no_retry_once_part_of_the_answer_came(serve) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        while True:
            head, _ = await read_request(reader, srv)
            if head.startswith(b"GET /half"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Le")
                await writer.drain()
                return
            writer.write(OK)
            await writer.drain()

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    assert await (await client.request("GET", "/", [])).read() == b"ok"
    with pytest.raises(RemoteClosed):
        await client.request("GET", "/half", [])
    assert len(srv.requests) == 2 and srv.accepts == 1
    await client.close()


# ------------------------------------------------------------------------- pool


async def test_idle_connections_expire(serve) -> None:  # type: ignore[no-untyped-def]
    srv = await serve(echo_server())
    client = HttpClient("127.0.0.1", srv.port, idle_timeout=0.2)
    assert await (await client.request("POST", "/", [], [b"a"])).read() == b"a"
    assert await (await client.request("POST", "/", [], [b"b"])).read() == b"b"
    assert srv.accepts == 1
    await asyncio.sleep(0.5)
    assert not client._idle  # closed by the sweep, not only skipped
    assert await (await client.request("POST", "/", [], [b"c"])).read() == b"c"
    assert srv.accepts == 2
    await client.close()


async def test_idle_connection_ended_by_the_server_is_not_used(serve) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        _, body = await read_request(reader, srv)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()  # then closes: keep-alive said, but not kept

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    for i in range(3):  # POSTs: never resent, so each must go on a live connection
        assert await (await client.request("POST", "/", [], [b"%d" % i])).read() == b"%d" % i
        for _ in range(500):  # until the server's FIN reached the idle connection
            if not client._idle[0].reusable:
                break
            await asyncio.sleep(0.01)
    assert srv.accepts == 3
    await client.close()


async def test_stray_bytes_on_an_idle_connection(serve) -> None:  # type: ignore[no-untyped-def]
    sent = asyncio.Event()

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        while True:
            await read_request(reader, srv)
            writer.write(OK)
            await writer.drain()
            if srv.accepts == 1:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nSTRAY")
                await writer.drain()
                sent.set()

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    assert await (await client.request("GET", "/", [])).read() == b"ok"
    await sent.wait()
    for _ in range(500):
        if not client._idle or not client._idle[0].reusable:
            break
        await asyncio.sleep(0.01)
    assert await (await client.request("GET", "/", [])).read() == b"ok"
    assert srv.accepts == 2
    await client.close()


async def test_pool_limit_and_concurrency(serve) -> None:  # type: ignore[no-untyped-def]
    open_now = most = 0

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        nonlocal open_now, most
        open_now += 1
        most = max(most, open_now)
        try:
            while True:
                _, body = await read_request(reader, srv)
                await asyncio.sleep(0.001)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        finally:
            open_now -= 1

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port, limit=3)

    async def one(i: int) -> bytes:
        return bytes(await (await client.request("POST", "/", [], [b"req-%d" % i])).read())

    answers = await asyncio.gather(*(one(i) for i in range(60)))
    assert answers == [b"req-%d" % i for i in range(60)]
    assert srv.accepts == 3 and most == 3 and client._slots._value == 3
    await client.close()


# ------------------------------------------------------------------------- request bytes


async def test_request_bytes(serve) -> None:  # type: ignore[no-untyped-def]
    srv = await serve(echo_server(b"204 No Content"))
    client = HttpClient("127.0.0.1", srv.port)
    headers = [(b"X-Euro", b"\xe2\x82\xac"), (b"x-raw", b"\xff\x80 a"), (b"Content-Type", b"a/b")]
    for body in ([b"ab", memoryview(b"cd")], None):
        (await client.request("POST", "/v2/m/infer?q=1", headers, body)).close()
    (await client.request("GET", "/caf\xc3\xa9/\xe2\x82\xac", [])).close()  # latin-1 decoded
    assert srv.requests == [
        b"POST /v2/m/infer?q=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-Euro: \xe2\x82\xac\r\n"
        b"x-raw: \xff\x80 a\r\nContent-Type: a/b\r\nContent-Length: 4\r\n\r\nabcd" % srv.port,
        b"POST /v2/m/infer?q=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-Euro: \xe2\x82\xac\r\n"
        b"x-raw: \xff\x80 a\r\nContent-Type: a/b\r\nContent-Length: 0\r\n\r\n" % srv.port,
        b"GET /caf\xc3\xa9/\xe2\x82\xac HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % srv.port,
    ]
    await client.close()


async def test_request_bytes_with_fixed_headers(serve) -> None:  # type: ignore[no-untyped-def]
    """Headers given as a tuple: the head remembered per (method, target) and tuple is the one
    written for a list of the same headers, whatever the length (or none), and another tuple
    on the same target is a head of its own."""
    srv = await serve(echo_server(b"204 No Content"))
    client = HttpClient("127.0.0.1", srv.port)
    fixed = ((b"X-Euro", b"\xe2\x82\xac"), (b"Content-Type", b"a/b"))
    other = ((b"Content-Type", b"c/d"),)
    calls: list[tuple[str, tuple[tuple[bytes, bytes], ...], list[bytes] | None]] = [
        ("POST", fixed, [b"ab"]),
        ("POST", fixed, [b"abcdefghijkl"]),
        ("POST", fixed, None),
        ("POST", other, [b"ab"]),
        ("POST", fixed, [b"a"]),
        ("GET", fixed, None),
        ("GET", fixed, None),
        ("GET", (), None),
        ("GET", (), None),
        # the last head of a size is kept: the same size again, then another, then none
        ("POST", fixed, [b"cd"]),
        ("POST", fixed, [b"ef"]),
        ("POST", fixed, [b"ghi"]),
        ("POST", fixed, None),
        ("POST", fixed, [b"jk"]),
    ]
    for method, headers, body in calls:
        (await client.request(method, "/v2/m/infer", headers, body)).close()
    for method, headers, body in calls:
        (await client.request(method, "/v2/m/infer", list(headers), body)).close()
    assert srv.requests[: len(calls)] == srv.requests[len(calls) :]
    assert srv.requests[:4] == [
        b"POST /v2/m/infer HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-Euro: \xe2\x82\xac\r\n"
        b"Content-Type: a/b\r\nContent-Length: 2\r\n\r\nab" % srv.port,
        b"POST /v2/m/infer HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-Euro: \xe2\x82\xac\r\n"
        b"Content-Type: a/b\r\nContent-Length: 12\r\n\r\nabcdefghijkl" % srv.port,
        b"POST /v2/m/infer HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-Euro: \xe2\x82\xac\r\n"
        b"Content-Type: a/b\r\nContent-Length: 0\r\n\r\n" % srv.port,
        b"POST /v2/m/infer HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: c/d\r\n"
        b"Content-Length: 2\r\n\r\nab" % srv.port,
    ]
    assert (
        srv.requests[5]
        == srv.requests[6]
        == (
            b"GET /v2/m/infer HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-Euro: \xe2\x82\xac\r\n"
            b"Content-Type: a/b\r\n\r\n" % srv.port
        )
    )
    await client.close()


async def test_invalid_fixed_headers_are_refused_every_time() -> None:
    client = HttpClient("127.0.0.1", 9)  # never connected: refused before
    for headers in (((b"X-A", b"a\r\nX-Injected: 1"),), ((b"Host", b"elsewhere"),)):
        for _ in range(2):
            with pytest.raises(ValueError):
                await client.request("POST", "/", headers, [b"x"])
    assert client._slots._value == 100
    await client.close()


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/", [(b"X-A", b"a\r\nX-Injected: 1")]),
        ("/", [(b"X-A", b"a\nb")]),
        ("/", [(b"X-A", b"a\x00")]),
        ("/", [(b"X A", b"a")]),
        ("/", [(b"X-A:", b"a")]),
        ("/", [(b"", b"a")]),
        ("/", [(b"Host", b"elsewhere")]),
        ("/", [(b"content-length", b"3")]),
        ("/", [(b"Transfer-Encoding", b"chunked")]),
        ("http://h/", []),
        ("/a b", []),
        ("/a\r\nX: 1", []),
        ("/a\x00", []),
        ("/\u20ac", []),  # past latin-1: the caller must percent-encode
    ],
)
async def test_invalid_requests_are_refused(
    target: str, headers: list[tuple[bytes, bytes]]
) -> None:
    client = HttpClient("127.0.0.1", 9)  # never connected: refused before
    with pytest.raises(ValueError):
        await client.request("GET", target, headers)
    assert client._slots._value == 100
    await client.close()


async def test_ipv6_host_header(serve) -> None:  # type: ignore[no-untyped-def]
    try:
        srv = await serve(echo_server(), host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    client = HttpClient("::1", srv.port)
    assert await (await client.request("POST", "/", [], [b"x"])).read() == b"x"
    assert srv.requests[0].startswith(b"POST / HTTP/1.1\r\nHost: [::1]:%d\r\n" % srv.port)
    await client.close()


@pytest.mark.parametrize("size", [10, 100_000, 9 << 20])
async def test_buffer_bodies_of_any_format(serve, size: int) -> None:  # type: ignore[no-untyped-def]
    """Content-Length counts bytes, not items, of typed memoryviews; small bodies (joined with
    the head) and big ones (written buffer by buffer) arrive the same."""
    floats = memoryview(array.array("f", range(size // 4)))
    parts = [b"[", floats, bytearray(b"]"), memoryview(b"0123456789")[2:5]]
    srv = await serve(echo_server())
    client = HttpClient("127.0.0.1", srv.port)
    assert await (await client.request("POST", "/", [], parts)).read() == b"".join(parts)
    await client.close()


async def test_streamed_request_body_with_backpressure(
    serve, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    parts = [b"head", random.Random(3).randbytes(20 << 20), b"", memoryview(b"tail" * 1000)]
    body = b"".join(parts)
    paused = []
    pause = client_conn.ClientConnection.pause_writing

    def counting(self: client_conn.ClientConnection) -> None:
        paused.append(1)
        pause(self)

    monkeypatch.setattr(client_conn.ClientConnection, "pause_writing", counting)

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        await asyncio.sleep(0.2)  # not reading yet: the client's transport must push back
        while True:
            _, got = await read_request(reader, srv)
            digest = hashlib.sha256(got).hexdigest().encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n" + digest)
            await writer.drain()

    async def chunks() -> AsyncIterator[bytes | memoryview]:
        for part in parts:
            await asyncio.sleep(0)
            yield part

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    resp = await client.request("POST", "/", [], StreamBody(len(body), chunks()))
    assert await resp.read() == hashlib.sha256(body).hexdigest().encode()
    assert paused  # the transport pushed back and the body waited
    resp = await client.request("POST", "/", [], [b"x"])  # the connection is reused
    assert await resp.read() == hashlib.sha256(b"x").hexdigest().encode()
    assert srv.accepts == 1
    await client.close()


# ------------------------------------------------------------------------- timeouts, errors


async def stall_after(reader: Any, writer: Any, srv: Server, raw: bytes) -> None:
    await read_request(reader, srv)
    writer.write(raw)
    await writer.drain()
    await asyncio.sleep(30)  # cancelled at the end of the test


@pytest.mark.parametrize("how", ["read", "iter_chunks", "head"])
async def test_read_timeout(serve, how: str) -> None:  # type: ignore[no-untyped-def]
    """The server sends part of the answer, then nothing: the idle-read deadline fails the
    wait, the connection is closed and its slot given back."""
    raw = b"" if how == "head" else b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf"
    srv = await serve(lambda r, w, s: stall_after(r, w, s, raw))
    client = HttpClient("127.0.0.1", srv.port, limit=2)
    with pytest.raises(ReadTimeout):
        resp = await client.request("GET", "/", [], read_timeout=0.2)
        if how == "read":
            await resp.read()
        else:
            assert [c async for c in resp.iter_chunks()] == [b"half"]
    assert client._slots._value == 2 and not client._idle
    await client.close()


async def test_call_timeout_bounds_the_whole_answer(serve) -> None:  # type: ignore[no-untyped-def]
    """``call_timeout``: an answer trickling in (each byte within ``read_timeout``) still fails
    at the call's deadline, on the head and on read(); the slot is given back, and a
    connection back in the pool is never failed by an earlier call's deadline."""

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        while True:
            head, _ = await read_request(reader, srv)
            if head.startswith(b"GET /fast"):
                writer.write(OK)
                await writer.drain()
                continue
            raw = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
            if head.startswith(b"GET /head"):
                raw = b"HTTP/1.1 200 OK\r\nX-Pad: "  # the head itself trickles
            writer.write(raw)
            await writer.drain()
            for _ in range(100):
                await asyncio.sleep(0.05)
                writer.write(b"x")
                await writer.drain()

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port, limit=2)
    for path in ("/head", "/body"):
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(ReadTimeout):
            resp = await client.request("GET", path, [], read_timeout=1.0, call_timeout=0.3)
            await resp.read()
        assert 0.25 < asyncio.get_running_loop().time() - t0 < 0.9
        assert client._slots._value == 2 and not client._idle
    resp = await client.request("GET", "/fast", [], read_timeout=1.0, call_timeout=0.2)
    assert await resp.read() == b"ok"
    await asyncio.sleep(0.3)  # past that call's deadline, idle in the pool
    resp = await client.request("GET", "/fast", [], call_timeout=0.2)
    assert await resp.read() == b"ok"
    assert srv.accepts == 3  # the last call reused the pooled connection
    await client.close()


async def test_stream_lifts_the_call_timeout(serve) -> None:  # type: ignore[no-untyped-def]
    """After :meth:`ClientResponse.stream` only the idle-read timeout bounds the body."""

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        await read_request(reader, srv)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n")
        for _ in range(8):
            await asyncio.sleep(0.05)
            writer.write(b"x")
            await writer.drain()
        await asyncio.sleep(30)

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    resp = await client.request("GET", "/", [], read_timeout=0.3, call_timeout=0.2)
    resp.stream()
    assert b"".join([c async for c in resp.iter_chunks()]) == b"x" * 8
    await client.close()


async def test_read_timeout_counts_only_waits(serve) -> None:  # type: ignore[no-untyped-def]
    """A slow consumer is not a slow server: time between waits is not counted."""

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        await read_request(reader, srv)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(b"1\r\nb\r\n0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(30)

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    resp = await client.request("GET", "/", [], read_timeout=0.3)
    got = []
    async for chunk in resp.iter_chunks():
        got.append(chunk)
        await asyncio.sleep(0.4)  # longer than the deadline, but nobody waits on the server
    assert got == [b"a", b"b"]
    await client.close()


async def test_cancelled_calls_drop_their_connection(serve) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        while True:
            head, _ = await read_request(reader, srv)
            if head.startswith(b"GET /hang"):
                await asyncio.sleep(30)
            if head.startswith(b"GET /slow-body"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
                await writer.drain()
                await asyncio.sleep(30)
            writer.write(OK)
            await writer.drain()

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port, limit=2)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await client.request("GET", "/hang", [])
    resp = await client.request("GET", "/slow-body", [])
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await resp.read()
    assert client._slots._value == 2 and not client._idle
    assert await (await client.request("GET", "/", [])).read() == b"ok"
    assert srv.accepts == 3
    await client.close()


async def test_connection_close_answer_does_not_wait_for_the_close(serve) -> None:  # type: ignore[no-untyped-def]
    done = asyncio.Event()

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        await read_request(reader, srv)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await done.wait()  # the server keeps the connection open until the client has read

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    resp = await client.request("GET", "/", [])
    assert not resp.keep_alive and await resp.read() == b"ok" and not client._idle
    done.set()
    await client.close()


async def test_read_limit(serve) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        while True:
            head, _ = await read_request(reader, srv)
            if b"chunked" in head:
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                writer.write(b"4\r\nabcd\r\n" * 10 + b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n" + b"a" * 40)
            await writer.drain()

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    for path in ("/length", "/chunked"):
        with pytest.raises(ProtocolError):
            await (await client.request("GET", path, [])).read(limit=39)
        assert len(await (await client.request("GET", path, [])).read(limit=40)) == 40
    assert client._slots._value == 100
    await client.close()


async def test_connect_failed() -> None:
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        client = HttpClient("127.0.0.1", s.getsockname()[1])
        with pytest.raises(ConnectFailed, match=r"cannot connect to http://127\.0\.0\.1"):
            await client.request("GET", "/", [])
    assert client._slots._value == 100


async def test_tls_handshake_failure_is_connect_failed(serve) -> None:  # type: ignore[no-untyped-def]
    """With an SSL context the connection is TLS: a plain-HTTP server fails the handshake (no
    test here of a successful TLS exchange: no certificate tooling is installed)."""

    async def plain(reader: Any, writer: Any, srv: Server) -> None:
        await reader.read(1)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    srv = await serve(plain)
    client = HttpClient("127.0.0.1", srv.port, ssl=ssl.create_default_context())
    with pytest.raises(ConnectFailed, match=r"cannot connect to https://127\.0\.0\.1"):
        await client.request("GET", "/", [])
    assert client._slots._value == 100
    await client.close()


async def test_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(*_args: object, **_kwargs: object) -> None:
        await asyncio.sleep(30)

    monkeypatch.setattr(asyncio.get_running_loop(), "create_connection", never)
    client = HttpClient("127.0.0.1", 9, connect_timeout=0.05)
    with pytest.raises(ConnectTimeout):
        await client.request("GET", "/", [])
    monkeypatch.undo()
    assert client._slots._value == 100


# ------------------------------------------------------------------------- big answers


@pytest.mark.parametrize("framing", ["length", "chunked", "to-close"])
async def test_big_answer_slow_consumer(serve, framing: str) -> None:  # type: ignore[no-untyped-def]
    """A 12 MiB answer read slowly: reading from the socket pauses (the unconsumed buffer stays
    bounded) and resumes; the bytes arrive complete and in order."""
    big = random.Random(7).randbytes(12 << 20)

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        while True:
            head, _ = await read_request(reader, srv)
            if head.startswith(b"GET /small"):
                writer.write(OK)
            elif framing == "length":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big)
            elif framing == "chunked":
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for i in range(0, len(big), 1_000_003):
                    part = big[i : i + 1_000_003]
                    writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + big)
                await writer.drain()
                return
            await writer.drain()

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    resp = await client.request("GET", "/big", [])
    await asyncio.sleep(0.1)  # nobody reads yet: the connection must stop reading
    conn = resp._conn
    assert conn is not None
    bound = client_conn._HIGH_WATER + (1 << 20)
    peak = conn.buffered
    digest = hashlib.sha256()
    total = 0
    async for chunk in resp.iter_chunks():
        peak = max(peak, conn.buffered + len(chunk))
        digest.update(chunk)
        total += len(chunk)
        if total < (4 << 20):
            await asyncio.sleep(0.002)  # a slow consumer for the first 4 MiB
    assert total == len(big) and digest.digest() == hashlib.sha256(big).digest()
    assert peak <= bound
    assert await (await client.request("GET", "/small", [])).read() == b"ok"
    assert srv.accepts == (2 if framing == "to-close" else 1)
    await client.close()


async def test_big_answer_given_up_midway(serve) -> None:  # type: ignore[no-untyped-def]
    big = b"y" * (8 << 20)

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        while True:
            head, _ = await read_request(reader, srv)
            if head.startswith(b"GET /big"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big)
            else:
                writer.write(OK)
            await writer.drain()

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port, limit=1)
    resp = await client.request("GET", "/big", [])
    chunks = resp.iter_chunks()
    first = await anext(chunks)
    assert first and set(first) == {ord("y")}
    await chunks.aclose()  # the consumer stops: the connection is dropped, its slot given back
    assert client._slots._value == 1 and not client._idle
    (await client.request("GET", "/big", [])).close()  # given up before reading at all
    assert await (await client.request("GET", "/small", [])).read() == b"ok"
    assert srv.accepts == 3
    await client.close()


async def test_streamed_body_stops_when_the_server_answers_and_closes(serve) -> None:  # type: ignore[no-untyped-def]
    """RFC 9112 §9.5: an early answer that closes the connection ends the upload."""
    yielded = 0

    async def handler(reader: Any, writer: Any, srv: Server) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 413 Too Large\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbig")
        await writer.drain()

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal yielded
        for _ in range(100):
            yielded += 1
            yield b"x" * 65536
            await asyncio.sleep(0.01)

    srv = await serve(handler)
    client = HttpClient("127.0.0.1", srv.port)
    resp = await client.request("POST", "/", [], StreamBody(100 * 65536, chunks()))
    assert resp.status == 413 and await resp.read() == b"big"
    assert yielded < 100 and not client._idle
    await client.close()
