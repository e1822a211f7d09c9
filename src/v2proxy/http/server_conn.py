"""One server connection: the :class:`asyncio.Protocol` that parses requests as their bytes
arrive and serves them in order (RFC 9112: parsing, persistence, pipelining, closing; llhttp via
httptools). Its requests and their answers reach it directly (its native class, compiled).

- Head limits give 414 and 431, checked at the head's end or where a piece of input ends
  inside it; a parse error gives 400 with llhttp's reason (a fixed text, never the client's
  bytes); HTTP/2's preface 505. A declined Upgrade continues with a fresh parser.
- One serving task per connection runs the handler on each request in turn; reading pauses
  while :data:`MAX_PIPELINE` requests wait or a body has too many unread bytes.
- Closing after an answer half-closes and drains input for :data:`LINGER` seconds, so that
  unread request bytes do not reset the connection before the client reads the answer.
- One :class:`~v2proxy.http.lazy_timer.LazyTimer` carries the deadline the state calls for
  (:meth:`Connection._arm`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final, Protocol, cast

import httptools

from v2proxy.http.head import (
    FRAMING,
    FieldNames,
    Rejection,
    check_head,
    fields_over,
    fields_size,
)
from v2proxy.http.lazy_timer import LazyTimer
from v2proxy.http.request import (
    HIGH_WATER,
    BodyError,
    BodyTimeout,
    BodyTooLarge,
    ClientDisconnected,
    HttpRequest,
    ServerLimits,
    split_target,
)
from v2proxy.http.response import STATUS_LINES, HttpResponse

log = logging.getLogger("v2proxy.http.server")

Handler = Callable[[HttpRequest, HttpResponse], Awaitable[None]]


class QuickHandler(Protocol):
    """A handler that may take a whole request at once, from the parser's callback, when
    nothing is ahead of it (else the serving task's :data:`Handler` serves it)."""

    def wants(self, request: HttpRequest) -> bool:
        """Whether to wait for the rest of a short body (at most :data:`QUICK_BODY` bytes)
        before the request is started, so that :meth:`take` may have it."""
        ...

    def take(self, request: HttpRequest, response: HttpResponse) -> bool:
        """True when it has taken ``request``: it ends the answer, then calls
        :meth:`HttpResponse.finished <v2proxy.http.response.HttpResponse.finished>`."""
        ...


MAX_PIPELINE: Final = 16
DISCARD_MAX: Final = 64 * 1024
LINGER: Final = 1.0
_SLICE: Final = 64 * 1024  # input is parsed in slices of this size, to stop when the queue is full
QUICK_BODY: Final = 64 * 1024

#: what the connection's one timer is for
NONE: Final = 0
IDLE: Final = 1
HEAD: Final = 2
BODY: Final = 3
LINGERING: Final = 4

_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE: Final = b"Connection: close\r\n\r\n"


class _NoCallbacks:
    """The protocol of :data:`CLOSED_PARSER`: no callbacks."""


#: the parser a lost connection keeps instead of its own (which holds it in a reference cycle)
CLOSED_PARSER: Final = httptools.HttpRequestParser(_NoCallbacks())


def error_answer(status: int, message: str) -> bytes:
    """A complete refusal: JSON body ``{"error": message}``, ``Connection: close``."""
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


#: what ``feed_data`` raises to stop: a parse error, or a (declined) Upgrade
_PARSE_STOPS: Final = (httptools.HttpParserError, httptools.HttpParserUpgrade)


class _Reject(Exception):
    """Raised in a parser callback to stop parsing; the answer is in ``rejection``."""


class Owner(Protocol):
    """What a connection needs of its server (:class:`~v2proxy.http.server.HttpServer`)."""

    limits: ServerLimits
    handler: Handler
    quick: QuickHandler | None
    max_connections: int | None
    closing: bool
    conns: set[Connection]

    def forget(self, conn: Connection) -> None:
        """``conn`` is lost."""


class Connection(asyncio.Protocol):
    """One server connection; see the module docstring."""

    __slots__ = (
        "answer", "backlog", "body_paused", "broken", "client", "closed", "closing_after",
        "cycle", "deadline", "discarded", "discarding", "drain_waiter", "eof", "framed", "gone",
        "handler", "head_size", "head_split", "headers", "in_head", "length_field", "limits",
        "loop", "lost", "names", "parked",
        "parser", "parsing", "piece", "progress", "queue", "quick", "reading_paused", "received",
        "rejection", "response", "server", "serving", "split", "stall", "starting", "timer",
        "timer_kind", "transport", "url", "writing_paused",
    )  # fmt: skip

    def __init__(self, server: Owner, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop
        self.limits: ServerLimits = server.limits
        self.handler: Handler = server.handler
        self.quick: QuickHandler | None = server.quick
        self.response: HttpResponse | None = None
        #: a request came while nothing was served: started once its body is in (:meth:`_start`)
        self.starting = False
        self.transport = cast(asyncio.Transport, None)
        self.parser = httptools.HttpRequestParser(self)
        self.client: tuple[str, int] | None = None
        self.queue: deque[HttpRequest | tuple[int, str]] = deque()
        #: the serving task, parked on ``parked`` while no request waits
        self.cycle: asyncio.Task[None] | None = None
        self.parked: asyncio.Future[None] | None = None
        self.serving = False
        self.answer: HttpResponse | None = None
        self.parsing: HttpRequest | None = None  # the request whose body is arriving
        self.in_head = False
        self.url = b""
        self.split: tuple[bytes, tuple[str, bytes]] = (b"", ("", b""))
        self.headers: list[tuple[bytes, bytes]] = []
        self.names = FieldNames()
        #: the head has a framing field other than Content-Length
        self.framed = False
        self.length_field: bytes | None = None
        self.head_size = self.received = self.discarded = self.stall = 0
        self.piece = 0  # the size of the piece being parsed
        self.head_split = False  # the head being parsed began in an earlier piece
        self.progress = self.discarding = False
        self.rejection: tuple[int, str] | None = None
        self.reading_paused = self.body_paused = self.writing_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self.gone: asyncio.Future[None] | None = None
        self.lost = self.closed = self.broken = self.closing_after = self.eof = False
        self.timer = LazyTimer(loop, self._on_timer)
        self.timer_kind = NONE
        self.deadline = 0.0
        self.backlog: bytearray | None = None

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
        self._set_timer(IDLE, self.limits.header_timeout)

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        if self.backlog is not None:
            self.backlog += data
            return
        if len(data) > _SLICE:
            self._feed(data)
        else:  # _feed_piece(data), written out: the usual small read pays one frame less
            self.piece = len(data)
            try:
                self.parser.feed_data(data)
            except _PARSE_STOPS as exc:
                self._parse_failed(data, exc)
            else:
                if self.progress and not self.in_head:
                    self.progress = False
                    self.stall = 0
                else:
                    self._parsed(len(data))
        if self.starting and not self._awaits_body():  # a body still arriving
            self._start()
        if self.serving and not (self.in_head or self.closed) and self.parsing is None:
            self.timer_kind = NONE  # what _arm decides here: no read deadline while serving
        else:
            self._arm()

    def eof_received(self) -> bool | None:
        if self.parsing is not None:
            self.parsing._fail(ClientDisconnected("client closed before the body ended"))
            if self.starting:
                self._start()
        self.closing_after = self.eof = True
        watched = self.gone  # a client that stops sending is taken as gone by long handlers
        if watched is not None and not watched.done():
            watched.set_result(None)
        return True if self.serving and not self.closed else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = self.closed = self.broken = True
        self.timer.close()
        # the parser calls back into this connection: a cycle only the collector's rare full
        # passes would free, with the connection's buffers
        self.parser = CLOSED_PARSER
        self.response = self.answer = None  # (each holds this connection: a cycle too)
        gone = ClientDisconnected("client went away")
        for item in self.queue:
            if isinstance(item, HttpRequest):
                item._fail(gone)
        if self.parsing is not None:
            self.parsing._fail(gone)
        w = self.drain_waiter
        if w is not None and not w.done():
            w.set_exception(ClientDisconnected("client went away"))
        parked = self.parked
        if parked is not None and not parked.done():
            parked.set_result(None)  # the serving task ends
        watched = self.gone
        if watched is not None and not watched.done():
            watched.set_result(None)
        self.server.forget(self)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        w = self.drain_waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _serve(self) -> None:
        """Answer the queued requests in order, then park until the next one arrives."""
        queue = self.queue
        try:
            while True:
                while queue and not self.closed:
                    req = queue[0]
                    if isinstance(req, tuple):
                        self._answer_error(*req)
                        return
                    resp = self._response(req)
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
                    if self.reading_paused:  # else nothing here can make it pause
                        self._sync_reading()
                if self.closed:
                    return
                self.serving = False
                self.answer = None
                self._arm()
                parked = self.parked = self.loop.create_future()
                try:
                    await parked  # woken by the next request's head, or by connection_lost
                finally:
                    self.parked = None
                if self.closed:
                    return
        finally:
            self.cycle = self.answer = None
            self.serving = False

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
        if not self.serving and not self.queue:
            self._answer_error(status, message)
        else:
            self.queue.append((status, message))

    def _answer_error(self, status: int, message: str) -> None:
        if not self.closed:
            self.transport.write(error_answer(status, message))
            self._close(linger=True)

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
        self.piece = len(data)
        try:
            self.parser.feed_data(data)
        except _PARSE_STOPS as exc:
            self._parse_failed(data, exc)
        else:
            self._parsed(len(data))
        if self.starting and not self._awaits_body():
            self._start()

    def _parse_failed(self, data: bytes | bytearray | memoryview, exc: Exception) -> None:
        if isinstance(exc, httptools.HttpParserUpgrade):
            # llhttp stops after an Upgrade request; declined, the bytes after it are the next
            self.parser = httptools.HttpRequestParser(self)
            offset = int(exc.args[0])
            if offset < len(data) and not self.broken:
                self._feed_piece(memoryview(data)[offset:])
            return
        rejection, self.rejection = self.rejection, None
        if rejection is None and self.in_head:
            rejection = self._head_over()  # fields gathered before the fault count first
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

    def _parsed(self, n: int) -> None:
        """After a piece of ``n`` bytes: the limits of a head still arriving, and the bound on
        bytes that made no callback (a field being accumulated, chunk framing)."""
        if self.in_head:
            self.head_split = True
            over = self._head_over()
            if over is not None:
                self._error(*over)
                return
        if self.progress:
            self.progress = False
            self.stall = 0
        elif self.in_head or self.parsing is not None:
            self.stall += n
            if self.stall > self.limits.max_header_bytes:
                if self.in_head:
                    self._error(431, "request head too large")
                else:
                    self._error(400, "chunk framing or trailers too large")

    def _head_over(self) -> tuple[int, str] | None:
        limits = self.limits
        return fields_over(self.headers, limits.max_header_bytes, limits.max_headers)

    def _reject(self, status: int, message: str) -> _Reject:
        self.rejection = (status, message)
        return _Reject()

    def on_message_begin(self) -> None:
        self.in_head = self.progress = True
        self.url = b""
        self.headers = []
        self.head_split = self.framed = False
        self.length_field = None
        if self.timer_kind == HEAD:
            self.timer_kind = NONE

    def on_url(self, url: bytes) -> None:
        self.progress = True
        self.url += url
        if len(self.url) > self.limits.max_request_line:
            raise self._reject(414, "request target too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        # only gathered here: their limits are checked once per piece (_head_over)
        self.progress = True
        if self.in_head:
            headers = self.headers
            name = self.names.lower(len(headers), name)
            headers.append((name, value))
            if name in FRAMING:
                if name == b"content-length":
                    self.length_field = value
                else:
                    self.framed = True
        else:
            self._trailer(name, value)

    def _trailer(self, name: bytes, value: bytes) -> None:
        """A trailer field: dropped, but its bytes count with the head's."""
        size = self.head_size
        if size < 0:  # the first trailer: start from the head's fields
            req = self.parsing
            fields = req.headers if req is not None else []
            size = fields_size(fields)
        self.head_size = size = size + len(name) + len(value) + 4
        if size > self.limits.max_header_bytes:
            raise self._reject(431, "request head too large")

    def on_headers_complete(self) -> None:
        self.progress = True
        self.in_head = False
        if self.broken:
            raise _Reject()
        headers = self.headers
        limits = self.limits
        if (
            self.head_split  # parsed in more than one piece
            or self.piece > limits.max_header_bytes
            or len(headers) > limits.max_headers
        ):
            over = self._head_over()
            if over is not None:
                raise self._reject(*over)
        self.head_size = -1  # trailers count from the head's size (_trailer)
        url = self.url
        parser = self.parser
        try:
            head = check_head(
                parser,
                url,
                headers,
                limits.max_body_size,
                parser.should_keep_alive(),
                self.framed,
                self.length_field,
            )
        except Rejection as exc:
            raise self._reject(exc.status, exc.message) from None
        split = self.split
        if url != split[0]:  # a client mostly asks for one target again and again
            split = self.split = (url, split_target(url))
        req = HttpRequest(self, url, split[1], headers, head)
        if not req._complete:
            self.parsing = req
            self.received = 0
        self.queue.append(req)
        if not self.serving:
            self.serving = self.starting = True  # started with its body (_start)
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
        if req._waiter is not None:
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
            if req._waiter is not None:
                req._wake()
            if self.body_paused:
                self.body_paused = False
                self._sync_reading()
        if self.starting:
            self._start()

    def _response(self, req: HttpRequest) -> HttpResponse:
        """The connection's answer writer, renewed for ``req`` (renew, written out)."""
        resp = self.response
        if resp is None:
            resp = self.response = HttpResponse(self, req)
        else:
            resp._req = req
            resp.started = resp._ended = resp._chunked = False
            resp._remaining = -1
            resp._head_only = req.method == "HEAD"
            resp.on_cut = None
        self.answer = resp
        return resp

    def _awaits_body(self) -> bool:
        """Whether the request whose head came waits for the rest of a short body, so that the
        quick handler may take it whole (the body's deadline runs meanwhile)."""
        req = self.parsing
        quick = self.quick
        return (
            req is not None
            and quick is not None
            and not self.broken
            and not req._expect
            and req._error is None
            and req.content_length is not None
            and req.content_length <= QUICK_BODY
            and quick.wants(req)
        )

    def _start(self) -> None:
        """Serve the request that came while nothing was served: the quick handler's when it
        is whole and takes it, else the serving task's (woken, or started)."""
        self.starting = False
        quick = self.quick
        queue = self.queue
        if quick is not None and len(queue) == 1 and not self.closed:
            req = queue[0]
            if isinstance(req, HttpRequest) and req._complete:
                try:
                    if quick.take(req, self._response(req)):
                        return
                except Exception:  # a bug: the request is lost, so is the connection
                    log.exception("HTTP quick handler failed on %s %s", req.method, req.path)
                    self.abort()
                    return
        self._serve_queue()

    def _serve_queue(self) -> None:
        parked = self.parked
        if parked is not None:
            if not parked.done():
                parked.set_result(None)
        else:
            self.cycle = self.loop.create_task(self._serve())

    def answered(self, req: HttpRequest) -> None:
        """The quick handler's answer to ``req`` is over: the connection goes on as after a
        handler's answer."""
        if self.closed:
            return
        resp = self.answer
        if resp is None or not resp._ended:
            self.abort()  # the answer was never completed: the client sees a broken one
            return
        queue = self.queue
        queue.popleft()
        if not req.keep_alive or self.closing_after:
            self._close(linger=True)
            return
        if self.backlog is not None and len(queue) < MAX_PIPELINE:
            data, self.backlog = self.backlog, None
            self._feed(data)
        if self.reading_paused:
            self._sync_reading()
        if self.closed:
            return
        if queue:  # requests that came meanwhile: the serving task's
            self._serve_queue()
        else:
            self.serving = False
            self.answer = None
            self._arm()

    def _arm(self) -> None:
        """Sets the deadline the connection's state calls for."""
        if self.closed:
            return
        if self.reading_paused or self.broken:
            self.timer_kind = NONE  # the server holds the client back: no read deadline
        elif self.in_head:
            if self.timer_kind != HEAD:
                self._set_timer(HEAD, self.limits.header_timeout)
        elif self.parsing is not None and not self.parsing._expect:
            self._set_timer(BODY, self.limits.body_timeout)
        elif not self.serving and not self.queue:  # idle (_set_timer, written out)
            self.timer_kind = IDLE
            self.deadline = when = self.loop.time() + self.limits.keepalive_timeout
            timer = self.timer
            if when < timer.due:  # (else it fires first: no call)
                timer.at(when)
        else:
            self.timer_kind = NONE

    def _set_timer(self, kind: int, delay: float) -> None:
        self.timer_kind = kind
        self.deadline = when = self.loop.time() + delay
        timer = self.timer
        if when < timer.due:
            timer.at(when)

    def _on_timer(self) -> float | None:
        """The deadline's action once it has passed (else when it will)."""
        kind = self.timer_kind
        if kind == NONE or self.lost:
            return None
        if self.loop.time() < self.deadline:
            return self.deadline
        self.timer_kind = NONE
        if kind == IDLE:
            self._close()
        elif kind == HEAD:
            self._error(408, "request head not received in time")
        elif kind == BODY and self.parsing is not None:
            self.parsing._fail(BodyTimeout("request body not received in time"))
            self.broken = True
            if self.discarding:
                self._close()
            elif self.starting:  # its handler answers the timeout
                self._start()
        elif kind == LINGERING:
            if self.transport.get_write_buffer_size():
                self.transport.abort()
            else:
                self.transport.close()
        return None

    def watch_gone(self) -> asyncio.Future[None]:
        """Done when the client goes away or half-closes (made on first demand)."""
        gone = self.gone
        if gone is None:
            gone = self.gone = self.loop.create_future()
            if self.lost or self.eof:
                gone.set_result(None)
        return gone

    def connection_header(self, req: HttpRequest) -> bytes:
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
            self._set_timer(LINGERING, LINGER)
        elif t.is_closing():
            # ended by the peer already: asyncio's TLS transport, closed twice, breaks
            return
        else:
            t.close()
            if t.get_write_buffer_size():
                self._set_timer(LINGERING, self.limits.write_timeout)

    def shut_down(self) -> None:
        """Server shutdown: close now if idle, else after the answer in progress."""
        self.closing_after = True
        if not self.serving and not self.queue:
            self._close()

    def kill(self) -> None:
        answer = self.answer
        cut = answer.on_cut if answer is not None else None
        self.abort()
        if self.cycle is not None:
            self.cycle.cancel()
        if cut is not None:  # the quick handler's request, cut as the task's would be
            cut()
