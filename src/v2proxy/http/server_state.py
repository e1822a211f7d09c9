"""The state of one server connection, shared by the mixins that make it up.

:class:`ConnectionState` owns every slot of a connection and sets them up; it declares (for the
type checker only, so nothing here shadows an implementation) the methods each part provides
the others: :class:`~v2proxy.http.server_parse.ConnectionParser` feeds bytes and runs llhttp's
callbacks, :class:`~v2proxy.http.server_timer.ConnectionTimer` keeps the one deadline, and
:class:`~v2proxy.http.server_conn.Connection` serves, closes, and is what
:class:`~v2proxy.http.request.HttpRequest` and ``HttpResponse`` talk to (``connection_header``,
``send_continue``, ``body_drained``, ``drain``, ``abort``). All of them are one object: no
indirection on the hot path.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, cast

import httptools

if TYPE_CHECKING:
    from v2proxy.http.request import HttpRequest, ServerLimits
    from v2proxy.http.response import HttpResponse
    from v2proxy.http.server import HttpServer

#: what the connection's one timer is for
NONE, IDLE, HEAD, BODY, LINGERING = range(5)


class _NoCallbacks:
    """The protocol of :data:`CLOSED_PARSER`: llhttp finds no callback on it."""


#: the parser a lost connection keeps instead of its own (which holds it in a reference cycle)
CLOSED_PARSER = httptools.HttpRequestParser(_NoCallbacks())


class ConnectionState(asyncio.Protocol):
    __slots__ = (
        "answer", "backlog", "body_paused", "broken", "client", "closed", "closing_after",
        "cycle", "deadline", "discarded", "discarding", "drain_waiter", "eof", "gone", "handler",
        "head_size", "headers", "in_head", "limits", "loop", "lost", "parked", "parser",
        "parsing", "progress", "queue", "reading_paused", "received", "rejection", "server",
        "serving", "stall", "timer", "timer_kind", "transport", "url", "writing_paused",
    )  # fmt: skip

    def __init__(self, server: HttpServer, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop
        self.limits: ServerLimits = server.limits
        self.handler: Callable[[HttpRequest, HttpResponse], Awaitable[None]] = server.handler
        self.transport = cast(asyncio.Transport, None)
        self.parser = httptools.HttpRequestParser(self)
        self.client: tuple[str, int] | None = None
        self.queue: deque[HttpRequest | tuple[int, str]] = deque()
        #: the serving task: started with the first request, parked (on ``parked``) while no
        #: request waits, ended when the connection closes; ``serving``: it has requests
        self.cycle: asyncio.Task[None] | None = None
        self.parked: asyncio.Future[None] | None = None
        self.serving = False
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
        #: done when the connection is lost (made on demand: :meth:`HttpRequest.gone`)
        self.gone: asyncio.Future[None] | None = None
        self.lost = self.closed = self.broken = self.closing_after = self.eof = False
        self.timer: asyncio.TimerHandle | None = None
        self.timer_kind = NONE
        self.deadline = 0.0
        self.backlog: bytearray | None = None

    if TYPE_CHECKING:
        # server_parse
        def _feed(self, data: bytes | bytearray) -> None: ...

        # server_timer
        def _arm(self) -> None: ...

        def _set_timer(self, kind: int, delay: float) -> None: ...

        # server_conn
        def _error(self, status: int, message: str) -> None: ...

        def _close(self, linger: bool = False) -> None: ...

        def _sync_reading(self) -> None: ...

        def _serve(self) -> Coroutine[None, None, None]: ...

        # server_conn, for HttpRequest / HttpResponse
        def connection_header(self, req: HttpRequest) -> bytes: ...

        def send_continue(self, req: HttpRequest) -> None: ...

        def body_drained(self, req: HttpRequest) -> None: ...

        async def drain(self) -> None: ...

        def abort(self) -> None: ...
