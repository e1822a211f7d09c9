"""One server connection: the :class:`asyncio.Protocol` that serves the requests its parsing half
queues, in order (RFC 9112 §9: persistence, pipelining, closing).

:class:`Connection` joins :class:`~v2proxy.http.server_parse.ConnectionParser` (bytes to queued
requests) and :class:`~v2proxy.http.server_timer.ConnectionTimer` (its one deadline) over the state
of :class:`~v2proxy.http.server_state.ConnectionState`. One task per connection (started with
its first complete head, parked while the queue is empty, woken by the next head, ended when
the connection closes) runs the handler on each request in turn, each after the previous
answer is complete. Reading pauses while ``MAX_PIPELINE``
requests wait, while a body has more than ``request.HIGH_WATER`` bytes unread, or while input is
kept in ``backlog``.

After each answer: the connection closes (lingering) when the request or answer was not
keep-alive, or the client half-closed; a body the handler left unread is dropped up to
``DISCARD_MAX`` bytes, else the connection closes. The handler raising
:class:`~v2proxy.http.request.BodyError` -> its status; ``ClientDisconnected`` -> the connection
ends; anything else -> logged once, 500 ``internal error: <ExcClassName>``; returning without
ending its answer -> 500 ``internal error: no answer``; an answer already started -> abort.
A refusal (``_error``) is answered after the requests ahead of it, with ``Connection: close``.
Closing after an answer half-closes first and drains input for ``LINGER`` seconds, so that
unread request bytes do not reset the connection before the client reads the answer.
Also the connection's side of :class:`~v2proxy.http.request.HttpRequest` and
:class:`~v2proxy.http.response.HttpResponse`:
``Connection`` header, ``100 Continue``, write flow control under ``write_timeout``, abort.
"""

from __future__ import annotations

import asyncio
import json
from typing import cast

from v2proxy.http.request import BodyError, ClientDisconnected, HttpRequest
from v2proxy.http.response import STATUS_LINES, HttpResponse
from v2proxy.http.server_parse import DISCARD_MAX, MAX_PIPELINE, ConnectionParser, log
from v2proxy.http.server_state import CLOSED_PARSER, IDLE, LINGERING
from v2proxy.http.server_timer import LINGER, ConnectionTimer

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"Connection: close\r\n\r\n"


def error_answer(status: int, message: str) -> bytes:
    """A complete refusal: JSON body ``{"error": message}``, ``Connection: close``."""
    body = json.dumps({"error": message}).encode()
    return (
        STATUS_LINES.get(status, b"HTTP/1.1 %d \r\n" % status)
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        + _CLOSE
        + body
    )


class Connection(ConnectionParser, ConnectionTimer):
    __slots__ = ()

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
        self._set_timer(IDLE, self.limits.header_timeout)

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
        watched = self.gone  # a client that stops sending is taken as gone by long handlers
        if watched is not None and not watched.done():
            watched.set_result(None)
        return True if self.serving and not self.closed else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = self.closed = self.broken = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        # The parser calls back into this connection: a reference cycle that only the garbage
        # collector's rare full passes would free (with the connection's buffers), and
        # memory would creep up between them. Nothing parses any more.
        self.parser = CLOSED_PARSER
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
        self.server._gone(self)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        w = self.drain_waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- serving --

    async def _serve(self) -> None:
        """Answer the queued requests in order, then park until the next one arrives (one
        task per connection, not per request); ends when the connection closes."""
        queue = self.queue
        try:
            while True:
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

    # -- flow control, closing --

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
            # ended by the peer already (connection_lost is yet to come): asyncio's TLS
            # transport, closed a second time, drops its protocol and breaks every later call
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
        self.abort()
        if self.cycle is not None:
            self.cycle.cancel()
