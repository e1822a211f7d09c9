"""A small keep-alive HTTP/1.1 client for the hot calls to a REST backend (``/infer``).

aiohttp's client costs about three times the CPU of plain asyncio streams per small request;
streams in turn cost more than a bare :class:`asyncio.Protocol`, which is what this client is:
one protocol object per connection parses each answer straight from the buffers
``data_received`` hands it, and a future wakes the one coroutine waiting for it.

Measured with ``benchmarks/http1_client.py`` (uvloop, 200-byte POST and ~200-byte JSON answer,
2-core VM, medians of 9 rounds of 5000 requests), client CPU per request, streams -> this:
15.2 -> 12.4 µs one at a time and 14.3 -> 11.3 µs with 16 concurrent (client and server pinned
to one CPU); across two cores 16.1 -> 12.2 µs with 16 concurrent, while one at a time is
≈40 µs for both, lost in the noise of waking idle cores. Without the kernel (an in-memory
transport: the client's own code and the event loop) 8.9 -> 6.3 µs and 7.6 -> 5.0 µs. A 64 MiB
answer streamed through: ≈13 -> ≈10 ms CPU on uvloop, 55 -> 10 ms on plain asyncio (pieces are
handed out as received; the streams client copied each twice through its buffer and paused
reading above 128 KiB).

Contract:

- ``post`` sends ``POST`` with a known body length: the buffers of a ``list[Buffer]`` (joined
  with the head when small, else written as they are), or a :class:`StreamedBody` piped through
  as it arrives with transport flow control (``pause_writing``/``resume_writing``). It returns
  once the answer's head is in; 1xx interim answers are skipped; 204 and 304 have no body.
- The body is framed by Content-Length, chunked transfer coding (extensions and trailers
  ignored) or the end of the connection. :meth:`Http1Response.read` gives it whole;
  :meth:`Http1Response.iter_chunks` in the ``bytes`` objects the transport delivered (no
  copy), except bodies of at most :data:`READ_WHOLE` bytes with a Content-Length, which come
  in one piece. While a streamed answer waits for its consumer, reading from the socket pauses
  above 1 MiB buffered (:data:`_HIGH_WATER`) and resumes below 256 KiB (:data:`_LOW_WATER`);
  :meth:`Http1Response.read` buffers the whole body without pausing.
- At most ``limit`` connections are open (in use or idle) at once. A connection goes back to
  the pool when its answer was read to the end, kept alive and nothing more arrived;
  otherwise (``Connection: close``, read-to-close framing, extra bytes, an error, an unread
  body given up with :meth:`Http1Response.close`) it is closed.
- A pooled connection that the server had closed before answering anything is tried once more
  on a fresh connection (never with a streamed body, which cannot be sent twice).
- Errors are left as the asyncio/OS exceptions they are, for the REST backend to map:
  :class:`ConnectionRefusedError`/:class:`OSError` from connecting, :class:`TimeoutError` when
  ``connect_timeout`` passes, :class:`asyncio.IncompleteReadError` when the connection ends
  before the answer does (or the :class:`ConnectionError` it ended with), and
  :class:`HTTPProtocolError` for answers that are not HTTP/1.1 (a head over :data:`MAX_HEAD`
  bytes included). There is no read timeout here; callers bound the whole call.
- TCP_NODELAY is set by the event loop itself (asyncio and uvloop both do for TCP).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import cast

from v2proxy.model import Buffer
from v2proxy.ports import StreamedBody

#: answers up to this size (with a Content-Length) are read whole, even when streamed
READ_WHOLE = 256 * 1024
#: the longest answer head or chunk-size line taken (asyncio streams' limit, too)
MAX_HEAD = 64 * 1024
#: a streamed answer pauses reading from the socket above this many unconsumed bytes...
_HIGH_WATER = 1 << 20
#: ...and resumes below this many
_LOW_WATER = 256 * 1024
#: request bodies up to this size are joined with the head and written at once
_JOIN_MAX = 64 * 1024
_HEX = b"0123456789abcdefABCDEF"

# What the parser expects next.
_IDLE = 0  # nothing: no answer is due, or it is complete; more bytes are unexpected
_HEAD = 1  # the answer's head, up to its empty line
_LENGTH = 2  # ``_remaining`` more body bytes (Content-Length)
_CHUNK_SIZE = 3  # a chunk-size line
_CHUNK_DATA = 4  # ``_remaining`` more bytes of a chunk
_CHUNK_END = 5  # the empty line after a chunk's data
_TRAILERS = 6  # trailer lines, up to an empty one
_TO_CLOSE = 7  # body bytes until the server closes the connection


class HTTPProtocolError(Exception):
    """The backend's answer is not valid HTTP/1.1."""


class _Conn(asyncio.Protocol):
    """One connection: parses each answer as its bytes arrive and wakes the coroutine waiting
    for it (only one at a time: the request's)."""

    __slots__ = (
        "_drain",
        "_loop",
        "_partial",
        "_reading_paused",
        "_remaining",
        "_state",
        "_waiter",
        "body_done",
        "buffered",
        "chunked",
        "closed",
        "content_length",
        "error",
        "got_answer",
        "head_done",
        "headers",
        "keep",
        "pieces",
        "reusable",
        "reused",
        "status",
        "transport",
        "whole",
        "writing_paused",
    )

    #: set by connection_made, before create_connection returns this protocol
    transport: asyncio.Transport

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.reused = False
        #: False once the connection cannot carry another request
        self.reusable = True
        #: the connection has ended (EOF, error, or closed here)
        self.closed = False
        #: why the current answer cannot be completed
        self.error: BaseException | None = None
        #: some byte of the current answer arrived
        self.got_answer = False
        self.head_done = False
        self.body_done = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunked = False
        self.content_length: int | None = None
        self.keep = True
        #: body pieces not yet handed out, and their size
        self.pieces: deque[bytes] = deque()
        self.buffered = 0
        #: the body is being read whole: no backpressure, no wake-up per piece
        self.whole = False
        self._state = _IDLE
        self._remaining = 0
        self._partial = bytearray()
        self._reading_paused = False
        self.writing_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        state = self._state
        if state == _LENGTH and len(data) < self._remaining:  # a piece of a long body
            self._remaining -= len(data)
            self._push(data)
            return
        try:
            if state == _HEAD and not self._partial:
                # The usual small answer: head and whole body in one buffer.
                i = data.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
                if i >= 0:
                    self.got_answer = True
                    self._on_head(data[:i])
                    i += 4
                    if self._state == _LENGTH and len(data) - i == self._remaining:
                        self._remaining = 0
                        self.pieces.append(data[i:])
                        self.buffered += len(data) - i
                        self._done()
                        return
                    self._feed(data, i)
                    return
            self._feed(data, 0)
        except HTTPProtocolError as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        self._end(None)
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake_drain()

    # ------------------------------------------------------------------ parsing

    def _feed(self, data: bytes, pos: int) -> None:
        end = len(data)
        while pos < end:
            state = self._state
            if state == _HEAD:
                self.got_answer = True
                partial = self._partial
                if partial:
                    before = len(partial)
                    partial += data[pos:]
                    i = partial.find(b"\r\n\r\n", max(before - 3, 0))
                    if i < 0:
                        if len(partial) > MAX_HEAD:
                            raise HTTPProtocolError(f"answer head longer than {MAX_HEAD} bytes")
                        return
                    head = bytes(partial[:i])
                    partial.clear()
                    pos += i + 4 - before
                else:
                    i = data.find(b"\r\n\r\n", pos)
                    if i < 0:
                        if end - pos > MAX_HEAD:
                            raise HTTPProtocolError(f"answer head longer than {MAX_HEAD} bytes")
                        partial += data[pos:]
                        return
                    head = data[pos:i]
                    pos = i + 4
                if len(head) > MAX_HEAD:
                    raise HTTPProtocolError(f"answer head longer than {MAX_HEAD} bytes")
                self._on_head(head)
            elif state in (_LENGTH, _CHUNK_DATA):
                n = min(end - pos, self._remaining)
                self._push(data[pos : pos + n])  # the very object when it is all body
                pos += n
                self._remaining -= n
                if not self._remaining:
                    if state == _LENGTH:
                        self._done()
                    else:
                        self._state = _CHUNK_END
            elif state == _TO_CLOSE:
                self._push(data[pos:])
                return
            elif state == _IDLE:
                self.reusable = False  # bytes nobody asked for: never reuse this connection
                return
            else:  # a line of the chunked framing
                partial = self._partial
                i = data.find(b"\n", pos)
                if i < 0:
                    partial += data[pos:]
                    if len(partial) > MAX_HEAD:
                        raise HTTPProtocolError(f"chunk line longer than {MAX_HEAD} bytes")
                    return
                if partial:
                    partial += data[pos:i]
                    line = bytes(partial)
                    partial.clear()
                else:
                    line = data[pos:i]
                pos = i + 1
                self._on_line(line[:-1] if line.endswith(b"\r") else line)

    def _on_head(self, head: bytes) -> None:
        status, headers = _parse_head(head)
        if status < 200:
            if status == 101:
                raise HTTPProtocolError("unexpected 101 Switching Protocols")
            return  # an interim answer (100 Continue, 103 Early Hints): the real one follows
        self.status = status
        self.headers = headers
        self.keep = headers.get("connection", "").lower() != "close"
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.head_done = True
        length = headers.get("content-length")
        if status in (204, 304):
            self.content_length = 0
            self._done()
        elif self.chunked:
            self.content_length = None
            self._state = _CHUNK_SIZE
        elif length is None:
            self.content_length = None
            self.keep = False
            self._state = _TO_CLOSE
        else:
            if not (length.isascii() and length.isdigit()):
                raise HTTPProtocolError(f"invalid Content-Length {length[:80]!r}")
            self.content_length = self._remaining = int(length)
            self._state = _LENGTH
            if not self._remaining:
                self._done()
        self._wake()

    def _on_line(self, line: bytes) -> None:
        state = self._state
        if state == _CHUNK_SIZE:
            size = line.split(b";", 1)[0].strip()
            if not size or size.translate(None, _HEX):
                raise HTTPProtocolError("invalid chunk size in the answer")
            self._remaining = int(size, 16)
            self._state = _CHUNK_DATA if self._remaining else _TRAILERS
        elif state == _CHUNK_END:
            if line:
                raise HTTPProtocolError("a chunk is longer than its size")
            self._state = _CHUNK_SIZE
        elif not line:  # the empty line that ends the trailers
            self._done()

    def _push(self, piece: bytes) -> None:
        self.pieces.append(piece)
        self.buffered += len(piece)
        if not self.whole:
            if self.buffered > _HIGH_WATER and not self._reading_paused:
                self._reading_paused = True
                self.transport.pause_reading()
            self._wake()

    def _done(self) -> None:
        self._state = _IDLE
        self.body_done = True
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        self._state = _IDLE
        self.close()
        self.closed = True
        self._wake()
        self._wake_drain()

    def _end(self, exc: BaseException | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.reusable = False
        state = self._state
        self._state = _IDLE
        if state == _TO_CLOSE and exc is None:
            self.body_done = True
        elif state != _IDLE:
            if exc is not None:
                self.error = exc
            elif state == _HEAD:
                self.error = asyncio.IncompleteReadError(bytes(self._partial), None)
            else:
                expected = self._remaining if state == _LENGTH else None
                self.error = asyncio.IncompleteReadError(b"", expected)
        self._wake()
        self._wake_drain()

    # ------------------------------------------------------------------ for the request

    def begin(self) -> None:
        """Expect a new answer (the previous one was complete: nothing is left of it)."""
        self._state = _HEAD
        self.got_answer = self.head_done = self.body_done = self.whole = False

    def write_error(self) -> BaseException:
        """What to raise for a connection that ended before the answer's head."""
        return self.error or ConnectionResetError("Connection lost")

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark (or until the
        connection ends: the caller looks at ``closed``)."""
        while self.writing_paused and not self.closed:
            fut = self._loop.create_future()
            self._drain = fut
            await fut

    async def wait(self) -> None:
        """Wait for the next event on the current answer (head, piece, end or error)."""
        fut = self._loop.create_future()
        self._waiter = fut
        await fut

    def read_whole(self) -> None:
        self.whole = True
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def take(self) -> bytes:
        piece = self.pieces.popleft()
        self.buffered -= len(piece)
        if self._reading_paused and self.buffered <= _LOW_WATER:
            self._reading_paused = False
            self.transport.resume_reading()
        return piece

    def take_all(self) -> bytes:
        pieces = self.pieces
        body = pieces.popleft() if len(pieces) == 1 else b"".join(pieces)
        pieces.clear()
        self.buffered = 0
        return body

    def close(self) -> None:
        self.reusable = False
        self.transport.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _wake_drain(self) -> None:
        waiter = self._drain
        if waiter is not None:
            self._drain = None
            if not waiter.done():
                waiter.set_result(None)


class Http1Response:
    """A response whose body is read (or streamed) from its connection."""

    __slots__ = ("_conn", "_pool", "chunked", "content_length", "headers", "status")

    def __init__(self, pool: Http1Pool, conn: _Conn, status: int, headers: dict[str, str]):
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status = status
        self.headers = headers
        self.chunked = conn.chunked
        self.content_length = conn.content_length

    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool."""
        conn = self._conn
        if conn is None:
            return b""
        if not conn.body_done:
            try:
                await self._rest(conn)
            except BaseException:
                self.close()
                raise
        body = conn.take_all()
        self._conn = None
        self._pool.release(conn, conn.keep)
        return body

    @staticmethod
    async def _rest(conn: _Conn) -> None:
        """Wait for the end of the body, buffering it (no backpressure: it is wanted whole)."""
        conn.read_whole()
        while not conn.body_done:
            if conn.error is not None:
                raise conn.error
            await conn.wait()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body in pieces; the connection goes back to the pool at its end."""
        conn = self._conn
        if conn is None:
            return
        try:
            if self.content_length is not None and self.content_length <= READ_WHOLE:
                if not conn.body_done:
                    await self._rest(conn)
                body = conn.take_all()
                if body:
                    yield body
            else:
                pieces = conn.pieces
                while True:
                    if pieces:
                        yield conn.take()
                    elif conn.body_done:
                        break
                    elif conn.error is not None:
                        raise conn.error
                    else:
                        await conn.wait()
        except BaseException:
            self.close()
            raise
        if self._conn is conn:  # not closed meanwhile (while a piece was out)
            self._conn = None
            self._pool.release(conn, conn.keep)

    def close(self) -> None:
        """Drop the connection (an unread or broken body cannot be reused)."""
        if self._conn is not None:
            conn = self._conn
            self._conn = None
            self._pool.release(conn, keep=False)


class _Slots:
    """A counting semaphore, first come first served, like :class:`asyncio.Semaphore`, whose
    ``try_acquire`` takes a free slot without a coroutine (the usual case on the hot path)."""

    __slots__ = ("_value", "_waiters")

    def __init__(self, value: int) -> None:
        self._value = value
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_acquire(self) -> bool:
        if self._value > 0 and not self._waiters:
            self._value -= 1
            return True
        return False

    async def acquire(self) -> None:
        if self.try_acquire():
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # release() hands its slot over by completing this
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release()  # given a slot just as the wait was given up: pass it on
            else:
                self._waiters.remove(fut)
            raise

    def release(self) -> None:
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._value += 1


class Http1Pool:
    """Idle keep-alive connections to one backend, at most ``limit`` open at once."""

    def __init__(
        self, host: str, port: int, limit: int = 100, connect_timeout: float | None = None
    ) -> None:
        self.host = host
        self.port = port
        self._connect_timeout = connect_timeout
        self._idle: deque[_Conn] = deque()
        self._slots = _Slots(limit)
        self._host_header = f"{host}:{port}"

    async def _acquire(self) -> _Conn:
        """A slot and a connection: the most recently used idle one, or a new one."""
        if not self._slots.try_acquire():
            await self._slots.acquire()
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.reusable:
                conn.reused = True
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(lambda: _Conn(loop), self.host, self.port)
        except BaseException:
            self._slots.release()
            raise
        return conn

    def release(self, conn: _Conn, keep: bool) -> None:
        if keep and conn.reusable and conn.body_done and not conn.pieces:
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()

    async def post(
        self, path: str, headers: dict[str, str], body: list[Buffer] | StreamedBody
    ) -> Http1Response:
        """POST ``body`` (written buffer by buffer, or piped through as it arrives) and read
        the answer's head. A streamed body is never retried."""
        streamed = isinstance(body, StreamedBody)
        if isinstance(body, StreamedBody):
            length = body.length
        else:
            length = 0
            for b in body:
                length += b.nbytes if isinstance(b, memoryview) else len(b)
        lines = [f"Host: {self._host_header}\r\n"]
        for k, v in headers.items():
            lines.append(f"{k}: {v}\r\n")
        lines.append(f"Content-Length: {length}\r\n\r\n")
        head = b"POST %s HTTP/1.1\r\n%s" % (path.encode(), "".join(lines).encode("latin-1"))
        for attempt in (1, 2):
            conn = await self._acquire()
            try:
                conn.begin()
                transport = conn.transport
                if conn.closed:
                    raise conn.write_error()
                if isinstance(body, StreamedBody):
                    transport.write(head)
                    async for chunk in body.chunks:
                        if conn.closed:
                            break  # the answer (or the error) is what matters now
                        transport.write(chunk)
                        if conn.writing_paused:
                            await conn.drain()
                else:
                    if length <= _JOIN_MAX:
                        transport.write(b"".join([head, *body]))
                    else:
                        transport.writelines([head, *body])
                    if conn.writing_paused:
                        await conn.drain()
                while not conn.head_done:
                    if conn.error is not None:
                        raise conn.error
                    if conn.closed:
                        raise conn.write_error()
                    await conn.wait()
            except (asyncio.IncompleteReadError, ConnectionError):
                self.release(conn, keep=False)
                # A pooled connection the server had closed: nothing was answered, try anew.
                if conn.reused and attempt == 1 and not streamed and not conn.got_answer:
                    continue
                raise
            except BaseException:
                self.release(conn, keep=False)
                raise
            return Http1Response(self, conn, conn.status, conn.headers)
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


def _parse_head(block: bytes) -> tuple[int, dict[str, str]]:
    """Status code and lower-cased headers of an answer's head (status line + header lines)."""
    lines = block.decode("latin-1").split("\r\n")
    parts = lines[0].split(None, 2)
    if (
        len(parts) < 2
        or not parts[0].startswith("HTTP/1.")
        or not (parts[1].isascii() and parts[1].isdigit())
    ):
        raise HTTPProtocolError(f"invalid status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise HTTPProtocolError(f"invalid header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers
