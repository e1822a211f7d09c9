"""v2proxy in front of another v2 REST server over loopback HTTP: encodings, headers,
pass-through streaming, and backend failures mapped to 502/503/504."""

from __future__ import annotations

import asyncio
import io
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import ml_dtypes
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from tests.integration.conftest import Factory, proxy_to
from tests.integration.test_rest_errors import BIN_HEADER, BLOB, framed, simple_json

# the loop is what is tested: on uvloop and plain asyncio (tests/conftest.py)
pytestmark = pytest.mark.both_loops

Recorded = tuple[Any, list[Any]]


def url_of(client: TestClient[Any, Any]) -> str:
    return str(client.make_url("")).rstrip("/")


@pytest.mark.parametrize(
    ("encoding", "accept", "sent_binary"),
    [
        ("json", None, False),  # relayed untouched
        ("auto", None, False),  # relayed untouched: nothing to change
        ("binary", None, True),  # binary tensors always, as configured
        ("auto", "gzip", True),  # the proxy compresses the answer itself: transcoded
        ("json", "gzip", False),
    ],
)
async def test_json_client_any_backend_encoding(
    make_client: Factory, recorded: Recorded, encoding: str, accept: str | None, sent_binary: bool
) -> None:
    backend, seen = recorded
    proxy = await proxy_to(make_client, url_of(backend), backend_encoding=encoding)
    body = simple_json(list(range(16)))
    headers = {"Accept-Encoding": accept} if accept else {}
    resp = await proxy.post(
        "/v2/models/simple/infer",
        data=body,
        headers=headers,
        skip_auto_headers=["Accept-Encoding"],
    )
    assert resp.status == 200, await resp.text()
    assert resp.content_type == "application/json"
    out = {o["name"]: o["data"] for o in (await resp.json())["outputs"]}
    assert out["OUTPUT0"] == [i + 1 for i in range(16)]
    assert out["OUTPUT1"] == [i - 1 for i in range(16)]
    infer = [r for r in seen if r.path.endswith("/infer")][-1]
    assert infer.headers["Content-Type"] == (
        "application/octet-stream" if sent_binary else "application/json"
    )
    assert ("Inference-Header-Content-Length" in infer.headers) is sent_binary


async def test_relay_sends_the_clients_bytes(make_client: Factory) -> None:
    """Nothing to change: the body reaches the backend byte for byte and the answer comes back
    byte for byte (Envoy's pass-through); the request is still validated first."""
    got: list[bytes] = []
    answer = b'{"model_name":"simple","outputs":[]}'

    async def infer(request: web.Request) -> web.Response:
        got.append(await request.read())
        return web.Response(body=answer, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v2/models/simple/infer", infer)
    backend = await make_client(app)
    proxy = await proxy_to(make_client, url_of(backend))
    body = b'{"inputs": [ {"name":"INPUT0","datatype":"INT32","shape":[2],"data":[1, 2]} ] }'
    resp = await proxy.post(
        "/v2/models/simple/infer", data=body, skip_auto_headers=["Accept-Encoding"]
    )
    assert resp.status == 200
    assert await resp.read() == answer
    assert got == [body]
    bad = await proxy.post(
        "/v2/models/simple/infer",
        data=body.replace(b"[1, 2]", b"[1]"),
        skip_auto_headers=["Accept-Encoding"],
    )
    assert bad.status == 400
    assert "expected 2 elements, got 1" in (await bad.json())["error"]
    assert len(got) == 1  # the malformed request never reached the backend


@pytest.mark.parametrize("encoding", ["json", "binary"])
async def test_binary_client_any_backend_encoding(
    make_client: Factory, recorded: Recorded, encoding: str
) -> None:
    backend, _ = recorded
    proxy = await proxy_to(make_client, url_of(backend), backend_encoding=encoding)
    header = {
        **BIN_HEADER,
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": True}},
            {"name": "OUTPUT1", "parameters": {"binary_data": False}},
        ],
    }
    body, headers = framed(header, BLOB + BLOB)
    resp = await proxy.post("/v2/models/simple/infer", data=body, headers=headers)
    assert resp.status == 200, await resp.text()
    assert resp.content_type == "application/octet-stream"
    payload = await resp.read()
    ihcl = int(resp.headers["Inference-Header-Content-Length"])
    head = json.loads(payload[:ihcl])
    out = {o["name"]: o for o in head["outputs"]}
    assert out["OUTPUT0"]["parameters"] == {"binary_data_size": 64}
    assert struct.unpack("<16i", payload[ihcl:]) == tuple(2 * i for i in range(16))
    assert out["OUTPUT1"]["data"] == [0] * 16


async def echo_backend(make_client: Factory, model: str, received: list[bytes]) -> str:
    """A binary-only backend for `model` that answers its one binary input as its output,
    byte for byte, and records every request body it got. Returns its base URL."""

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        received.append(body)
        ihcl = int(request.headers["Inference-Header-Content-Length"])
        (inp,) = json.loads(body[:ihcl])["inputs"]
        output = {
            "name": "OUT",
            "datatype": inp["datatype"],
            "shape": inp["shape"],
            "parameters": {"binary_data_size": len(body) - ihcl},
        }
        head = json.dumps({"model_name": model, "model_version": "1", "outputs": [output]}).encode()
        return web.Response(
            body=head + body[ihcl:],
            headers={
                "Inference-Header-Content-Length": str(len(head)),
                "Content-Type": "application/octet-stream",
            },
        )

    async def metadata(_request: web.Request) -> web.Response:
        return web.json_response({"extensions": ["binary_tensor_data"]})

    app = web.Application(client_max_size=2**30)
    app.router.add_post(f"/v2/models/{model}/infer", echo)
    app.router.add_get("/v2", metadata)
    return url_of(await make_client(app))


@pytest.mark.parametrize("dt", ["FP16", "BF16"])
async def test_fp16_and_bf16_as_json_numbers(make_client: Factory, dt: str) -> None:
    """Triton and KServe refuse FP16/BF16 in JSON; v2proxy converts JSON numbers (round to
    nearest) to the binary form the backend gets, and binary outputs back to numbers."""
    received: list[bytes] = []
    backend = await echo_backend(make_client, "echo", received)
    proxy = await proxy_to(make_client, backend, backend_encoding="binary")
    values = [1.0, 2.5, 1.0000001, -3.25, 0.1]
    body = json.dumps(
        {"inputs": [{"name": "IN", "datatype": dt, "shape": [5], "data": values}]}
    ).encode()
    resp = await proxy.post("/v2/models/echo/infer", data=body)
    assert resp.status == 200, await resp.text()
    np_dt = np.float16 if dt == "FP16" else ml_dtypes.bfloat16
    expected = np.array(values, dtype=np.float64).astype(np_dt)
    (sent,) = received  # the backend got binary FP16/BF16 bytes, rounded to nearest
    head = json.loads(sent[: len(sent) - expected.nbytes])
    assert head["inputs"][0]["parameters"]["binary_data_size"] == expected.nbytes
    assert sent[-expected.nbytes :] == expected.tobytes()
    (out,) = (await resp.json())["outputs"]
    assert out["datatype"] == dt
    assert out["data"] == expected.astype(np.float64).tolist()
    assert out["data"][2] == 1.0  # rounded to nearest


async def test_request_id_and_headers_forwarded(make_client: Factory, recorded: Recorded) -> None:
    backend, seen = recorded
    proxy = await proxy_to(make_client, url_of(backend), backend_encoding="json")
    resp = await proxy.post(
        "/v2/models/simple/infer",
        data=simple_json(),
        headers={
            "x-request-id": "abc-123",
            "traceparent": "00-1-2-01",
            "Connection": "close",
            "Accept-Encoding": "gzip",
        },
    )
    assert resp.status == 200
    assert resp.headers["x-request-id"] == "abc-123"
    infer = [r for r in seen if r.path.endswith("/infer")][-1]
    assert infer.headers["x-request-id"] == "abc-123"
    assert infer.headers["traceparent"] == "00-1-2-01"
    assert infer.headers["Content-Type"] == "application/json"
    assert infer.headers.get("Accept-Encoding") == "identity"
    # the client's gzip wish is served by the proxy itself
    assert resp.headers["Content-Encoding"] == "gzip"


async def test_passthrough_of_other_endpoints(make_client: Factory, recorded: Recorded) -> None:
    backend, seen = recorded
    proxy = await proxy_to(make_client, url_of(backend))
    # a restricted group is refused before its body is read (as Triton: 403, not the body's 400)
    resp = await proxy.post("/v2/repository/index", data=b'{"ready": "yes"}')
    assert resp.status == 403
    proxy = await proxy_to(make_client, url_of(backend), restricted_api="none")
    await proxy.post("/v2/models/simple/infer", data=simple_json())
    resp = await proxy.get("/v2/models/simple/stats?x=1")
    assert resp.status == 200
    stats = (await resp.json())["model_stats"]
    assert len(stats) == 1 and stats[0]["name"] == "simple" and stats[0]["inference_count"] >= 1
    # a typed operation: the backend is asked its statistics (query strings mean nothing in v2)
    assert (seen[-1].method, seen[-1].path) == ("GET", "/v2/models/simple/stats")
    resp = await proxy.post("/v2/repository/index", data=b'{"ready": "yes"}')
    assert resp.status == 400
    assert (await resp.json()) == {"error": "Invalid value for 'ready': expected a boolean"}
    resp = await proxy.get("/v2/models/nope/config")
    assert resp.status == 404
    assert (await resp.json())["error"].startswith("Request for unknown model: 'nope'")
    meta = await (await proxy.get("/v2")).json()
    assert meta["name"] == "reference"
    assert "binary_tensor_data" in meta["extensions"]


async def test_generate_stream_is_not_buffered(make_client: Factory) -> None:
    """Server-sent events reach the client while the backend is still streaming."""
    release = asyncio.Event()

    async def generate_stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        await resp.write(b'data: {"text_output": "a"}\n\n')
        await asyncio.wait_for(release.wait(), 10)
        await resp.write(b'data: {"text_output": "b"}\n\n')
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v2/models/llm/generate_stream", generate_stream)
    backend = await make_client(app)
    proxy = await proxy_to(make_client, url_of(backend), backend_encoding="json")
    resp = await proxy.post("/v2/models/llm/generate_stream", data=b'{"text_input": "x"}')
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
    assert first == b'data: {"text_output": "a"}\n\n'
    release.set()
    assert await resp.content.read() == b'data: {"text_output": "b"}\n\n'


async def test_backend_timeout_is_504(make_client: Factory) -> None:
    async def slow(_request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response()

    app = web.Application()
    app.router.add_post("/v2/models/simple/infer", slow)
    backend = await make_client(app)
    proxy = await proxy_to(
        make_client, url_of(backend), backend_encoding="json", backend_timeout=0.3
    )
    resp = await proxy.post("/v2/models/simple/infer", data=simple_json())
    assert resp.status == 504
    assert "did not answer inference in time" in (await resp.json())["error"]


@pytest.mark.parametrize(
    ("status", "body", "headers", "expect_status", "expect"),
    [
        (200, b"this is not json", {}, 502, "invalid inference response from backend"),
        (
            200,
            b'{"outputs": [{"name": "O", "datatype": "INT32", "shape": [2], "data": [1]}]}',
            {},
            502,
            "invalid inference response from backend",
        ),
        (
            200,
            b'{"outputs": []}',
            {"Inference-Header-Content-Length": "999"},
            502,
            "Inference-Header-Content-Length 999",
        ),
        (500, b'{"error": "model crashed"}', {}, 500, "model crashed"),
        (422, b'{"detail": [{"msg": "bad"}]}', {}, 422, "bad"),
        (
            404,
            b'{"error": "Model simple not found"}',
            {},
            404,
            "Request for unknown model: 'simple' is not found (backend: Model simple not found)",
        ),
    ],
    ids=["garbage", "bad-count", "bad-ihcl", "backend-500", "backend-422", "backend-404"],
)
async def test_backend_answers_mapped(
    make_client: Factory,
    status: int,
    body: bytes,
    headers: dict[str, str],
    expect_status: int,
    expect: str,
) -> None:
    async def answer(_request: web.Request) -> web.Response:
        return web.Response(status=status, body=body, headers=headers)

    app = web.Application()
    app.router.add_post("/v2/models/simple/infer", answer)
    backend = await make_client(app)
    proxy = await proxy_to(make_client, url_of(backend), backend_encoding="json")
    resp = await proxy.post("/v2/models/simple/infer", data=simple_json())
    assert resp.status == expect_status
    assert expect in (await resp.json())["error"]


def _big_binary(n: int, extra: dict[str, Any] | None = None) -> tuple[bytes, dict[str, str], bytes]:
    blob = np.arange(n, dtype="<f4").tobytes()
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [n],
                "parameters": {"binary_data_size": len(blob)},
            }
        ],
        "parameters": {"binary_data_output": True},
        **(extra or {}),
    }
    body, headers = framed(header, blob)
    return body, headers, blob


async def test_large_binary_relay_streams_through(make_client: Factory) -> None:
    """A 6 MiB binary request is relayed while it arrives: the backend gets the exact bytes and
    the client gets the backend's exact answer."""
    got: list[bytes] = []
    backend = await echo_backend(make_client, "identity_fp32", got)
    proxy = await proxy_to(make_client, backend, backend_encoding="binary")
    body, headers, blob = _big_binary(1536 * 1024)  # 6 MiB
    resp = await proxy.post(
        "/v2/models/identity_fp32/infer",
        data=io.BytesIO(body),
        headers=headers,
        skip_auto_headers=["Accept-Encoding"],
    )
    assert resp.status == 200, await resp.text()
    payload = await resp.read()
    assert got == [body]
    ihcl = int(resp.headers["Inference-Header-Content-Length"])
    assert payload[ihcl:] == blob


async def test_large_binary_request_checked_before_relaying(
    make_client: Factory, recorded: Recorded
) -> None:
    backend, seen = recorded
    proxy = await proxy_to(make_client, url_of(backend), backend_encoding="binary")
    body, headers, _ = _big_binary(1536 * 1024)
    # a header that declares 4 bytes fewer than the body holds
    bad_body = body.replace(b'"binary_data_size": 6291456', b'"binary_data_size": 6291452')
    resp = await proxy.post(
        "/v2/models/identity_fp32/infer",
        data=io.BytesIO(bad_body),
        headers=headers,
        skip_auto_headers=["Accept-Encoding"],
    )
    assert resp.status == 400
    assert "unexpected additional input data" in (await resp.json())["error"]
    assert not [r for r in seen if r.path.endswith("/infer")]  # never reached the backend


async def test_large_binary_to_json_backend_is_transcoded(
    make_client: Factory, recorded: Recorded
) -> None:
    """A JSON-only backend cannot take the body as it is: after the header the rest is read and
    the request is transcoded (the streamed relay steps back)."""
    backend, seen = recorded
    proxy = await proxy_to(make_client, url_of(backend), backend_encoding="json")
    body, headers, blob = _big_binary(1536 * 1024)
    resp = await proxy.post(
        "/v2/models/identity_fp32/infer",
        data=io.BytesIO(body),
        headers=headers,
        skip_auto_headers=["Accept-Encoding"],
    )
    assert resp.status == 200, await resp.text()
    payload = await resp.read()
    ihcl = int(resp.headers["Inference-Header-Content-Length"])
    assert payload[ihcl:] == blob
    infer = [r for r in seen if r.path.endswith("/infer")][-1]
    assert infer.headers["Content-Type"] == "application/json"


# ----------------------------------------------------------------- backends that misbehave
# Raw servers on loopback that write chosen bytes; every wait on the proxy is bounded, so that
# a proxy that hangs fails the test instead of hanging it.

RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
GOOD = b'{"model_name":"simple","outputs":[]}'
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(GOOD),
    GOOD,
)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request (head and body) as it came."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


@pytest.fixture
async def raw_backend() -> AsyncIterator[Callable[[RawHandler], Awaitable[str]]]:
    """raw_backend(handler) -> the URL of a server running ``handler`` per connection."""
    servers: list[asyncio.Server] = []
    tasks: set[asyncio.Task[Any]] = set()

    async def start(handler: RawHandler) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for task in list(tasks):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in servers:
        s.close()
        await s.wait_closed()


def answering(raw: bytes, then: float = 0) -> RawHandler:
    """A backend that answers every request with ``raw``, then holds the connection ``then``
    seconds (or answers the next request)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(raw)
            await writer.drain()
            if then:
                await asyncio.sleep(then)
                return

    return handler


async def post_infer(proxy: Any, accept: str) -> tuple[int, bytes]:
    async with asyncio.timeout(10):
        resp = await proxy.post(
            "/v2/models/simple/infer", data=simple_json(), headers={"Accept-Encoding": accept}
        )
        return resp.status, await resp.read()


@pytest.mark.parametrize("accept", ["identity", "gzip"], ids=["relayed", "decoded"])
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n"
            b"this is not json",
            "invalid inference response from backend",
        ),
        (b"HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\nok", "invalid status 999"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", "Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            b"Inference-Header-Content-Length: 99\r\nContent-Length: 2\r\n\r\n{}",
            "Inference-Header-Content-Length",
        ),
    ],
    ids=["not-json", "status-999", "two-lengths", "ihcl-past-the-body"],
)
async def test_answer_that_is_not_v2_is_502(
    make_client: Factory, raw_backend: Any, raw: bytes, message: str, accept: str
) -> None:
    """Relayed (the client takes the backend's bytes) or decoded, an answer that is not a v2
    answer over HTTP/1.1 is a 502 naming what is wrong."""
    url = await raw_backend(answering(raw))
    proxy = await proxy_to(make_client, url, backend_encoding="json")
    status, body = await post_infer(proxy, accept)
    assert status == 502, body
    assert message in json.loads(body)["error"]


async def test_relayed_answer_of_another_type_is_502(
    make_client: Factory, raw_backend: Any
) -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (
        len(GOOD),
        GOOD,
    )
    proxy = await proxy_to(make_client, await raw_backend(answering(raw)), backend_encoding="json")
    status, body = await post_infer(proxy, "identity")
    assert status == 502
    assert "Content-Type b'text/html' is neither JSON" in json.loads(body)["error"]


@pytest.mark.parametrize("path", ["relayed", "decoded", "passed-through"])
async def test_answer_stalling_mid_body_is_504(
    make_client: Factory, raw_backend: Any, path: str
) -> None:
    """--backend-timeout covers the answer's body too, on every path."""
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    url = await raw_backend(answering(raw, then=30))
    proxy = await proxy_to(make_client, url, backend_encoding="json", backend_timeout=0.3)
    if path == "passed-through":
        async with asyncio.timeout(10):
            resp = await proxy.post("/v2/models/llm/generate", data=b'{"text_input": "x"}')
            status, body = resp.status, await resp.read()
        what = "POST /v2/models/llm/generate"
    else:
        status, body = await post_infer(proxy, "identity" if path == "relayed" else "gzip")
        what = "inference"
    assert status == 504, body
    assert f"did not answer {what} in time" in json.loads(body)["error"]


async def test_streamed_answer_stalling_breaks_off(make_client: Factory, raw_backend: Any) -> None:
    """A large relayed answer is passed on as it comes; when the backend stalls in it, the
    answer to the client breaks off (never a complete-looking one, never a hang)."""
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (
        1 << 20
    )
    url = await raw_backend(answering(raw + b"{" + b" " * 300_000, then=30))
    proxy = await proxy_to(make_client, url, backend_encoding="json", backend_timeout=0.3)
    async with asyncio.timeout(10):
        resp = await proxy.post(
            "/v2/models/simple/infer",
            data=simple_json(),
            headers={"Accept-Encoding": "identity"},
        )
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()


async def test_passthrough_to_a_backend_that_never_answers_is_504(
    make_client: Factory, raw_backend: Any
) -> None:
    async def silent(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(30)

    proxy = await proxy_to(make_client, await raw_backend(silent), backend_timeout=0.3)
    async with asyncio.timeout(10):
        resp = await proxy.get("/v2/models/llm/custom?x=1")
        assert resp.status == 504
        assert "did not answer GET /v2/models/llm/custom in time" in (await resp.json())["error"]


async def test_post_is_never_sent_twice(make_client: Factory, raw_backend: Any) -> None:
    """A backend that drops a kept-alive connection after reading a POST (it may have acted
    on it): 502, and the POST is not sent again on a new connection."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(ANSWER)
        await writer.drain()
        seen.append(await read_request(reader))  # the second: read, then dropped unanswered

    proxy = await proxy_to(make_client, await raw_backend(handler), backend_encoding="json")
    assert await post_infer(proxy, "identity") == (200, GOOD)
    status, body = await post_infer(proxy, "identity")
    assert status == 502
    assert "failed during inference: the connection ended" in json.loads(body)["error"]
    assert len(seen) == 2
