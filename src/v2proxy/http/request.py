"""One request of a server connection (:mod:`.server_conn`); its answer is written by
:class:`~v2proxy.http.response.HttpResponse`. Both reach their connection,
:class:`~v2proxy.http.server_conn.Connection`, typed with its class (compiled, its fields are
read in C; a protocol would make each read a generic look-up). The import is for the type
checker only: ``server_conn`` imports this module, never the other way at run time.

The body arrives in the ``bytes`` pieces llhttp delivers; the connection pauses reading while
more than :data:`HIGH_WATER` bytes wait and resumes below :data:`LOW_WATER`. Nothing is
allocated from a Content-Length. :class:`BodyError` subclasses carry the status the server
answers when a handler lets them propagate.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, TypeVar

from mypy_extensions import mypyc_attr

from v2proxy.http.head import Head

if TYPE_CHECKING:
    from v2proxy.http.server_conn import Connection

T = TypeVar("T")

HIGH_WATER: Final = 1 << 20
_deque: Final = deque  # (a C static: the module's dict is not read per request)
LOW_WATER: Final = 256 * 1024


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Limits and timeouts of :class:`~v2proxy.http.server.HttpServer` (seconds, bytes)."""

    max_request_line: int = 8192  # request target longer -> 414
    max_header_bytes: int = 65536  # whole head bigger -> 431
    max_headers: int = 128  # more header fields -> 431
    header_timeout: float = 10.0  # whole head within this from its first byte -> 408, close
    keepalive_timeout: float = 5.0  # idle between requests -> close silently
    body_timeout: float = 60.0  # no body byte for this long -> 408, close
    max_body_size: int = 2**31 - 1  # Content-Length above -> 413; chunked growing above -> 413
    write_timeout: float = 60.0  # a client that does not read its answer this long is dropped


@mypyc_attr(native_class=False)
class ClientDisconnected(ConnectionError):
    """The client closed the connection (or stopped reading) before the exchange ended."""


class BodyError(Exception):
    """The request body cannot be taken; the server answers :attr:`status` and closes."""

    status: ClassVar[int] = 400


class BodyTooLarge(BodyError):
    status: ClassVar[int] = 413


class BodyTimeout(BodyError):
    status: ClassVar[int] = 408


class Request(Protocol):
    """What a handler reads of a request: an :class:`HttpRequest` (compiled, so a function typed
    with it takes nothing else) or, where a handler may be given another, anything of this shape
    (the tests' stand-ins)."""

    method: str
    path: str
    target: bytes
    query: bytes
    headers: list[tuple[bytes, bytes]]
    content_length: int | None
    chunked: bool
    keep_alive: bool
    client: tuple[str, int] | None
    state: Any

    def header(self, name: bytes) -> bytes | None: ...

    def whole(self, limit: int, take: bool = True) -> bytes | None: ...

    async def read(self, limit: int | None = None) -> bytearray: ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    def gone(self) -> asyncio.Future[None]: ...


def split_target(target: bytes) -> tuple[str, bytes]:
    """An origin-form target's path (decoded as latin-1) and query (after the first ``?``)."""
    path, _, query = target.partition(b"?")
    return path.decode("latin-1"), query


class _Pieces:
    """:meth:`HttpRequest.chunks`: its body in the pieces it arrived in, read from the first
    :meth:`__anext__` (an iterator of its own: mypyc compiles no async generator)."""

    __slots__ = ("_begun", "_req")

    def __init__(self, req: HttpRequest) -> None:
        self._req = req
        self._begun = False

    def __aiter__(self) -> _Pieces:
        return self

    async def __anext__(self) -> bytes:
        req = self._req
        if not self._begun:
            self._begun = True
            req._begin()
        chunks = req._chunks
        while True:
            if chunks:
                piece = chunks.popleft()
                req._took(len(piece))
                return piece
            if req._complete:
                raise StopAsyncIteration
            if req._error is not None:
                raise req._error
            await req._wait()


class HttpRequest:
    """The head of one request and its body as it arrives."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_complete",
        "_conn",
        "_consuming",
        "_error",
        "_expect",
        "_waiter",
        "chunked",
        "client",
        "content_length",
        "headers",
        "keep_alive",
        "method",
        "path",
        "query",
        "state",
        "target",
        "version",
    )

    def __init__(
        self,
        conn: Connection,
        target: bytes,
        split: tuple[str, bytes],
        headers: list[tuple[bytes, bytes]],
        head: Head,
    ) -> None:
        self._conn = conn
        self.target = target
        self.path, self.query = split
        self.headers = headers
        self.method, self.version, length, chunked, self.keep_alive, expect = head
        self.content_length = length
        self.chunked = chunked
        self.client = conn.client
        self._chunks: deque[bytes] = _deque()
        self._buffered = 0
        self._complete = not chunked and not length
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._expect = expect  # 100-continue asked and not yet sent
        self._consuming = False
        #: what a quick handler that declined made of the request, for the serving task's
        self.state: Any = None

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (given lowercase), or None."""
        for n, v in self.headers:
            if n == name:
                return v
        return None

    def gone(self) -> asyncio.Future[None]:
        """Done when the client goes away or half-closes (as uvicorn takes it), for a handler
        doing long work without reading or writing."""
        return self._conn.watch_gone()

    def whole(self, limit: int, take: bool = True) -> bytes | None:
        """The whole body when it is all here in one piece within ``limit`` bytes and not
        chunked, else None (then :meth:`read` it). ``take=False``: only looked at."""
        chunks = self._chunks
        if (
            self._complete
            and len(chunks) == 1
            and not self.chunked
            and len(chunks[0]) <= limit
            and len(chunks[0]) <= self._conn.limits.max_body_size
        ):
            if not take:
                return chunks[0]
            piece = chunks[0]
            self.taken()
            return piece
        return None

    def taken(self) -> None:
        """The whole body that :meth:`whole` gave (``take=False``) is taken after all."""
        self._consuming = True
        self._expect = False  # all here: no 100 Continue is due
        self._buffered = 0
        self._chunks.clear()
        if self._conn.body_paused:
            self._conn.body_drained(self)

    async def read(self, limit: int | None = None) -> bytearray:
        """The whole body. :class:`BodyTooLarge` beyond ``limit`` or ``max_body_size``."""
        cap = self._conn.limits.max_body_size
        if limit is not None and limit < cap:
            cap = limit
        if self.content_length is not None and self.content_length > cap:
            self._refuse(cap)
        self._consuming = True
        if self._expect:
            self._expect = False
            self._conn.send_continue(self)
        chunks = self._chunks
        if self._complete and len(chunks) == 1:  # the usual small body: here whole already
            piece = chunks.popleft()
            self._buffered = 0
            if self._conn.body_paused:
                self._conn.body_drained(self)
            return bytearray(piece)
        body = bytearray()
        while True:
            n = 0
            while chunks:
                piece = chunks.popleft()
                n += len(piece)
                body += piece
            if n:
                self._took(n)
            if len(body) > cap:
                self._refuse(cap)
            if self._complete:
                return body
            if self._error is not None:
                raise self._error
            await self._wait()

    def chunks(self) -> AsyncIterator[bytes]:
        """The body in the pieces it arrived in."""
        return _Pieces(self)

    def _refuse(self, cap: int) -> None:
        self.keep_alive = False
        raise BodyTooLarge(f"request body larger than {cap} bytes")

    def _begin(self) -> None:
        self._consuming = True
        if self._expect:
            self._expect = False
            self._conn.send_continue(self)

    def _took(self, n: int) -> None:
        self._buffered -= n
        if self._buffered < LOW_WATER and self._conn.body_paused:
            self._conn.body_drained(self)

    async def _wait(self) -> None:
        waiter = self._waiter = self._conn.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if not self._complete and self._error is None:
            self._error = exc
            self.keep_alive = False
            self._wake()


async def unless_gone(r: Request, work: Coroutine[Any, Any, T]) -> T:
    """``work``'s result, or :class:`ClientDisconnected` (``work`` cancelled) when the client
    goes away first. For long waits only (an LLM's generation): it costs a task."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait((task, r.gone()), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        await _cancel(task)
        raise
    if task.done():
        return task.result()
    await _cancel(task)
    raise ClientDisconnected("client went away")


async def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
