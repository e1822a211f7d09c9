"""The floor of a Python proxy: a byte relay on uvloop that does no HTTP work at all.

Every client connection gets its own backend connection and bytes are copied both ways as they
come (``asyncio.Protocol`` callbacks, no coroutines, no parsing). No real proxy can do less per
request in Python, so its latency and throughput next to nginx's show what any Python sidecar
can reach on the machine, and how much of v2proxy's cost is its own work. It is a compared
system in scenario (a) (``py-relay``), never a product.

    python benchmarks/pyrelay.py --port 9100 --backend 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import cast

import uvloop


class _Half(asyncio.Protocol):
    """One side of a relayed connection: what it receives is written to its peer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self.pending.append(data)  # the backend connection is still being made

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Client(_Half):
    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self._backend = (host, port)
        self._connecting: asyncio.Task[None] | None = None  # held: the loop keeps tasks weakly

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, backend = await loop.create_connection(_Half, *self._backend)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        backend.peer, self.peer = self, backend
        for data in self.pending:
            backend.transport.write(data)  # type: ignore[union-attr]
        self.pending.clear()


async def _serve(port: int, backend: str) -> None:
    host, _, bport = backend.rpartition(":")
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(host, int(bport)), "127.0.0.1", port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True, help="host:port")
    args = parser.parse_args()
    uvloop.run(_serve(args.port, args.backend))


if __name__ == "__main__":
    main()
