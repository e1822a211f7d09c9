"""The one timer of a server connection: which deadline runs, and what happens when it passes.

A mixin of :class:`~v2proxy.http.server_conn.Connection` (state: :mod:`.server_state`), which
provides ``_close`` and ``_error``. One :class:`asyncio.TimerHandle` per connection, re-armed
lazily: a later deadline leaves the pending handle in place, and it re-arms itself when it
fires early. :meth:`ConnectionTimer._arm` picks the deadline from the connection's state:

- none while the server holds reading back (paused or refusing): no read deadline runs;
- ``header_timeout`` from a head's first byte -> 408; also on a new connection (silent close);
- ``body_timeout`` without a body byte (100-continue not yet sent: none) -> the handler's
  read raises :class:`~v2proxy.http.request.BodyTimeout`, the connection closes;
- ``keepalive_timeout`` while idle between requests -> silent close;
- :data:`LINGER` after a half-close, or ``write_timeout`` to flush on close -> close, or
  abort when answer bytes are still unsent.
"""

from __future__ import annotations

from v2proxy.http.request import BodyTimeout
from v2proxy.http.server_state import BODY, HEAD, IDLE, LINGERING, NONE, ConnectionState

#: seconds a closing connection keeps draining input after its last answer
LINGER = 1.0


class ConnectionTimer(ConnectionState):
    __slots__ = ()

    def _arm(self) -> None:
        """Sets the deadline the connection's state calls for."""
        if self.closed:
            return
        if self.reading_paused or self.broken:
            self.timer_kind = NONE  # the server holds the client back: no read deadline
        elif self.in_head:
            if self.timer_kind != HEAD:
                self._set_timer(HEAD, self.limits.header_timeout)
        elif self.parsing is not None and not self.parsing._expect:
            self._set_timer(BODY, self.limits.body_timeout)
        elif not self.serving and not self.queue:
            self._set_timer(IDLE, self.limits.keepalive_timeout)
        else:
            self.timer_kind = NONE

    def _set_timer(self, kind: int, delay: float) -> None:
        self.timer_kind = kind
        when = self.deadline = self.loop.time() + delay
        timer = self.timer
        if timer is not None:
            if timer.when() <= when:
                return  # it fires first and re-arms for the later deadline
            timer.cancel()
        self.timer = self.loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        kind = self.timer_kind
        if kind == NONE or self.lost:
            return
        if self.loop.time() < self.deadline:
            self.timer = self.loop.call_at(self.deadline, self._on_timer)
            return
        self.timer_kind = NONE
        if kind == IDLE:
            self._close()
        elif kind == HEAD:
            self._error(408, "request head not received in time")
        elif kind == BODY and self.parsing is not None:
            self.parsing._fail(BodyTimeout("request body not received in time"))
            self.broken = True
            if self.discarding:
                self._close()
        elif kind == LINGERING:
            if self.transport.get_write_buffer_size():
                self.transport.abort()
            else:
                self.transport.close()
