"""The REST backend over several endpoints (``http://A,B``), against raw loopback servers:
readiness while one endpoint is ready, a request that finds one endpoint closed goes to the
other, and an /infer POST whose connection is lost once sent is a 502, never sent to the other
endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from v2proxy.backends.rest import RestBackend
from v2proxy.core.errors import BadGateway

# the loop is what is tested: on uvloop and plain asyncio (tests/conftest.py)
pytestmark = pytest.mark.both_loops

Handler = Callable[[bytes], Awaitable[bytes | None]]  # request head+body -> answer (None: close)


def _answer(status: str, body: bytes = b"") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


@contextlib.asynccontextmanager
async def _server(handler: Handler, seen: list[bytes]) -> AsyncIterator[int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                seen.append(request.split(b" ", 2)[1])
                answer = await handler(request)
                if answer is None:
                    writer.transport.abort()
                    return
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


async def _status(code: str) -> Handler:
    async def handler(request: bytes) -> bytes | None:
        return _answer(code)

    return handler


@pytest.mark.parametrize(
    ("a", "b", "ready"),
    [
        ("503 Service Unavailable", "200 OK", True),
        ("200 OK", "503 Service Unavailable", True),
        ("503 Service Unavailable", "503 Service Unavailable", False),
        ("200 OK", None, True),  # B closed: it passes the question on
        ("503 Service Unavailable", None, False),
    ],
)
async def test_ready_while_one_endpoint_is(a: str, b: str | None, ready: bool) -> None:
    seen_a: list[bytes] = []
    seen_b: list[bytes] = []
    async with _server(await _status(a), seen_a) as port_a, contextlib.AsyncExitStack() as stack:
        if b is None:
            port_b = _closed_port()
        else:
            port_b = await stack.enter_async_context(_server(await _status(b), seen_b))
        backend = RestBackend(f"http://127.0.0.1:{port_a},127.0.0.1:{port_b}")
        await backend.start()
        try:
            for _ in range(4):  # whichever endpoint each question starts with
                assert await backend.server_ready() is ready
        finally:
            await backend.close()
    assert seen_a and set(seen_a) == {b"/v2/health/ready"}


INFER = b'{"model_name":"m","outputs":[{"name":"O","datatype":"INT32","shape":[1],"data":[7]}]}'
BODY = b'{"inputs":[{"name":"I","datatype":"INT32","shape":[1],"data":[7]}]}'


async def test_a_request_that_finds_an_endpoint_closed_goes_to_the_other() -> None:
    seen: list[bytes] = []

    async def ok(request: bytes) -> bytes | None:
        return _answer("200 OK", INFER)

    async with _server(ok, seen) as port:
        backend = RestBackend(f"http://127.0.0.1:{_closed_port()},127.0.0.1:{port}")
        await backend.start()
        try:
            for _ in range(6):
                answer = await backend.relay_infer("m", "", BODY, None, [])
                assert answer.status == 200
        finally:
            await backend.close()
    assert seen == [b"/v2/models/m/infer"] * 6


async def test_a_post_whose_connection_is_lost_is_a_502_and_never_sent_again() -> None:
    seen_a: list[bytes] = []
    seen_b: list[bytes] = []

    async def drop(request: bytes) -> bytes | None:
        return None  # reads the request, then the connection is reset

    async def ok(request: bytes) -> bytes | None:
        return _answer("200 OK", INFER)

    async with _server(drop, seen_a) as port_a, _server(ok, seen_b) as port_b:
        backend = RestBackend(f"http://127.0.0.1:{port_a},127.0.0.1:{port_b}")
        await backend.start()
        try:
            outcomes = []
            for _ in range(4):
                try:
                    answer = await backend.relay_infer("m", "", BODY, None, [])
                    outcomes.append(answer.status)
                except BadGateway as exc:
                    assert "backend" in str(exc)
                    outcomes.append(502)
        finally:
            await backend.close()
    # each POST went to one endpoint only: the ones A dropped failed, none reached B twice
    assert outcomes.count(502) == len(seen_a) >= 1
    assert outcomes.count(200) == len(seen_b)
    assert len(seen_a) + len(seen_b) == 4
