"""A connection's one deadline timer, re-armed lazily (:mod:`v2proxy.http.server_conn` and
:mod:`v2proxy.http.client_conn` keep their deadlines on one).

``timer.at(when)`` leaves a pending handle due no later in place, so moving a deadline later (the
common case) costs no timer call; when it comes due, the owner's ``fire()`` returns when to be
called again, or None. ``timer.close()`` also forgets ``fire``, which would keep a reference
cycle (owner -> timer -> owner) for the collector's rare full passes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

_NEVER = float("inf")


class LazyTimer:
    """One :class:`asyncio.TimerHandle` at a time, re-armed lazily (see the module docstring)."""

    __slots__ = ("_call_at", "_fire", "_handle", "due")

    def __init__(self, loop: asyncio.AbstractEventLoop, fire: Callable[[], float | None]) -> None:
        self._call_at = loop.call_at
        self._fire = fire
        self._handle: asyncio.TimerHandle | None = None
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
