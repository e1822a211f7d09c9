"""Bad input gets a clear 4xx naming what is wrong, and the proxy keeps serving."""

from __future__ import annotations

import asyncio
import gzip
import json
import struct
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.integration.conftest import Factory, proxy_to, settings
from v2proxy.app import build_rest
from v2proxy.app_core import build_pipeline
from v2proxy.backends.builtin import BuiltinBackend

ONES = [1] * 16


def simple_json(data0: Any = ONES, dt: str = "INT32", shape: list[int] | None = None) -> bytes:
    shape = [1, 16] if shape is None else shape
    return json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": dt, "shape": shape, "data": data0},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": ONES},
            ]
        }
    ).encode()


def framed(header: dict[str, Any], blob: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head))}


BIN_HEADER = {
    "inputs": [
        {
            "name": "INPUT0",
            "datatype": "INT32",
            "shape": [1, 16],
            "parameters": {"binary_data_size": 64},
        },
        {
            "name": "INPUT1",
            "datatype": "INT32",
            "shape": [1, 16],
            "parameters": {"binary_data_size": 64},
        },
    ]
}
BLOB = struct.pack("<16i", *range(16))

# (id, path, body, headers, status, message substring)
CASES: list[tuple[str, str, bytes, dict[str, str], int, str]] = [
    (
        "ihcl-not-a-number",
        "simple",
        b"{}",
        {"Inference-Header-Content-Length": "abc"},
        400,
        "Unable to parse Inference-Header-Content-Length, got: abc",
    ),
    (
        "ihcl-trailing-garbage",
        "simple",
        b"{}",
        {"Inference-Header-Content-Length": "2x"},
        400,
        "Unable to parse Inference-Header-Content-Length",
    ),
    (
        "ihcl-beyond-body",
        "simple",
        b"{}",
        {"Inference-Header-Content-Length": "3"},
        400,
        "inference header size should be in range (0, 2), got: 3",
    ),
    (
        "ihcl-out-of-range",
        "simple",
        b"{}",
        {"Inference-Header-Content-Length": "99999999999"},
        400,
        "should be in range",
    ),
    (
        "missing-binary-bytes",
        "simple",
        *framed(BIN_HEADER, BLOB + BLOB[:10]),
        400,
        "unexpected size for input 'INPUT1', expecting 54 additional bytes for model 'simple'",
    ),
    (
        "extra-binary-bytes",
        "simple",
        *framed(BIN_HEADER, BLOB * 2 + b"x"),
        400,
        "unexpected additional input data for model 'simple'",
    ),
    (
        "binary-without-ihcl",
        "simple",
        json.dumps(BIN_HEADER).encode(),
        {},
        400,
        "missing Inference-Header-Content-Length",
    ),
    (
        "malformed-json",
        "simple",
        b'{"inputs": [',
        {},
        400,
        "failed to parse the request JSON buffer",
    ),
    ("empty-body", "simple", b"", {}, 400, "the request body is empty"),
    (
        "unknown-datatype",
        "simple",
        simple_json(dt="INT33"),
        {},
        400,
        "invalid datatype 'INT33' for input 'INPUT0'",
    ),
    (
        "too-few-elements",
        "simple",
        simple_json([1] * 15),
        {},
        400,
        "input 'INPUT0': shape does not match true shape of 'data' field: expected 16",
    ),
    ("too-many-elements", "simple", simple_json([1] * 18), {}, 400, "got 18"),
    (
        "string-for-number",
        "simple",
        simple_json(["1"] * 16),
        {},
        400,
        "input 'INPUT0': INT32 elements must be integers",
    ),
    ("null-for-number", "simple", simple_json([None] * 16), {}, 400, "INPUT0"),
    (
        "negative-dim",
        "simple",
        simple_json(shape=[-1, 16]),
        {},
        400,
        "Unable to parse 'shape' for input 'INPUT0'",
    ),
    (
        "wrong-datatype-for-model",
        "simple",
        simple_json([1.5] * 16, dt="FP32"),
        {},
        400,
        "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
    ),
    (
        "wrong-shape-for-model",
        "simple",
        simple_json([1] * 15, shape=[1, 15]),
        {},
        400,
        "unexpected shape for input 'INPUT0' for model 'simple'",
    ),
    (
        "unknown-output",
        "simple",
        json.dumps({**json.loads(simple_json()), "outputs": [{"name": "DUMMY"}]}).encode(),
        {},
        400,
        "unexpected inference output 'DUMMY' for model 'simple'",
    ),
    ("unknown-model", "nope", simple_json(), {}, 404, "Request for unknown model: 'nope'"),
    # a lone surrogate escape ("\ud800", no Unicode text): the field named, never a 500
    (
        "lone-surrogate-input-name",
        "simple",
        simple_json().replace(b'"INPUT0"', b'"\\ud800"'),
        {},
        400,
        "Unable to parse 'inputs[0].name': a lone surrogate (\\ud800) is not valid UTF-8 text",
    ),
    (
        "lone-surrogate-output-name",
        "simple",
        json.dumps({**json.loads(simple_json()), "outputs": [{"name": "\ud800"}]}).encode(),
        {},
        400,
        "Unable to parse 'outputs[0].name': a lone surrogate (\\ud800) is not valid UTF-8 text",
    ),
    (
        "lone-surrogate-bytes-data",
        "simple_string",
        json.dumps(
            {
                "inputs": [
                    {"name": n, "datatype": "BYTES", "shape": [1, 16], "data": ["1"] * 15 + [d]}
                    for n, d in (("INPUT0", "1"), ("INPUT1", "\udc00"))
                ]
            }
        ).encode(),
        {},
        400,
        "Unable to parse 'data[15]' for input 'INPUT1': a lone surrogate (\\udc00) is not valid"
        " UTF-8 text",
    ),
    (
        "lone-surrogate-id",
        "simple",
        json.dumps({**json.loads(simple_json()), "id": "r\ud800"}).encode(),
        {},
        400,
        "Unable to parse 'id': a lone surrogate (\\ud800) is not valid UTF-8 text",
    ),
    (
        "invalid-gzip",
        "simple",
        b"not gzip at all",
        {"Content-Encoding": "gzip"},
        400,
        "failed to decompress the gzip request body",
    ),
    (
        "truncated-gzip",
        "simple",
        gzip.compress(simple_json())[:-12],
        {"Content-Encoding": "gzip"},
        400,
        "failed to decompress",
    ),
    (
        "unsupported-encoding",
        "simple",
        simple_json(),
        {"Content-Encoding": "br"},
        415,  # Triton: 501, a server error for a client's fault (RFC 9110: 415)
        "Unsupported compression type",
    ),
    (
        "raw-to-two-input-model",
        "simple",
        BLOB,
        {"Inference-Header-Content-Length": "0"},
        400,
        "Raw request must only have 1 input",
    ),
    (
        "raw-size-remainder",
        "simple_identity",
        b"abc",
        {"Inference-Header-Content-Length": "0"},
        200,
        "",
    ),
    (
        "raw-bad-size",
        "classifier",
        b"\0" * 12,
        {"Inference-Header-Content-Length": "0"},
        400,
        "input byte size mismatch for input 'INPUT0' for model 'classifier'. Expected 40, got 12",
    ),
]


@pytest.mark.parametrize(
    ("model", "body", "headers", "status", "message"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
async def test_bad_input(
    builtin: TestClient[Any, Any],
    model: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    message: str,
) -> None:
    resp = await builtin.post(f"/v2/models/{model}/infer", data=body, headers=headers)
    text = await resp.text()
    assert resp.status == status, text
    if status != 200:
        assert resp.content_type == "application/json"
        assert message in json.loads(text)["error"]
    if status == 415:
        assert resp.headers["Accept-Encoding"] == "gzip, deflate"
    # the proxy keeps serving
    ok = await builtin.post("/v2/models/simple/infer", data=simple_json())
    assert ok.status == 200
    out = {o["name"]: o["data"] for o in (await ok.json())["outputs"]}
    assert out["OUTPUT0"] == [2] * 16 and out["OUTPUT1"] == [0] * 16


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            {"inputs": "a\ud800"},
            "inputs must be valid UTF-8 text, got a lone surrogate \\ud800.",
            id="text",
        ),
        pytest.param(
            {"inputs": "a\ud800", "stream": True},
            "inputs must be valid UTF-8 text, got a lone surrogate \\ud800.",
            id="stream",
        ),
        pytest.param(
            {"inputs": [{"type": "text", "text": "\udfff"}]},
            "inputs[0].text must be valid UTF-8 text, got a lone surrogate \\udfff.",
            id="multimodal-text",
        ),
    ],
)
async def test_mindie_lone_surrogate(
    builtin: TestClient[Any, Any], body: dict[str, Any], message: str
) -> None:
    """MindIE's ``POST /infer`` with a lone surrogate escape in its text: MindIE's validation
    answer (422) naming the field, stream or not; the proxy keeps serving."""
    raw = json.dumps(body).encode()
    assert b"\\u" in raw  # the escape itself, as a client's JSON encoder writes it
    resp = await builtin.post("/infer", data=raw)
    assert resp.status == 422, await resp.text()
    assert resp.content_type == "application/json"
    assert await resp.json() == {"error": message, "error_type": "Input Validation Error"}
    ok = await builtin.post("/infer", data=json.dumps({"inputs": "a b"}).encode())
    assert ok.status == 200, await ok.text()


async def test_wrong_method_and_unknown_path(builtin: TestClient[Any, Any]) -> None:
    resp = await builtin.get("/v2/models/simple/infer")
    assert resp.status == 405
    assert (await resp.json()) == {"error": "Method Not Allowed"}
    resp = await builtin.get("/v2/nothing/here")
    assert resp.status == 404
    assert (await resp.json()) == {"error": "Not Found"}


@pytest.mark.both_loops  # HTTP framing and connections: the loop's transports
async def test_input_size_limits(make_client: Factory) -> None:
    """--max-input-size bounds JSON headers, raw bodies and decompressed bodies (Triton's
    messages); --max-body-size bounds any body with 413."""
    client = await make_client(
        build_rest(
            s := settings(max_input_size=1000, max_body_size=4000),
            build_pipeline(s, BuiltinBackend()),
        )
    )
    big_json = simple_json() + b" " * 1000
    resp = await client.post("/v2/models/simple/infer", data=big_json)
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert "request JSON size of" in error
    assert error.endswith("Use --max-input-size to increase the limit.")  # the option there is
    resp = await client.post(
        "/v2/models/identity_fp32/infer",
        data=b"\0" * 1004,
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert "Raw input has a byte_size (1004 bytes)" in error
    assert error.endswith("Use --max-input-size to increase the limit.")
    resp = await client.post(
        "/v2/models/simple/infer",
        data=gzip.compress(big_json),
        headers={"Content-Encoding": "gzip"},
    )
    assert resp.status == 400
    assert (
        "Decompressed data size exceeds the maximum allowed value of 1000 bytes"
        in (await resp.json())["error"]
    )
    resp = await client.post("/v2/models/simple/infer", data=b"x" * 5000)
    assert resp.status == 413
    assert "maximum body size of 4000 bytes" in (await resp.json())["error"]
    # binary tensors inside a framed request are not bound by max-input-size (as in Triton)
    body, headers = framed(BIN_HEADER, BLOB * 2)
    assert len(body) > 0
    resp = await client.post("/v2/models/simple/infer", data=body, headers=headers)
    assert resp.status == 200


@pytest.mark.both_loops  # HTTP framing and connections: the loop's transports
async def test_backend_refuses_connection(make_client: Factory) -> None:
    from tests.interop.peers.launch import _free_ports

    (port,) = _free_ports(1)
    client = await proxy_to(make_client, f"http://127.0.0.1:{port}")
    resp = await client.post("/v2/models/simple/infer", data=simple_json())
    assert resp.status == 503
    assert "unavailable" in (await resp.json())["error"]
    resp = await client.get("/v2/health/ready")
    assert resp.status == 503
    # liveness is the proxy's own: still alive
    assert (await client.get("/v2/health/live")).status == 200


async def _exchange(client: TestClient[Any, Any], head: bytes) -> tuple[bytes, Any, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    writer.write(head)
    await writer.drain()
    async with asyncio.timeout(5):  # a server that does not answer fails, not hangs
        return await reader.readuntil(b"\r\n\r\n"), reader, writer


@pytest.mark.both_loops  # HTTP framing and connections: the loop's transports
async def test_expect_100_continue(builtin: TestClient[Any, Any]) -> None:
    """A client that sends ``Expect: 100-continue`` gets the interim answer before it sends
    its body (curl does so for big bodies); any other expectation is refused with 417."""
    body = simple_json()
    head = (
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    interim, reader, writer = await _exchange(builtin, head)
    try:
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        final = await reader.readuntil(b"\r\n\r\n")
        assert final.startswith(b"HTTP/1.1 200 ")
        length = int(final.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        answer = json.loads(await reader.readexactly(length))
        assert answer["outputs"][0]["data"] == [2] * 16
    finally:
        writer.close()
    resp = await builtin.post(
        "/v2/models/simple/infer", data=body, headers={"Expect": "something-else"}
    )
    assert resp.status == 417
    assert (await resp.json()) == {"error": "only 'Expect: 100-continue' is supported"}


@pytest.mark.both_loops  # HTTP framing and connections: the loop's transports
async def test_chunked_body_over_the_limit(make_client: Factory) -> None:
    """A body without Content-Length is bounded by --max-body-size as it arrives."""
    client = await make_client(
        build_rest(s := settings(max_body_size=4000), build_pipeline(s, BuiltinBackend()))
    )

    async def chunks() -> Any:
        for _ in range(10):
            yield b" " * 1000

    resp = await client.post("/v2/models/simple/infer", data=chunks())
    assert resp.status == 413
    assert "maximum body size of 4000 bytes" in (await resp.json())["error"]
    resp = await client.post("/v2/models/simple/infer", data=simple_json())
    assert resp.status == 200
