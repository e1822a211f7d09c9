"""The parsing half of a server connection: bytes in, requests (or one refusal) queued
(RFC 9112 §2-§7, llhttp via httptools).

A mixin of :class:`~v2proxy.http.server_conn.Connection` (state: :mod:`.server_state`), which
provides ``_error`` (refuse: answer after the requests ahead, then close), ``_close``,
``_sync_reading`` and ``_serve``. llhttp's callbacks build an
:class:`~v2proxy.http.request.HttpRequest` per head, queue it, start the serving task when none
runs, and hand it the body pieces as they arrive. Here, while the head arrives: 414 for a target
over ``max_request_line``; 431 for over ``max_headers`` fields or ``max_header_bytes`` of head
(trailers count too). At its end, :func:`~v2proxy.http.head.check_head` says what it means or
why it is refused. Also 431/400 when more than ``max_header_bytes`` arrive without a callback
(a field being accumulated; chunk framing or trailers); 400 with llhttp's reason (a fixed text,
printable ASCII, never the client's bytes) for what it cannot parse; 505 for HTTP/2's preface.
A chunked body growing over ``max_body_size`` fails the handler's read with
:class:`~v2proxy.http.request.BodyTooLarge`. A declined Upgrade (one without a body) continues
with a fresh parser on the bytes after its head.

Input is parsed in slices of :data:`_SLICE` bytes; while :data:`MAX_PIPELINE` requests wait, the
rest is kept in ``backlog`` and reading pauses. A body left unread by the handler is dropped up
to :data:`DISCARD_MAX` bytes (``discarding``) so that the next request parses.
"""

from __future__ import annotations

import logging

import httptools

from v2proxy.http.head import Rejection, check_head
from v2proxy.http.request import HIGH_WATER, BodyTooLarge, HttpRequest
from v2proxy.http.server_state import HEAD, NONE, ConnectionState

log = logging.getLogger("v2proxy.http.server")

#: requests parsed and not yet answered (the one in hand included) before reading pauses
MAX_PIPELINE = 16
#: an unread request body is read and dropped up to this many bytes, else the connection closes
DISCARD_MAX = 64 * 1024
_SLICE = 64 * 1024  # input is parsed in slices of this size, to stop when the queue is full


def _reason(exc: Exception) -> str:
    """llhttp's reason (a fixed text of its own), printable ASCII only, for the client."""
    text = "".join(c for c in str(exc)[:100] if " " <= c <= "~")
    return text or "parse error"


class _Reject(Exception):
    """Raised in a parser callback to stop parsing; the answer is in ``rejection``."""


class ConnectionParser(ConnectionState):
    __slots__ = ()

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

    # -- llhttp callbacks --

    def on_message_begin(self) -> None:
        self.in_head = self.progress = True
        self.url = b""
        self.headers = []
        self.head_size = 0
        if self.timer_kind == HEAD:
            self.timer_kind = NONE

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
        try:
            method, version, length, chunked, keep_alive, expect = check_head(
                self.parser, self.url, self.headers, self.limits.max_body_size
            )
        except Rejection as exc:
            raise self._reject(exc.status, exc.message) from None
        req = HttpRequest(
            self, method, self.url, version, self.headers, length, chunked, keep_alive, expect
        )
        if not req._complete:
            self.parsing = req
            self.received = 0
        self.queue.append(req)
        if not self.serving:
            self.serving = True
            parked = self.parked
            if parked is not None:
                if not parked.done():
                    parked.set_result(None)
            else:
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
