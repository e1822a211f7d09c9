"""The floor of v2proxy's small relayed /infer: floorrelay.py plus every duty that path has,
each done the least way on the same stack (uvloop + httptools), all from the protocols'
callbacks. A measuring stick, never a product: it serves only ``POST /v2/models/<m>/infer``
with a whole JSON body to one backend, and answers 502 for whatever else.

Per request, on top of floorrelay.py's parse, drop and rewrite:

- limits: the head's field count, Content-Length within ``--max-body-size``;
- deadlines: the client connection's keep-alive and the backend call's, each a float checked
  by one timer per connection re-armed only when it fires (no timer call per request);
- the route: the path looked up in a cache of model names (a regex on a new path);
- the headers, one pass: the hop-by-hop and own ones dropped, ``x-request-id`` taken, and a
  compressed or binary-framed body declined;
- access: the API group looked up in the restricted set; admission: an in-flight count;
- the one decision: v2proxy's own ``relays_as_sent`` (the check that no stage applies to the
  body and the decoder would accept it);
- the backend head prepared once per model; the answer checked to be a JSON object (v2proxy's
  ``is_object``), written back with ``x-request-id``;
- the record: a count per (model, status), bytes in and out, and the latency into histogram
  buckets, in plain Python numbers (turned into metric families at scrape time).

    python benchmarks/floorpath.py --port 9100 --backend 127.0.0.1:8000
    python benchmarks/floorpath.py 9100 127.0.0.1 8000
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
from bisect import bisect_left
from collections import defaultdict
from time import perf_counter
from typing import cast

import httptools
import uvloop

from v2proxy.codecs.json import is_object
from v2proxy.core.decide import relays_as_sent

DROPPED = frozenset(
    b"connection keep-alive proxy-connection te trailer transfer-encoding upgrade"
    b" content-length host accept-encoding content-encoding"
    b" inference-header-content-length".split()
)
DECLINED = frozenset((b"content-encoding", b"inference-header-content-length"))
BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
INFER = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
MAX_BODY = 64 * 1024 * 1024
MAX_HEADERS = 100
TIMEOUT = 60.0


class Record:
    """What the metrics scrape reads: plain numbers."""

    def __init__(self) -> None:
        self.count: defaultdict[tuple[str, int], int] = defaultdict(int)
        self.bytes_in = self.bytes_out = 0
        self.latency = [0] * (len(BUCKETS) + 1)
        self.latency_sum = 0.0


class Shared:
    """The relay's one backend, its idle connections and what all requests share."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.host_line = b"host: %s:%d\r\n" % (host.encode(), port)
        self.idle: list[Backend] = []
        self.heads: dict[bytes, tuple[str, bytes] | None] = {}  # path -> model, backend head
        self.restricted: frozenset[str] = frozenset()
        self.in_flight = 0
        self.limit = 1024
        self.record = Record()
        self.tasks: set[asyncio.Task[None]] = set()

    def route(self, url: bytes) -> tuple[str, bytes] | None:
        found = self.heads.get(url, False)
        if found is False:
            m = INFER.fullmatch(url.decode("latin-1"))
            found = None
            if m is not None:
                found = (m.group(1), b"POST " + url + b" HTTP/1.1\r\n" + self.host_line)
            self.heads[url] = found
        return found  # type: ignore[return-value]

    def send(self, request: bytes, client: Client) -> None:
        if self.idle:
            self.idle.pop().send(request, client)
            return
        task = asyncio.get_running_loop().create_task(self._connect(request, client))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _connect(self, request: bytes, client: Client) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, backend = await loop.create_connection(lambda: Backend(self), self.host, self.port)
        except OSError:
            client.answer(BAD_GATEWAY, 502, False)
        else:
            backend.send(request, client)


class Timed(asyncio.Protocol):
    """A connection with one deadline, checked by a timer re-armed only when it fires."""

    transport: asyncio.Transport

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def due(self, when: float) -> None:
        self.deadline = when
        if self.timer is None:
            self.timer = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self.timer = None
        if self.deadline and self.loop.time() >= self.deadline:
            self.expired()
        elif self.deadline:
            self.timer = self.loop.call_at(self.deadline, self._fire)

    def expired(self) -> None:
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Backend(Timed):
    def __init__(self, shared: Shared) -> None:
        super().__init__()
        self.shared = shared
        self.parser = httptools.HttpResponseParser(self)
        self.client: Client | None = None
        self.ctype = b""
        self.body: list[bytes] = []

    def send(self, request: bytes, client: Client) -> None:
        self.client = client
        self.due(self.loop.time() + TIMEOUT)
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.ctype = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.deadline = 0.0
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        status = self.parser.get_status_code()
        client, self.client = self.client, None
        if self.parser.should_keep_alive():
            self.shared.idle.append(self)
        else:
            self.transport.close()
        if client is None:
            return
        if status != 200 or self.ctype != b"application/json" or not is_object(body):
            client.answer(BAD_GATEWAY, 502, False)
            return
        client.answer_body(body)

    def expired(self) -> None:
        self.connection_lost(None)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self in self.shared.idle:
            self.shared.idle.remove(self)
        if self.client is not None:
            self.client.answer(BAD_GATEWAY, 502, False)
            self.client = None


class Client(Timed):
    def __init__(self, shared: Shared) -> None:
        super().__init__()
        self.shared = shared
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.model = ""
        self.rid: bytes | None = None
        self.started = 0.0
        self.size = 0
        self.in_flight = False

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.answer(BAD_GATEWAY, 400, False)

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if len(self.headers) > MAX_HEADERS:
            raise ValueError("too many headers")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        shared = self.shared
        self.started = perf_counter()
        found = shared.route(self.url) if self.parser.get_method() == b"POST" else None
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        if found is None or len(body) > MAX_BODY or "inference" in shared.restricted:
            self.answer(BAD_GATEWAY, 502, False)
            return
        model, head = found
        out = [head]
        rid = None
        for name, value in self.headers:
            if name not in DROPPED:
                out += (name, b": ", value, b"\r\n")
                if name == b"x-request-id":
                    rid = value
            elif name in DECLINED:
                self.answer(BAD_GATEWAY, 502, False)
                return
        if shared.in_flight >= shared.limit or not relays_as_sent(body, MAX_BODY, 64):
            self.answer(BAD_GATEWAY, 502, False)
            return
        shared.in_flight += 1
        self.model, self.rid, self.size = model, rid, len(body)
        out += (b"content-length: %d\r\n\r\n" % len(body), body)
        self.deadline = 0.0  # none while the answer is due
        shared.send(b"".join(out), self)

    def answer_body(self, body: bytes) -> None:
        rid = self.rid
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        if rid is not None:
            head += b"x-request-id: " + rid + b"\r\n"
        self.answer(b"%scontent-length: %d\r\n\r\n%s" % (head, len(body), body), 200, True)

    def answer(self, data: bytes, status: int, keep: bool) -> None:
        shared = self.shared
        if self.started:
            shared.in_flight -= 1
            record = shared.record
            elapsed = perf_counter() - self.started
            self.started = 0.0
            record.count[self.model, status] += 1
            record.bytes_in += self.size
            record.bytes_out += len(data)
            record.latency[bisect_left(BUCKETS, elapsed)] += 1
            record.latency_sum += elapsed
        if self.transport.is_closing():
            return
        self.transport.write(data)
        if not (keep and self.parser.should_keep_alive()):
            self.transport.close()
        else:
            self.due(self.loop.time() + TIMEOUT)


async def start(port: int, backend: str, shared: Shared | None = None) -> asyncio.Server:
    """A server relaying 127.0.0.1:``port`` (0: any free port) to ``backend`` (host:port);
    ``shared``: its state (its record read by tests), made here when not given."""
    if shared is None:
        host, _, bport = backend.rpartition(":")
        shared = Shared(host, int(bport))
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: Client(shared), "127.0.0.1", port)


async def _main(port: int, backend: str) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with await start(port, backend):
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int)
    parser.add_argument("--backend", help="host:port")
    # or positionally, PORT BACKEND_HOST BACKEND_PORT, as a floor relay is started to be counted
    parser.add_argument("positional", nargs="*")
    args = parser.parse_args()
    if args.positional:
        port, host, bport = args.positional
        args.port, args.backend = int(port), f"{host}:{bport}"
    if args.port is None or args.backend is None:
        parser.error("--port and --backend (or PORT HOST BACKEND_PORT) are required")
    uvloop.run(_main(args.port, args.backend))


if __name__ == "__main__":
    main()
