"""Relay.relay_json, the pipeline's strategy for a large JSON /infer body still arriving: the
body relayed to a REST backend while it arrives.

The backend here is a plain socket server that records, for every request, the bytes it got and
whether they made a whole request (Content-Length reached) before the connection ended. A valid
body must reach it byte for byte, and its answer come back byte for byte; a malformed one must
be answered with the full decoder's error and never reach it whole.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from tests.integration.conftest import Factory, proxy_to
from v2proxy.backends.rest import RestBackend
from v2proxy.codecs import binary as binc
from v2proxy.core.errors import CodecError, InvalidRequest, PayloadTooLarge
from v2proxy.core.model import InferRequest
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import ForwardResponse, StreamedBody
from v2proxy.core.relay import HOLD_BACK, Relay

# the loop is what is tested: on uvloop and plain asyncio (tests/conftest.py)
pytestmark = pytest.mark.both_loops

MODEL = "identity_fp32"
LIMIT = 64 * 1024 * 1024
N = 150_000  # about 3 MB of JSON


class RecordingBackend:
    """A v2 REST server on a raw socket: answers every whole /infer request with ``answer``
    and records what arrived (``whole``: complete bodies; ``broken``: byte counts of requests
    whose connection ended before their Content-Length)."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.whole: list[bytes] = []
        self.broken: list[int] = []
        self.cut_off = asyncio.Event()
        self.head_seen = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as exc:
                    if exc.partial:
                        self._cut_off(0)
                    return
                self.head_seen.set()
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                try:
                    body = await reader.readexactly(length)
                except asyncio.IncompleteReadError as exc:
                    self._cut_off(len(exc.partial))
                    return
                self.whole.append(body)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(self.answer)
                )
                writer.write(self.answer)
                await writer.drain()
        except ConnectionError:
            self._cut_off(-1)
        finally:
            writer.close()

    def _cut_off(self, received: int) -> None:
        self.broken.append(received)
        self.cut_off.set()

    async def wait_broken(self) -> None:
        """Until the connection of a request that was cut off has been seen to end."""
        async with asyncio.timeout(10):
            await self.cut_off.wait()


def big_body(n: int = N, datatype: str = "FP32", **extra: Any) -> bytes:
    values = np.random.default_rng(n).random(n).astype(np.float32).astype(np.float64)
    data = ",".join(repr(float(v)) for v in values)
    head = json.dumps({"name": "INPUT0", "datatype": datatype, "shape": [n]})[:-1]
    rest = "".join(f',"{k}":{json.dumps(v)}' for k, v in extra.items())
    return f'{{"inputs":[{head},"data":[{data}]}}]{rest}}}'.encode()


async def chunks_of(
    body: bytes, sizes: list[int], stop_at: int | None = None
) -> AsyncIterator[bytes]:
    pos, i = 0, 0
    end = len(body) if stop_at is None else stop_at
    while pos < end:
        n = sizes[i % len(sizes)]
        yield body[pos : min(pos + n, end)]
        pos, i = pos + n, i + 1
        await asyncio.sleep(0)


@pytest.fixture
async def setup() -> AsyncIterator[tuple[RecordingBackend, Pipeline]]:
    answer = json.dumps({"model_name": MODEL, "outputs": [], "pad": "x" * 400_000}).encode()
    backend = RecordingBackend(answer)
    url = await backend.start()
    rest = RestBackend(url, encoding="json")
    await rest.start()
    yield backend, Pipeline(rest, LIMIT)
    await rest.close()
    await backend.close()


async def relay(
    pipeline: Pipeline, body: bytes, sizes: list[int], stop_at: int | None = None
) -> ForwardResponse | InferRequest:
    relay = Relay(pipeline.backend, pipeline.stages, pipeline.max_input_size, pipeline.max_tensors)
    return await relay.relay_json(
        MODEL, "", StreamedBody(len(body), chunks_of(body, sizes, stop_at)), []
    )


async def answer_of(result: ForwardResponse | InferRequest) -> bytes:
    assert isinstance(result, ForwardResponse)
    try:
        if result.content is not None:
            return result.content
        return b"".join([chunk async for chunk in result.body])
    finally:
        await result.release()


@pytest.mark.parametrize("sizes", [[65536], [768000], [1, 5000, 99999], [10**8]])
async def test_valid_body_relayed_unchanged(
    setup: tuple[RecordingBackend, Pipeline], sizes: list[int]
) -> None:
    backend, pipeline = setup
    body = big_body()
    result = await relay(pipeline, body, sizes)
    assert await answer_of(result) == backend.answer
    assert backend.whole == [body]
    assert not backend.broken


async def test_bodies_one_after_another(setup: tuple[RecordingBackend, Pipeline]) -> None:
    """The buffer that keeps a body is reused: a smaller body after a larger one is sent as
    it is, and one that ends early is refused, never completed from the last one's bytes."""
    backend, pipeline = setup
    first, second = big_body(), big_body(N // 3)
    for body in (first, second, first):
        assert await answer_of(await relay(pipeline, body, [65536])) == backend.answer
    assert backend.whole == [first, second, first]
    with pytest.raises(InvalidRequest, match="incomplete request body"):
        await relay(pipeline, second, [65536], stop_at=len(second) - 10)
    await backend.wait_broken()
    assert backend.whole == [first, second, first]


async def test_undecided_valid_body_still_relayed(
    setup: tuple[RecordingBackend, Pipeline],
) -> None:
    """Valid, but beyond the streamed check (the datatype after the data): the full decoder
    decides, and the body is relayed."""
    backend, pipeline = setup
    body = (
        big_body().replace(b'"datatype": "FP32", ', b"").replace(b"]}]}", b'],"datatype":"FP32"}]}')
    )
    assert isinstance(binc.decode_request(body, None, MODEL), InferRequest)
    assert await answer_of(await relay(pipeline, body, [65536])) == backend.answer
    assert backend.whole == [body]


def _malformed() -> list[tuple[str, bytes]]:
    body = big_body()
    middle = body.index(b",", len(body) // 2)
    return [
        ("count", big_body().replace(b"[%d]" % N, b"[%d]" % (N + 1), 1)),
        ("string", body[:middle] + b',"7"' + body[middle:]),
        ("bool at the end", body[:-4] + b",true]}]}"),
        ("trailing comma", body[:-4] + b",]}]}"),
        ("bad number", body[:middle] + b",1.2.3" + body[middle:]),
        ("garbage after", body + b" x"),
        ("unfinished", body[:-1]),
        ("floats as INT8", big_body(datatype="INT8")),
        ("reserved parameter", big_body(parameters={"triton_x": 1})),
        ("bad output", big_body(outputs=[{"name": 5}])),
    ]


@pytest.mark.parametrize(("what", "body"), _malformed(), ids=[w for w, _ in _malformed()])
async def test_malformed_body_never_reaches_the_backend_whole(
    setup: tuple[RecordingBackend, Pipeline], what: str, body: bytes
) -> None:
    backend, pipeline = setup
    with pytest.raises(CodecError) as expected:
        binc.decode_request(body, None, MODEL, "", LIMIT)
    with pytest.raises(CodecError) as got:
        await relay(pipeline, body, [65536])
    assert got.value.message == expected.value.message  # the full decoder's words
    await backend.wait_broken()
    assert backend.whole == []
    assert len(backend.broken) == 1
    # streamed on while it arrived, all but the held-back end
    assert len(body) - HOLD_BACK - 65536 <= backend.broken[0] < len(body)


@pytest.mark.parametrize(
    "extra",
    [
        {"outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]},
        {"parameters": {"binary_data_output": True}},
        {"outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]},
    ],
)
async def test_body_needing_a_stage_is_returned_decoded(
    setup: tuple[RecordingBackend, Pipeline], extra: dict[str, Any]
) -> None:
    backend, pipeline = setup
    body = big_body(**extra)
    result = await relay(pipeline, body, [65536])
    assert isinstance(result, InferRequest)
    reference = binc.decode_request(body, None, MODEL, "", LIMIT)
    assert bytes(result.inputs[0].data) == bytes(reference.inputs[0].data)
    assert result.outputs == reference.outputs
    assert result.parameters == reference.parameters
    await backend.wait_broken()
    assert backend.whole == []


async def test_body_over_the_input_limit_is_refused_unsent(
    setup: tuple[RecordingBackend, Pipeline],
) -> None:
    """A JSON body longer than --max-input-size gets the decoder's 400 and never reaches
    the backend."""
    backend, pipeline = setup
    body = big_body()
    limit = len(body) - 1
    with pytest.raises(PayloadTooLarge) as expected:
        binc.decode_request(body, None, MODEL, "", limit)
    small = Pipeline(pipeline.backend, limit)
    with pytest.raises(PayloadTooLarge) as got:
        await relay(small, body, [65536])
    assert got.value.message == expected.value.message
    assert got.value.http_status == 400  # as Triton answers
    assert backend.whole == [] and backend.broken == []


async def test_binary_only_backend_gets_nothing_relayed() -> None:
    backend = RecordingBackend(b"{}")
    url = await backend.start()
    rest = RestBackend(url, encoding="binary")
    await rest.start()
    try:
        body = big_body(1000)
        result = await relay(Pipeline(rest, LIMIT), body, [4096])
        assert isinstance(result, InferRequest)
        assert result.inputs[0].shape == (1000,)
        assert backend.whole == [] and backend.broken == []
    finally:
        await rest.close()
        await backend.close()


# --------------------------------------------------------------------------- through the frontend

BIG_N = 250_000  # about 5 MB of JSON: large enough for the REST frontend to stream it


@pytest.fixture
async def recording() -> AsyncIterator[tuple[RecordingBackend, str]]:
    answer = json.dumps({"model_name": MODEL, "outputs": [], "pad": "y" * 300_000}).encode()
    backend = RecordingBackend(answer)
    url = await backend.start()
    yield backend, url
    await backend.close()


async def post_json(proxy: TestClient[Any, Any], body: bytes) -> ClientResponse:
    """POST a JSON /infer body whose length is known, asking for no compressed answer."""
    return await proxy.post(
        f"/v2/models/{MODEL}/infer",
        data=io.BytesIO(body),
        headers={"Content-Type": "application/json"},
        skip_auto_headers=["Accept-Encoding"],
    )


async def post_in_halves(
    proxy: TestClient[Any, Any], body: bytes, pause: Callable[[], Awaitable[None]]
) -> ClientResponse:
    """POST a JSON /infer body with its length known, in two halves with ``pause`` between."""
    half = len(body) // 2

    async def halves() -> AsyncIterator[bytes]:
        yield body[:half]
        await pause()
        yield body[half:]

    return await proxy.post(
        f"/v2/models/{MODEL}/infer",
        data=halves(),
        headers={"Content-Type": "application/json", "Content-Length": str(len(body))},
        skip_auto_headers=["Accept-Encoding"],
    )


async def test_frontend_relays_large_json_unchanged(
    make_client: Factory, recording: tuple[RecordingBackend, str]
) -> None:
    backend, url = recording
    proxy = await proxy_to(make_client, url, backend_encoding="auto")
    body = big_body(BIG_N)
    resp = await post_json(proxy, body)
    assert resp.status == 200, await resp.text()
    assert await resp.read() == backend.answer
    assert backend.whole == [body]


async def test_frontend_relays_large_json_while_it_arrives(
    make_client: Factory, recording: tuple[RecordingBackend, str]
) -> None:
    """The backend has the request (its head and first bytes) before the client has sent the
    second half of the body: the proxy did not wait for the whole body."""
    backend, url = recording
    proxy = await proxy_to(make_client, url, backend_encoding="auto")
    body = big_body(BIG_N)
    seen_early: list[bool] = []

    async def until_the_backend_has_the_request() -> None:
        try:
            async with asyncio.timeout(10):
                await backend.head_seen.wait()
            seen_early.append(True)
        except TimeoutError:
            seen_early.append(False)

    resp = await post_in_halves(proxy, body, until_the_backend_has_the_request)
    assert resp.status == 200, await resp.text()
    assert await resp.read() == backend.answer
    assert seen_early == [True]
    assert backend.whole == [body]


async def test_slow_upload_is_not_counted_against_the_backend_timeout(
    make_client: Factory, recording: tuple[RecordingBackend, str]
) -> None:
    """--backend-timeout bounds waits on the backend, not on the client's upload: a body
    streamed to the backend more slowly than the timeout still gets its answer."""
    backend, url = recording
    proxy = await proxy_to(make_client, url, backend_encoding="auto", backend_timeout=0.3)
    body = big_body(BIG_N)
    resp = await post_in_halves(proxy, body, lambda: asyncio.sleep(0.8))
    assert resp.status == 200, await resp.text()
    assert await resp.read() == backend.answer
    assert backend.whole == [body]


async def test_backend_that_stops_reading_a_streamed_body_times_out(make_client: Factory) -> None:
    """A backend that takes no more of a streamed body (here: reads nothing) gets
    --backend-timeout like one that does not answer: 504, not a request waiting forever."""
    accepted: list[asyncio.StreamWriter] = []

    async def never_reads(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(never_reads, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        # no lingering read of the body left unsent once the answer is out (aiohttp keeps
        # reading for 10 s by default, even after the client has gone)
        proxy = await proxy_to(
            make_client,
            f"http://127.0.0.1:{port}",
            server_options={},
            backend_encoding="binary",
            backend_timeout=0.5,
        )
        n = 12 * 1024 * 1024  # 48 MiB: more than the sockets between them buffer
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "datatype": "FP32",
                        "shape": [n],
                        "parameters": {"binary_data_size": 4 * n},
                    }
                ]
            }
        ).encode()
        body = header + bytes(4 * n)
        head = (
            f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: test\r\n"
            "Content-Type: application/octet-stream\r\n"
            f"{binc.IHCL_HEADER}: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        # a raw client: it sends the whole body at once and drops its connection once it has
        # the answer
        assert proxy.server.port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.server.port)
        try:
            async with asyncio.timeout(20):
                writer.write(head + body)
                status_line = await reader.readline()
                assert status_line.split()[1] == b"504", status_line
                fields = (await reader.readuntil(b"\r\n\r\n")).decode().lower().split("\r\n")
                length = next(
                    int(f.split(":")[1]) for f in fields if f.startswith("content-length")
                )
                answer = json.loads(await reader.readexactly(length))
                assert "did not answer inference in time" in answer["error"]
        finally:
            writer.transport.abort()
    finally:
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_frontend_refuses_json_over_the_input_limit(
    make_client: Factory, recording: tuple[RecordingBackend, str]
) -> None:
    """Refused from its Content-Length, unread: the client still gets the 400 that names
    the limit, and the backend nothing."""
    backend, url = recording
    proxy = await proxy_to(make_client, url, backend_encoding="auto", max_input_size=4 << 20)
    body = big_body(BIG_N)
    assert len(body) > 4 << 20
    resp = await post_json(proxy, body)
    assert resp.status == 400
    assert (await resp.json())["error"].startswith(f"request JSON size of {len(body)} bytes")
    assert backend.whole == [] and backend.broken == []


@pytest.mark.parametrize("what", ["count", "string", "unfinished", "garbage after"])
async def test_frontend_refuses_large_malformed_json(
    make_client: Factory, recording: tuple[RecordingBackend, str], what: str
) -> None:
    backend, url = recording
    proxy = await proxy_to(make_client, url, backend_encoding="auto")
    body = {
        "count": big_body(BIG_N).replace(b"[%d]" % BIG_N, b"[%d]" % (BIG_N - 1), 1),
        "string": big_body(BIG_N).replace(b",", b',"x",', 1),
        "unfinished": big_body(BIG_N)[:-1],
        "garbage after": big_body(BIG_N) + b"]",
    }[what]
    with pytest.raises(CodecError) as expected:
        binc.decode_request(body, None, MODEL, "", LIMIT)
    resp = await post_json(proxy, body)
    assert resp.status == 400
    assert (await resp.json())["error"] == expected.value.message
    assert backend.whole == []


async def test_frontend_transcodes_large_json_that_needs_a_stage(
    make_client: Factory, recording: tuple[RecordingBackend, str]
) -> None:
    """Binary outputs asked of a JSON-only backend: the request is decoded and sent anew."""
    backend, url = recording
    proxy = await proxy_to(make_client, url, backend_encoding="json")
    body = big_body(BIG_N, parameters={"binary_data_output": True})
    resp = await post_json(proxy, body)
    assert resp.status == 200, await resp.text()
    assert len(backend.whole) == 1
    assert backend.whole[0] != body  # re-encoded, never the client's body relayed whole
