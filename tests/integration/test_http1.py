"""The lean keep-alive HTTP/1.1 client used for /infer: framing variants (also split into
pieces of any size), connection reuse, a pooled connection the server closed, answers that end
early or are not HTTP, backpressure on big answers and streamed request bodies."""

from __future__ import annotations

import array
import asyncio
import hashlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from v2proxy.backends import http1
from v2proxy.backends.http1 import Http1Pool, HTTPProtocolError
from v2proxy.ports import StreamedBody

Answer = Callable[[bytes], Awaitable[bytes | None]]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


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

    monkeypatch.setattr(asyncio.get_running_loop(), "create_connection", never)
    pool = Http1Pool("127.0.0.1", 9, connect_timeout=0.05)
    with pytest.raises(TimeoutError):
        await pool.post("/", {}, [b"x"])
    # the slot taken for the attempt was given back
    monkeypatch.undo()
    assert pool._slots._value == 100


# ---------------------------------------------------------------------------------------------
# Raw servers that misbehave in chosen ways, and what the client must make of them.


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's body (its head read and dropped)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length)


@pytest.fixture
async def serve_raw() -> AsyncIterator[Callable[[Handler], Awaitable[tuple[int, list[int]]]]]:
    """A server running `handler` for each connection (closed after it returns; handlers still
    running at the end of the test are cancelled)."""
    servers: list[asyncio.Server] = []
    tasks: set[asyncio.Task[None]] = set()

    async def start(handler: Handler) -> tuple[int, list[int]]:
        connections: list[int] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(1)
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                await handler(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()
                tasks.discard(task)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        return server.sockets[0].getsockname()[1], connections

    yield start
    for task in list(tasks):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in servers:
        s.close()
        await s.wait_closed()


#: answers to the bodies below, exactly as the client must hand them out
_FRAMINGS: dict[bytes, tuple[bytes, int, bytes]] = {
    b"length": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-A: b\r\n\r\nhello world",
        200,
        b"hello world",
    ),
    b"empty": (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 200, b""),
    b"chunked": (
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'3\r\nabc\r\n4;ext=1;q="x"\r\ndefg\r\nA\r\n0123456789\r\n'
        b"0\r\nX-Trailer: 1\r\nX-T2: 2\r\n\r\n",
        201,
        b"abcdefg0123456789",
    ),
    b"chunked-bare": (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n",
        200,
        b"z",
    ),
    b"interim": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        200,
        b"ok",
    ),
    b"no-content": (b"HTTP/1.1 204 No Content\r\nX-A: b\r\n\r\n", 204, b""),
    b"error": (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 5\r\n\r\nnope!", 400, b"nope!"),
}


async def _framings(body: bytes) -> bytes:
    return _FRAMINGS[body][0]


async def _check_framings(pool: Http1Pool, streamed: bool) -> None:
    for name, (_raw, status, expected) in [*_FRAMINGS.items(), *_FRAMINGS.items()]:
        resp = await pool.post("/", {}, [name])
        assert resp.status == status
        if streamed:
            assert b"".join([c async for c in resp.iter_chunks()]) == expected
        else:
            assert await resp.read() == expected


@pytest.mark.parametrize("piece", [1, 2, 3, 5, 7, 64])
async def test_answers_split_into_pieces(
    serve, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:  # type: ignore[no-untyped-def]
    """Every framing parses the same whatever the sizes of the buffers it arrives in (each
    buffer the transport delivers is fed to the parser cut into `piece`-byte slices)."""
    deliver = http1._Conn.data_received

    def in_pieces(self: http1._Conn, data: bytes) -> None:
        for i in range(0, len(data), piece):
            deliver(self, data[i : i + piece])

    monkeypatch.setattr(http1._Conn, "data_received", in_pieces)
    port, conns = await serve(_framings)
    pool = Http1Pool("127.0.0.1", port)
    await _check_framings(pool, streamed=False)
    await _check_framings(pool, streamed=True)
    assert len(conns) == 1  # every answer was complete and exact: the connection was kept
    await pool.close()


async def test_answer_written_byte_by_byte(serve_raw) -> None:  # type: ignore[no-untyped-def]
    """The same over the wire: the server sends each answer one byte at a time."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            raw = _FRAMINGS[await _read_request(reader)][0]
            for i in range(len(raw)):
                writer.write(raw[i : i + 1])
                await writer.drain()
                await asyncio.sleep(0)

    port, conns = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port)
    await _check_framings(pool, streamed=False)
    await _check_framings(pool, streamed=True)
    assert len(conns) == 1
    await pool.close()


async def test_random_splits_of_a_long_exchange(serve, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(1234)
    deliver = http1._Conn.data_received

    def randomly(self: http1._Conn, data: bytes) -> None:
        i = 0
        while i < len(data):
            n = rng.choice([1, 2, 3, 4, 5, 13, 100, 4096])
            deliver(self, data[i : i + n])
            i += n

    monkeypatch.setattr(http1._Conn, "data_received", randomly)
    port, _ = await serve(_framings)
    pool = Http1Pool("127.0.0.1", port)
    for _ in range(10):
        await _check_framings(pool, streamed=rng.random() < 0.5)
    await pool.close()


async def test_extra_bytes_after_an_answer_are_never_taken_as_the_next_one(serve_raw) -> None:  # type: ignore[no-untyped-def]
    """A server that sends more than the answer (a stray pipelined answer, in the same write or
    later while the connection is idle): the answer is exact and the connection is not reused,
    so the stray bytes never pass for the next request's answer."""
    stray = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nSTRAY"
    sent = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await _read_request(reader)
            answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            if body == b"same-write":
                writer.write(answer + stray)
            elif body == b"later":
                writer.write(answer)
                await writer.drain()
                await asyncio.sleep(0.01)
                writer.write(stray)
                await writer.drain()
                sent.set()
            else:
                writer.write(answer)
            await writer.drain()

    port, conns = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port)
    assert await (await pool.post("/", {}, [b"same-write"])).read() == b"same-write"
    assert await (await pool.post("/", {}, [b"next"])).read() == b"next"
    assert len(conns) == 2
    assert await (await pool.post("/", {}, [b"later"])).read() == b"later"
    await sent.wait()
    for _ in range(500):  # until the stray bytes reach the idle pooled connection
        if not pool._idle[0].reusable:
            break
        await asyncio.sleep(0.01)
    assert await (await pool.post("/", {}, [b"after"])).read() == b"after"
    assert len(conns) == 3
    await pool.close()


async def test_idle_connection_closed_by_server_is_not_used(serve_raw) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()  # then closes: keep-alive said, but not kept

    port, conns = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port)
    for i in range(3):
        assert await (await pool.post("/", {}, [b"%d" % i])).read() == b"%d" % i
        await asyncio.sleep(0.02)  # the server's FIN arrives while the connection is idle
    assert len(conns) == 3
    await pool.close()


async def test_retry_on_a_pooled_connection_closed_before_answering(serve_raw) -> None:  # type: ignore[no-untyped-def]
    """The race keep-alive has: the server closes the pooled connection as the request goes
    out. Nothing was answered, so the request is sent again on a new connection, once."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while True:
            body = await _read_request(reader)
            seen.append(body)
            if body.startswith(b"drop") and not first:
                return  # closed without a byte of answer
            first = False
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    port, conns = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port)
    assert await (await pool.post("/", {}, [b"one"])).read() == b"one"
    assert await (await pool.post("/", {}, [b"drop", b"me"])).read() == b"dropme"
    assert seen == [b"one", b"dropme", b"dropme"] and len(conns) == 2

    # a streamed body cannot be sent twice: the error surfaces
    async def chunks() -> AsyncIterator[bytes]:
        yield b"drop"
        yield b"-streamed"

    with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
        await pool.post("/", {}, StreamedBody(13, chunks()))
    assert seen[3:] == [b"drop-streamed"]
    assert pool._slots._value == 100
    await pool.close()


async def test_no_retry_once_part_of_the_answer_came(serve_raw) -> None:  # type: ignore[no-untyped-def]
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await _read_request(reader)
            seen.append(body)
            if body == b"half":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Le")
                await writer.drain()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    port, _ = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port)
    assert await (await pool.post("/", {}, [b"a"])).read() == b"ok"
    with pytest.raises(asyncio.IncompleteReadError) as info:
        await pool.post("/", {}, [b"half"])
    assert info.value.partial == b"HTTP/1.1 200 OK\r\nContent-Le"
    assert seen == [b"a", b"half"]
    assert pool._slots._value == 100
    await pool.close()


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 300_000,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n5\r\n56",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n0\r\nX-T: 1\r\n",
    ],
    ids=["length", "long-length", "chunk-data", "chunk-size", "trailers"],
)
async def test_server_closing_mid_body(serve_raw, raw: bytes, streamed: bool) -> None:  # type: ignore[no-untyped-def]
    """The answer ends early: what arrived is handed out, then IncompleteReadError; the
    connection is not reused and its slot is given back."""
    head, _, body = raw.partition(b"\r\n\r\n")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await _read_request(reader)) != b"go":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        writer.write(raw)
        await writer.drain()

    port, conns = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port, limit=3)
    resp = await pool.post("/", {}, [b"go"])
    assert resp.status == 200
    got: list[bytes] = []
    with pytest.raises(asyncio.IncompleteReadError):
        if streamed:
            async for chunk in resp.iter_chunks():
                got.append(chunk)
        else:
            await resp.read()
    if streamed and b"chunked" not in head and len(body) > http1.READ_WHOLE:
        assert b"".join(got) == body  # a long body: what came was handed out first
    assert pool._slots._value == 3 and not pool._idle
    assert await (await pool.post("/", {}, [b"next"])).read() == b"ok"
    assert len(conns) == 2
    await pool.close()


async def test_connection_close_answer(serve_raw) -> None:  # type: ignore[no-untyped-def]
    """``Connection: close`` with a Content-Length: the body is exact (the client does not wait
    for the close) and the connection is never pooled."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await _read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        await writer.drain()
        await asyncio.sleep(5)  # the server is slow to close: the client must not wait

    port, conns = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port)
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(3):
        resp = await pool.post("/", {}, [b"n%d" % i])
        assert resp.headers["connection"] == "close"
        assert await resp.read() == b"n%d" % i
        assert not pool._idle
    assert loop.time() - start < 3
    assert len(conns) == 3
    await pool.close()


@pytest.mark.parametrize("framing", ["length", "chunked", "to-close"])
async def test_big_answer_slow_consumer(serve_raw, framing: str) -> None:  # type: ignore[no-untyped-def]
    """A 12 MiB answer read slowly: reading from the socket pauses (the unconsumed buffer stays
    bounded) and resumes; the bytes arrive complete and in order."""
    big = random.Random(7).randbytes(12 << 20)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await _read_request(reader)
            if body == b"small":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nsmall")
            elif framing == "length":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big))
                writer.write(big)
            elif framing == "chunked":
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for i in range(0, len(big), 1_000_003):
                    part = big[i : i + 1_000_003]
                    writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
                writer.write(big)
                await writer.drain()
                return
            await writer.drain()

    port, conns = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port)
    resp = await pool.post("/", {}, [b"big"])
    await asyncio.sleep(0.1)  # nobody reads yet: the connection must stop reading
    conn = resp._conn
    assert conn is not None
    peak = conn.buffered
    digest = hashlib.sha256()
    total = 0
    async for chunk in resp.iter_chunks():
        assert conn.buffered + len(chunk) <= http1._HIGH_WATER + (1 << 20)
        peak = max(peak, conn.buffered + len(chunk))
        digest.update(chunk)
        total += len(chunk)
        if total < (4 << 20):
            await asyncio.sleep(0.002)  # a slow consumer for the first 4 MiB
    assert total == len(big) and digest.digest() == hashlib.sha256(big).digest()
    assert peak <= http1._HIGH_WATER + (1 << 20)
    # the connection is in a clean state again (reused unless the answer ran to its close)
    assert await (await pool.post("/", {}, [b"small"])).read() == b"small"
    assert len(conns) == (2 if framing == "to-close" else 1)
    await pool.close()


async def test_big_answer_given_up_midway(serve_raw) -> None:  # type: ignore[no-untyped-def]
    big = b"y" * (8 << 20)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await _read_request(reader)
            if body == b"big":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big)
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    port, conns = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port, limit=1)
    resp = await pool.post("/", {}, [b"big"])
    chunks = resp.iter_chunks()
    first = await anext(chunks)
    assert first and set(first) == {ord("y")}
    await chunks.aclose()  # the consumer stops: the connection is dropped, its slot given back
    assert pool._slots._value == 1 and not pool._idle
    resp = await pool.post("/", {}, [b"big"])
    resp.close()  # given up before reading at all
    assert await (await pool.post("/", {}, [b"small"])).read() == b"ok"
    assert len(conns) == 3
    await pool.close()


async def _echo(body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest().encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(digest), digest)


async def test_streamed_request_body(serve) -> None:  # type: ignore[no-untyped-def]
    """A body piped through as it arrives (big enough for the transport to push back)."""
    parts = [b"head", random.Random(3).randbytes(20 << 20), b"", b"tail" * 1000]
    body = b"".join(parts)

    async def chunks() -> AsyncIterator[bytes]:
        for part in parts:
            await asyncio.sleep(0)
            yield part

    port, conns = await serve(_echo)
    pool = Http1Pool("127.0.0.1", port)
    resp = await pool.post("/", {"X-A": "1"}, StreamedBody(len(body), chunks()))
    assert await resp.read() == hashlib.sha256(body).hexdigest().encode()
    # and the connection is reused for the next request
    resp = await pool.post("/", {}, [b"x"])
    assert await resp.read() == hashlib.sha256(b"x").hexdigest().encode()
    assert len(conns) == 1
    await pool.close()


@pytest.mark.parametrize("size", [10, 100_000, 9 << 20])
async def test_buffer_bodies_of_any_format(serve, size: int) -> None:  # type: ignore[no-untyped-def]
    """Content-Length counts bytes, not items, of typed memoryviews; small bodies (joined with
    the head) and big ones (written buffer by buffer) arrive the same."""
    floats = memoryview(array.array("f", range(size // 4)))
    parts = [b"[", floats, bytearray(b"]"), memoryview(b"0123456789")[2:5]]
    body = b"".join(parts)
    port, _ = await serve(_echo)
    pool = Http1Pool("127.0.0.1", port)
    assert (
        await (await pool.post("/", {}, parts)).read() == hashlib.sha256(body).hexdigest().encode()
    )
    await pool.close()


async def test_pool_limit_and_concurrency(serve_raw) -> None:  # type: ignore[no-untyped-def]
    """At most `limit` connections however many requests wait; each gets its own answer."""
    open_now = 0
    most = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now, most
        open_now += 1
        most = max(most, open_now)
        try:
            while True:
                body = await _read_request(reader)
                await asyncio.sleep(0.001)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        finally:
            open_now -= 1

    port, conns = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port, limit=3)

    async def one(i: int) -> bytes:
        return await (await pool.post("/", {}, [b"req-%d" % i])).read()

    answers = await asyncio.gather(*(one(i) for i in range(60)))
    assert answers == [b"req-%d" % i for i in range(60)]
    assert len(conns) == 3 and most == 3 and pool._slots._value == 3
    await pool.close()


async def test_timeout_while_waiting_drops_the_connection(serve_raw) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await _read_request(reader)
            if body == b"hang":
                await asyncio.sleep(5)
                return
            if body == b"slow-body":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
                await writer.drain()
                await asyncio.sleep(5)
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    port, conns = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port, limit=2)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await pool.post("/", {}, [b"hang"])
    resp = await pool.post("/", {}, [b"slow-body"])
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await resp.read()
    assert pool._slots._value == 2 and not pool._idle
    assert await (await pool.post("/", {}, [b"x"])).read() == b"ok"
    assert len(conns) == 3
    await pool.close()


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n1",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n1",
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (70 * 1024) + b"\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
    ],
    ids=[
        "chunk-size",
        "negative-chunk",
        "long-chunk",
        "length",
        "negative-length",
        "huge-head",
        "101",
    ],
)
async def test_invalid_framing(serve_raw, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(raw)
        await writer.drain()
        await asyncio.sleep(0.1)

    port, _ = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port)
    with pytest.raises(HTTPProtocolError):
        resp = await pool.post("/", {}, [b"x"])
        await resp.read()
    assert pool._slots._value == 100 and not pool._idle
    await pool.close()


async def test_request_bytes(serve_raw) -> None:  # type: ignore[no-untyped-def]
    """What goes on the wire: request line, Host, the headers as given, Content-Length counting
    bytes, then the body buffers in order."""
    received: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            received.append(head + await _read_request_body(reader, head))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

    port, _ = await serve_raw(handler)
    pool = Http1Pool("127.0.0.1", port)
    headers = {"X-A": "1", "Content-Type": "application/json"}
    assert await (await pool.post("/v2/m/infer", headers, [b"ab", memoryview(b"cd")])).read() == b""
    assert await (await pool.post("/é", {}, [])).read() == b""
    assert received == [
        b"POST /v2/m/infer HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-A: 1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 4\r\n\r\nabcd" % port,
        b"POST /\xc3\xa9 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: 0\r\n\r\n" % port,
    ]
    await pool.close()


async def _read_request_body(reader: asyncio.StreamReader, head: bytes) -> bytes:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return await reader.readexactly(int(line.split(b":")[1]))
    return b""
