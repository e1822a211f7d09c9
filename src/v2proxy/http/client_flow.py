"""The read side of a client connection (:mod:`v2proxy.http.client_conn`): how an answer's
body reaches the one coroutine waiting for it.

Contract:

- One waiter at a time: :meth:`AnswerFlow.wait` returns at the next event of the answer (head,
  piece, end, error), which the connection signals with ``_wake``.
- ``wait(idle)``: the idle-read deadline: :class:`ReadTimeout` when no byte comes for ``idle``
  seconds while the answer is awaited.
- :meth:`AnswerFlow.set_deadline`: the whole exchange's deadline (``loop.time()`` based): when it
  passes before it is lifted (``set_deadline(None)``), the answer fails with
  :class:`ReadTimeout`, whatever waits (the answer, or the request's body on the write buffer).
- Both run on one timer per connection, re-armed only when it fires: a later deadline (the next
  request's) leaves the pending timer in place, so a request costs no timer call.
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
        "_deadline",
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
        self._deadline: float | None = None

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
        self._arm_at(now + limit)

    def _arm_at(self, due: float) -> None:
        timer = self._timer
        if timer is None or self._timer_due > due:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(due, self._check_read)
            self._timer_due = due

    def set_deadline(self, when: float | None) -> None:
        """The exchange must be over by ``when`` (``loop.time()``), else it fails with
        ReadTimeout; None lifts the deadline."""
        self._deadline = when
        if when is not None:
            self._arm_at(when)

    def _check_read(self) -> None:
        self._timer = None
        now = self._loop.time()
        due = self._deadline
        if due is not None and now >= due:
            self._deadline = None
            self._fail(ReadTimeout("the answer did not come before the call's deadline"))
            return
        limit = self._idle_limit
        if self._waiter is not None and limit is not None:
            idle_due = self._last_read + limit
            if now >= idle_due:
                self._fail(ReadTimeout(f"no byte of the answer came in {limit:g} s"))
                return
            if due is None or idle_due < due:
                due = idle_due
        if due is not None:  # else nobody waits: the next wait arms again
            self._timer = self._loop.call_at(due, self._check_read)
            self._timer_due = due

    def _disarm(self) -> None:
        """Stop the timer (the connection ended)."""
        self._deadline = None
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
        if self._reading_paused:
            # the whole answer had come before anyone read it (reading paused over the high
            # water mark): the connection reads again before it can carry the next exchange
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
