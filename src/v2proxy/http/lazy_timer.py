"""A connection's one deadline timer, re-armed lazily: the server's connection
(:mod:`v2proxy.http.server_conn`) and the backend client's (:mod:`v2proxy.http.client_conn`)
both keep their deadlines on one.

Contract:

- ``timer.at(when)`` (``loop.time()`` based) makes sure the timer fires no later than ``when``:
  a pending handle due earlier (or at the same time) is left in place — so moving a deadline
  later, the common case on a kept connection, costs no timer call —, one due later is cancelled
  and replaced.
- When the handle comes due the owner's ``fire()`` is called, which reads its own state (its
  deadline may have moved since) and returns the time it wants to be called again at (a
  deadline not yet reached), or None. ``fire`` may call ``at`` itself (a new deadline of
  another kind); it then returns None.
- ``timer.due`` is when the pending handle fires (infinity when none is): an owner on a hot
  path asks ``at`` only ``if when < timer.due`` (the same effect, without the call).
- ``timer.cancel()`` drops the pending handle; ``timer.pending`` tells whether one is pending.
- ``timer.close()`` (the connection ended) drops it and forgets ``fire``: the owner's bound
  method would otherwise keep a reference cycle (owner -> timer -> owner) for the garbage
  collector's rare full passes; a deadline set afterwards fires into nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

_NEVER = float("inf")


class LazyTimer:
    """One :class:`asyncio.TimerHandle` at a time, re-armed lazily (see the module's contract)."""

    __slots__ = ("_call_at", "_fire", "_handle", "due")

    def __init__(self, loop: asyncio.AbstractEventLoop, fire: Callable[[], float | None]) -> None:
        self._call_at = loop.call_at
        self._fire = fire
        self._handle: asyncio.TimerHandle | None = None
        #: when ``_handle`` fires (infinity: no handle)
        self.due = _NEVER

    def at(self, when: float) -> None:
        """Fire no later than ``when``."""
        handle = self._handle
        if handle is not None:
            if self.due <= when:
                return  # it fires first, and the owner's fire() asks again for ``when``
            handle.cancel()
        self.due = when
        self._handle = self._call_at(when, self._run)

    @property
    def pending(self) -> bool:
        return self._handle is not None

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self.due = _NEVER

    def close(self) -> None:
        self.cancel()
        self._fire = _nothing

    def _run(self) -> None:
        self._handle = None
        self.due = _NEVER
        again = self._fire()
        if again is not None:
            self.at(again)


def _nothing() -> None:
    return None
