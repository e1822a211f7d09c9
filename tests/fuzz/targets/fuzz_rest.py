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

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzzlib import expect, instrumented, main, take

with instrumented(__name__ == "__main__"):
    from v2proxy.app_core import build_pipeline
    from v2proxy.backends.builtin import BuiltinBackend
    from v2proxy.core.restricted import RestrictedPolicy
    from v2proxy.frontends.rest import RestFrontend
    from v2proxy.http.request import ServerLimits
    from v2proxy.http.server import HttpServer
    from v2proxy.ops.config import Settings
    from v2proxy.ops.metrics_export import NullMetrics

from fuzz_http import drive, statuses

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
    server = HttpServer(_frontend().dispatch, LIMITS)
    transport = drive(server, control, sent, MAX_PIECES, 256)
    if b"HEAD" in sent:
        return
    for status in statuses(bytes(transport.out)):
        expect(status < 500 or status in (501, 503, 505), f"answered {status}: {transport.out!r}")


if __name__ == "__main__":
    main(test_one_input)
