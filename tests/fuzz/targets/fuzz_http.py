"""Fuzz target: the HTTP/1.1 server's request handling fed raw bytes (v2proxy.http: the
connection protocol object of server_conn / head, on llhttp), over a fake
transport on an event loop of its own: no sockets, no timers firing.

Input: a control byte, then the bytes the client sends. Control bits 0-2 pick the size of the
pieces the bytes arrive in (at most MAX_PIECES), bit 3 whether the client half-closes after
sending, bit 4 small server limits. The handler echoes: it reads the body whole (``/chunks``:
piece by piece; ``/limit``: with a 16-byte limit), or not at all (``/noread``), or streams its
answer (``/stream``); HEAD is answered 204. While the server has paused reading, no more bytes
arrive (a real transport would hold them); the run then ends with the client going away.

Invariants (h11's: parse or answer the protocol error, nothing else): the handler and the server
raise nothing but what they document; nothing is logged at ERROR (a parser callback or handler
failing); every answer is well-framed HTTP/1.1 that a client parser reads, with a status of the
server's contract (the handler's, or 400/413/414/417/431/501/505) and never a 500; at most one
answer per request begun plus one refusal; and when the client goes away the connection's task
ends (no hang, no task left behind).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzzlib import expect, instrumented, main, take

with instrumented(__name__ == "__main__"):
    import httptools

    from v2proxy.http.request import ClientDisconnected, HttpRequest, ServerLimits
    from v2proxy.http.response import HttpResponse
    from v2proxy.http.server import BodyError, HttpServer

PIECES = (1, 2, 3, 7, 16, 64, 1024, 1 << 20)
LIMITS = ServerLimits()
SMALL = ServerLimits(max_request_line=64, max_header_bytes=256, max_headers=4, max_body_size=100)
ALLOWED = frozenset({100, 200, 204, 400, 413, 414, 417, 431, 501, 505})
MAX_PIECES = 64  # the bytes arrive in at most this many pieces (the last one takes the rest)
SPINS = 64  # loop iterations at most after each piece: the handler's chain is a few awaits deep


async def echo(req: HttpRequest, resp: HttpResponse) -> None:
    if req.method == "HEAD":
        await resp.send(204, [], b"")
        return
    path = req.path
    if path == "/noread":
        await resp.send(200, [], b"not read")
        return
    if path == "/stream":
        await resp.start(200, [(b"content-type", b"text/plain")])
        for piece in (b"ab", b"", b"cde"):
            await resp.write(piece)
        await resp.end()
        return
    if path == "/chunks":
        n = 0
        async for chunk in req.chunks():
            n += len(chunk)
        body = b"%d" % n
    else:
        body = bytes(await req.read(16 if path == "/limit" else None))
    await resp.send(200, [(b"content-type", b"text/plain")], body[:32])


class Transport(asyncio.Transport):
    """Records what the server writes; closing reports the connection lost (soon, as a real
    transport does)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.out = bytearray()
        self.paused = self.closed = self.eof = False
        self.protocol: Any = None

    def write(self, data: Any) -> None:
        expect(not self.closed and not self.eof, "write after close or half-close")
        self.out += data

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_reading(self) -> bool:
        return not self.paused

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default


class Answers:
    """llhttp's response parser over what the server wrote: the status of each answer."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_headers_complete(self) -> None:
        self.statuses.append(self.parser.get_status_code())


class Failures(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


LOOP = asyncio.new_event_loop()
PROBLEMS: list[str] = []
LOOP.set_exception_handler(lambda _loop, context: PROBLEMS.append(str(context.get("message"))))
FAILURES = Failures()


def _spin(n: int = SPINS) -> None:
    """Run the loop while callbacks are ready (no timers: nothing here waits for time)."""
    ready = LOOP._ready  # type: ignore[attr-defined]  # the loop's queue of ready callbacks
    for _ in range(n):
        if not ready:
            return
        LOOP.call_soon(LOOP.stop)
        LOOP.run_forever()


async def _handler(req: HttpRequest, resp: HttpResponse) -> None:
    try:
        await echo(req, resp)
    except (BodyError, ClientDisconnected):
        raise  # documented: the server answers its status, or the connection ends
    except Exception as exc:
        PROBLEMS.append(f"handler saw {type(exc).__name__}: {exc}")
        raise


def drive(server: HttpServer, control: int, sent: bytes, max_pieces: int, spins: int) -> Transport:
    """One connection of ``server`` on LOOP fed ``sent``: in pieces of ``PIECES[control & 7]``
    bytes (at most ``max_pieces``, the last one takes the rest; none while the server has paused
    reading) with ``spins`` loop iterations after each, a half-close when control bit 3 is set,
    then the client goes away. Fails the run when callbacks are still ready after that, the
    connection's task did not end, the loop saw an unexpected problem or something was logged
    at ERROR. Returns the transport: ``out`` holds what the server wrote."""
    piece = PIECES[control & 7]
    server._loop = LOOP
    conn = server._factory()
    transport = Transport(LOOP)
    transport.protocol = conn
    PROBLEMS.clear()
    FAILURES.records.clear()
    logger = logging.getLogger("v2proxy")
    logger.addHandler(FAILURES)  # only while the run lasts: corpus replay shares the process
    try:
        conn.connection_made(transport)
        pos = 0
        for i in range(max_pieces):
            if pos >= len(sent) or transport.closed or transport.paused:
                break
            end = pos + piece if i < max_pieces - 1 else len(sent)  # the rest at once
            conn.data_received(sent[pos:end])
            pos = end
            _spin(spins)
        if control & 8 and not transport.closed:
            if not conn.eof_received():
                transport.close()
            _spin(spins)
        if not transport.closed:  # the client goes away
            transport.closed = True
            conn.connection_lost(None)
        _spin(1000)
        still = LOOP._ready  # type: ignore[attr-defined]
        expect(not still, "callbacks still ready after 1000 loop iterations")
        cycle = conn.cycle
        expect(cycle is None or cycle.done(), "the connection's task did not end")
    finally:
        logger.removeHandler(FAILURES)
        conn.timer.cancel()
        if conn.cycle is not None and not conn.cycle.done():
            conn.cycle.cancel()
            _spin(2)
    expect(not PROBLEMS, f"unexpected: {PROBLEMS}")
    expect(not FAILURES.records, f"logged: {[r.getMessage() for r in FAILURES.records]}")
    return transport


def statuses(out: bytes) -> list[int]:
    """The status of each answer in ``out``; an answer a client parser cannot read fails the
    run."""
    answers = Answers()
    try:
        answers.parser.feed_data(out)
    except httptools.HttpParserError as exc:
        raise AssertionError(f"malformed answer ({exc}): {out[:300]!r}") from exc
    return answers.statuses


def test_one_input(data: bytes) -> None:
    control, sent = take(data, 1)
    server = HttpServer(_handler, SMALL if control & 16 else LIMITS)
    begun = sent.count(b"\n") + 1  # a bound on the requests that can begin
    out = bytes(drive(server, control, sent, MAX_PIECES, SPINS).out)
    expect(not server.conns, "the server still holds the connection")
    answered = statuses(out)
    for status in answered:
        expect(status in ALLOWED, f"answered {status}: {out[:300]!r}")
    finals = [s for s in answered if s >= 200]
    expect(len(finals) <= begun + 1, f"{len(finals)} answers to {begun} requests at most")


if __name__ == "__main__":
    main(test_one_input)
