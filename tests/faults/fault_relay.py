"""A fault-injecting TCP relay for tests: listens on 127.0.0.1, forwards every connection to one
upstream (the backend), and injects the faults set on it, switchable while it runs.

Faults (:class:`Faults`; the byte counts are counted per connection and per direction from the
moment the faults were set, so that a kept-alive or HTTP/2 connection opened earlier is hit by
the next request, not by what it carried before):

- ``latency_up`` / ``latency_down``: seconds added to every byte towards the backend / towards
  the proxy (pipelined: the bytes keep their pace, each arrives that much later);
- ``reset_request_after`` / ``reset_answer_after``: after N bytes towards the backend / the
  proxy, both sockets are reset (SO_LINGER 0: an RST, not a FIN);
- ``truncate_answer_after``: after N answer bytes, both sides are closed cleanly (FIN);
- ``stall_request_after``: after N bytes from the proxy, the relay stops reading from it (and
  forwards nothing more), so that the proxy's writes block once the socket buffers are full, as
  with a backend that stops reading; reading resumes when the faults are changed;
- ``stall_answer_after``: after N answer bytes, the relay stops reading from the backend (a
  backend that stops sending mid-answer, the connection open); resumes when the faults change;
- ``bandwidth``: bytes per second, each direction of each connection (``bandwidth_up``,
  ``bandwidth_down``: one direction's, instead);
- ``refuse``: every new connection reset at once (its time kept in ``attempts``).

:meth:`Relay.stop` closes the listener and every connection (a backend going away: refused from
then on); :meth:`Relay.start` listens again on the same port (the backend back).

The relay runs its own event loop in a daemon thread (:meth:`Relay.start` and the others are
called from the test's thread), so it serves whatever the test does with blocking clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["Faults", "Relay"]

T = TypeVar("T")
_CHUNK = 64 * 1024
#: the most bytes read from one side and not yet written to the other (a TCP window's worth):
#: beyond it the relay stops reading, so that a slow link slows its sender down too; with a
#: bandwidth limit, a quarter of a second's worth (a bottleneck's queue)
_IN_FLIGHT = 4 << 20
#: the relay's sockets' receive buffers (the kernel's own queue before the relay reads)
_RCVBUF = 256 * 1024
_UP, _DOWN = 0, 1


@dataclass(frozen=True)
class Faults:
    """What the relay does to the bytes (the default: nothing)."""

    latency_up: float = 0.0
    latency_down: float = 0.0
    reset_request_after: int | None = None
    reset_answer_after: int | None = None
    truncate_answer_after: int | None = None
    stall_request_after: int | None = None
    stall_answer_after: int | None = None
    bandwidth: int | None = None
    bandwidth_up: int | None = None
    bandwidth_down: int | None = None
    #: every new connection is reset as soon as it is accepted (a backend that is there but
    #: fails every connection; unlike a stopped relay, each attempt is seen: ``attempts``)
    refuse: bool = False


@dataclass(eq=False)
class _Conn:
    """One relayed connection: the proxy's side, the backend's side, the faults' epoch."""

    down_writer: asyncio.StreamWriter  # towards the proxy
    up_writer: asyncio.StreamWriter  # towards the backend
    epoch: int = -1
    seen: list[int] = field(default_factory=lambda: [0, 0])
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    done: bool = False


class _Pipe:
    """The bytes read from one side, with when they came, until written to the other; ``put``
    waits while more than :data:`_IN_FLIGHT` bytes are queued; None is the end."""

    def __init__(self) -> None:
        self._items: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        self._queued = 0
        self._room = asyncio.Event()
        self._room.set()
        self.limit = _IN_FLIGHT

    async def put(self, data: bytes | None) -> None:
        if data is None:
            self._items.put_nowait(None)
            return
        self._queued += len(data)
        self._items.put_nowait((time.monotonic(), data))
        if self._queued > self.limit:
            self._room.clear()
            await self._room.wait()

    async def get(self) -> tuple[float, bytes] | None:
        return await self._items.get()

    def done(self, n: int) -> None:
        self._queued -= n
        if self._queued <= self.limit:
            self._room.set()


def _small_buffer(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER on, 0 s)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Relay:
    """``Relay(upstream_host, upstream_port)``; ``start()``, ``set(Faults(...))``, ``stop()``."""

    def __init__(self, upstream_host: str, upstream_port: int, port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = port
        self._faults = Faults()
        self._epoch = 0
        self._conns: set[_Conn] = set()
        self._server: asyncio.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._changed: asyncio.Event | None = None
        #: when each connection was accepted (time.monotonic())
        self.attempts: list[float] = []

    # ------------------------------------------------------------------ from the test's thread

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def start(self) -> None:
        """Listen (again) on ``port`` (a free one the first time when 0)."""
        self._run(self._start())

    def stop(self, reset: bool = False) -> None:
        """Stop listening and close every connection (with an RST when ``reset``)."""
        self._run(self._stop(reset))

    def set(self, faults: Faults) -> None:
        """Apply ``faults`` from now on (counts start again on every connection)."""
        self._run(self._set(faults))

    def clear(self) -> None:
        self.set(Faults())

    def close(self) -> None:
        """Stop and end the relay's thread."""
        self.stop(reset=True)
        self._run(self._drain())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ on the relay's loop

    async def _start(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True, limit=_CHUNK
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self, reset: bool) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self._conns):
            self._end(conn, reset)
        if server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await server.wait_closed()

    async def _drain(self) -> None:
        """Cancel and await every task left (the connections' pumps)."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _set(self, faults: Faults) -> None:
        self._faults = faults
        self._epoch += 1
        changed = self._changed
        assert changed is not None
        changed.set()  # wakes stalled readers and writers waiting on a delay
        self._changed = asyncio.Event()

    def _end(self, conn: _Conn, reset: bool) -> None:
        if conn.done:
            return
        conn.done = True
        self._conns.discard(conn)
        for writer in (conn.down_writer, conn.up_writer):
            if reset:
                _reset(writer)
            else:
                writer.close()
        for task in conn.tasks:
            if task is not asyncio.current_task():
                task.cancel()

    async def _serve(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        self.attempts.append(time.monotonic())
        if self._faults.refuse:
            _reset(down_w)
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream, limit=_CHUNK)
        except OSError:
            _reset(down_w)
            return
        _small_buffer(down_w)
        _small_buffer(up_w)
        conn = _Conn(down_w, up_w, self._epoch)
        self._conns.add(conn)
        conn.tasks = [
            asyncio.ensure_future(self._pump(conn, _UP, down_r, up_w)),
            asyncio.ensure_future(self._pump(conn, _DOWN, up_r, down_w)),
        ]
        await asyncio.gather(*conn.tasks, return_exceptions=True)
        self._end(conn, reset=False)

    def _limit(self, conn: _Conn, direction: int) -> tuple[str, int] | None:
        """The fault that cuts this direction after some bytes: (kind, bytes left before it)."""
        f = self._faults
        if conn.epoch != self._epoch:
            conn.epoch = self._epoch
            conn.seen = [0, 0]
        seen = conn.seen[direction]
        cuts = (
            [("reset", f.reset_request_after), ("stall", f.stall_request_after)]
            if direction == _UP
            else [
                ("reset", f.reset_answer_after),
                ("truncate", f.truncate_answer_after),
                ("stall", f.stall_answer_after),
            ]
        )
        armed = [(n - seen, kind) for kind, n in cuts if n is not None]
        if not armed:
            return None
        left, kind = min(armed)
        return kind, max(left, 0)

    async def _pump(
        self,
        conn: _Conn,
        direction: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Copy one direction, with the faults, until EOF or the connection's end."""
        queue = _Pipe()
        sender = asyncio.ensure_future(self._send(conn, direction, queue, writer))
        conn.tasks.append(sender)
        try:
            held = b""  # read, but held back by a stall
            while not conn.done:
                data = held or await reader.read(_CHUNK)
                held = b""
                if not data:
                    break
                # the faults as they are now (they may have been set while the read waited)
                cut = self._limit(conn, direction)
                if cut is not None and cut[1] < len(data):
                    kind, left = cut
                    if left:
                        conn.seen[direction] += left
                        await queue.put(data[:left])
                    await self._cut(conn, kind)
                    if kind != "stall":
                        return
                    held = data[left:]  # the faults changed: go on with the rest
                    continue
                conn.seen[direction] += len(data)
                await queue.put(data)
            await queue.put(None)  # EOF: passed on once the bytes before it are sent
            await sender
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if not sender.done() and conn.done:
                sender.cancel()

    async def _cut(self, conn: _Conn, kind: str) -> None:
        if kind == "stall":
            changed = self._changed
            assert changed is not None
            await changed.wait()  # until the faults change
            return
        await asyncio.sleep(0.05)  # the bytes before the cut go out first
        self._end(conn, reset=kind == "reset")

    async def _send(
        self,
        conn: _Conn,
        direction: int,
        queue: _Pipe,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Write what the reader queued: each piece ``latency`` after it arrived, at most
        ``bandwidth`` bytes per second; EOF (None) half-closes."""
        sent_since = time.monotonic()
        sent = 0
        while True:
            item = await queue.get()
            if item is None:
                if writer.can_write_eof():
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                return
            arrived, data = item
            f = self._faults
            delay = arrived + (f.latency_up if direction == _UP else f.latency_down)
            wait = delay - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            rate = (f.bandwidth_up, f.bandwidth_down)[direction] or f.bandwidth
            queue.limit = _IN_FLIGHT if rate is None else max(_CHUNK, rate // 4)
            view = memoryview(data)
            while view:
                if rate is None:
                    piece, view = view, view[:0]
                else:
                    step = max(1, rate // 50)
                    piece, view = view[:step], view[step:]
                    now = time.monotonic()
                    if now - sent_since > 1.0:  # the budget starts again after a pause
                        sent_since, sent = now, 0
                    due = sent_since + sent / rate
                    if due > now:
                        await asyncio.sleep(due - now)
                    sent += len(piece)
                writer.write(piece)
                await writer.drain()
            queue.done(len(data))
