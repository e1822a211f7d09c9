"""The floor of an HTTP-aware Python proxy: the least a relay on uvloop + httptools does.

Each request head is parsed by httptools, the hop-by-hop headers are dropped, and the request
goes out on a kept-alive backend connection with Host and Content-Length written afresh; the
answer head is parsed and written back the same way. Nothing else: no routes, checks, limits,
timeouts or metrics, and a body is gathered whole (the benchmark's requests are small). Beside
``py-relay`` (pyrelay.py, bytes only) it is a compared system (``floor-relay``) of scenarios a,
a-triton and c-triton: what the stack itself costs per request, never a product.

    python benchmarks/floorrelay.py --port 9100 --backend 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections import deque
from typing import cast

import httptools
import uvloop

#: hop-by-hop headers (RFC 9110 7.6.1), and the two this relay writes itself
DROPPED = frozenset(
    b"connection keep-alive proxy-connection te trailer transfer-encoding upgrade"
    b" content-length host".split()
)
BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class _Message(asyncio.Protocol):
    """One side's connection: the parser's callbacks gather a message's kept headers and body."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head: list[bytes] = []
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in DROPPED:
            self.head += (name, b": ", value, b"\r\n")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def message(self, start: bytes) -> bytes:
        """The message gathered, with ``start`` (its start line and added headers) first."""
        body = b"".join(self.body)
        out = b"".join([start, *self.head, b"content-length: %d\r\n\r\n" % len(body), body])
        self.head, self.body = [], []
        return out


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
            client.answer(BAD_GATEWAY, keep_alive=False)
        else:
            backend.send(request, client)


class _Backend(_Message):
    def __init__(self, pool: _Pool) -> None:
        super().__init__()
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.client: _Client | None = None
        self.reason = b""

    def send(self, request: bytes, client: _Client) -> None:
        self.client = client
        self.transport.write(request)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()  # type: ignore[union-attr]

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_message_complete(self) -> None:
        status = b"HTTP/1.1 %d %s\r\n" % (self.parser.get_status_code(), self.reason)
        answer, self.reason = self.message(status), b""
        client, self.client = self.client, None
        if self.parser.should_keep_alive():
            self.pool.idle.append(self)
        else:
            self.transport.close()  # type: ignore[union-attr]
        if client is not None:
            client.answer(answer, keep_alive=True)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool.idle:
            self.pool.idle.remove(self)
        if self.client is not None:
            self.client.answer(BAD_GATEWAY, keep_alive=False)


class _Client(_Message):
    def __init__(self, pool: _Pool) -> None:
        super().__init__()
        self.pool = pool
        self.parser = httptools.HttpRequestParser(self)
        self.url: list[bytes] = []
        self.waiting: deque[tuple[bytes, bool]] = deque()  # pipelined behind the one in flight
        self.in_flight = False
        self.keep_alive = True

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()  # type: ignore[union-attr]

    def on_url(self, url: bytes) -> None:
        self.url.append(url)

    def on_message_complete(self) -> None:
        line = b"%s %s HTTP/1.1\r\n" % (self.parser.get_method(), b"".join(self.url))
        self.url = []
        request = self.message(line + self.pool.host_line)
        if self.in_flight:
            self.waiting.append((request, self.parser.should_keep_alive()))
        else:
            self._send(request, self.parser.should_keep_alive())

    def _send(self, request: bytes, keep_alive: bool) -> None:
        self.in_flight, self.keep_alive = True, keep_alive
        self.pool.send(request, self)

    def answer(self, data: bytes, keep_alive: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(data)
        if not (keep_alive and self.keep_alive):
            transport.close()
        elif self.waiting:
            self._send(*self.waiting.popleft())
        else:
            self.in_flight = False


async def start(port: int, backend: str) -> asyncio.Server:
    """A server relaying 127.0.0.1:``port`` (0: any free port) to ``backend`` (host:port)."""
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
