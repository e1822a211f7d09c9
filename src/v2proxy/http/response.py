"""The writer of the answer to one :class:`~v2proxy.http.request.HttpRequest`.

Content-Length framing for :meth:`HttpResponse.send` and a known length; chunked (HTTP/1.1) or
close-delimited (HTTP/1.0) otherwise. The head and a body up to :data:`JOIN_MAX` bytes go out in
one write. A header name or value holding CR or LF is refused (``ValueError``: no response
splitting). A connection keeps one :class:`HttpResponse`, renewed for each request: a handler
uses it only until it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Final

from v2proxy.http import Buffer
from v2proxy.http.request import ClientDisconnected, HttpRequest

if TYPE_CHECKING:
    from v2proxy.http.server_conn import Connection

JOIN_MAX: Final = 64 * 1024

STATUS_LINES: Final[dict[int, bytes]] = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode("ascii")) for s in HTTPStatus
}
_NO_BODY: Final = frozenset((204, 304))
_V11: Final = (1, 1)


def nbytes(buf: Buffer) -> int:
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)


def flat(buf: Buffer) -> Buffer:
    """``buf`` as something every transport writes byte for byte."""
    if isinstance(buf, memoryview) and (buf.format != "B" or buf.ndim != 1):
        return buf.cast("B")
    return buf


class HttpResponse:
    """Writes the answer to one :class:`HttpRequest` (then, renewed, to the next one)."""

    __slots__ = (
        "_chunked",
        "_conn",
        "_ended",
        "_head_only",
        "_last_framing",
        "_last_size",
        "_remaining",
        "_req",
        "on_cut",
        "started",
    )

    def __init__(self, conn: Connection, req: HttpRequest) -> None:
        self._conn = conn
        #: the last answer's size and its framing line (the connection's answers mostly have
        #: one size: the line is not formatted again)
        self._last_size = -1
        self._last_framing = b""
        self.renew(req)

    def renew(self, req: HttpRequest) -> None:
        """Start over as the writer of the answer to ``req``."""
        self._req = req
        self.started = self._ended = self._chunked = False
        self._remaining = -1  # bytes of a Content-Length answer still due; -1: not so framed
        self._head_only = req.method == "HEAD"
        #: set by a quick handler: called when the server cuts the connection, as the serving
        #: task would be cancelled
        self.on_cut: Callable[[], None] | None = None

    def _head(
        self, status: int, headers: list[tuple[bytes, bytes]], framing: bytes
    ) -> list[Buffer]:
        if self.started:
            raise RuntimeError("the answer has already started")
        if status < 200:
            raise ValueError("interim (1xx) answers are the server's business")
        line = STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status
        if not headers:
            out: list[Buffer] = [line, framing]
        else:
            # every field in one join, then one pass for CR/LF: only the separators hold them
            fields = b"\r\n".join(map(b": ".join, headers))
            n = len(headers) - 1
            if fields.count(b"\n") != n or fields.count(b"\r") != n:
                raise ValueError("CR or LF in a response header")
            out = [line, fields, b"\r\n", framing]
        out.append(self._conn.connection_header(self._req))
        self.started = True
        return out

    def send_now(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes | bytearray
    ) -> bool:
        """:meth:`send` of the usual small answer in one write, without awaiting: True when
        written (the caller then minds :attr:`paused`), False when not of that kind."""
        conn = self._conn
        size = len(body)
        if (
            conn.lost
            or not headers
            or size > JOIN_MAX
            or status < 200
            or status in _NO_BODY
            or self.started
            or self._head_only
        ):
            return False
        line = STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status
        fields = b"\r\n".join(map(b": ".join, headers))
        n = len(headers) - 1
        if fields.count(b"\n") != n or fields.count(b"\r") != n:
            raise ValueError("CR or LF in a response header")
        self.started = self._ended = True
        if size == self._last_size:
            framing = self._last_framing
        else:
            framing = self._last_framing = b"\r\nContent-Length: %d\r\n" % size
            self._last_size = size
        req = self._req
        if (
            req._complete
            and req.keep_alive
            and req.version == _V11
            and not req._expect
            and not conn.closing_after
        ):
            end = b"\r\n"  # (connection_header's usual answer, written out)
        else:
            end = conn.connection_header(req)
        conn.transport.write(b"".join((line, fields, framing, end, body)))
        return True

    @property
    def paused(self) -> bool:
        """Whether the client has not kept up: await :meth:`drain` before going on."""
        return self._conn.writing_paused

    async def drain(self) -> None:
        """Wait until the client has read enough of what was written (``write_timeout``)."""
        await self._conn.drain()

    def finished(self) -> None:
        """A quick handler's answer is over, written or given up: the connection goes on."""
        self.on_cut = None
        self._conn.answered(self._req)

    async def send(
        self, status: int, headers: list[tuple[bytes, bytes]], body: Buffer | list[Buffer] = b""
    ) -> None:
        """A complete answer framed by Content-Length."""
        conn = self._conn
        if conn.lost:
            raise ClientDisconnected("client went away")
        if (type(body) is bytes or type(body) is bytearray) and self.send_now(
            status, headers, body
        ):
            if conn.writing_paused:
                await conn.drain()
            return
        if status in _NO_BODY:
            out = self._head(status, headers, b"")
            parts: list[Buffer] = []
        elif not isinstance(body, list):  # one piece: the usual answer
            size = body.nbytes if isinstance(body, memoryview) else len(body)
            out = self._head(status, headers, b"Content-Length: %d\r\n" % size)
            if self._head_only or not size:
                parts = []
            elif size <= JOIN_MAX:
                out.append(body)
                parts = []
            else:
                parts = [body]
        else:
            size = 0
            for p in body:
                size += p.nbytes if isinstance(p, memoryview) else len(p)
            out = self._head(status, headers, b"Content-Length: %d\r\n" % size)
            if self._head_only:
                parts = []
            elif size <= JOIN_MAX:
                out += body
                parts = []
            else:
                parts = body
        self._ended = True
        write = conn.transport.write
        write(b"".join(out))
        for p in parts:
            if nbytes(p):
                write(flat(p))
                if conn.writing_paused:
                    await conn.drain()
        if conn.writing_paused:
            await conn.drain()

    async def start(
        self, status: int, headers: list[tuple[bytes, bytes]], content_length: int | None = None
    ) -> None:
        """The head of a streamed answer; the body follows with :meth:`write`, then :meth:`end`."""
        conn = self._conn
        if conn.lost:
            raise ClientDisconnected("client went away")
        if status in _NO_BODY:
            framing = b""
            self._remaining = 0
        elif content_length is not None:
            framing = b"Content-Length: %d\r\n" % content_length
            self._remaining = content_length
        elif self._req.version >= (1, 1):
            framing = b"Transfer-Encoding: chunked\r\n"
            self._chunked = True
        else:
            self._req.keep_alive = False  # close-delimited
            framing = b""
        conn.transport.write(b"".join(self._head(status, headers, framing)))
        if conn.writing_paused:
            await conn.drain()

    async def write(self, chunk: Buffer) -> None:
        """The next piece of a streamed answer; waits while the client does not keep up."""
        if not self.started or self._ended:
            raise RuntimeError("write() needs start() and comes before end()")
        conn = self._conn
        if conn.lost:
            raise ClientDisconnected("client went away")
        n = nbytes(chunk)
        if n == 0 or self._head_only:
            return
        write = conn.transport.write
        if self._chunked:
            if n <= JOIN_MAX:
                out = bytearray(b"%x\r\n" % n)
                out += chunk
                out += b"\r\n"
                write(out)
            else:
                write(b"%x\r\n" % n)
                write(flat(chunk))
                write(b"\r\n")
        else:
            if self._remaining >= 0:
                if n > self._remaining:
                    raise ValueError("more bytes than the answer's Content-Length")
                self._remaining -= n
            write(flat(chunk))
        if conn.writing_paused:
            await conn.drain()

    async def end(self) -> None:
        """Completes a streamed answer."""
        if not self.started or self._ended:
            raise RuntimeError("end() needs start() and comes once")
        self._ended = True
        conn = self._conn
        if conn.lost:
            raise ClientDisconnected("client went away")
        if self._remaining > 0 and not self._head_only:
            self.abort()
            raise ValueError(f"answer ended {self._remaining} bytes short of its Content-Length")
        if self._chunked and not self._head_only:
            conn.transport.write(b"0\r\n\r\n")
            if conn.writing_paused:
                await conn.drain()

    def abort(self) -> None:
        """Closes the connection now: the client sees a broken answer, never a short one."""
        self._ended = True
        self._conn.abort()
