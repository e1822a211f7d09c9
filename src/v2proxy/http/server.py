"""A lean HTTP/1.1 server: llhttp (httptools) under a bare :class:`asyncio.Protocol`.

One :class:`_Connection` per TCP connection parses requests as bytes arrive and queues them;
one task per busy period (started when a request's head is complete and no handler runs, ended
when the queue is empty) runs the handler on each in turn, so pipelined requests are answered in
order, each after the previous answer is complete. Reading pauses while :data:`MAX_PIPELINE`
requests wait, or while a body has more than ``request.HIGH_WATER`` bytes unread.

Contract (RFC 9112; the handler is never called for any of these, the answer is a JSON body
``{"error": "<message>"}`` with ``Connection: close``, and the connection closes after it):

- 400: malformed requests (llhttp's reason, a fixed text, never the client's bytes), among them
  Content-Length with Transfer-Encoding, any duplicate Content-Length (llhttp refuses identical
  ones too), a Content-Length that is not all digits, bare LF and obs-fold; request targets
  that are not origin-form (absolute-form, ``*``, authority-form) and every ``CONNECT`` — a target
  is never a host; an ``Upgrade`` request with a body. An ``Upgrade`` without a body is answered
  as if the header were absent. 413: Content-Length over ``max_body_size``; 414: target over
  ``max_request_line``; 417: an Expect other than ``100-continue``; 431: over ``max_headers``
  fields or ``max_header_bytes`` of head; 501: a transfer coding other than chunked;
  505: HTTP/2 (its preface included) and versions other than 1.0/1.1.
- Timeouts (one lazily re-armed timer per connection): ``header_timeout`` from a head's first
  byte -> 408; a connection that sends nothing is closed after ``header_timeout``, an idle
  keep-alive one after ``keepalive_timeout`` (silently); ``body_timeout`` without a body byte
  -> the handler's read raises :class:`BodyTimeout` (408), and the connection closes. While the
  server itself holds reading back, no read deadline runs. ``write_timeout``: see request.py.
- ``Expect: 100-continue`` (HTTP/1.1): the interim answer is written when the handler first
  reads the body; an answer given without reading it closes the connection.
- A handler that returns without reading the whole body: up to :data:`DISCARD_MAX` more bytes
  are read and dropped so the next request parses, else the connection closes. It raising
  :class:`BodyError` -> its status; :class:`ClientDisconnected` -> the connection ends; anything
  else -> logged once, 500 ``internal error: <ExcClassName>`` (or abort if the head was sent).
- Closing after an answer half-closes first and drains input for :data:`LINGER` seconds, so
  that unread request bytes do not reset the connection before the client reads the answer.
- Malformed requests log at DEBUG, never with a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from typing import cast

import httptools

from v2proxy.http.request import (
    HIGH_WATER,
    STATUS_LINES,
    BodyError,
    BodyTimeout,
    BodyTooLarge,
    ClientDisconnected,
    HttpRequest,
    HttpResponse,
    ServerLimits,
)

log = logging.getLogger(__name__)
DEFAULT_LIMITS = ServerLimits()

Handler = Callable[[HttpRequest, HttpResponse], Awaitable[None]]

#: requests parsed and not yet answered (the one in hand included) before reading pauses
MAX_PIPELINE = 16
#: an unread request body is read and dropped up to this many bytes, else the connection closes
DISCARD_MAX = 64 * 1024
#: seconds a closing connection keeps draining input after its last answer
LINGER = 1.0
_SLICE = 64 * 1024  # input is parsed in slices of this size, to stop when the queue is full

# What the connection's one timer is for.
_NONE, _IDLE, _HEAD, _BODY, _LINGER = range(5)

_VERSIONS = {"1.1": (1, 1), "1.0": (1, 0)}
_METHODS = {m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"Connection: close\r\n\r\n"


def error_answer(status: int, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (
        STATUS_LINES.get(status, b"HTTP/1.1 %d \r\n" % status)
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        + _CLOSE
        + body
    )


def _reason(exc: Exception) -> str:
    """llhttp's reason (a fixed text of its own), printable ASCII only, for the client."""
    text = "".join(c for c in str(exc)[:100] if " " <= c <= "~")
    return text or "parse error"


class _Reject(Exception):
    """Raised in a parser callback to stop parsing; the answer is in ``_Connection.rejection``."""


class _Connection(asyncio.Protocol):
    __slots__ = (
        "answer", "backlog", "body_paused", "broken", "client", "closed", "closing_after",
        "cycle", "deadline", "discarded", "discarding", "drain_waiter", "eof", "handler",
        "head_size", "headers", "in_head", "limits", "loop", "lost", "parser", "parsing",
        "progress", "queue", "reading_paused", "received", "rejection", "server", "stall",
        "timer", "timer_kind", "transport", "url", "writing_paused",
    )  # fmt: skip

    def __init__(self, server: HttpServer, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop
        self.limits = server.limits
        self.handler = server.handler
        self.transport = cast(asyncio.Transport, None)
        self.parser = httptools.HttpRequestParser(self)
        self.client: tuple[str, int] | None = None
        self.queue: deque[HttpRequest | tuple[int, str]] = deque()
        self.cycle: asyncio.Task[None] | None = None
        self.answer: HttpResponse | None = None
        self.parsing: HttpRequest | None = None  # the request whose body is arriving
        self.in_head = False
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_size = self.received = self.discarded = self.stall = 0
        self.progress = self.discarding = False
        self.rejection: tuple[int, str] | None = None
        self.reading_paused = self.body_paused = self.writing_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self.lost = self.closed = self.broken = self.closing_after = self.eof = False
        self.timer: asyncio.TimerHandle | None = None
        self.timer_kind = _NONE
        self.deadline = 0.0
        self.backlog: bytearray | None = None

    # -- transport events --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t = cast(asyncio.Transport, transport)
        peer = t.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.client = (str(peer[0]), int(peer[1]))
        server = self.server
        limit = server.max_connections
        if server.closing or (limit is not None and len(server.conns) >= limit):
            self.closed = self.broken = True
            t.write(error_answer(503, "too many connections"))
            t.close()
            return
        server.conns.add(self)
        self._set_timer(_IDLE, self.limits.header_timeout)

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        if self.backlog is not None:
            self.backlog += data
            return
        self._feed(data)
        self._arm()

    def eof_received(self) -> bool | None:
        if self.parsing is not None:
            self.parsing._fail(ClientDisconnected("client closed before the body ended"))
        self.closing_after = self.eof = True
        return True if self.cycle is not None and not self.closed else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = self.closed = self.broken = True
        if self.timer is not None:
            self.timer.cancel()
        gone = ClientDisconnected("client went away")
        for item in self.queue:
            if isinstance(item, HttpRequest):
                item._fail(gone)
        if self.parsing is not None:
            self.parsing._fail(gone)
        w = self.drain_waiter
        if w is not None and not w.done():
            w.set_exception(ClientDisconnected("client went away"))
        self.server._gone(self)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        w = self.drain_waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- parsing --

    def _feed(self, data: bytes | bytearray) -> None:
        if len(data) <= _SLICE:
            self._feed_piece(data)
            return
        view = memoryview(data)
        for i in range(0, len(data), _SLICE):
            if self.broken:
                return
            if len(self.queue) >= MAX_PIPELINE:
                self.backlog = bytearray(view[i:])
                self._sync_reading()
                return
            self._feed_piece(view[i : i + _SLICE])

    def _feed_piece(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            # llhttp stops after an Upgrade request (one without a body: on_headers_complete
            # saw to it); the upgrade is declined, so the bytes after it are the next request.
            self.parser = httptools.HttpRequestParser(self)
            offset = int(exc.args[0])
            if offset < len(data) and not self.broken:
                self._feed_piece(memoryview(data)[offset:])
            return
        except httptools.HttpParserError as exc:
            rejection, self.rejection = self.rejection, None
            if rejection is not None:
                self._error(*rejection)
            elif self.broken:
                pass  # stopped on purpose
            elif isinstance(exc, httptools.HttpParserCallbackError):
                log.error("HTTP parser callback failed", exc_info=exc.__context__)
                self._error(500, "internal error: parser callback")
            elif str(exc).startswith("Pause on PRI"):
                self._error(505, "HTTP/2 is not supported on this port; use HTTP/1.1")
            else:
                self._error(400, f"malformed HTTP request: {_reason(exc)}")
            return
        if self.progress:
            self.progress = False
            self.stall = 0
        elif self.in_head or self.parsing is not None:
            # bytes that made no callback: a header or trailer still being accumulated, chunk
            # framing; bounded like the head
            self.stall += len(data)
            if self.stall > self.limits.max_header_bytes:
                if self.in_head:
                    self._error(431, "request head too large")
                else:
                    self._error(400, "chunk framing or trailers too large")

    def _reject(self, status: int, message: str) -> _Reject:
        self.rejection = (status, message)
        return _Reject()

    def on_message_begin(self) -> None:
        self.in_head = self.progress = True
        self.url = b""
        self.headers = []
        self.head_size = 0
        if self.timer_kind == _HEAD:
            self.timer_kind = _NONE

    def on_url(self, url: bytes) -> None:
        self.progress = True
        self.url += url
        if len(self.url) > self.limits.max_request_line:
            raise self._reject(414, "request target too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.progress = True
        self.head_size += len(name) + len(value) + 4
        if self.in_head:
            self.headers.append((name.lower(), value))
            if len(self.headers) > self.limits.max_headers:
                raise self._reject(431, "too many header fields")
        if self.head_size > self.limits.max_header_bytes:
            raise self._reject(431, "request head too large")  # trailers count too

    def on_headers_complete(self) -> None:
        self.progress = True
        self.in_head = False
        if self.broken:
            raise _Reject()
        parser = self.parser
        version = _VERSIONS.get(parser.get_http_version())
        if version is None:
            raise self._reject(505, "HTTP version not supported; use HTTP/1.1")
        raw = parser.get_method()
        method = _METHODS.get(raw) or raw.decode("ascii", "replace")
        if method == "CONNECT":
            raise self._reject(400, "CONNECT is not supported")
        url = self.url
        if url[:1] != b"/":
            raise self._reject(400, "the request target must be a path (origin-form)")
        length: int | None = None
        chunked = close = keep = expect = upgrade = False
        for name, value in self.headers:
            if name == b"content-length":
                length = int(value)  # llhttp let only digits and one such header through
            elif name == b"transfer-encoding":
                for coding in value.split(b","):
                    if coding.strip().lower() != b"chunked":
                        raise self._reject(501, "only the chunked transfer coding is supported")
                chunked = True
            elif name == b"connection":
                tokens = [t.strip() for t in value.lower().split(b",")]
                close = close or b"close" in tokens
                keep = keep or b"keep-alive" in tokens
            elif name == b"upgrade":
                upgrade = True
            elif name == b"expect":
                if value.strip().lower() != b"100-continue":
                    raise self._reject(417, "only 'Expect: 100-continue' is supported")
                expect = version == (1, 1)
        if chunked and length is not None:
            raise self._reject(400, "Content-Length together with Transfer-Encoding")
        if length is not None and length > self.limits.max_body_size:
            raise self._reject(413, f"request body larger than {self.limits.max_body_size} bytes")
        if upgrade and (chunked or length) and parser.should_upgrade():
            raise self._reject(400, "an Upgrade request cannot have a body here")
        req = HttpRequest(
            self,
            method,
            url,
            version,
            self.headers,
            length,
            chunked,
            not close and (keep or version == (1, 1)),
            expect and (chunked or bool(length)),
        )
        if not req._complete:
            self.parsing = req
            self.received = 0
        self.queue.append(req)
        if self.cycle is None:
            self.cycle = self.loop.create_task(self._serve())
        elif len(self.queue) >= MAX_PIPELINE:
            self._sync_reading()

    def on_body(self, body: bytes) -> None:
        self.progress = True
        req = self.parsing
        if req is None or self.broken:
            raise _Reject()
        n = len(body)
        self.received += n
        if self.discarding:
            self.discarded += n
            if self.discarded > DISCARD_MAX:
                self._close()
                raise _Reject()
            return
        if self.received > self.limits.max_body_size:
            req._fail(BodyTooLarge(f"request body larger than {self.limits.max_body_size} bytes"))
            self.broken = True
            raise _Reject()
        req._chunks.append(body)
        req._buffered += n
        req._wake()
        if req._buffered > HIGH_WATER and not self.body_paused:
            self.body_paused = True
            self._sync_reading()

    def on_message_complete(self) -> None:
        self.progress = True
        req = self.parsing
        if req is not None:
            self.parsing = None
            self.discarding = False
            req._complete = True
            req._wake()
            if self.body_paused:
                self.body_paused = False
                self._sync_reading()

    # -- serving --

    async def _serve(self) -> None:
        queue = self.queue
        try:
            while queue and not self.closed:
                req = queue[0]
                if isinstance(req, tuple):
                    self._answer_error(*req)
                    return
                resp = self.answer = HttpResponse(self, req)
                try:
                    await self.handler(req, resp)
                except Exception as exc:
                    self._handler_failed(req, resp, exc)
                    return
                if not resp._ended:
                    self._handler_failed(req, resp, None)
                    return
                queue.popleft()
                if not req.keep_alive or self.closing_after:
                    self._close(linger=True)
                    return
                if not req._complete and not self._discard(req):
                    return
                if self.backlog is not None and len(queue) < MAX_PIPELINE:
                    data, self.backlog = self.backlog, None
                    self._feed(data)
                self._sync_reading()
        finally:
            self.cycle = self.answer = None
        self._arm()

    def _handler_failed(self, req: HttpRequest, resp: HttpResponse, exc: Exception | None) -> None:
        if isinstance(exc, ClientDisconnected):
            log.debug("client %s went away: %s", self.client, exc)
            self.abort()
            return
        if isinstance(exc, BodyError):
            log.debug("request body refused: %s", exc)
            status, message = exc.status, str(exc)
        elif exc is not None:
            log.exception("HTTP handler failed on %s %s", req.method, req.path, exc_info=exc)
            status, message = 500, f"internal error: {type(exc).__name__}"
        else:
            log.error("HTTP handler returned without completing its answer to %s", req.path)
            status, message = 500, "internal error: no answer"
        if resp.started:
            self.abort()
        else:
            self._answer_error(status, message)

    def _discard(self, req: HttpRequest) -> bool:
        """The handler left part of the body unread: drop the rest if it is short."""
        req._chunks.clear()
        req._buffered = 0
        if req._error is not None or (
            req.content_length is not None and req.content_length - self.received > DISCARD_MAX
        ):
            self._close(linger=True)
            return False
        self.discarding = True
        self.discarded = 0
        self.body_paused = False
        return True

    def _error(self, status: int, message: str) -> None:
        log.debug("refused a request from %s: %d %s", self.client, status, message)
        self.broken = True
        self.in_head = False
        if self.parsing is not None:
            self.parsing._fail(BodyError(message))
        if self.cycle is None and not self.queue:
            self._answer_error(status, message)
        else:
            self.queue.append((status, message))

    def _answer_error(self, status: int, message: str) -> None:
        if not self.closed:
            self.transport.write(error_answer(status, message))
            self._close(linger=True)

    # -- used by HttpRequest / HttpResponse --

    def connection_header(self, req: HttpRequest) -> bytes:
        """The end of an answer's head: whether the connection stays open after it."""
        if (
            req.keep_alive
            and not self.closing_after
            and not req._expect
            and (
                req._complete
                or req._consuming
                or (not req.chunked and (req.content_length or 0) - self.received <= DISCARD_MAX)
            )
        ):
            return b"\r\n" if req.version == (1, 1) else b"Connection: keep-alive\r\n\r\n"
        req.keep_alive = False
        return _CLOSE

    def send_continue(self, req: HttpRequest) -> None:
        answer = self.answer
        if not req._complete and not self.closed and (answer is None or not answer.started):
            self.transport.write(_CONTINUE)
            self._arm()

    def body_drained(self, req: HttpRequest) -> None:
        if self.body_paused and req is self.parsing:
            self.body_paused = False
            self._sync_reading()

    async def drain(self) -> None:
        if self.lost:
            raise ClientDisconnected("client went away")
        if not self.writing_paused:
            return
        waiter = self.drain_waiter = self.loop.create_future()
        try:
            async with asyncio.timeout(self.limits.write_timeout):
                await waiter
        except TimeoutError:
            self.abort()
            raise ClientDisconnected("client did not read its answer in time") from None
        finally:
            self.drain_waiter = None

    def abort(self) -> None:
        if not self.lost:
            self.closed = self.broken = True
            self.transport.abort()

    # -- flow control, timers, closing --

    def _sync_reading(self) -> None:
        want = not self.broken and (
            self.body_paused or self.backlog is not None or len(self.queue) >= MAX_PIPELINE
        )
        if want != self.reading_paused and not self.closed:
            self.reading_paused = want
            if want:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()
            self._arm()

    def _arm(self) -> None:
        """Sets the deadline the connection's state calls for."""
        if self.closed:
            return
        if self.reading_paused or self.broken:
            self.timer_kind = _NONE  # the server holds the client back: no read deadline
        elif self.in_head:
            if self.timer_kind != _HEAD:
                self._set_timer(_HEAD, self.limits.header_timeout)
        elif self.parsing is not None and not self.parsing._expect:
            self._set_timer(_BODY, self.limits.body_timeout)
        elif self.cycle is None and not self.queue:
            self._set_timer(_IDLE, self.limits.keepalive_timeout)
        else:
            self.timer_kind = _NONE

    def _set_timer(self, kind: int, delay: float) -> None:
        self.timer_kind = kind
        when = self.deadline = self.loop.time() + delay
        timer = self.timer
        if timer is not None:
            if timer.when() <= when:
                return  # it fires first and re-arms for the later deadline
            timer.cancel()
        self.timer = self.loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        kind = self.timer_kind
        if kind == _NONE or self.lost:
            return
        if self.loop.time() < self.deadline:
            self.timer = self.loop.call_at(self.deadline, self._on_timer)
            return
        self.timer_kind = _NONE
        if kind == _IDLE:
            self._close()
        elif kind == _HEAD:
            self._error(408, "request head not received in time")
        elif kind == _BODY and self.parsing is not None:
            self.parsing._fail(BodyTimeout("request body not received in time"))
            self.broken = True
            if self.discarding:
                self._close()
        elif kind == _LINGER:
            if self.transport.get_write_buffer_size():
                self.transport.abort()
            else:
                self.transport.close()

    def _close(self, linger: bool = False) -> None:
        if self.closed:
            return
        self.closed = self.broken = True
        t = self.transport
        if linger and not self.eof and t.can_write_eof():
            if self.reading_paused:
                self.reading_paused = False
                t.resume_reading()
            t.write_eof()
            self._set_timer(_LINGER, LINGER)
        else:
            t.close()
            if t.get_write_buffer_size():
                self._set_timer(_LINGER, self.limits.write_timeout)

    def shut_down(self) -> None:
        """Server shutdown: close now if idle, else after the answer in progress."""
        self.closing_after = True
        if self.cycle is None and not self.queue:
            self._close()

    def kill(self) -> None:
        self.abort()
        if self.cycle is not None:
            self.cycle.cancel()


class HttpServer:
    """Serves ``handler`` on one listening socket; see the module docstring."""

    def __init__(
        self,
        handler: Handler,
        limits: ServerLimits = DEFAULT_LIMITS,
        *,
        max_connections: int | None = None,
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.max_connections = max_connections
        self.conns: set[_Connection] = set()
        self.closing = False
        self._server: asyncio.Server | None = None
        self._all_gone: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop = cast(asyncio.AbstractEventLoop, None)

    def _factory(self) -> _Connection:
        return _Connection(self, self._loop)

    async def start(
        self, host: str, port: int, *, reuse_port: bool = False, backlog: int = 2048
    ) -> int:
        """Listens on ``host:port`` (0: an ephemeral port); returns the bound port."""
        loop = self._loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._factory, host, port, reuse_port=reuse_port or None, backlog=backlog
        )
        return self.port

    async def start_on(self, sock: socket.socket) -> None:
        """Serves on an already bound (and possibly listening) socket."""
        loop = self._loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._factory, sock=sock)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._server.sockets) if self._server is not None else ()

    @property
    def port(self) -> int:
        return int(self.sockets[0].getsockname()[1])

    def _gone(self, conn: _Connection) -> None:
        self.conns.discard(conn)
        if not self.conns and self._all_gone is not None and not self._all_gone.done():
            self._all_gone.set_result(None)

    async def close(self, grace: float = 30.0) -> None:
        """Stops accepting, closes idle connections at once and lets answers in progress
        finish for up to ``grace`` seconds; then the rest are closed."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.conns):
            conn.shut_down()
        if self.conns:
            self._all_gone = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(grace):
                    await self._all_gone
            except TimeoutError:
                pass
        cycles = [c.cycle for c in self.conns if c.cycle is not None]
        for conn in list(self.conns):
            conn.kill()
        if cycles:
            await asyncio.wait(cycles)
        if self._server is not None:
            await self._server.wait_closed()


__all__ = [
    "BodyError",
    "BodyTimeout",
    "BodyTooLarge",
    "ClientDisconnected",
    "Handler",
    "HttpRequest",
    "HttpResponse",
    "HttpServer",
    "ServerLimits",
]
