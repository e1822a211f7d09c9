"""The gRPC backend's deadline watchdog: the event loop's own end of a unary call that grpcio
leaves waiting past its deadline (a request blocked on a backend that stopped reading is never
ended by grpcio's deadline)."""

from __future__ import annotations

import asyncio

from v2proxy.http.lazy_timer import LazyTimer


class Watch:
    """One call watched: its end, its task, and whether the watchdog cancelled it."""

    __slots__ = ("cancelling", "end", "fired", "task")

    def __init__(self, end: float, task: asyncio.Task[object]) -> None:
        self.end = end
        self.task = task
        #: the task's pending cancellations when it was watched (asyncio.timeout's rule)
        self.cancelling = task.cancelling()
        self.fired = False

    def timed_out(self) -> bool:
        """After the watched call raised CancelledError: whether that was the watchdog's doing
        alone (the cancellation taken back; answer a timeout) rather than the task being
        cancelled by someone else too (let it go on)."""
        return self.fired and self.task.uncancel() <= self.cancelling


class Watchdog:
    """The ends of the unary calls in flight on one event loop."""

    __slots__ = ("_loop", "_timer", "_watched")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        #: the calls in flight, in the order of their ends
        self._watched: dict[Watch, None] = {}
        self._timer = LazyTimer(loop, self._fire)

    def watch(self, end: float) -> Watch:
        """The current task's call is to be over by ``end`` (the loop's time)."""
        task = asyncio.current_task(self._loop)
        assert task is not None  # called from the task making the call
        w = Watch(end, task)
        self._watched[w] = None
        self._timer.at(end)  # no timer call while an earlier end is pending
        return w

    def unwatch(self, w: Watch) -> None:
        """The call is over (a cancellation by the watchdog is met as CancelledError at the
        call's await, where :meth:`Watch.timed_out` takes it back)."""
        self._watched.pop(w, None)

    def _fire(self) -> float | None:
        """The calls whose end is reached are cancelled; the next end, if any, returned (the
        :class:`~v2proxy.http.lazy_timer.LazyTimer` fires again then)."""
        now = self._loop.time()
        watched = self._watched
        while watched:
            w = next(iter(watched))
            if w.end > now:
                return w.end
            del watched[w]
            w.fired = True
            w.task.cancel()
        return None
