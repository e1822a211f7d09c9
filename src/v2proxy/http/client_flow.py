"""The read side of a client connection (:mod:`v2proxy.http.client_conn`): how an answer's
body reaches the one coroutine waiting for it.

Contract:

- One waiter at a time: :meth:`AnswerFlow.wait` returns at the next event of the answer (head,
  piece, end, error), which the connection signals with ``_wake``.
- ``wait(idle)``: the idle-read deadline: :class:`ReadTimeout` when no byte comes for ``idle``
  seconds while the answer is awaited (one timer per connection, re-armed only when it fires).
- The body is kept as the pieces the transport delivered (``pieces``, ``buffered`` bytes). A
  streamed body pauses reading from the socket above 1 MiB unconsumed and resumes below
  256 KiB; one read whole (:meth:`AnswerFlow.read_whole`) is never paused and fails with
  :class:`ProtocolError` past its ``limit``.
"""

from __future__ import annotations

import asyncio
from collections import deque

from v2proxy.http.client_errors import HttpClientError, ProtocolError, ReadTimeout

__all__ = ["AnswerFlow"]

#: a streamed answer pauses reading from the socket above this many unconsumed bytes...
_HIGH_WATER = 1 << 20
#: ...and resumes below this many
_LOW_WATER = 256 * 1024


class AnswerFlow(asyncio.Protocol):
    """The answer's pieces, the one coroutine waiting for them and its idle-read deadline; the
    connection (the subclass) parses, and ends the answer with ``_fail``."""

    __slots__ = (
        "_idle_limit",
        "_last_read",
        "_loop",
        "_reading_paused",
        "_timer",
        "_timer_due",
        "_waiter",
        "buffered",
        "limit",
        "pieces",
        "transport",
        "whole",
    )

    transport: asyncio.Transport  # set by connection_made, before create_connection returns

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.whole = False
        self.limit: int | None = None
        self.pieces: deque[bytes] = deque()
        self.buffered = 0
        self._reading_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = self._last_read = 0.0
        self._idle_limit: float | None = None

    def _fail(self, exc: HttpClientError) -> None:
        """End the answer with ``exc`` (the connection knows its state)."""
        raise NotImplementedError

    def _push(self, piece: bytes) -> None:
        self.pieces.append(piece)
        self.buffered += len(piece)
        if self.whole:
            if self.limit is not None and self.buffered > self.limit:
                self._fail(ProtocolError(f"answer body over the limit of {self.limit} bytes"))
        else:
            if self.buffered > _HIGH_WATER and not self._reading_paused:
                self._reading_paused = True
                self.transport.pause_reading()
            self._wake()

    async def wait(self, idle: float | None) -> None:
        """Wait for the next event of the answer (head, piece, end, error); ``idle``: the
        idle-read deadline (ReadTimeout)."""
        fut = self._loop.create_future()
        self._waiter = fut
        if idle is None:
            self._idle_limit = None
        else:
            self._arm(idle)
        try:
            await fut
        except BaseException:
            self._waiter = None
            raise

    def _arm(self, limit: float) -> None:
        now = self._loop.time()
        self._idle_limit = limit
        self._last_read = now
        due = now + limit
        if self._timer is None or self._timer_due > due:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(due, self._check_read)
            self._timer_due = due

    def _check_read(self) -> None:
        self._timer = None
        limit = self._idle_limit
        if self._waiter is None or limit is None:
            return  # nobody waits: the next wait arms again
        due = self._last_read + limit
        if self._loop.time() >= due:
            self._fail(ReadTimeout(f"no byte of the answer came in {limit:g} s"))
        else:
            self._timer = self._loop.call_at(due, self._check_read)
            self._timer_due = due

    def _disarm(self) -> None:
        """Stop the idle-read timer (the connection ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def read_whole(self, limit: int | None) -> None:
        self.whole = True
        self.limit = limit
        if limit is not None and self.buffered > limit:
            self._fail(ProtocolError(f"answer body over the limit of {limit} bytes"))
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
        self.buffered = 0
        return body

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
