"""The HTTP/1.1 server (v2proxy.http.server) over real loopback sockets: one conformance table
of raw byte cases (what is answered, and whether the connection stays usable), then behaviour:
timeouts, disconnects, backpressure both ways, pipelining, shutdown. Timeouts are small; tests
wait for outcomes with generous bounds and never assert durations."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from v2proxy.http.request import HIGH_WATER
from v2proxy.http.server import (
    BodyTimeout,
    ClientDisconnected,
    HttpRequest,
    HttpResponse,
    HttpServer,
    ServerLimits,
)

# the loop is what is tested: on uvloop and plain asyncio (tests/conftest.py)
pytestmark = pytest.mark.both_loops

WAIT = 10.0  # the most any outcome is waited for
FAST = ServerLimits(header_timeout=0.3, keepalive_timeout=0.3, body_timeout=0.3, write_timeout=0.3)
Handler = Callable[[HttpRequest, HttpResponse], Awaitable[None]]


async def echo(req: HttpRequest, resp: HttpResponse) -> None:
    """Answers what it was asked: method, path, body length and so on, as JSON."""
    if req.path == "/noread":
        await resp.send(200, [], b"not read")
        return
    if req.path == "/stream":
        await resp.start(200, [(b"content-type", b"text/plain")])
        for piece in (b"ab", b"", b"cde"):
            await resp.write(piece)
        await resp.end()
        return
    body = await req.read()
    probe = req.header(b"x-probe")
    info = {
        "method": req.method,
        "path": req.path,
        "query": req.query.decode("latin-1"),
        "version": list(req.version),
        "headers": len(req.headers),
        "names": [n.decode("latin-1") for n, _ in req.headers],
        "probe": probe.hex() if probe is not None else None,
        "length": len(body),
        "body": body[:64].decode("latin-1"),
        "content_length": req.content_length,
        "chunked": req.chunked,
        "keep_alive": req.keep_alive,
    }
    await resp.send(200, [(b"content-type", b"application/json")], json.dumps(info).encode())


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def read_answer(reader: asyncio.StreamReader, head_only: bool = False) -> Answer:
    """One answer: head, then the body by Content-Length, chunked coding or to the close."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    version, status = lines[0].split(b" ")[:2]
    assert version == b"HTTP/1.1"
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        key = name.decode().lower()
        assert key not in headers, f"duplicate {key}"
        headers[key] = value.strip().decode("latin-1")
    code = int(status)
    if head_only or code < 200 or code in (204, 304):
        return Answer(code, headers, b"")
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        chunks = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            chunks += await reader.readexactly(size)
            assert await reader.readexactly(2) == b"\r\n"
            if size == 0:
                break
        body = bytes(chunks)
    else:
        body = await reader.read()
    return Answer(code, headers, body)


async def closes(reader: asyncio.StreamReader) -> bool:
    """Whether the server ends the connection (EOF or reset) with nothing more sent."""
    try:
        rest = await asyncio.wait_for(reader.read(1), WAIT)
    except ConnectionError:
        return True
    assert rest == b"", f"unexpected bytes {rest!r}"
    return True


async def still_open(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Whether the connection still serves a request (and was framed right until now)."""
    writer.write(b"GET /ping HTTP/1.1\r\n\r\n")
    answer = await asyncio.wait_for(read_answer(reader), WAIT)
    return answer.status == 200 and answer.json()["path"] == "/ping"


class Harness:
    """Starts servers and opens client connections; closes them all after the test."""

    def __init__(self) -> None:
        self.servers: list[HttpServer] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def start(
        self, handler: Handler = echo, limits: ServerLimits | None = None, **kw: Any
    ) -> HttpServer:
        server = HttpServer(handler, limits or ServerLimits(), **kw)
        await server.start("127.0.0.1", 0)
        self.servers.append(server)
        return server

    async def connect(
        self, server: HttpServer, host: str = "127.0.0.1"
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(host, server.port)
        self.writers.append(writer)
        return reader, writer

    async def close(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        for server in self.servers:
            await server.close(grace=1.0)
        await asyncio.sleep(0)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = Harness()
    yield harness
    await harness.close()


# -- the conformance table --


@dataclass
class Case:
    name: str
    raw: bytes | tuple[bytes, bytes]  # a pair: the head, then (after "100 Continue") the body
    answers: list[tuple[int, str]]  # (status, a substring of the body) per answer, in order
    closes: bool = False
    headers: dict[str, str] = field(default_factory=dict)  # expected in the last answer
    head: bool = False  # a HEAD request: no body follows the answer's head


LIMITS = ServerLimits(max_body_size=10_000, max_request_line=1000, max_header_bytes=4096)
GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
POST5 = b"POST /p HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
MALFORMED = "malformed HTTP request"
NOT_PATH = "origin-form"

CASES = [
    Case("get", GET, [(200, '"method": "GET"')]),
    Case("get-query", b"GET /a%20b?x=1&y HTTP/1.1\r\n\r\n", [(200, '"query": "x=1&y"')]),
    Case("path-not-decoded", b"GET /a%20b?x HTTP/1.1\r\n\r\n", [(200, '"path": "/a%20b"')]),
    Case("post", POST5, [(200, '"length": 5')]),
    Case("post-empty", b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", [(200, '"length": 0')]),
    Case("http10", b"GET / HTTP/1.0\r\n\r\n", [(200, '"version": [1, 0]')], closes=True,
         headers={"connection": "close"}),
    Case("http10-keepalive", b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
         [(200, '"keep_alive": true')], headers={"connection": "keep-alive"}),
    Case("token-list", b"GET / HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\n\r\n",
         [(200, '"keep_alive": true')]),
    Case("close-in-list", b"GET / HTTP/1.1\r\nConnection: foo, CLOSE , bar\r\n\r\n",
         [(200, '"keep_alive": false')], closes=True, headers={"connection": "close"}),
    Case("upgrade-declined", b"GET /u HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
         [(200, '"path": "/u"')]),
    Case("upgrade-with-body",
         b"POST / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: x\r\nContent-Length: 2\r\n\r\nab",
         [(400, "Upgrade")], closes=True),
    Case("chunked",
         b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"3;name=value\r\nabc\r\n4\r\ndefg\r\n0\r\nX-Trailer: 1\r\n\r\n",
         [(200, '"body": "abcdefg", "content_length": null, "chunked": true')]),
    Case("chunked-upper", b"POST / HTTP/1.1\r\nTransfer-Encoding: CHUNKED\r\n\r\n0\r\n\r\n",
         [(200, '"length": 0')]),
    Case("chunked-bad-size", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
         [(400, MALFORMED)], closes=True),
    Case("cl-and-te",
         b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         [(400, MALFORMED)], closes=True),
    Case("te-and-cl",
         b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
         [(400, MALFORMED)], closes=True),
    Case("cl-differing",
         b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
         [(400, "Duplicate Content-Length")], closes=True),
    Case("cl-identical",
         b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
         [(400, "Duplicate Content-Length")], closes=True),
    Case("cl-negative", b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", [(400, MALFORMED)],
         closes=True),
    Case("cl-exponent", b"POST / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", [(400, MALFORMED)],
         closes=True),
    Case("cl-plus", b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello", [(400, MALFORMED)],
         closes=True),
    # RFC 9112 §6.1: Transfer-Encoding in HTTP/1.0 is faulty framing, keep-alive or not
    Case("http10-chunked",
         b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
         b"3\r\nabc\r\n0\r\n\r\n" + GET,
         [(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request")], closes=True),
    Case("http10-chunked-and-cl",
         b"POST / HTTP/1.0\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc",
         [(400, MALFORMED)], closes=True),
    Case("te-gzip", b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
         [(501, "chunked transfer coding")], closes=True),
    Case("te-gzip-chunked",
         b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
         [(501, "chunked transfer coding")], closes=True),
    Case("absolute-form", b"GET http://127.0.0.1:1/x HTTP/1.1\r\n\r\n", [(400, NOT_PATH)],
         closes=True),
    Case("connect-ssrf", b"CONNECT 0@127.0.0.1:28555 HTTP/1.1\r\nHost: x\r\n\r\n",
         [(400, "CONNECT")], closes=True),
    Case("connect-authority", b"CONNECT example.com:443 HTTP/1.1\r\n\r\n", [(400, "CONNECT")],
         closes=True),
    Case("options-star", b"OPTIONS * HTTP/1.1\r\n\r\n", [(400, NOT_PATH)], closes=True),
    Case("target-too-long", b"GET /" + b"a" * 1000 + b" HTTP/1.1\r\n\r\n",
         [(414, "too long")], closes=True),
    Case("too-many-headers",
         b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(129)) + b"\r\n",
         [(431, "too many")], closes=True),
    Case("header-too-big", b"GET / HTTP/1.1\r\nX: " + b"v" * 5000 + b"\r\n\r\n",
         [(431, "too large")], closes=True),
    Case("head-too-big",
         b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 60) for i in range(70))
         + b"\r\n", [(431, "too large")], closes=True),
    Case("too-large-before-too-many",
         b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 60) for i in range(140))
         + b"\r\n", [(431, "too large")], closes=True),
    Case("too-many-before-too-large",
         b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(129))
         + b"X: " + b"v" * 5000 + b"\r\n\r\n", [(431, "too many")], closes=True),
    Case("too-many-then-malformed",
         b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(130))
         + b"bad header\r\n\r\n", [(431, "too many")], closes=True),
    Case("trailers-too-large",
         b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"
         + b"X-T: " + b"v" * 5000 + b"\r\n\r\n", [(400, "too large")], closes=True),
    Case("expect-continue",
         (b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n", b"hello"),
         [(100, ""), (200, '"length": 5')]),
    Case("expect-continue-unread",
         b"POST /noread HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 5\r\n\r\n",
         [(200, "not read")], closes=True, headers={"connection": "close"}),
    Case("expect-other", b"POST / HTTP/1.1\r\nExpect: fancy\r\nContent-Length: 5\r\n\r\nhello",
         [(417, "100-continue")], closes=True),
    Case("http2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", [(505, "HTTP/2")], closes=True),
    Case("http20", b"GET / HTTP/2.0\r\n\r\n", [(505, "version")], closes=True),
    Case("http09", b"GET / HTTP/0.9\r\n\r\n", [(505, "version")], closes=True),
    Case("http12", b"GET / HTTP/1.2\r\n\r\n", [(400, MALFORMED)], closes=True),
    Case("bare-lf", b"GET / HTTP/1.1\nHost: x\n\n", [(400, MALFORMED)], closes=True),
    Case("obs-fold", b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", [(400, MALFORMED)], closes=True),
    Case("space-before-colon", b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", [(400, MALFORMED)],
         closes=True),
    Case("nul-in-value", b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n", [(400, MALFORMED)],
         closes=True),
    Case("bad-method", b"G(T / HTTP/1.1\r\n\r\n", [(400, MALFORMED)], closes=True),
    Case("garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", [(400, MALFORMED)],
         closes=True),
    Case("utf8-value", b"GET / HTTP/1.1\r\nX-Probe: \xe2\x82\xac \xff\r\n\r\n",
         [(200, '"probe": "e282ac20ff"')]),
    Case("names-lowercased", b"GET / HTTP/1.1\r\nX-MiXeD: 1\r\n\r\n", [(200, '"x-mixed"')]),
    Case("pipelined", GET.replace(b"/", b"/1", 1) + POST5 + GET.replace(b"/", b"/3", 1),
         [(200, '"path": "/1"'), (200, '"path": "/p"'), (200, '"path": "/3"')]),
    Case("pipelined-then-malformed", GET + b"GET / HTTP/1.1\r\nbad header\r\n\r\n",
         [(200, '"path": "/"'), (400, MALFORMED)], closes=True),
    Case("pipelined-close", GET + b"GET /2 HTTP/1.1\r\nConnection: close\r\n\r\n" + GET,
         [(200, '"path": "/"'), (200, '"path": "/2"')], closes=True),
    Case("unread-body-discarded", POST5.replace(b"/p", b"/noread") + GET,
         [(200, "not read"), (200, '"path": "/"')]),
    Case("head", b"HEAD / HTTP/1.1\r\n\r\n", [(200, "")], head=True),
    Case("stream-chunked", b"GET /stream HTTP/1.1\r\n\r\n", [(200, "abcde")],
         headers={"transfer-encoding": "chunked"}),
    Case("stream-http10", b"GET /stream HTTP/1.0\r\n\r\n", [(200, "abcde")], closes=True,
         headers={"connection": "close"}),
    Case("body-too-large", b"POST / HTTP/1.1\r\nContent-Length: 10001\r\n\r\nabc",
         [(413, "larger than 10000")], closes=True),
    Case("chunked-too-large",
         b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2711\r\n" + b"a" * 10001
         + b"\r\n0\r\n\r\n", [(413, "larger than 10000")], closes=True),
    Case("leading-crlf", b"\r\n" + GET, [(200, '"path": "/"')]),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_conformance(h: Harness, case: Case) -> None:
    server = await h.start(limits=LIMITS)
    reader, writer = await h.connect(server)
    if isinstance(case.raw, tuple):
        writer.write(case.raw[0])
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(case.raw[1])
        expected = case.answers[1:]
    else:
        writer.write(case.raw)
        expected = case.answers
    answer = None
    for status, text in expected:
        answer = await asyncio.wait_for(read_answer(reader, case.head), WAIT)
        assert answer.status == status, answer
        assert text.encode() in answer.body, answer
        if status >= 400:
            assert answer.headers["content-type"] == "application/json"
            assert answer.headers["connection"] == "close"
            assert set(answer.json()) == {"error"}
    assert answer is not None
    for name, value in case.headers.items():
        assert answer.headers.get(name) == value, answer.headers
    if case.head:
        assert answer.headers["content-length"] != "0"
    if case.closes:
        assert await closes(reader)
    else:
        assert "connection" not in answer.headers or case.headers
        assert await still_open(reader, writer)
    writer.close()


# -- behaviour --


async def test_slowloris_gets_408(h: Harness) -> None:
    server = await h.start(limits=FAST)
    reader, writer = await h.connect(server)

    async def drip() -> None:
        try:
            for byte in b"GET / HTTP/1.1\r\nX-Slow: " + b"a" * 400:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.02)
        except ConnectionError:
            pass

    dripping = asyncio.create_task(drip())
    answer = await asyncio.wait_for(read_answer(reader), WAIT)
    assert answer.status == 408
    assert await closes(reader)
    assert not dripping.done()  # closed while the client was still dripping
    dripping.cancel()
    writer.close()


async def test_idle_keepalive_closed(h: Harness) -> None:
    server = await h.start(limits=FAST)
    reader, writer = await h.connect(server)
    writer.write(GET)
    assert (await asyncio.wait_for(read_answer(reader), WAIT)).status == 200
    assert await closes(reader)
    writer.close()


async def test_silent_connections_closed(h: Harness) -> None:
    server = await h.start(limits=FAST)
    conns = [await h.connect(server) for _ in range(300)]
    for reader, _ in conns:
        assert await closes(reader)
    for _, writer in conns:
        writer.close()
    for _ in range(100):
        if not server.conns:
            break
        await asyncio.sleep(0.05)
    assert not server.conns


async def test_body_stall_gets_408(h: Harness) -> None:
    seen: list[BaseException] = []

    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        try:
            await req.read()
        except BodyTimeout as exc:
            seen.append(exc)
            raise

    server = await h.start(handler, limits=FAST)
    reader, writer = await h.connect(server)
    writer.write(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
    answer = await asyncio.wait_for(read_answer(reader), WAIT)
    assert answer.status == 408
    assert "not received in time" in answer.json()["error"]
    assert await closes(reader)
    assert len(seen) == 1
    writer.close()


@pytest.mark.parametrize("how", ["read", "chunks"])
async def test_disconnect_mid_body(h: Harness, how: str) -> None:
    seen: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        try:
            if how == "read":
                await req.read()
            else:
                async for _ in req.chunks():
                    pass
        except BaseException as exc:
            seen.set_result(exc)
            raise

    server = await h.start(handler)
    _, writer = await h.connect(server)
    writer.write(b"POST / HTTP/1.1\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    assert isinstance(await asyncio.wait_for(seen, WAIT), ClientDisconnected)


async def test_disconnect_mid_answer(h: Harness) -> None:
    seen: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        await resp.start(200, [])
        try:
            for _ in range(100_000):
                await resp.write(b"x" * 65536)
        except BaseException as exc:
            seen.set_result(exc)
            raise

    server = await h.start(handler)
    reader, writer = await h.connect(server)
    writer.write(GET)
    await reader.readexactly(100_000)
    writer.transport.abort()
    assert isinstance(await asyncio.wait_for(seen, WAIT), ClientDisconnected)


async def test_client_not_reading_dropped(h: Harness) -> None:
    seen: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        await resp.start(200, [], 1 << 40)
        try:
            while True:
                await resp.write(bytes(1 << 20))
        except BaseException as exc:
            seen.set_result(exc)
            raise

    server = await h.start(handler, limits=FAST)
    _, writer = await h.connect(server)
    writer.write(GET)
    exc = await asyncio.wait_for(seen, WAIT)
    assert isinstance(exc, ClientDisconnected)
    assert "in time" in str(exc)
    writer.close()


async def test_streamed_answer_backpressure(h: Harness) -> None:
    """A client that reads slowly: the writer waits, the transport's buffer stays bounded."""
    total, piece = 64, 1 << 20
    written: list[int] = []
    buffered: list[int] = []

    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        if req.path == "/ping":
            await echo(req, resp)
            return
        await resp.start(200, [])
        for i in range(total):
            await resp.write(bytes([i % 256]) * piece)
            written.append(i)
            buffered.append(resp._conn.transport.get_write_buffer_size())
        await resp.end()

    server = await h.start(handler)
    reader, writer = await h.connect(server)
    writer.write(GET)
    await asyncio.sleep(0.5)  # the client reads nothing meanwhile
    assert len(written) < total // 2  # the writer waited for the client
    answer = await asyncio.wait_for(read_answer(reader), WAIT * 3)
    assert len(answer.body) == total * piece
    assert answer.body[::piece] == bytes(i % 256 for i in range(total))
    assert max(buffered) <= 2 * piece
    assert await still_open(reader, writer)
    writer.close()


async def test_upload_backpressure(h: Harness) -> None:
    """A handler that does not read yet: reading pauses, the buffered body stays bounded."""
    size = 32 << 20
    go = asyncio.Event()
    requests: list[HttpRequest] = []

    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        requests.append(req)
        await go.wait()
        n = 0
        async for chunk in req.chunks():
            n += len(chunk)
        await resp.send(200, [], b"%d" % n)

    server = await h.start(handler)
    reader, writer = await h.connect(server)
    writer.write(b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % size)
    sending = asyncio.create_task(writer.drain())
    writer.write(bytes(size))
    await asyncio.sleep(0.5)
    assert requests and requests[0]._buffered <= HIGH_WATER + 256 * 1024
    assert not sending.done()
    go.set()
    answer = await asyncio.wait_for(read_answer(reader), WAIT)
    assert answer.body == b"%d" % size
    await sending
    writer.close()


async def test_pipelining_pauses_reading(h: Harness) -> None:
    go = asyncio.Event()

    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        await go.wait()
        await echo(req, resp)

    server = await h.start(handler)
    reader, writer = await h.connect(server)
    n = 40
    writer.write(b"".join(b"GET /%d HTTP/1.1\r\nX-Pad: %s\r\n\r\n" % (i, b"p" * 4000)
                          for i in range(n)))  # fmt: skip
    await asyncio.sleep(0.3)
    (conn,) = server.conns
    assert conn.reading_paused
    assert len(conn.queue) < n
    go.set()
    for i in range(n):
        answer = await asyncio.wait_for(read_answer(reader), WAIT)
        assert answer.json()["path"] == f"/{i}"
    assert await still_open(reader, writer)
    writer.close()


async def test_big_unread_body_closes(h: Harness) -> None:
    server = await h.start()
    reader, writer = await h.connect(server)
    writer.write(b"POST /noread HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 1000)
    answer = await asyncio.wait_for(read_answer(reader), WAIT)
    assert answer.status == 200
    assert answer.headers["connection"] == "close"
    assert await closes(reader)
    writer.close()


async def test_handler_errors(h: Harness) -> None:
    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        if req.path == "/raise":
            raise KeyError("boom")
        if req.path == "/late":
            await resp.start(200, [])
            await resp.write(b"partial")
            raise RuntimeError("late")
        if req.path == "/limit":
            await req.read(limit=3)
        # /silent: returns without answering

    server = await h.start(handler)
    for path, status, text in [
        (b"/raise", 500, "internal error: KeyError"),
        (b"/silent", 500, "internal error: no answer"),
        (b"/limit", 413, "request body larger than 3 bytes"),
    ]:
        reader, writer = await h.connect(server)
        writer.write(b"POST %s HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello" % path)
        answer = await asyncio.wait_for(read_answer(reader), WAIT)
        assert (answer.status, answer.json()["error"]) == (status, text)
        assert await closes(reader)
        writer.close()
    reader, writer = await h.connect(server)
    writer.write(b"GET /late HTTP/1.1\r\n\r\n")
    with pytest.raises(asyncio.IncompleteReadError):  # no terminating chunk: a broken answer
        await asyncio.wait_for(read_answer(reader), WAIT)
    writer.close()


async def test_send_buffers(h: Harness) -> None:
    import array

    floats = array.array("f", range(100_000))
    big = memoryview(floats)

    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        if req.path == "/small":
            await resp.send(201, [(b"x-a", b"1")], [b"ab", memoryview(b"cd"), bytearray(b"e")])
        elif req.path == "/big":
            await resp.send(200, [], [b"head", big, b"tail"])
        else:
            await resp.send(204, [], b"")

    server = await h.start(handler)
    reader, writer = await h.connect(server)
    writer.write(b"GET /small HTTP/1.1\r\n\r\nGET /big HTTP/1.1\r\n\r\nGET /none HTTP/1.1\r\n\r\n")
    small = await asyncio.wait_for(read_answer(reader), WAIT)
    assert (small.status, small.headers["x-a"], small.body) == (201, "1", b"abcde")
    large = await asyncio.wait_for(read_answer(reader), WAIT)
    assert large.body == b"head" + floats.tobytes() + b"tail"
    empty = await asyncio.wait_for(read_answer(reader), WAIT)
    assert (empty.status, "content-length" in empty.headers) == (204, False)
    writer.close()


async def test_answers_of_one_and_of_other_sizes_on_one_connection(h: Harness) -> None:
    """Each answer is framed by its own size, whether the one before had the same (its framing
    line is kept) or another."""
    sizes = [3, 3, 10, 3, 0, 0, 12345, 12345, 3]

    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        await resp.send(200, [(b"x-n", req.path[1:].encode())], b"z" * int(req.path[1:]))

    server = await h.start(handler)
    reader, writer = await h.connect(server)
    writer.write(b"".join(b"GET /%d HTTP/1.1\r\n\r\n" % n for n in sizes))
    for n in sizes:
        answer = await asyncio.wait_for(read_answer(reader), WAIT)
        assert (answer.status, answer.headers["x-n"], answer.body) == (200, str(n), b"z" * n)
        assert answer.headers["content-length"] == str(n)
    writer.close()


@pytest.mark.parametrize(
    ("fields", "text"),
    [([b"X-%d: v\r\n" % i for i in range(129)], "too many"), ([b"X: " + b"v" * 5000], "too large")],
    ids=["too-many", "too-large"],
)
async def test_head_limits_in_pieces(h: Harness, fields: list[bytes], text: str) -> None:
    """The head's limits hold when its fields arrive in many pieces (each checked as it ends)."""
    server = await h.start(limits=LIMITS)
    reader, writer = await h.connect(server)
    pieces = [b"GET / HTTP/1.1\r\n", *fields, b"\r\n"]
    for piece in pieces if len(pieces) > 3 else [pieces[0], *(bytes([b]) for b in pieces[1])]:
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(0)
    answer = await asyncio.wait_for(read_answer(reader), WAIT)
    assert (answer.status, text in answer.json()["error"]) == (431, True)
    assert await closes(reader)
    writer.close()


async def test_answers_after_head_and_stream(h: Harness) -> None:
    """Each answer on a connection is framed for its own request (HEAD, streamed, plain)."""
    server = await h.start()
    reader, writer = await h.connect(server)
    writer.write(b"HEAD / HTTP/1.1\r\n\r\nGET /stream HTTP/1.1\r\n\r\n" + GET + GET)
    head = await asyncio.wait_for(read_answer(reader, head_only=True), WAIT)
    assert (head.status, head.body, head.headers["content-length"] != "0") == (200, b"", True)
    streamed = await asyncio.wait_for(read_answer(reader), WAIT)
    assert (streamed.headers["transfer-encoding"], streamed.body) == ("chunked", b"abcde")
    for _ in range(2):
        plain = await asyncio.wait_for(read_answer(reader), WAIT)
        assert (plain.status, plain.json()["path"]) == (200, "/")
        assert "transfer-encoding" not in plain.headers
    assert await still_open(reader, writer)
    writer.close()


@pytest.mark.parametrize(
    "field",
    [
        (b"x-bad", b"a\r\nSet-Cookie: x"),
        (b"x-bad", b"a\nb"),
        (b"x-bad", b"a\rb"),
        (b"x-bad\r\nSet-Cookie", b"x"),
        (b"x-bad", b"\n"),
    ],
)
async def test_header_injection_refused(h: Harness, field: tuple[bytes, bytes]) -> None:
    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        await resp.send(200, [(b"x-ok", b"1"), field, (b"x-ok2", b"2")], b"")

    server = await h.start(handler)
    reader, writer = await h.connect(server)
    writer.write(GET)
    answer = await asyncio.wait_for(read_answer(reader), WAIT)
    assert (answer.status, answer.json()["error"]) == (500, "internal error: ValueError")
    writer.close()


async def test_close_grace_lets_request_finish(
    h: Harness,
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        started.set()
        await release.wait()
        await resp.send(200, [], b"finished")

    server = await h.start(handler)
    port = server.port
    idle_reader, idle_writer = await h.connect(server)
    busy_reader, busy_writer = await h.connect(server)
    busy_writer.write(GET)
    await asyncio.wait_for(started.wait(), WAIT)
    closing = asyncio.create_task(server.close(grace=WAIT))
    assert await closes(idle_reader)  # idle connections go at once
    assert not closing.done()
    release.set()
    answer = await asyncio.wait_for(read_answer(busy_reader), WAIT)
    assert (answer.status, answer.body, answer.headers["connection"]) == (200, b"finished", "close")
    assert await closes(busy_reader)
    await asyncio.wait_for(closing, WAIT)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    idle_writer.close()
    busy_writer.close()


async def test_close_grace_expires(h: Harness) -> None:
    cancelled = asyncio.Event()

    async def handler(req: HttpRequest, resp: HttpResponse) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    server = await h.start(handler)
    reader, writer = await h.connect(server)
    writer.write(GET)
    await asyncio.sleep(0.1)
    await asyncio.wait_for(server.close(grace=0.2), WAIT)
    assert cancelled.is_set()
    assert await closes(reader)
    writer.close()


async def test_max_connections(h: Harness) -> None:
    server = await h.start(max_connections=2)
    kept = [await h.connect(server) for _ in range(2)]
    for reader, writer in kept:
        assert await still_open(reader, writer)
    reader, writer = await h.connect(server)
    answer = await asyncio.wait_for(read_answer(reader), WAIT)
    assert answer.status == 503
    assert await closes(reader)
    for _, w in [*kept, (reader, writer)]:
        w.close()


async def test_ipv6(h: Harness) -> None:
    server = HttpServer(echo)
    try:
        port = await server.start("::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback")
    reader, writer = await asyncio.open_connection("::1", port)
    assert await still_open(reader, writer)
    writer.close()
    await server.close(grace=1.0)


async def test_unread_body_still_arriving_discarded(h: Harness) -> None:
    """The handler answers before the body is in: the rest (short) is dropped as it arrives and
    the next request on the connection parses."""
    server = await h.start()
    reader, writer = await h.connect(server)
    writer.write(b"POST /noread HTTP/1.1\r\nContent-Length: 30000\r\n\r\n" + b"x" * 10)
    answer = await asyncio.wait_for(read_answer(reader), WAIT)
    assert (answer.status, answer.body, "connection" in answer.headers) == (200, b"not read", False)
    writer.write(b"x" * 29990)
    assert await still_open(reader, writer)


async def test_large_body_read_whole(h: Harness) -> None:
    size = 5 << 20
    body = bytes(range(256)) * (size // 256)
    server = await h.start()
    reader, writer = await h.connect(server)
    writer.write(b"POST /big HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % size + body + GET)
    answer = await asyncio.wait_for(read_answer(reader), WAIT)
    assert answer.json()["length"] == size
    assert answer.json()["body"] == body[:64].decode("latin-1")
    assert (await asyncio.wait_for(read_answer(reader), WAIT)).json()["path"] == "/"
