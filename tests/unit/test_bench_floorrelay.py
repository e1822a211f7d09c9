"""``benchmarks/floorrelay.py``, the ``floor-relay`` system of ``make bench``: it relays what an
HTTP proxy must (hop-by-hop headers dropped, Host and Content-Length written afresh, a chunked
answer sent with its length), keeps one backend connection alive across requests, answers
pipelined requests in order, closes when the client asks to, and answers 502 when the backend
is gone. A benchmark's compared system that relays wrongly would measure the wrong thing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.unit.bench_module import bench_module

pytestmark = pytest.mark.both_loops


floorrelay = bench_module("floorrelay")

#: the backend's answer: chunked, with hop-by-hop headers the relay must drop
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nKeep-Alive: timeout=5\r\n"
    b"Connection: keep-alive\r\nTransfer-Encoding: chunked\r\nX-Model: simple\r\n\r\n"
    b'3\r\n{"a\r\n4\r\n":1}\r\n0\r\n\r\n'
)
RELAYED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Model: simple\r\n"
    b'content-length: 7\r\n\r\n{"a":1}'
)


class _Backend:
    """A backend that records the request heads it reads and answers each with CHUNKED."""

    def __init__(self) -> None:
        self.port = 0
        self.connections = 0
        self.requests: list[bytes] = []
        self.handlers: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.CancelledError):
                break
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            self.requests.append(head + await reader.readexactly(length))
            writer.write(CHUNKED)
        writer.close()


@pytest.fixture
async def relay() -> AsyncIterator[tuple[int, _Backend]]:
    backend = _Backend()
    server = await asyncio.start_server(backend.handle, "127.0.0.1", 0)
    backend.port = server.sockets[0].getsockname()[1]
    front = await floorrelay.start(0, f"127.0.0.1:{backend.port}")
    yield front.sockets[0].getsockname()[1], backend
    for task in backend.handlers:  # the relay's kept-alive connection: closed from this side
        task.cancel()
    await asyncio.gather(*backend.handlers, return_exceptions=True)
    for one in (front, server):
        one.close()
        await one.wait_closed()


def _request(extra: bytes = b"") -> bytes:
    return (
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json"
        b"\r\nTE: trailers\r\nProxy-Connection: keep-alive\r\n" + extra + b"Content-Length: 5"
        b"\r\n\r\nhello"
    )


async def test_it_rewrites_the_heads_and_keeps_the_backend_connection(
    relay: tuple[int, _Backend],
) -> None:
    port, backend = relay
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(2):
        writer.write(_request(b"Connection: keep-alive\r\n"))
        assert await reader.readexactly(len(RELAYED)) == RELAYED
    # pipelined: both answers, in order
    writer.write(_request() * 2)
    assert await reader.readexactly(2 * len(RELAYED)) == 2 * RELAYED
    writer.close()
    await writer.wait_closed()
    assert backend.connections == 1
    assert backend.requests == 4 * [
        b"POST /v2/models/simple/infer HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n" % backend.port
        + b"Content-Type: application/json\r\ncontent-length: 5\r\n\r\nhello"
    ]


async def test_it_closes_when_the_client_asks(relay: tuple[int, _Backend]) -> None:
    port, _ = relay
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request(b"Connection: close\r\n"))
    assert await reader.read() == RELAYED  # then end of file
    writer.close()
    await writer.wait_closed()


async def test_a_backend_that_is_gone_is_a_502() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    dead = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    front = await floorrelay.start(0, f"127.0.0.1:{dead}")
    reader, writer = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
    writer.write(_request())
    assert (await reader.read()).startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    writer.close()
    await writer.wait_closed()
    front.close()
    await front.wait_closed()
