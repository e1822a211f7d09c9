"""A keep-alive HTTP/1.1 client pool for one origin (RFC 9112), on httptools (llhttp).

Transport only. Each connection is a bare :class:`asyncio.Protocol`
(:mod:`v2proxy.http.client_conn`), cheaper per request than asyncio streams or aiohttp's
client; no Task per request.

- A connection goes back to the pool only when its answer was read to the end and may be kept.
- Retries: only a GET, HEAD or OPTIONS whose *reused* connection ended before any byte of the
  answer is sent once more, on a new connection. A POST (an inference) is never sent twice: it
  may have reached the model.
- ``read_timeout`` bounds each wait for the answer's next bytes, ``call_timeout`` the whole call
  (:class:`ReadTimeout`). A cancelled call closes its connection.
- Failures are :class:`HttpClientError` subclasses only, except what a :class:`StreamBody`'s
  own iterator raises.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Final

from v2proxy.http import Buffer
from v2proxy.http.client_conn import ClientConnection
from v2proxy.http.client_errors import (
    ConnectFailed,
    ConnectTimeout,
    ReadTimeout,
    RemoteClosed,
)
from v2proxy.http.client_head import RequestHeads
from v2proxy.http.client_response import ClientResponse

_JOIN_MAX: Final = 64 * 1024
_RETRIABLE: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_EMPTY_BODY_LENGTH: Final = frozenset({"POST", "PUT", "PATCH"})

__all__ = ["HttpClient", "StreamBody"]


@dataclass(slots=True)
class StreamBody:
    """A request body still arriving: exactly ``length`` bytes in ``chunks``."""

    length: int
    chunks: AsyncIterator[Buffer]


def _size(b: Buffer) -> int:
    return b.nbytes if isinstance(b, memoryview) else len(b)


class _Slots:
    """A first-come-first-served counting semaphore whose ``try_acquire`` takes a free slot
    without a coroutine (the usual case)."""

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


class HttpClient:
    """Keep-alive connections to one origin, at most ``limit`` open (in use or idle);
    ``address``: the one address of the origin's name to connect to (else the name)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        address: str | None = None,
        ssl: _ssl.SSLContext | None = None,
        limit: int = 100,
        connect_timeout: float = 5.0,
        idle_timeout: float = 4.0,
        max_head: int = 65536,
        on_retry: Callable[[], object] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        #: the Host header and the TLS server name stay ``host``
        self.address = address or host
        self._on_retry = on_retry
        self._ssl = ssl
        self._connect_timeout = connect_timeout
        self._idle_timeout = idle_timeout
        self._max_head = max_head
        self._idle: deque[ClientConnection] = deque()  # oldest on the left
        self._slots = _Slots(limit)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False
        heads = RequestHeads(host, port)
        self._name = ("https://" if ssl else "http://") + heads.authority
        self._at = self._name + (f" ({self.address})" if self.address != host else "")
        self._head = heads.build
        #: head(method, target, headers, length): a request's head as :meth:`request` writes it
        self.head: Callable[[str, str, Sequence[tuple[bytes, bytes]], int | None], bytes] = (
            heads.build
        )

    async def request(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: list[Buffer] | StreamBody | None = None,
        *,
        read_timeout: float | None = None,
        call_timeout: float | None = None,
    ) -> ClientResponse:
        """Send ``method target`` and return once the final answer's head is in."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        deadline = None
        covered = False  # the deadline comes before any idle-read timeout: one timer to mind
        if call_timeout is not None:
            deadline = loop.time() + call_timeout
            covered = read_timeout is None or read_timeout >= call_timeout
        stream = None
        chunks: list[Buffer] = []
        if body is None:
            length = 0 if method in _EMPTY_BODY_LENGTH else None
        elif isinstance(body, StreamBody):
            stream = body
            length = body.length
        else:
            chunks = body
            length = 0
            for b in body:
                length += b.nbytes if isinstance(b, memoryview) else len(b)
        head = self._head(method, target, headers, length)
        data: bytes | None = head  # written at once (else buffer by buffer)
        if chunks:
            data = b"".join([head, *chunks]) if length is not None and length <= _JOIN_MAX else None
        retry = stream is None and method in _RETRIABLE
        head_only = method == "HEAD"
        fresh = False
        wait_for = None if covered else read_timeout
        idle = self._idle
        slots = self._slots
        while True:
            if not fresh and idle and slots._value > 0 and not slots._waiters:
                slots._value -= 1  # a free slot, taken as try_acquire() does
                conn = self._reuse()  # the usual case: no coroutine to get a connection
                if conn is None:
                    conn = await self._open(deadline)
            else:
                conn = await self._acquire(deadline, fresh)
            try:
                conn.begin(head_only, deadline)
                if stream is not None:
                    await self._send(conn, head, stream)
                else:
                    if data is not None:
                        conn.transport.write(data)
                    else:
                        conn.transport.writelines([head, *chunks])
                    if conn.writing_paused:
                        await conn.drain()
                while not conn.head_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(wait_for)
            except RemoteClosed:
                self._release(conn, False)
                if retry and conn.reused and not conn.got_answer:
                    retry = False
                    fresh = True
                    if self._on_retry is not None:
                        self._on_retry()
                    continue
                raise
            except BaseException:
                self._release(conn, False)
                raise
            return ClientResponse(self, conn, read_timeout, covered)

    def idle_now(self) -> ClientConnection | None:
        """A live idle connection, its slot taken, at once (for an exchange driven by the
        connection's ``on_event``; then :meth:`release`); None when none is idle or free."""
        idle = self._idle
        slots = self._slots
        loop = self._loop
        if not idle or slots._value <= 0 or slots._waiters or loop is None:
            return None
        slots._value -= 1
        conn = idle.pop()  # the last one used, as _reuse() looks at first
        if loop.time() - conn.idle_since < self._idle_timeout and conn.alive():
            conn.reused = True
            return conn
        conn.close()
        reused = self._reuse()
        if reused is None:
            slots.release()
        return reused

    async def connection(self, deadline: float | None) -> ClientConnection:
        """A connection and its slot, as :meth:`idle_now` but waiting for one by ``deadline``."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        conn = self.idle_now()
        if conn is None:
            conn = await self._acquire(deadline)
        return conn

    def release(self, conn: ClientConnection) -> None:
        """An exchange on ``conn`` (from :meth:`idle_now` or :meth:`connection`) is over: back
        in the pool when it may be kept, else closed."""
        conn.on_event = None
        self._release(conn, conn.keep)

    async def _send(self, conn: ClientConnection, head: bytes, body: StreamBody) -> None:
        transport = conn.transport
        transport.write(head)
        sent = 0
        async for chunk in body.chunks:
            if conn.stop_sending():
                conn.reusable = False  # the rest of the body is not sent: never reuse
                return
            sent += _size(chunk)
            if sent > body.length:
                raise ValueError(f"streamed body longer than its length {body.length}")
            transport.write(chunk)
            if conn.writing_paused:
                await conn.drain()
        if sent != body.length:
            raise ValueError(f"streamed body of {sent} bytes, not its length {body.length}")

    async def _acquire(self, deadline: float | None, fresh: bool = False) -> ClientConnection:
        """A slot and a connection, the most recently used live idle one or a new one (always
        when ``fresh``), by ``deadline`` when one is given, else ReadTimeout."""
        if not self._slots.try_acquire():
            if deadline is None:
                await self._slots.acquire()
            else:
                try:
                    async with asyncio.timeout_at(deadline):
                        await self._slots.acquire()
                except TimeoutError:
                    raise ReadTimeout(
                        f"no connection to {self._name} came free before the call's deadline"
                    ) from None
        if fresh:
            if self._idle:
                self._idle.popleft().close()
        elif self._idle:
            conn = self._reuse()
            if conn is not None:
                return conn
        return await self._open(deadline)

    def _reuse(self) -> ClientConnection | None:
        loop = self._loop
        assert loop is not None  # set by the request
        idle = self._idle
        now = loop.time()
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < self._idle_timeout and conn.alive():
                conn.reused = True
                return conn
            conn.close()
        return None

    async def _open(self, deadline: float | None) -> ClientConnection:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        try:
            if self._closed:
                raise ConnectFailed(f"the HTTP client for {self._name} is closed")
            if deadline is None:
                return await self._connect(loop)
            try:
                async with asyncio.timeout_at(deadline):
                    return await self._connect(loop)
            except TimeoutError:  # the call's deadline (the connect timeout is ConnectTimeout)
                raise ReadTimeout(
                    f"connecting to {self._name} outlasted the call's deadline"
                ) from None
        except BaseException:
            self._slots.release()
            raise

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> ClientConnection:
        max_head = self._max_head
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: ClientConnection(loop, max_head),
                    self.address,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
        except TimeoutError:  # an OSError too: first
            raise ConnectTimeout(
                f"connecting to {self._at} took over {self._connect_timeout:g} s"
            ) from None
        except _ssl.SSLCertVerificationError as exc:  # an OSError too: first
            raise ConnectFailed(
                f"TLS verification of {self._name}'s certificate failed: {exc.verify_message}"
            ) from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self._at}: {exc}") from None
        return conn

    def _release(self, conn: ClientConnection, keep: bool) -> None:
        if keep and conn.body_done and conn.reusable and not self._closed:
            loop = self._loop
            assert loop is not None
            conn.idle_since = loop.time()
            self._idle.append(conn)
            if self._sweeper is None:
                self._sweeper = loop.call_at(conn.idle_since + self._idle_timeout, self._sweep)
        else:
            conn.set_deadline(None)  # (a complete answer's deadline is lifted already)
            conn.close()
        slots = self._slots
        if slots._waiters:
            slots.release()
        else:
            slots._value += 1  # what release() does when nobody waits

    def _sweep(self) -> None:
        self._sweeper = None
        loop = self._loop
        assert loop is not None
        idle = self._idle
        expired = loop.time() - self._idle_timeout
        while idle and (idle[0].idle_since <= expired or not idle[0].reusable):
            idle.popleft().close()
        if idle:
            when = idle[0].idle_since + self._idle_timeout
            self._sweeper = loop.call_at(when, self._sweep)

    async def close(self) -> None:
        """Close the idle connections; those in use close when their answers are done."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        while self._idle:
            self._idle.pop().close()
