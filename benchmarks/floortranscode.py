"""The floor of a transcoding Python proxy: the least a proxy on uvloop + httptools does to put a
JSON client in front of a binary-tensor backend.

As ``floor-relay`` (floorrelay.py) for the HTTP side: each head parsed by httptools, a kept-alive
backend connection, bodies gathered whole. And in between the least transcoding of a small v2
``/infer``: the client's JSON body parsed (orjson) and each input's ``data`` packed (struct, which
checks each element's kind and range), the request sent as binary tensors (its JSON header
written by orjson, every output asked binary); the answer's JSON header parsed (orjson), each
output's bytes listed (a memoryview cast) and the JSON answer written (orjson). Nothing else: no
routes, no other checks, limits, timeouts or metrics, the fixed-size datatypes of struct only,
one request in flight per client connection. What this path's stack costs per request, beside
v2proxy's ``serve --backend-encoding binary``; never a product.

    python benchmarks/floortranscode.py --port 9100 --backend 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import struct
from typing import Any, cast

import httptools
import orjson
import uvloop

#: struct codes (and memoryview formats) of the datatypes it takes
CODES = {
    "BOOL": "?",
    "INT8": "b",
    "INT16": "h",
    "INT32": "i",
    "INT64": "q",
    "UINT8": "B",
    "UINT16": "H",
    "UINT32": "I",
    "UINT64": "Q",
    "FP32": "f",
    "FP64": "d",
}
IHCL = b"inference-header-content-length"
BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def binary_request(body: bytes) -> tuple[bytes, int]:
    """A JSON /infer body as binary tensors: (the body, its JSON header's length)."""
    inputs, blobs = [], []
    for t in orjson.loads(body)["inputs"]:
        data = t["data"]
        blob = struct.pack(f"<{len(data)}{CODES[t['datatype']]}", *data)
        blobs.append(blob)
        inputs.append(
            {
                "name": t["name"],
                "datatype": t["datatype"],
                "shape": t["shape"],
                "parameters": {"binary_data_size": len(blob)},
            }
        )
    head = orjson.dumps({"parameters": {"binary_data_output": True}, "inputs": inputs})
    return b"".join([head, *blobs]), len(head)


def json_answer(body: bytes, ihcl: int) -> bytes:
    """A binary-framed /infer answer as JSON."""
    head = orjson.loads(body[:ihcl])
    view = memoryview(body)
    start = ihcl
    outputs: list[dict[str, Any]] = []
    for o in head["outputs"]:
        end = start + o["parameters"]["binary_data_size"]
        data = view[start:end].cast(CODES[o["datatype"]]).tolist()  # type: ignore[call-overload]
        outputs.append(
            {"name": o["name"], "datatype": o["datatype"], "shape": o["shape"], "data": data}
        )
        start = end
    model = {"model_name": head["model_name"], "model_version": head["model_version"]}
    return orjson.dumps({**model, "outputs": outputs})


class _Message(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def take(self) -> bytes:
        body, self.body = b"".join(self.body), []
        return body


class _Pool:
    """Kept-alive connections to the backend, idle ones on a stack (the last used first)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.host_line = b"host: %s:%d\r\n" % (host.encode(), port)
        self.idle: list[_Backend] = []
        self._connecting: set[asyncio.Task[None]] = set()  # held: the loop keeps tasks weakly

    def send(self, request: bytes, client: _Client) -> None:
        if self.idle:
            self.idle.pop().send(request, client)
            return
        task = asyncio.get_running_loop().create_task(self._connect(request, client))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect(self, request: bytes, client: _Client) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, backend = await loop.create_connection(lambda: _Backend(self), self.host, self.port)
        except OSError:
            client.answer(BAD_GATEWAY)
        else:
            backend.send(request, client)


class _Backend(_Message):
    def __init__(self, pool: _Pool) -> None:
        super().__init__()
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.client: _Client | None = None
        self.ihcl = 0

    def send(self, request: bytes, client: _Client) -> None:
        self.client = client
        self.transport.write(request)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == IHCL:
            self.ihcl = int(value)

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() == 200 and self.ihcl:
            body = json_answer(self.take(), self.ihcl)
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            answer = head + b"content-length: %d\r\n\r\n" % len(body) + body
        else:
            self.take()
            answer = BAD_GATEWAY
        client, self.client, self.ihcl = self.client, None, 0
        self.pool.idle.append(self)
        if client is not None:
            client.answer(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool.idle:
            self.pool.idle.remove(self)
        if self.client is not None:
            self.client.answer(BAD_GATEWAY)


class _Client(_Message):
    def __init__(self, pool: _Pool) -> None:
        super().__init__()
        self.pool = pool
        self.parser = httptools.HttpRequestParser(self)
        self.url: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url.append(url)

    def on_message_complete(self) -> None:
        body, ihcl = binary_request(self.take())
        line = b"POST %s HTTP/1.1\r\n" % b"".join(self.url)
        self.url = []
        head = b"content-type: application/octet-stream\r\n%s: %d\r\ncontent-length: %d\r\n\r\n"
        self.pool.send(line + self.pool.host_line + head % (IHCL, ihcl, len(body)) + body, self)

    def answer(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)


async def start(port: int, backend: str) -> asyncio.Server:
    """A server transcoding 127.0.0.1:``port`` (0: any free port) for ``backend``
    (host:port)."""
    host, _, bport = backend.rpartition(":")
    pool = _Pool(host, int(bport))
    return await asyncio.get_running_loop().create_server(lambda: _Client(pool), "127.0.0.1", port)


async def _main(port: int, backend: str) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with await start(port, backend):
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True, help="host:port")
    args = parser.parse_args()
    uvloop.run(_main(args.port, args.backend))


if __name__ == "__main__":
    main()
