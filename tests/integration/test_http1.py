"""The lean keep-alive HTTP/1.1 client used for /infer: framing variants, connection reuse,
a pooled connection the server closed, and answers that are not HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from v2proxy.backends.http1 import Http1Pool, HTTPProtocolError

Answer = Callable[[bytes], Awaitable[bytes | None]]


async def _serve(answer: Answer) -> tuple[asyncio.Server, int, list[int]]:
    """A raw server: reads one request head+body at a time and writes what `answer` returns
    (None: close the connection without answering). Counts connections."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                out = await answer(body)
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
                if b"connection: close" in out.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, port, connections


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[tuple[int, list[int]]]]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Answer) -> tuple[int, list[int]]:
        server, port, conns = await _serve(answer)
        servers.append(server)
        return port, conns

    yield start
    for s in servers:
        s.close()
        await s.wait_closed()


async def test_content_length_keep_alive(serve) -> None:  # type: ignore[no-untyped-def]
    async def echo(body: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Type: x\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body),
            body,
        )

    port, conns = await serve(echo)
    pool = Http1Pool("127.0.0.1", port)
    for i in range(5):
        resp = await pool.post("/p", {"X-A": "1"}, [b"ab", memoryview(b"cd"), bytearray(b"%d" % i)])
        assert resp.status == 200 and resp.headers["content-type"] == "x"
        assert await resp.read() == b"abcd%d" % i
    assert len(conns) == 1  # one keep-alive connection for all five
    await pool.close()


async def test_chunked_and_read_to_close_and_big(serve) -> None:  # type: ignore[no-untyped-def]
    big = bytes(range(256)) * 4096  # 1 MiB: streamed in pieces

    async def answer(body: bytes) -> bytes:
        if body == b"chunked":
            return (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nX-Trailer: 1\r\n\r\n"
            )
        if body == b"close":
            return b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end"
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big

    port, _ = await serve(answer)
    pool = Http1Pool("127.0.0.1", port)
    assert await (await pool.post("/", {}, [b"chunked"])).read() == b"abcdefg"
    assert await (await pool.post("/", {}, [b"close"])).read() == b"until the end"
    resp = await pool.post("/", {}, [b"big"])
    pieces = [c async for c in resp.iter_chunks()]
    assert b"".join(pieces) == big and len(pieces) >= 1
    assert await (await pool.post("/", {}, [b"chunked"])).read() == b"abcdefg"
    await pool.close()


async def test_pooled_connection_closed_by_server_is_retried(serve) -> None:  # type: ignore[no-untyped-def]
    calls: list[bytes] = []

    async def answer(body: bytes) -> bytes | None:
        calls.append(body)
        if body == b"second":  # the server drops the kept-alive connection, answering nothing
            return None
        return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    port, _ = await serve(answer)
    pool = Http1Pool("127.0.0.1", port)
    assert await (await pool.post("/", {}, [b"first"])).read() == b"ok"
    with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
        # a fresh retry also gets nothing: the error surfaces (the backend maps it to 502)
        await pool.post("/", {}, [b"second"])
    assert await (await pool.post("/", {}, [b"third"])).read() == b"ok"
    assert calls.count(b"second") == 2  # tried on the pooled connection, then on a new one
    await pool.close()


@pytest.mark.parametrize(
    "raw",
    [b"SMTP 220 hello\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n"],
)
async def test_invalid_answers(serve, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    async def answer(_body: bytes) -> bytes:
        return raw

    port, _ = await serve(answer)
    pool = Http1Pool("127.0.0.1", port)
    with pytest.raises(HTTPProtocolError):
        await pool.post("/", {}, [b"x"])
    await pool.close()


async def test_refused() -> None:
    from tests.interop.peers.launch import _free_ports

    (port,) = _free_ports(1)
    pool = Http1Pool("127.0.0.1", port)
    with pytest.raises(ConnectionRefusedError):
        await pool.post("/", {}, [b"x"])


async def test_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """--backend-connect-timeout bounds the connection set-up (a connect that never completes
    stands in for an unreachable host: only loopback may be used here)."""

    async def never(*_args: object, **_kwargs: object) -> None:
        await asyncio.sleep(30)

    monkeypatch.setattr(asyncio, "open_connection", never)
    pool = Http1Pool("127.0.0.1", 9, connect_timeout=0.05)
    with pytest.raises(TimeoutError):
        await pool.post("/", {}, [b"x"])
    # the slot taken for the attempt was given back
    monkeypatch.undo()
    assert pool._slots._value == 100
