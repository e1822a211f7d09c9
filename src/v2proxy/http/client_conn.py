"""One client connection of :mod:`v2proxy.http.client`: an :class:`asyncio.Protocol` that
feeds what it receives to httptools' ``HttpResponseParser`` (llhttp) and hands the answer to the
one coroutine waiting for it (or, with none, to ``on_event``).

- Framing (RFC 9112): chunked (no ``TE`` is ever sent), Content-Length, or the connection's end;
  anything else is a :class:`ProtocolError`, an early end a :class:`RemoteClosed`.
- Never kept after a read-to-close body or a 5xx (error handlers often close right after one
  without saying so); :meth:`ClientConnection.alive` polls the socket before a reuse, as the
  server's end may be there before the loop has read it.
- Past its first buffer, a Content-Length body is handed out in the transport's own ``bytes``
  (llhttp is not fed the rest: it copies what it hands out).
- A streamed body pauses reading above 1 MiB unconsumed and resumes below 256 KiB.
"""

from __future__ import annotations

import asyncio
import select
from collections import deque
from collections.abc import Callable
from typing import Final

import httptools

from v2proxy.http.client_errors import (
    AnswerTooLarge,
    Http2Answer,
    HttpClientError,
    ProtocolError,
    ReadTimeout,
    RemoteClosed,
)
from v2proxy.http.head import FieldNames
from v2proxy.http.lazy_timer import LazyTimer

__all__ = ["ClientConnection"]

# What the connection expects.
_IDLE: Final = 0  # no answer is due: bytes now are unexpected
_HEAD: Final = 1
_BODY: Final = 2  # parsed by llhttp (chunked, read-to-close, the first buffer of a length)
_RAW: Final = (
    3  # the rest of a Content-Length body: counted here, handed out as the transport gave it
)

_HIGH_WATER: Final = 1 << 20
_FRAMING: Final = frozenset((b"content-length", b"transfer-encoding", b"connection"))
_V11: Final = (1, 1)
_LOW_WATER: Final = 256 * 1024

#: anything the server sends to an idle connection, its end included (POLLERR, POLLHUP unasked)
_POLL_READ: Final = select.POLLIN | select.POLLPRI | getattr(select, "POLLRDHUP", 0)


def _http2_frames(data: bytes) -> bool:
    """Whether ``data`` opens with an HTTP/2 SETTINGS frame on stream 0, what an HTTP/2 server
    (a gRPC port) sends first."""
    return len(data) >= 9 and data[3] == 4 and data[5:9] == b"\0\0\0\0"


def _http2_answer() -> Http2Answer:
    return Http2Answer("invalid HTTP/1.1 answer: the server sent HTTP/2 frames")


class ClientConnection(asyncio.Protocol):
    """One connection: llhttp parses each answer as its bytes arrive; the one coroutine waiting
    for the answer (the request's) is woken through one future at a time."""

    __slots__ = (
        "_deadline",
        "_drain",
        "_framed",
        "_head_only",
        "_http2",
        "_idle_limit",
        "_last_read",
        "_length_field",
        "_loop",
        "_max_head",
        "_names",
        "_parser",
        "_poll",
        "_reading_paused",
        "_remaining",
        "_seen",
        "_stale",
        "_state",
        "_timer",
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
        "idle_since",
        "keep",
        "limit",
        "on_event",
        "pieces",
        "read_limit",
        "read_upto",
        "reason",
        "reusable",
        "reused",
        "status",
        "to_close",
        "transport",
        "version",
        "whole",
        "writing_paused",
    )

    transport: asyncio.Transport  # set by connection_made, before create_connection returns

    def __init__(self, loop: asyncio.AbstractEventLoop, max_head: int) -> None:
        self._loop = loop
        self.whole = False
        self.limit: int | None = None
        #: for one answer: one up to this size, or not a 200, is read whole (no event at its head)
        self.read_upto: int | None = None
        self.read_limit: int | None = None
        self.pieces: deque[bytes] = deque()
        self.buffered = 0
        self._reading_paused = False
        self._waiter: asyncio.Future[None] | None = None
        #: called, when no coroutine waits, at the answer's head, its end and its failure
        self.on_event: Callable[[], None] | None = None
        self._timer = LazyTimer(loop, self._check_read)
        self._last_read = 0.0
        self._idle_limit: float | None = None
        self._deadline: float | None = None
        self._max_head = max_head
        self._parser = httptools.HttpResponseParser(self)
        self._stale = False  # the parser was left inside a message: a new one is needed
        self._state = _IDLE
        self._head_only = self._http2 = False
        self._seen = self._remaining = 0
        #: Content-Length's first value; _framed: any other framing field (or a second one) came
        self._length_field: bytes | None = None
        self._framed = False
        self.reused = self.closed = self.got_answer = self.head_done = self.body_done = False
        self.reusable = self.keep = True
        self.error: HttpClientError | None = None
        self.status = 0
        self.reason = b""
        self.version = (1, 1)
        self.headers: list[tuple[bytes, bytes]] = []
        self._names = FieldNames()
        self.content_length: int | None = None
        self.chunked = self.to_close = False
        self.writing_paused = False
        self._drain: asyncio.Future[None] | None = None
        self.idle_since = 0.0
        self._poll: select.poll | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a socket transport (TLS ones pass the question on to theirs)
            poll = select.poll()
            poll.register(sock.fileno(), _POLL_READ)
            self._poll = poll

    def data_received(self, data: bytes) -> None:
        if self._idle_limit is not None:
            self._last_read = self._loop.time()
        state = self._state
        if state == _RAW:
            n, rem = len(data), self._remaining
            if n < rem:
                self._remaining = rem - n
                self._push(data)
                return
            if n > rem:
                self.reusable = False  # bytes past the answer: never reuse this connection
                data = data[:rem]
            self._remaining = 0
            self._push(data)
            self._complete()
            return
        if state == _IDLE:
            self.reusable = False
            self._http2 = self._http2 or _http2_frames(data)
            return
        if state == _HEAD:
            self.got_answer = True
            self._seen += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ProtocolError("the answer switches protocols, which was not asked for"))
            return
        except httptools.HttpParserError as exc:
            if self._state == _IDLE:  # stopped at bytes past a complete answer (or a failure)
                self.reusable = False
            else:
                cause = exc.__context__  # what a callback raised
                if self._http2 or (self._seen == len(data) and _http2_frames(data)):
                    cause = _http2_answer()
                elif not isinstance(cause, ProtocolError):
                    cause = ProtocolError(f"invalid HTTP/1.1 answer: {exc}")
                self._fail(cause)
            return
        state = self._state
        if state == _HEAD:
            if self._seen > self._max_head:
                self._fail(ProtocolError(f"answer head longer than {self._max_head} bytes"))
        elif state == _BODY and self._remaining > 0:
            self._state = _RAW
            self._stale = True

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

    def on_message_begin(self) -> None:
        if self._state != _HEAD:
            raise ProtocolError("bytes past the end of the answer")  # stops llhttp there
        self.headers = []
        self._length_field = None
        self._framed = False

    def on_status(self, reason: bytes) -> None:
        self.reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return  # a chunked answer's trailer: not one of its headers (and not forwarded)
        headers = self.headers
        name = self._names.lower(len(headers), name)
        headers.append((name, value))
        if name in _FRAMING:
            if name == b"content-length" and self._length_field is None:
                self._length_field = value
            else:
                self._framed = True

    def on_headers_complete(self) -> None:
        parser = self._parser
        if self._seen > self._max_head and self._head_length() > self._max_head:
            raise ProtocolError(f"answer head longer than {self._max_head} bytes")
        status = parser.get_status_code()
        length = self._length_field
        if (
            200 <= status < 500
            and length is not None
            and not self._framed
            and not self._head_only
            and status not in {204, 304}
            and parser.should_keep_alive()
        ):
            # the usual answer: only Content-Length frames it, and llhttp keeps it alive with
            # no Connection field, so it is HTTP/1.1 (an HTTP/1.0 one needs that field)
            self.version = _V11
            self.status = status
            self.keep = True
            self.content_length = self._remaining = int(length)
        elif not self._final_head(status):
            return  # an interim answer: the final one follows
        self.head_done = True
        self._state = _BODY
        if self._head_only:
            self._complete()
        elif self.read_upto is not None:
            # read whole with no event at its head: not a 200 over read_upto bytes or of
            # unknown length (streamed), nor one over read_limit (its event fails it)
            known = self.content_length
            if self.status != 200 or (known is not None and known <= self.read_upto):
                limit = self.read_limit
                if limit is None or known is None or known <= limit:
                    self.whole = True
                    self.limit = limit
                    return
        if self._waiter is not None or self.on_event is not None:
            self._wake()
        if self._drain is not None:
            self._wake_drain()  # a body still being sent may stop (see stop_sending)

    def _final_head(self, status: int) -> bool:
        """Any other head checked field by field: False for an interim (1xx) answer, else its
        status, version, keep-alive and framing noted."""
        parser = self._parser
        if not 100 <= status <= 599 or status == 101:
            raise ProtocolError(f"invalid status {status} in the answer")
        if status < 200:
            return False
        version = parser.get_http_version()
        if version == "1.1":
            self.version = (1, 1)
        elif version == "1.0":
            self.version = (1, 0)
        else:
            raise ProtocolError(f"HTTP/{version} answer to an HTTP/1.1 request")
        self.status = status
        te = length = None
        for name, value in self.headers:
            if name == b"content-length":
                length = value  # llhttp rejects a second one
            elif name == b"transfer-encoding":
                te = value if te is None else te + b"," + value
        # never kept after a 5xx: error handlers often close right after one without saying so
        if self._head_only:
            self.keep = self._keep_alive() and status < 500
            self.content_length = 0
        else:
            # llhttp's reading of Connection's tokens and the version (and of read-to-close)
            self.keep = parser.should_keep_alive() and status < 500
            if status in (204, 304):
                self.content_length = 0
            elif te is not None:
                if self.version == (1, 0):
                    raise ProtocolError("Transfer-Encoding in an HTTP/1.0 answer")
                if [t.strip().lower() for t in te.split(b",")] != [b"chunked"]:
                    raise ProtocolError(f"unsupported Transfer-Encoding {te[:80]!r}: not chunked")
                self.chunked = True
            elif length is not None:
                self.content_length = self._remaining = int(length)
            else:
                self.to_close = True
        return True

    def _keep_alive(self) -> bool:
        """Keep-alive for answers to HEAD, which llhttp, not knowing the method, would take as
        delimited by the connection's end."""
        tokens = {
            t.strip() for n, v in self.headers if n == b"connection" for t in v.lower().split(b",")
        }
        return b"close" not in tokens and (self.version == (1, 1) or b"keep-alive" in tokens)

    def _head_length(self) -> int:
        return len(self.reason) + 15 + sum(len(n) + len(v) + 4 for n, v in self.headers)

    def on_body(self, body: bytes) -> None:
        if self._state != _BODY:
            # bytes past an answer to HEAD, which llhttp takes for the body its Content-Length
            # announces (the parser, left inside it, is replaced before the next exchange)
            self.reusable = False
            return
        if self._remaining:
            self._remaining -= len(body)
        self._push(body)

    def on_message_complete(self) -> None:
        if self._state == _BODY:
            self._complete()

    def _complete(self) -> None:
        self._state = _IDLE
        self.body_done = True
        self._deadline = None  # nothing left to bound
        if self._waiter is not None:
            self._wake()
        else:  # (the answer's end of an exchange driven by callbacks: its event at once)
            event = self.on_event
            if event is not None:
                event()

    def _fail(self, exc: HttpClientError) -> None:
        if self.error is None:
            self.error = exc
        self._state = _IDLE
        self.close()
        self._wake()
        self._wake_drain()

    def _end(self, exc: BaseException | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.reusable = False
        self._disarm()
        state = self._state
        self._state = _IDLE
        if state == _BODY and self.to_close and exc is None:
            self._complete()
        elif state == _HEAD and self._http2 and self.error is None:
            self.error = _http2_answer()
        elif state != _IDLE and self.error is None:
            where = "before the answer's head" if state == _HEAD else "in the answer's body"
            self.error = RemoteClosed(f"the connection ended {where}" + (f": {exc}" * bool(exc)))
        self._wake()
        self._wake_drain()

    def begin(self, head_only: bool, deadline: float | None = None) -> None:
        """Expect a new answer, by ``deadline`` when one is given (as :meth:`set_deadline`)."""
        if self._stale:
            self._parser = httptools.HttpResponseParser(self)
        self._stale = self._head_only = head_only
        self._state = _HEAD
        self.got_answer = self.head_done = self.body_done = False
        self.chunked = self.to_close = self.whole = False
        self._seen = self._remaining = 0
        self.content_length = self.limit = self.read_upto = None
        if deadline is not None:
            self._deadline = deadline
            timer = self._timer
            if deadline < timer.due:  # (else it fires first: no call)
                timer.at(deadline)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark (or until the
        connection ends, the answer fails or its head comes)."""
        while self.writing_paused and not self.stop_sending() and self.error is None:
            fut = self._loop.create_future()
            self._drain = fut
            await fut

    def stop_sending(self) -> bool:
        """The request's body is no longer wanted: the connection ended, or the server
        answered and is closing it (RFC 9112 §9.5)."""
        return self.closed or (self.head_done and not self.keep)

    def alive(self) -> bool:
        """Fit to carry the next exchange (asked right before reuse): not ended nor unfit, and
        nothing waiting on its socket. Closes the connection when not."""
        if self.reusable and not self.transport.is_closing():
            poll = self._poll
            if poll is None or not poll.poll(0):
                return True
        self.close()
        return False

    def close(self) -> None:
        self.reusable = False
        if not self.transport.is_closing():  # asyncio's TLS transport breaks if closed twice
            self.transport.close()

    def _wake_drain(self) -> None:
        waiter = self._drain
        if waiter is not None:
            self._drain = None
            if not waiter.done():
                waiter.set_result(None)

    def _push(self, piece: bytes) -> None:
        self.pieces.append(piece)
        self.buffered += len(piece)
        if self.whole:
            if self.limit is not None and self.buffered > self.limit:
                self._fail(AnswerTooLarge(self.limit))
        else:
            if self.buffered > _HIGH_WATER and not self._reading_paused:
                self._reading_paused = True
                self.transport.pause_reading()
            if self._waiter is not None:
                self._wake()

    def wait(self, idle: float | None) -> asyncio.Future[None]:
        """Done at the next event of the answer (head, piece, end, error); ReadTimeout when no
        byte comes for ``idle`` seconds. A future, not a coroutine: one object per wait."""
        fut = self._loop.create_future()
        self._waiter = fut
        if idle is None:
            self._idle_limit = None
        else:
            self._arm(idle)
        return fut

    def _arm(self, limit: float) -> None:
        now = self._loop.time()
        self._idle_limit = limit
        self._last_read = now
        self._timer.at(now + limit)

    def set_deadline(self, when: float | None) -> None:
        """The exchange must be over by ``when`` (``loop.time()``), else it fails with
        ReadTimeout; None lifts the deadline."""
        self._deadline = when
        if when is not None:
            self._timer.at(when)

    def _check_read(self) -> float | None:
        """Fails the answer past its deadline or idle-read limit; else when to look again (None:
        nobody waits, the next wait arms again)."""
        now = self._loop.time()
        due = self._deadline
        if due is not None and now >= due:
            self._deadline = None
            self._fail(ReadTimeout("the answer did not come before the call's deadline"))
            return None
        limit = self._idle_limit
        waiter = self._waiter
        if waiter is not None and not waiter.done() and limit is not None:
            idle_due = self._last_read + limit
            if now >= idle_due:
                self._fail(ReadTimeout(f"no byte of the answer came in {limit:g} s"))
                return None
            if due is None or idle_due < due:
                due = idle_due
        return due

    def _disarm(self) -> None:
        self._deadline = None
        self._timer.close()

    def read_whole(self, limit: int | None) -> None:
        self.whole = True
        self.limit = limit
        if limit is not None and self.buffered > limit:
            self._fail(AnswerTooLarge(limit))
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
        if self._reading_paused:
            # the whole answer came before anyone read it: read again before the next exchange
            self._reading_paused = False
            self.transport.resume_reading()
        self.buffered = 0
        return body

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
        else:
            event = self.on_event
            if event is not None:
                event()
