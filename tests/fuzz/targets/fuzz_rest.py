"""Fuzz target: every REST route of v2proxy fed raw HTTP bytes (Triton's L0_http_fuzz, without
sockets): the real REST frontend (routing, the v2 routes and extensions, generate, MindIE's
/infer, /metrics) over the builtin reference models, behind the HTTP server's connection object
and the fake transport of :mod:`fuzz_http`. Every API group is open (no restricted routes);
client shared memory is off (the fuzzer must not map other processes' segments); a fresh
backend and pipeline per run, so that no run's model unloading or settings leak into the next.

Input: a control byte (as for fuzz_http: bits 0-2 the piece size, bit 3 a half-close), then the
bytes the client sends. The seeds are real requests to each route.

Invariants: no answer is a 5xx other than 501/503 (a client's bytes never make a 500, 502 or
504 here: there is no remote backend to fail); nothing is logged at ERROR (an exception that
escaped to the frontend's or the server's catch-all); answers are well-framed HTTP/1.1 (not
checked when a HEAD request was sent: its answer has a length and no body); when the client goes
away, the connection's task ends and no callback is left running.
"""

from __future__ import annotations

import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzzlib import expect, instrumented, main, take

with instrumented(__name__ == "__main__"):
    import httptools

    from v2proxy.app import build_pipeline
    from v2proxy.backends.builtin import BuiltinBackend
    from v2proxy.config import Settings
    from v2proxy.frontends.rest import RestFrontend
    from v2proxy.http.request import ServerLimits
    from v2proxy.http.server import HttpServer
    from v2proxy.metrics_export import NullMetrics
    from v2proxy.restricted import RestrictedPolicy

from fuzz_http import FAILURES, LOOP, PIECES, PROBLEMS, Answers, Transport, _spin

SETTINGS = Settings(
    max_input_size=1 << 16,
    max_body_size=1 << 18,
    client_shm="off",
    restricted=RestrictedPolicy(groups=frozenset()),  # every route open
)
LIMITS = ServerLimits(max_body_size=SETTINGS.max_body_size)
MAX_PIECES = 16


def _frontend() -> RestFrontend:
    pipeline = build_pipeline(SETTINGS, BuiltinBackend(), cuda_adapter=None)
    return RestFrontend(
        pipeline, SETTINGS.max_input_size, SETTINGS.max_body_size, NullMetrics(), False
    )


def test_one_input(data: bytes) -> None:
    control, sent = take(data, 1)
    piece = PIECES[control & 7]
    server = HttpServer(_frontend().dispatch, LIMITS)
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
        for i in range(MAX_PIECES):
            if pos >= len(sent) or transport.closed or transport.paused:
                break
            end = pos + piece if i < MAX_PIECES - 1 else len(sent)
            conn.data_received(sent[pos:end])
            pos = end
            _spin(256)
        if control & 8 and not transport.closed:
            if not conn.eof_received():
                transport.close()
            _spin(256)
        if not transport.closed:
            transport.closed = True
            conn.connection_lost(None)
        _spin(1000)
        still = LOOP._ready  # type: ignore[attr-defined]
        expect(not still, "callbacks still ready after 1000 loop iterations")
        expect(conn.cycle is None or conn.cycle.done(), "the connection's task did not end")
    finally:
        logger.removeHandler(FAILURES)
        if conn.timer is not None:
            conn.timer.cancel()
        if conn.cycle is not None and not conn.cycle.done():
            conn.cycle.cancel()
            _spin(2)
    expect(not PROBLEMS, f"unexpected: {PROBLEMS}")
    expect(not FAILURES.records, f"logged: {[r.getMessage() for r in FAILURES.records]}")
    if b"HEAD" in sent:
        return
    answers = Answers()
    try:
        answers.parser.feed_data(bytes(transport.out))
    except httptools.HttpParserError as exc:
        raise AssertionError(f"malformed answer ({exc}): {bytes(transport.out)[:300]!r}") from exc
    for status in answers.statuses:
        expect(status < 500 or status in (501, 503, 505), f"answered {status}: {transport.out!r}")


if __name__ == "__main__":
    main(test_one_input)
