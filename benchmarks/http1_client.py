"""Micro-benchmark of the lean HTTP/1.1 client (``v2proxy.backends.http1``) against the
asyncio-streams client it replaced (kept below as ``StreamsPool``, as it was), in one run.

    .venv/bin/python benchmarks/http1_client.py [--requests 4000] [--rounds 7] [--loop uvloop]

A raw asyncio server in a subprocess on 127.0.0.1 answers every ``POST /small`` with a fixed
~200-byte JSON and ``POST /big`` with 64 MiB (Content-Length). Each round measures, for both
clients in alternating order: N sequential POSTs of a 200-byte body, N POSTs from 16 concurrent
tasks, and one 64 MiB answer streamed through ``iter_chunks``. Reported: the median over the
rounds of CPU time of this process (``time.process_time``: the client only, the server runs
elsewhere) and wall time, per request (µs) or per big answer (ms). No assertion on speed.

Then the same small requests again over an in-memory transport that answers at once: no
socket and no kernel, so what remains is the clients' own code plus the event loop's, measured
without the noise of loopback TCP (where most of the CPU is the kernel's, equal for both).

On a 2-core machine the loopback numbers of ``c=1`` are bimodal: each request wakes an idle
core twice, and whether client and server share a core changes the cost per request by 3x.
``--cpu 0`` pins both to one CPU, which gives steadier numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from v2proxy.backends.http1 import Http1Pool

SMALL_BODY = b'{"inputs":[{"name":"x","shape":[1,16],"datatype":"FP32","data":[' + b"0.5," * 30
SMALL_BODY = SMALL_BODY[:198] + b"]}"
SMALL_ANSWER_BODY = (
    b'{"model_name":"simple","model_version":"1","outputs":[{"name":"y","datatype":"FP32",'
    b'"shape":[1,16],"data":[1.5,2.5,3.5,4.5,5.5,6.5,7.5,8.5,9.5,10.5,11.5,12.5,13.5,14.5,'
    b"15.5,16.5]}]}"
)
BIG = 64 << 20
HEADERS = {"Accept-Encoding": "identity", "Content-Type": "application/json"}
CONCURRENCY = 16


# ------------------------------------------------------------------------------ the server


class _ServerProtocol(asyncio.Protocol):
    small = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(SMALL_ANSWER_BODY),
        SMALL_ANSWER_BODY,
    )
    big_head = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
    big_head += b"Content-Length: %d\r\n\r\n" % BIG
    big_body = b"\x01" * BIG

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(buf) < end + 4 + length:
                return
            path = head.split(b" ", 2)[1]
            del buf[: end + 4 + length]
            if path == b"/big":
                self.transport.write(self.big_head)
                self.transport.write(self.big_body)
            else:
                self.transport.write(self.small)


def serve() -> None:
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_ServerProtocol, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


# ------------------------------------------------------------------------------ the baseline
# The streams-based client as it was before the asyncio.Protocol rewrite (behaviour kept).


class HTTPProtocolError(Exception):
    pass


@dataclass(slots=True)
class _StreamConn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False


class StreamsResponse:
    def __init__(
        self, pool: StreamsPool, conn: _StreamConn, status: int, headers: dict[str, str]
    ) -> None:
        self._pool = pool
        self._conn: _StreamConn | None = conn
        self.status = status
        self.headers = headers
        length = headers.get("content-length")
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.content_length = None if self.chunked or length is None else int(length)
        self._keep = headers.get("connection", "").lower() != "close"

    async def read(self) -> bytes:
        chunks = [c async for c in self.iter_chunks()]
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        reader = conn.reader
        try:
            if self.chunked:
                while True:
                    line = await reader.readuntil(b"\r\n")
                    try:
                        size = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise HTTPProtocolError("invalid chunk size in the answer") from None
                    if size == 0:
                        while await reader.readuntil(b"\r\n") != b"\r\n":
                            pass
                        break
                    yield await reader.readexactly(size)
                    await reader.readexactly(2)
            elif self.content_length is not None:
                remaining = self.content_length
                if remaining <= 256 * 1024:
                    if remaining:
                        yield await reader.readexactly(remaining)
                else:
                    while remaining:
                        chunk = await reader.read(min(remaining, 1 << 20))
                        if not chunk:
                            raise asyncio.IncompleteReadError(b"", remaining)
                        remaining -= len(chunk)
                        yield chunk
            else:
                self._keep = False
                while chunk := await reader.read(1 << 20):
                    yield chunk
        except BaseException:
            self.close()
            raise
        self._conn = None
        self._pool.release(conn, self._keep)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.writer.close()
            self._pool.release(self._conn, keep=False)
            self._conn = None


class StreamsPool:
    def __init__(
        self, host: str, port: int, limit: int = 100, connect_timeout: float | None = None
    ) -> None:
        self.host = host
        self.port = port
        self._connect_timeout = connect_timeout
        self._idle: deque[_StreamConn] = deque()
        self._slots = asyncio.Semaphore(limit)
        self._host_header = f"{host}:{port}".encode()

    async def _acquire(self) -> _StreamConn:
        await self._slots.acquire()
        while self._idle:
            conn = self._idle.pop()
            if not conn.writer.is_closing() and not conn.reader.at_eof():
                conn.reused = True
                return conn
            conn.writer.close()
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await asyncio.open_connection(self.host, self.port)
        except BaseException:
            self._slots.release()
            raise
        return _StreamConn(reader, writer)

    def release(self, conn: _StreamConn, keep: bool) -> None:
        if keep and not conn.writer.is_closing():
            self._idle.append(conn)
        else:
            conn.writer.close()
        self._slots.release()

    async def post(self, path: str, headers: dict[str, str], body: list[bytes]) -> StreamsResponse:
        length = sum(memoryview(b).nbytes for b in body)
        lines = [b"POST " + path.encode() + b" HTTP/1.1", b"Host: " + self._host_header]
        lines.extend(f"{k}: {v}".encode("latin-1") for k, v in headers.items())
        lines.append(b"Content-Length: " + str(length).encode())
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        for attempt in (1, 2):
            conn = await self._acquire()
            try:
                conn.writer.writelines([head, *body])
                await conn.writer.drain()
                block = await conn.reader.readuntil(b"\r\n\r\n")
                status, headers_in = _parse_head(block)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                self.release(conn, keep=False)
                if conn.reused and attempt == 1 and not getattr(exc, "partial", b""):
                    continue
                raise
            except BaseException:
                self.release(conn, keep=False)
                raise
            return StreamsResponse(self, conn, status, headers_in)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().writer.close()


def _parse_head(block: bytes) -> tuple[int, dict[str, str]]:
    lines = block.split(b"\r\n")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise HTTPProtocolError(f"invalid status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            raise HTTPProtocolError(f"invalid header line {line[:80]!r}")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return int(parts[1]), headers


# ------------------------------------------------------------------------------ the client


class _Response(Protocol):
    def read(self) -> Awaitable[bytes]: ...
    def iter_chunks(self) -> AsyncIterator[bytes]: ...


class _Pool(Protocol):
    async def post(self, path: str, headers: dict[str, str], body: Any) -> Any: ...
    async def close(self) -> None: ...


async def _small(pool: _Pool) -> None:
    resp = await pool.post("/small", HEADERS, [SMALL_BODY])
    if len(await resp.read()) != len(SMALL_ANSWER_BODY):
        raise SystemExit("wrong answer")


async def _sequential(pool: _Pool, n: int) -> None:
    for _ in range(n):
        await _small(pool)


async def _concurrent(pool: _Pool, n: int) -> None:
    async def worker(count: int) -> None:
        for _ in range(count):
            await _small(pool)

    await asyncio.gather(*(worker(n // CONCURRENCY) for _ in range(CONCURRENCY)))


async def _big(pool: _Pool, _n: int) -> None:
    resp = await pool.post("/big", HEADERS, [SMALL_BODY])
    total = 0
    async for chunk in resp.iter_chunks():
        total += len(chunk)
    if total != BIG:
        raise SystemExit(f"big answer: {total} bytes")


async def _measure(
    fn: Callable[[_Pool, int], Awaitable[None]], pool: _Pool, n: int
) -> tuple[float, float]:
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    await fn(pool, n)
    return time.process_time() - cpu, time.perf_counter() - wall


class _MemoryTransport(asyncio.Transport):
    """Answers each write (one per request, for both clients) with the small answer on the next
    loop iteration: no socket, no kernel, only the clients' own code and the event loop."""

    def __init__(self, protocol: asyncio.Protocol, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._protocol = protocol
        self._loop = loop
        self._closing = False

    def write(self, data: Any) -> None:
        self._loop.call_soon(self._protocol.data_received, _ServerProtocol.small)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"")

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._loop.call_soon(self._protocol.connection_lost, None)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def run(
    port: int, requests: int, rounds: int, in_memory: bool
) -> dict[str, dict[str, list[float]]]:
    if in_memory:
        loop = asyncio.get_running_loop()

        async def create_connection(factory: Callable[[], Any], *_: Any, **__: Any) -> Any:
            protocol = factory()
            transport = _MemoryTransport(protocol, loop)
            protocol.connection_made(transport)
            return transport, protocol

        loop.create_connection = create_connection  # type: ignore[method-assign,assignment]
    pools: dict[str, _Pool] = {
        "streams (before)": StreamsPool("127.0.0.1", port),
        "protocol (after)": Http1Pool("127.0.0.1", port),
    }
    cases: list[tuple[str, Callable[[_Pool, int], Awaitable[None]], int, float]] = [
        ("small c=1   µs/req", _sequential, requests, 1e6 / requests),
        (f"small c={CONCURRENCY}  µs/req", _concurrent, requests, 1e6 / requests),
    ]
    if not in_memory:
        cases.append(("64 MiB answer  ms", _big, 1, 1e3))
    results: dict[str, dict[str, list[float]]] = {}
    for pool in pools.values():  # warm up: connections open, code paths hot
        await _concurrent(pool, CONCURRENCY * 20)
        if not in_memory:
            await _big(pool, 1)
    for r in range(rounds):
        names = list(pools) if r % 2 == 0 else list(pools)[::-1]
        for case, fn, n, scale in cases:
            for name in names:
                cpu, wall = await _measure(fn, pools[name], n)
                entry = results.setdefault(f"{case}|{name}", {"cpu": [], "wall": []})
                entry["cpu"].append(cpu * scale)
                entry["wall"].append(wall * scale)
    for pool in pools.values():
        await pool.close()
    return results


def report(title: str, results: dict[str, dict[str, list[float]]]) -> None:
    print(f"\n{title}")
    print(f"{'case':<22} {'client':<18} {'CPU median':>11} {'(min-max)':>17} {'wall median':>12}")
    by_case: dict[str, dict[str, float]] = {}
    for key, entry in results.items():
        case, name = key.split("|")
        cpu = statistics.median(entry["cpu"])
        by_case.setdefault(case, {})[name] = cpu
        spread = f"({min(entry['cpu']):.1f}-{max(entry['cpu']):.1f})"
        print(
            f"{case:<22} {name:<18} {cpu:>11.1f} {spread:>17} "
            f"{statistics.median(entry['wall']):>12.1f}"
        )
    for case, cpus in by_case.items():
        before, after = cpus["streams (before)"], cpus["protocol (after)"]
        print(f"{case:<22} CPU after/before: {after / before:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000, help="small requests per run")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument(
        "--cpu", type=int, help="pin client and server to this one CPU (steadier numbers)"
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})  # the server inherits it
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        runner: Callable[[Any], Any] = asyncio.run
        if args.loop == "uvloop":
            import uvloop

            runner = uvloop.run
        loopback = runner(run(port, args.requests, args.rounds, in_memory=False))
    finally:
        server.terminate()
        server.wait()
    in_memory = runner(run(0, args.requests, args.rounds, in_memory=True))
    pinned = f", client and server on CPU {args.cpu}" if args.cpu is not None else ""
    print(
        f"loop: {args.loop}, {args.requests} small requests per run, medians of {args.rounds} "
        f"rounds{pinned}; CPU = time.process_time of the client process"
    )
    report("127.0.0.1, server in another process:", loopback)
    report("in-memory transport (the clients' own code and the event loop, no kernel):", in_memory)


if __name__ == "__main__":
    main()
