"""``--backend-timeout`` covers the whole of every backend call, on every path: a REST backend that
never answers, or answers part of a body and stalls, gets the client a 504 (gRPC
DEADLINE_EXCEEDED), never an endless wait; the proxy keeps serving."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest

from tests.integration.conftest import Factory, grpc_frontend, proxy_to, settings
from tests.integration.test_rest_errors import simple_json
from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.app_core import build_backend, build_pipeline

# the loop is what is tested: on uvloop and plain asyncio (tests/conftest.py)
pytestmark = pytest.mark.both_loops

TIMEOUT = 0.3


class StuckBackend:
    """A REST server that reads each request head and then sends ``answer`` (maybe nothing)
    and never another byte, holding the connection open."""

    def __init__(self, answer: bytes = b"") -> None:
        self.answer = answer
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(self.answer)
        await reader.read()  # hold on until the proxy gives up

    async def close(self) -> None:
        for w in self.writers:
            w.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def stuck() -> AsyncIterator[StuckBackend]:
    backend = StuckBackend()
    yield backend
    await backend.close()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v2/models/stats", None),
        ("GET", "/v2/models/simple/stats", None),
        ("POST", "/v2/repository/index", b"{}"),
        ("POST", "/v2/repository/models/simple/unload", b""),
        ("GET", "/v2/logging", None),
        ("POST", "/v2/models/simple/generate", b'{"text_input": "x"}'),  # passed through
        ("GET", "/v2/models/simple", None),
        ("GET", "/v2/health/ready", None),
    ],
)
async def test_rest_paths_time_out(
    make_client: Factory, stuck: StuckBackend, method: str, path: str, body: bytes | None
) -> None:
    url = await stuck.start()
    proxy = await proxy_to(
        make_client, url, backend_timeout=TIMEOUT, backend_encoding="json", restricted_api="none"
    )
    resp = await proxy.request(method, path, data=body)
    assert resp.status == 504, await resp.text()
    assert "in time" in (await resp.json())["error"]


@pytest.mark.parametrize(
    "answer",
    [
        b"",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n",
    ],
    ids=["nothing", "part-of-a-length-body", "part-of-a-chunked-body"],
)
@pytest.mark.parametrize("relayed", [True, False], ids=["relayed", "transcoded"])
async def test_infer_times_out_on_a_stalled_answer(
    make_client: Factory, answer: bytes, relayed: bool
) -> None:
    backend = StuckBackend(answer)
    url = await backend.start()
    try:
        proxy = await proxy_to(
            make_client,
            url,
            backend_timeout=TIMEOUT,
            backend_encoding="json" if relayed else "binary",
        )
        resp = await proxy.post(
            "/v2/models/simple/infer", data=simple_json(), headers={"Accept-Encoding": "identity"}
        )
        if relayed and b"chunked" in answer:
            # an answer of unknown length is streamed as it comes: its head is out when the
            # backend stalls, so the client sees the answer cut off, never a complete one
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
        else:
            assert resp.status == 504, await resp.text()
            assert "in time" in (await resp.json())["error"]
        assert (await proxy.get("/v2/health/live")).status == 200
    finally:
        await backend.close()


async def test_grpc_repository_index_times_out(stuck: StuckBackend) -> None:
    url = await stuck.start()
    s = settings(backend=url, backend_timeout=TIMEOUT, restricted_api="none")
    backend = build_backend(s)
    await backend.start()
    try:
        async with grpc_frontend(s, build_pipeline(s, backend)) as channel:
            call = channel.unary_unary(
                "/inference.GRPCInferenceService/RepositoryIndex",
                request_serializer=pb.RepositoryIndexRequest.SerializeToString,
                response_deserializer=pb.RepositoryIndexResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(pb.RepositoryIndexRequest(), timeout=30)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "in time" in (info.value.details() or "")
    finally:
        await backend.close()


async def test_a_broken_answer_is_502_with_a_message(make_client: Factory) -> None:
    """Answers that are not HTTP or not v2 become 502 on every path."""
    for answer, relayed in [
        (b"HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\n{}", True),
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: 16\r\n\r\nthis is not json",
            True,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: 16\r\n\r\nthis is not json",
            False,
        ),
        (b"this is not http\r\n\r\n", True),
    ]:
        backend = StuckBackend(answer)
        url = await backend.start()
        try:
            proxy = await proxy_to(
                make_client, url, backend_encoding="json" if relayed else "binary"
            )
            resp = await proxy.post(
                "/v2/models/simple/infer",
                data=simple_json(),
                headers={"Accept-Encoding": "identity"},
            )
            assert resp.status == 502, (answer, await resp.text())
            assert json.loads(await resp.read())["error"]
        finally:
            await backend.close()
