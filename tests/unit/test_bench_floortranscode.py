"""``benchmarks/floortranscode.py``, the floor of the JSON-client-to-binary-backend path: the
backend gets the client's request as binary tensors (its JSON header's length in
Inference-Header-Content-Length, every output asked binary) and the client gets the very JSON
answer v2proxy writes for the backend's binary answer, over one kept-alive backend connection;
a backend that is gone is a 502. A measuring stick that transcodes wrongly would measure the
wrong thing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from tests.unit.bench_module import bench_module
from v2proxy.codecs import binary as binc
from v2proxy.codecs.dtypes import as_numpy, from_numpy
from v2proxy.core.model import Datatype, InferResponse

pytestmark = pytest.mark.both_loops


floortranscode = bench_module("floortranscode")

BODY = (
    b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[%s]},'
    b'{"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":[%s]}]}'
    % (b",".join(b"%d" % i for i in range(16)), b",".join([b"3"] * 16))
)


def _simple(request_body: bytes, ihcl: int) -> InferResponse:
    """The ``simple`` model's answer to a binary request (sum and difference)."""
    request = binc.decode_request(request_body, ihcl, "simple")
    assert request.parameters == {"binary_data_output": True}
    a, b = (as_numpy(t) for t in request.inputs)
    outputs = [from_numpy("OUTPUT0", Datatype.INT32, a + b)]
    outputs.append(from_numpy("OUTPUT1", Datatype.INT32, a - b))
    return InferResponse("simple", outputs, "1")


class _Backend:
    """A binary-tensor backend serving ``simple``; it records each request's head."""

    def __init__(self) -> None:
        self.connections = 0
        self.heads: list[bytes] = []
        self.handlers: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.CancelledError):
                break
            fields = dict(
                line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line
            )
            body = await reader.readexactly(int(fields[b"content-length"]))
            self.heads.append(head)
            ihcl = int(fields[b"inference-header-content-length"])
            chunks, length = binc.encode_response(_simple(body, ihcl), lambda _t: True)
            answer = b"".join(bytes(c) for c in chunks)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s"
                % (length, len(answer), answer)
            )
        writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[int, _Backend]]:
    backend = _Backend()
    server = await asyncio.start_server(backend.handle, "127.0.0.1", 0)
    front = await floortranscode.start(0, f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
    yield front.sockets[0].getsockname()[1], backend
    for task in backend.handlers:  # the kept-alive connection: closed from this side
        task.cancel()
    await asyncio.gather(*backend.handlers, return_exceptions=True)
    for one in (front, server):
        one.close()
        await one.wait_closed()


async def test_it_answers_what_v2proxy_answers(proxy: tuple[int, _Backend]) -> None:
    port, backend = proxy
    expected, _ = binc.encode_response(_simple(*_binary(BODY)), lambda _t: False)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(2):
        writer.write(
            b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: proxy\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
        length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
        assert await reader.readexactly(length) == bytes(expected[0])
    writer.close()
    await writer.wait_closed()
    assert backend.connections == 1
    assert all(
        h.startswith(b"POST /v2/models/simple/infer HTTP/1.1\r\n")
        and b"content-type: application/octet-stream\r\n" in h
        for h in backend.heads
    )


def _binary(body: bytes) -> tuple[bytes, int]:
    binary, ihcl = floortranscode.binary_request(body)
    assert isinstance(binary, bytes) and isinstance(ihcl, int)
    return binary, ihcl


def test_the_request_goes_binary_to_the_same_tensors() -> None:
    binary, ihcl = _binary(BODY)
    ours = binc.decode_request(BODY, None, "simple")
    theirs = binc.decode_request(binary, ihcl, "simple")
    assert [(t.name, t.datatype, t.shape) for t in theirs.inputs] == [
        (t.name, t.datatype, t.shape) for t in ours.inputs
    ]
    for a, b in zip(theirs.inputs, ours.inputs, strict=True):
        np.testing.assert_array_equal(as_numpy(a), as_numpy(b))


async def test_a_backend_that_is_gone_is_a_502() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    dead = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    front = await floortranscode.start(0, f"127.0.0.1:{dead}")
    reader, writer = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
    writer.write(
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: proxy\r\nContent-Length: %d\r\n\r\n%s"
        % (len(BODY), BODY)
    )
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    writer.close()
    await writer.wait_closed()
    front.close()
    await front.wait_closed()
