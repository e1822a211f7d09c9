"""A small keep-alive HTTP/1.1 client for the hot calls to a REST backend (``/infer``).

aiohttp's client costs about three times the CPU of plain asyncio streams per small request
(measured: ≈160 µs vs ≈50 µs), which made it the largest single cost of the proxy. This client
does only what those calls need: POST with a known body length, a pool of idle keep-alive
connections, Content-Length, chunked and read-to-close answers, and one retry when a pooled
connection turns out to have been closed by the server before it answered anything.

Errors are left as the asyncio/OS exceptions they are (:class:`ConnectionRefusedError`,
:class:`TimeoutError`, :class:`asyncio.IncompleteReadError`, :class:`HTTPProtocolError`); the
REST backend maps them to the error tree.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from v2proxy.model import Buffer
from v2proxy.pipeline import StreamedBody

#: answers up to this size are read whole; larger ones can be streamed
READ_WHOLE = 256 * 1024
_CHUNK = 1 << 20


class HTTPProtocolError(Exception):
    """The backend's answer is not valid HTTP/1.1."""


@dataclass(slots=True)
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False


class Http1Response:
    """A response whose body is read (or streamed) from its connection."""

    def __init__(self, pool: Http1Pool, conn: _Conn, status: int, headers: dict[str, str]):
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status = status
        self.headers = headers
        length = headers.get("content-length")
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.content_length = None if self.chunked or length is None else int(length)
        self._keep = headers.get("connection", "").lower() != "close"

    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool."""
        chunks = [c async for c in self.iter_chunks()]
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body in pieces; the connection goes back to the pool at its end."""
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
                            pass  # trailers
                        break
                    yield await reader.readexactly(size)
                    await reader.readexactly(2)
            elif self.content_length is not None:
                remaining = self.content_length
                if remaining <= READ_WHOLE:
                    if remaining:
                        yield await reader.readexactly(remaining)
                else:
                    while remaining:
                        chunk = await reader.read(min(remaining, _CHUNK))
                        if not chunk:
                            raise asyncio.IncompleteReadError(b"", remaining)
                        remaining -= len(chunk)
                        yield chunk
            else:
                self._keep = False
                while chunk := await reader.read(_CHUNK):
                    yield chunk
        except BaseException:
            self.close()
            raise
        self._conn = None
        self._pool.release(conn, self._keep)

    def close(self) -> None:
        """Drop the connection (an unread or broken body cannot be reused)."""
        if self._conn is not None:
            self._conn.writer.close()
            self._pool.release(self._conn, keep=False)
            self._conn = None


class Http1Pool:
    """Idle keep-alive connections to one backend, at most ``limit`` open at once."""

    def __init__(
        self, host: str, port: int, limit: int = 100, connect_timeout: float | None = None
    ) -> None:
        self.host = host
        self.port = port
        self._connect_timeout = connect_timeout
        self._idle: deque[_Conn] = deque()
        self._slots = asyncio.Semaphore(limit)
        self._host_header = f"{host}:{port}".encode()

    async def _acquire(self) -> _Conn:
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
        return _Conn(reader, writer)

    def release(self, conn: _Conn, keep: bool) -> None:
        if keep and not conn.writer.is_closing():
            self._idle.append(conn)
        else:
            conn.writer.close()
        self._slots.release()

    async def post(
        self, path: str, headers: dict[str, str], body: list[Buffer] | StreamedBody
    ) -> Http1Response:
        """POST ``body`` (written buffer by buffer, or piped through as it arrives) and read
        the answer's head. A streamed body is never retried."""
        streamed = isinstance(body, StreamedBody)
        length = (
            body.length
            if isinstance(body, StreamedBody)
            else sum(memoryview(b).nbytes for b in body)
        )
        lines = [b"POST " + path.encode() + b" HTTP/1.1", b"Host: " + self._host_header]
        lines.extend(f"{k}: {v}".encode("latin-1") for k, v in headers.items())
        lines.append(b"Content-Length: " + str(length).encode())
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        for attempt in (1, 2):
            conn = await self._acquire()
            try:
                if isinstance(body, StreamedBody):
                    conn.writer.write(head)
                    async for chunk in body.chunks:
                        conn.writer.write(chunk)
                        await conn.writer.drain()
                else:
                    conn.writer.writelines([head, *body])
                    await conn.writer.drain()
                block = await conn.reader.readuntil(b"\r\n\r\n")
                status, headers_in = _parse_head(block)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                self.release(conn, keep=False)
                # A pooled connection the server had closed: nothing was answered, try anew.
                retry = conn.reused and attempt == 1 and not streamed
                if retry and not getattr(exc, "partial", b""):
                    continue
                raise
            except BaseException:
                self.release(conn, keep=False)
                raise
            return Http1Response(self, conn, status, headers_in)
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().writer.close()


def _parse_head(block: bytes) -> tuple[int, dict[str, str]]:
    """Status code and lower-cased headers of an answer's head (status line + header lines)."""
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
