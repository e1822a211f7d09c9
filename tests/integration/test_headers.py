"""Client headers reach the backend as the bytes the client sent, never re-encoded: values that
are not Latin-1 text (UTF-8 `€`, invalid UTF-8) on a REST backend, and a clear 400 naming the
header where the backend cannot take them (gRPC metadata is ASCII)."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from tests.integration.conftest import Factory, proxy_to

SIMPLE = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
        ]
    }
).encode()

#: header values as raw bytes: UTF-8 euro sign, invalid UTF-8, Latin-1 text sent as UTF-8
VALUES = {b"x-euro": "€".encode(), b"x-bad": b"\xff\xfe", b"x-accent": "é".encode()}


async def raw_post(port: int, path: bytes, headers: dict[bytes, bytes], body: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    for k, v in headers.items():
        head += k + b": " + v + b"\r\n"
    writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    answer = await reader.read()
    writer.close()
    return answer


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (b"/v2/models/simple/infer", SIMPLE),  # relayed
        (b"/v2/models/simple/infer?binary=1", SIMPLE),
        (b"/v2/models/simple/stats", b""),  # a side operation
    ],
)
async def test_header_bytes_reach_a_rest_backend_unchanged(
    make_client: Factory, recorded: tuple[object, list[object]], path: bytes, body: bytes
) -> None:
    backend, seen = recorded
    url = str(backend.make_url("")).rstrip("/")  # type: ignore[attr-defined]
    proxy = await proxy_to(make_client, url)
    method = b"POST" if body else b"GET"
    if method == b"GET":
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        head = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        for k, v in VALUES.items():
            head += k + b": " + v + b"\r\n"
        writer.write(head + b"\r\n")
        answer = await reader.read()
        writer.close()
    else:
        answer = await raw_post(proxy.port, path, VALUES, body)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    got = seen[-1].headers  # type: ignore[attr-defined]
    for name, value in VALUES.items():
        # the recording server decodes header bytes as Latin-1, one character per byte
        assert got[name.decode()] == value.decode("latin-1"), name


async def test_non_ascii_header_to_a_grpc_backend_is_a_400_naming_it(make_client: Factory) -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        proxy = await proxy_to(make_client, f"grpc://127.0.0.1:{port}")
        answer = await raw_post(
            proxy.port, b"/v2/models/simple/infer", {b"x-euro": "€".encode()}, SIMPLE
        )
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        assert error == (
            "header 'x-euro' has a value that is not ASCII, which a gRPC backend cannot take"
        )
    finally:
        await server.stop(None)
