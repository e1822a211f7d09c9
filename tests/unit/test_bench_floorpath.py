"""``benchmarks/floorpath.py``, the least version of v2proxy's small relayed /infer (a measuring
stick, never a product): it relays a plain JSON /infer as the client sent it (hop-by-hop headers
dropped, Host and Content-Length written afresh, ``x-request-id`` passed on and echoed), records
it, and answers 502 for what v2proxy would not relay (a body a stage applies to, compression, an
answer that is no JSON object), the backend seeing nothing of a declined request. A measuring
stick that skipped a duty would measure less than the path costs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.unit.bench_module import bench_module

pytestmark = pytest.mark.both_loops


floorpath = bench_module("floorpath")

BODY = json.dumps(
    {"inputs": [{"name": "X", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}
).encode()
ANSWER = b'{"model_name":"m","outputs":[]}'


class _Backend:
    """Records each request it reads and answers ``answer`` (JSON)."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.handlers: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % len(self.answer)
                + self.answer
            )
        writer.close()


@pytest.fixture
async def stack(request: pytest.FixtureRequest) -> AsyncIterator[tuple[int, _Backend, Any]]:
    backend = _Backend(getattr(request, "param", ANSWER))
    server = await asyncio.start_server(backend.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    shared = floorpath.Shared("127.0.0.1", port)
    front = await floorpath.start(0, f"127.0.0.1:{port}", shared)
    yield front.sockets[0].getsockname()[1], backend, shared
    for task in backend.handlers:
        task.cancel()
    await asyncio.gather(*backend.handlers, return_exceptions=True)
    front.close()
    server.close()


async def _post(port: int, body: bytes, extra: bytes = b"") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: client\r\nConnection: keep-alive\r\n"
        b"TE: trailers\r\nx-request-id: r1\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    answer = head + await reader.readexactly(length)
    writer.close()
    return answer


async def test_a_plain_infer_is_relayed_and_recorded(stack: tuple[int, _Backend, Any]) -> None:
    port, backend, shared = stack
    answer = await _post(port, BODY)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"x-request-id: r1\r\n" in answer
    assert answer.endswith(b"\r\n\r\n" + ANSWER)
    (sent,) = backend.requests
    head, _, body = sent.partition(b"\r\n\r\n")
    assert body == BODY  # as the client sent it
    lines = head.lower().split(b"\r\n")
    assert lines[0] == b"post /v2/models/m/infer http/1.1"
    assert b"host: 127.0.0.1:%d" % shared.port in lines
    assert b"x-request-id: r1" in lines
    assert not any(line.startswith((b"te:", b"connection:", b"host: client")) for line in lines)
    record = shared.record
    assert dict(record.count) == {("m", 200): 1}
    assert record.bytes_in == len(BODY)
    assert sum(record.latency) == 1


@pytest.mark.parametrize(
    ("body", "extra"),
    [
        (  # a stage applies (shared memory): never relayed as sent
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": "X",
                            "datatype": "INT32",
                            "shape": [2],
                            "parameters": {"shared_memory_region": "r"},
                        }
                    ]
                }
            ).encode(),
            b"",
        ),
        (BODY, b"Content-Encoding: gzip\r\n"),  # compressed
        (b'{"inputs": [', b""),  # malformed
    ],
    ids=["stage", "compressed", "malformed"],
)
async def test_what_v2proxy_would_not_relay_is_declined(
    stack: tuple[int, _Backend, Any], body: bytes, extra: bytes
) -> None:
    port, backend, _ = stack
    answer = await _post(port, body, extra)
    assert answer.startswith(b"HTTP/1.1 502 ")
    assert backend.requests == []


@pytest.mark.parametrize("stack", [b"[1, 2]"], indirect=True)
async def test_an_answer_that_is_no_json_object_is_a_502(
    stack: tuple[int, _Backend, Any],
) -> None:
    port, backend, _ = stack
    answer = await _post(port, BODY)
    assert answer.startswith(b"HTTP/1.1 502 ")
    assert len(backend.requests) == 1
