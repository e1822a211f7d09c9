"""The REST backend over several endpoints (``http://A,B``), against raw loopback servers:
readiness while one endpoint is ready, a request that finds one endpoint closed goes to the
other, and an /infer POST whose connection is lost once sent is a 502, never sent to the other
endpoint. A metadata question that fails on one endpoint (5xx, garbage) goes to the next; an
inference answered 5xx is not, and 3 in a row take the endpoint out; an answer over
``max_answer_size`` is a 502 naming the backend. A decoded inference is sent once, to the next
endpoint only when it could not be sent, and its answer read whole: one that breaks off counts
against its endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from v2proxy.backends.mindie import MindieBackend
from v2proxy.backends.rest import RestBackend
from v2proxy.core.errors import BackendError, BadGateway
from v2proxy.core.model import Datatype, InferRequest, Tensor

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


META = b'{"name":"srv","version":"1","extensions":[]}'


@pytest.mark.parametrize(
    "sick",
    [
        _answer("500 Internal Server Error", b'{"error":"broken"}'),
        b"SSH-2.0-OpenSSH_9.6\r\nnot HTTP\r\n\r\n",
    ],
    ids=["5xx", "garbage"],
)
async def test_a_question_that_fails_on_one_endpoint_goes_to_the_next(sick: bytes) -> None:
    seen_a: list[bytes] = []
    seen_b: list[bytes] = []

    async def bad(request: bytes) -> bytes | None:
        return sick

    async def ok(request: bytes) -> bytes | None:
        return _answer("200 OK", META)

    async with _server(bad, seen_a) as port_a, _server(ok, seen_b) as port_b:
        backend = RestBackend(f"http://127.0.0.1:{port_a},127.0.0.1:{port_b}")
        await backend.start()
        try:
            for _ in range(4):  # whichever endpoint each question starts with
                assert (await backend.server_metadata())["name"] == "srv"
            bad_ep = backend.client.endpoints.all[0]
            assert bad_ep.failures >= 1 and backend.client.endpoints.all[1].failures == 0
        finally:
            await backend.close()
    assert seen_a and len(seen_b) == 4


async def test_an_inference_answered_5xx_is_not_sent_again_and_counts() -> None:
    seen_a: list[bytes] = []
    seen_b: list[bytes] = []

    async def broken(request: bytes) -> bytes | None:
        return _answer("500 Internal Server Error", b'{"error":"broken"}')

    async def ok(request: bytes) -> bytes | None:
        return _answer("200 OK", INFER)

    async with _server(broken, seen_a) as port_a, _server(ok, seen_b) as port_b:
        backend = RestBackend(f"http://127.0.0.1:{port_a},127.0.0.1:{port_b}")
        await backend.start()
        try:
            statuses = []
            for _ in range(8):
                try:
                    answer = await backend.relay_infer("m", "", BODY, None, [])
                    statuses.append(answer.status)
                except BackendError as exc:
                    statuses.append(exc.http_status)
        finally:
            await backend.close()
    # each inference went to one endpoint only; A is out after 3 5xx in a row (the cap lets
    # one of two go)
    assert len(seen_a) + len(seen_b) == 8
    assert statuses.count(500) == len(seen_a) == 3
    assert statuses.count(200) == len(seen_b) == 5


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_answer_over_its_bound_is_a_502_naming_the_backend(chunked: bool) -> None:
    big = b'{"name":"' + b"x" * 5000 + b'"}'

    async def bloated(request: bytes) -> bytes | None:
        if not chunked:
            return _answer("200 OK", big)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        return (
            head
            + b"Transfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n0\r\n\r\n"
            % (
                len(big),
                big,
            )
        )

    seen: list[bytes] = []
    async with _server(bloated, seen) as port:
        url = f"http://127.0.0.1:{port}"
        backend = RestBackend(url, max_answer_size=4096)
        await backend.start()
        try:
            with pytest.raises(BadGateway) as info:
                await backend.server_metadata()
            assert url in str(info.value) and "--backend-max-answer-size" in str(info.value)
            assert "4096" in str(info.value)
            # a status-only question reads no more than it needs and answers
            assert await backend.server_ready() is True
        finally:
            await backend.close()


async def test_a_mindie_answer_over_its_bound_is_a_502_naming_the_backend() -> None:
    big = b'{"name":"' + b"x" * 5000 + b'"}'

    async def bloated(request: bytes) -> bytes | None:
        return _answer("200 OK", big)

    seen: list[bytes] = []
    async with _server(bloated, seen) as port:
        backend = MindieBackend(f"127.0.0.1:{port}", max_answer_size=4096)
        await backend.start()
        try:
            with pytest.raises(BadGateway) as info:
                await backend.server_metadata()
            assert f"mindie://127.0.0.1:{port}" in str(info.value)
            assert "--backend-max-answer-size" in str(info.value)
            assert await backend.server_ready() is True
        finally:
            await backend.close()


def _decoded_request() -> InferRequest:
    return InferRequest("m", [Tensor("I", Datatype.INT32, (1,), struct.pack("<i", 7))])


def _chunked(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked"
    return head + b"\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


@pytest.mark.parametrize("encoding", ["json", "binary"])
async def test_a_decoded_inference_goes_on_when_unsent_and_is_read_whole(encoding: str) -> None:
    """A decoded request (sent as JSON or binary tensors) that finds an endpoint closed goes
    to the other; its answer is read whole whatever its framing (chunked too)."""
    seen: list[bytes] = []
    answers = iter([_chunked(INFER), _answer("200 OK", INFER)] * 2)

    async def ok(request: bytes) -> bytes | None:
        return next(answers)

    async with _server(ok, seen) as port:
        backend = RestBackend(f"http://127.0.0.1:{_closed_port()},127.0.0.1:{port}", encoding)
        await backend.start()
        try:
            for _ in range(4):
                response = await backend.infer(_decoded_request(), [])
                assert bytes(response.outputs[0].data) == struct.pack("<i", 7)
        finally:
            await backend.close()
    assert seen == [b"/v2/models/m/infer"] * 4


@pytest.mark.parametrize("encoding", ["json", "binary"])
async def test_a_decoded_inference_cut_off_after_its_head_counts_against_its_endpoint(
    encoding: str,
) -> None:
    """An answer to a decoded request that breaks off once its head is in is a 502 naming the
    backend, and a failure of its endpoint (not an answer), never sent again."""
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b" ", 2)[1])
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        writer.write(_answer("200 OK", INFER)[:-10])
        await writer.drain()
        writer.transport.abort()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    backend = RestBackend(url, encoding)
    await backend.start()
    try:
        with pytest.raises(BadGateway, match=f"backend at {url}"):
            await backend.infer(_decoded_request(), [])
        endpoint = backend.client.endpoints.all[0]
        assert endpoint.failures == 1
    finally:
        await backend.close()
        server.close()
        await server.wait_closed()
    assert seen == [b"/v2/models/m/infer"]
