"""Sick backends behind a running proxy (``v2proxy serve``): endpoints judged by what they do,
and every answer from the backend read within a bound.

- One backend URL with three host:port: a reference server, a black hole (accepts, reads, never
  answers) and one that answers bytes that are not HTTP. After the first failures (each bad
  endpoint's few in a row) every inference is served by the good one, readiness is 200 every
  time, and /metrics shows the two out of rotation with their timeouts and malformed answers.
- The same over a gRPC backend (``grpc://``): the black hole's DEADLINE_EXCEEDED count against
  it; grpcio meets the garbage in its handshake (UNAVAILABLE, nothing sent).
- A backend that answers every call with a 100 MB body (streamed by a small server here): 8
  concurrent readiness checks and a metadata call keep the proxy's RSS within 50 MiB of where
  it was; readiness is read only as far as its status, the metadata is a 502 naming the
  backend.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import socketserver
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

from peers.launch import _free_ports
from procs import Proc, v2proxy
from test_hostile import SIMPLE, rss_kib

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, data: bytes | None = None, timeout: float = 30.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with OPENER.open(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def _read_head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    return data


@contextlib.contextmanager
def tcp_server(host: str, handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """A threaded TCP server on ``host`` (a free port) calling ``handle`` per connection."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            with contextlib.suppress(OSError):
                handle(self.request)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    srv = Server((host, _free_ports(1)[0]), Handler)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=10)


def black_hole(conn: socket.socket) -> None:
    """Reads whatever comes and never answers (until the proxy gives up the connection)."""
    while conn.recv(65536):
        pass


def garbage(conn: socket.socket) -> None:
    """Answers each request with bytes that are not HTTP."""
    while _read_head(conn):
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\nthis is not HTTP at all\r\n\r\n")


def _metrics(p: Proc) -> str:
    return _get(f"{p.base_url}/metrics")[1].decode()


def _series(text: str, name: str) -> dict[tuple[str, ...], float]:
    found = {}
    for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
        labels = tuple(v for v in re.findall(r'="([^"]*)"', m.group(1)))
        found[labels] = float(m.group(2))
    return found


def test_a_black_hole_and_a_garbage_endpoint_are_taken_out() -> None:
    with (
        v2proxy("reference-server", name="sick-good") as good,
        tcp_server("127.0.0.2", black_hole) as hole_port,
        tcp_server("127.0.0.3", garbage) as junk_port,
    ):
        good_ep = f"127.0.0.1:{good.port}"
        hole, junk = f"127.0.0.2:{hole_port}", f"127.0.0.3:{junk_port}"
        url = f"http://{good_ep},{hole},{junk}"
        with v2proxy(
            "serve", "--backend", url, "--backend-timeout", "1", "--backend-encoding", "json",
            name="sick-proxy",
        ) as p:  # fmt: skip
            infer = f"{p.base_url}/v2/models/simple/infer"
            # the first failures: each bad endpoint fails a few calls in a row, then is out
            for _ in range(30):
                up = _series(_metrics(p), "v2proxy_backend_endpoint_up")
                if up.get((hole,)) == 0.0 and up.get((junk,)) == 0.0:
                    break
                _get(infer, SIMPLE)
            else:
                raise AssertionError(f"the bad endpoints stay in rotation: {up}")
            # from now on: every inference served by the good one, readiness 200 every time
            statuses = [_get(infer, SIMPLE)[0] for _ in range(12)]
            ready = [_get(f"{p.base_url}/v2/health/ready")[0] for _ in range(12)]
            assert statuses == [200] * 12
            assert ready == [200] * 12
            text = _metrics(p)
            up = _series(text, "v2proxy_backend_endpoint_up")
            assert up == {(good_ep,): 1.0, (hole,): 0.0, (junk,): 0.0}
            calls = _series(text, "v2proxy_backend_endpoint_calls_total")
            assert calls[(hole, "timeout")] >= 3
            assert calls[(junk, "malformed")] >= 3
            assert calls[(good_ep, "ok")] >= 24
            assert calls[(good_ep, "timeout")] == calls[(good_ep, "malformed")] == 0


def test_readiness_is_asked_of_the_next_endpoint_when_one_fails() -> None:
    with (
        v2proxy("reference-server", name="sick-good-ready") as good,
        tcp_server("127.0.0.2", black_hole) as hole_port,
        tcp_server("127.0.0.3", garbage) as junk_port,
    ):
        url = f"http://127.0.0.2:{hole_port},127.0.0.3:{junk_port},127.0.0.1:{good.port}"
        with v2proxy("serve", "--backend", url, "--backend-timeout", "1", name="sick-ready") as p:
            # from the very first question, whichever endpoint it starts with
            assert [_get(f"{p.base_url}/v2/health/ready")[0] for _ in range(6)] == [200] * 6
            status, body = _get(f"{p.base_url}/v2/models/simple")
            assert status == 200 and json.loads(body)["name"] == "simple"


#: the size of every answer of the bloated backend
HUGE = 100_000_000


def bloated(conn: socket.socket) -> None:
    """Answers every request 200 with a JSON body of :data:`HUGE` bytes, sent piece by piece."""
    if not _read_head(conn):
        return
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {HUGE}\r\n\r\n".encode()
        + b'{"pad":"'
    )
    piece = b"x" * 65536
    left = HUGE - len(b'{"pad":"') - len(b'"}')
    while left > 0:
        n = min(left, len(piece))
        conn.sendall(piece[:n])
        left -= n
    conn.sendall(b'"}')


def test_huge_answers_to_health_and_metadata_are_not_read_whole() -> None:
    with tcp_server("127.0.0.1", bloated) as port:
        backend = f"http://127.0.0.1:{port}"
        with v2proxy("serve", "--backend", backend, "--backend-timeout", "30",
                     name="bloated") as p:  # fmt: skip
            assert _get(f"{p.base_url}/v2/health/live")[0] == 200
            before = rss_kib(p.pid)
            peak = [before]
            done = threading.Event()

            def sample() -> None:
                while not done.is_set():
                    peak.append(rss_kib(p.pid))
                    time.sleep(0.01)

            sampler = threading.Thread(target=sample)
            sampler.start()
            results: dict[str, tuple[int, bytes]] = {}

            def ask(key: str, path: str) -> None:
                results[key] = _get(f"{p.base_url}{path}", timeout=60)

            threads = [
                threading.Thread(target=ask, args=(f"ready{i}", "/v2/health/ready"))
                for i in range(8)
            ]
            threads.append(threading.Thread(target=ask, args=("meta", "/v2")))
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=90)
            done.set()
            sampler.join()
            growth_mib = (max(peak) - before) / 1024
            assert growth_mib < 50, f"proxy RSS grew by {growth_mib:.0f} MiB"
            assert [results[f"ready{i}"][0] for i in range(8)] == [200] * 8
            status, body = results["meta"]
            assert status == 502, (status, body[:200])
            message = json.loads(body)["error"]
            assert backend in message and "--backend-max-answer-size" in message, message
            assert _get(f"{p.base_url}/v2/health/live")[0] == 200


def test_grpc_black_hole_and_garbage_endpoints_are_taken_out() -> None:
    with (
        v2proxy("reference-server", name="sick-good-grpc") as good,
        tcp_server("127.0.0.2", black_hole) as hole_port,
        tcp_server("127.0.0.3", garbage) as junk_port,
    ):
        good_ep = f"127.0.0.1:{good.grpc_port}"
        hole, junk = f"127.0.0.2:{hole_port}", f"127.0.0.3:{junk_port}"
        url = f"grpc://{good_ep},{hole},{junk}"
        with v2proxy("serve", "--backend", url, "--backend-timeout", "1",
                     name="sick-proxy-grpc") as p:  # fmt: skip
            infer = f"{p.base_url}/v2/models/simple/infer"
            assert [_get(f"{p.base_url}/v2/health/ready")[0] for _ in range(6)] == [200] * 6
            for _ in range(30):
                up = _series(_metrics(p), "v2proxy_backend_endpoint_up")
                if up.get((hole,)) == 0.0 and up.get((junk,)) == 0.0:
                    break
                _get(infer, SIMPLE)
            else:
                raise AssertionError(f"the bad endpoints stay in rotation: {up}")
            statuses = [_get(infer, SIMPLE)[0] for _ in range(12)]
            ready = [_get(f"{p.base_url}/v2/health/ready")[0] for _ in range(12)]
            assert statuses == [200] * 12
            assert ready == [200] * 12
            calls = _series(_metrics(p), "v2proxy_backend_endpoint_calls_total")
            assert calls[(hole, "timeout")] >= 3
            # grpcio meets the garbage in its handshake: UNAVAILABLE before anything was sent
            assert calls[(junk, "unreachable")] + calls[(junk, "malformed")] >= 1
            assert calls[(good_ep, "timeout")] == calls[(good_ep, "malformed")] == 0
