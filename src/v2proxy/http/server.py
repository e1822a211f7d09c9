"""A lean HTTP/1.1 server: llhttp (httptools) under a bare :class:`asyncio.Protocol`.

:class:`HttpServer` listens, tracks its connections and shuts them down; this docstring is the
server's whole contract, implemented by :mod:`.server_conn` (a connection: parsing, serving,
timeouts), :mod:`.head` (what a head means), :mod:`.request` and :mod:`.response` (the request
and answer objects).

One connection per TCP connection parses requests as bytes arrive and queues them;
one task per connection (started with its first complete head, parked while no request waits,
ended when the connection closes: no task per request) runs the handler on each in turn, so
pipelined requests are answered in order, each after the previous answer is complete. Reading
pauses while :data:`MAX_PIPELINE` requests wait, or while a body has more than
``request.HIGH_WATER`` bytes unread.

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
- TLS (``ssl_context``, HTTPS): the event loop's TLS transport under the same protocol; a
  handshake not done within ``header_timeout`` is dropped. Closing after an answer sends
  close_notify once the answer is flushed and drops what the client still sends until it
  closes too, for up to ``write_timeout`` (TLS's lingering: the client reads its answer).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any, cast

from v2proxy.http.request import (
    BodyError,
    BodyTimeout,
    BodyTooLarge,
    ClientDisconnected,
    HttpRequest,
    ServerLimits,
)
from v2proxy.http.response import HttpResponse
from v2proxy.http.server_conn import (
    DISCARD_MAX,
    LINGER,
    MAX_PIPELINE,
    Connection,
    Handler,
    QuickHandler,
    error_answer,
)

DEFAULT_LIMITS = ServerLimits()


class HttpServer:
    """Serves ``handler`` on one listening socket; see the module docstring."""

    def __init__(
        self,
        handler: Handler,
        limits: ServerLimits = DEFAULT_LIMITS,
        *,
        max_connections: int | None = None,
        ssl_context: ssl.SSLContext | None = None,
        quick: QuickHandler | None = None,
    ) -> None:
        self.handler = handler
        #: takes a whole request at once from the parser's callback when it can (else ``handler``)
        self.quick = quick
        #: TLS on the socket (HTTPS); the handshake must end within ``limits.header_timeout``
        self.ssl_context = ssl_context
        self.limits = limits
        self.max_connections = max_connections
        self.conns: set[Connection] = set()
        self.closing = False
        self._server: asyncio.Server | None = None
        self._all_gone: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop = cast(asyncio.AbstractEventLoop, None)

    def _factory(self) -> Connection:
        return Connection(self, self._loop)

    async def start(
        self, host: str, port: int, *, reuse_port: bool = False, backlog: int = 2048
    ) -> int:
        """Listens on ``host:port`` (0: an ephemeral port); returns the bound port."""
        loop = self._loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._factory,
            host,
            port,
            reuse_port=reuse_port or None,
            backlog=backlog,
            **self._tls(),
        )
        return self.port

    def _tls(self) -> dict[str, Any]:
        if self.ssl_context is None:
            return {}
        limits = self.limits
        return {
            "ssl": self.ssl_context,
            "ssl_handshake_timeout": limits.header_timeout,
            # closing: the answer's last bytes flushed, close_notify sent and the client's
            # input read and dropped (TLS's lingering), within the write deadline
            "ssl_shutdown_timeout": limits.write_timeout,
        }

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._server.sockets) if self._server is not None else ()

    @property
    def port(self) -> int:
        return int(self.sockets[0].getsockname()[1])

    def forget(self, conn: Connection) -> None:
        """``conn`` is lost (:class:`~v2proxy.http.server_conn.Owner`)."""
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
    "DEFAULT_LIMITS",
    "DISCARD_MAX",
    "LINGER",
    "MAX_PIPELINE",
    "BodyError",
    "BodyTimeout",
    "BodyTooLarge",
    "ClientDisconnected",
    "Handler",
    "HttpRequest",
    "HttpResponse",
    "HttpServer",
    "QuickHandler",
    "ServerLimits",
    "error_answer",
]
