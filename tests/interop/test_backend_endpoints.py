"""Several backend endpoints: ``v2proxy serve --backend http://A,B,C`` (and ``grpc://``) in front
of three reference servers (``v2proxy reference-server``) on 127.0.0.1, 127.0.0.2 and
127.0.0.3, driven by tritonclient over HTTP.

- Requests spread across the three: each serves a third of them, within ±40 %.
- One killed (SIGKILL) mid-load: the requests that had not reached it are all answered (the
  proxy sends a request that found no connection to the next endpoint); the only failures are
  requests that may have reached it (at most the requests in flight: 502 for a REST backend,
  the connection lost: never sent again), while its failed attempts counted by the proxy are
  more than that (the ones that found it dead went elsewhere). Readiness holds while one
  answers. Restarted on the same address, it is back in rotation after its back-off.
- The proxy's /metrics shows the calls per endpoint.

No timing is asserted beyond clients' own timeouts of a few seconds.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from peers.launch import _free_ports, _http_status, _stop
from procs import Proc, v2proxy
from simple_io import IN0, IN1, http_inputs
from tritonclient.utils import InferenceServerException

HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
SUM = (IN0 + IN1).reshape(-1).tolist()
#: concurrent clients of the load
CLIENTS = 4


def _accepts(host: str, port: int) -> bool:
    """Whether ``host:port`` accepts a TCP connection."""
    try:
        socket.create_connection((host, port), timeout=0.5).close()
    except OSError:
        return False
    return True


@dataclass
class Server:
    host: str
    port: int
    grpc_port: int
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def start(self) -> None:
        fd, name = tempfile.mkstemp(prefix=f"ref-{self.host}-", suffix=".log")
        os.close(fd)
        self.log = Path(name)
        cmd = [sys.executable, "-m", "v2proxy", "reference-server", "--host", self.host]
        cmd += ["--http-port", str(self.port), "--grpc-port", str(self.grpc_port)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        # both ports: the gRPC one may open after the HTTP one, and a gRPC backend endpoint
        # refused at the first calls is out of rotation while the test counts what it served
        while _http_status(f"http://{self.host}:{self.port}/v2/health/live") != 200 or not _accepts(
            self.host, self.grpc_port
        ):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"reference server on {self.host} did not start:\n"
                                   f"{self.log.read_text()[-3000:]}")  # fmt: skip
            time.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _stop(self.proc)
        if self.log is not None:
            self.log.unlink(missing_ok=True)

    def served(self) -> int:
        """Inferences of ``simple`` this server answered (its own /metrics)."""
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://{self.host}:{self.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("v2proxy_requests_total{") and 'operation="infer"' in line:
                total += float(line.rsplit(" ", 1)[1]) if 'model="simple"' in line else 0.0
        return int(total)


@contextlib.contextmanager
def three_servers() -> Iterator[list[Server]]:
    servers = []
    try:
        for host in HOSTS:
            port, grpc_port = _free_ports(2)
            s = Server(host, port, grpc_port)
            servers.append(s)
            s.start()
        yield servers
    finally:
        for s in servers:
            s.stop()


def _url(kind: str, servers: list[Server]) -> str:
    if kind == "http":
        return "http://" + ",".join(f"{s.host}:{s.port}" for s in servers)
    return "grpc://" + ",".join(f"{s.host}:{s.grpc_port}" for s in servers)


def _infer(c: httpclient.InferenceServerClient) -> list[int]:
    out = c.infer("simple", http_inputs()).as_numpy("OUTPUT0")
    assert out is not None
    return [int(x) for x in out.reshape(-1)]


def _endpoint_calls(p: Proc) -> dict[tuple[str, str], float]:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{p.base_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found = {}
    pattern = r'_endpoint_calls_total\{backend_endpoint="([^"]+)",outcome="(\w+)"\} (\S+)'
    for m in re.finditer(pattern, text):
        found[(m.group(1), m.group(2))] = float(m.group(3))
    return found


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_requests_spread_across_the_backends(kind: str) -> None:
    with three_servers() as servers, v2proxy("serve", "--backend", _url(kind, servers),
                                             name=f"spread-{kind}") as p:  # fmt: skip
        n = 300
        per_client = n // CLIENTS
        answers: list[list[int]] = []
        lock = threading.Lock()

        def load() -> None:
            with httpclient.InferenceServerClient(p.url, network_timeout=30) as c:
                for _ in range(per_client):
                    out = _infer(c)
                    with lock:
                        answers.append(out)

        threads = [threading.Thread(target=load) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert answers == [SUM] * n
        # a server counts a request once its answer is on its way: the last ones may still be
        # being counted when their answers have arrived
        deadline = time.monotonic() + 10
        while sum(counts := [s.served() for s in servers]) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(counts) == n
        assert all(0.6 * n / 3 <= c <= 1.4 * n / 3 for c in counts), counts
        calls = _endpoint_calls(p)
        port = (lambda s: s.port) if kind == "http" else (lambda s: s.grpc_port)
        ok = {s.host: calls.get((f"{s.host}:{port(s)}", "ok"), 0.0) for s in servers}
        # every call the proxy made on each (its readiness and model look-ups included)
        assert all(ok[s.host] >= c for s, c in zip(servers, counts, strict=True)), (ok, counts)


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_one_backend_killed_mid_load_loses_no_request_and_comes_back(kind: str) -> None:
    with three_servers() as servers, v2proxy("serve", "--backend", _url(kind, servers),
                                             name=f"kill-{kind}") as p:  # fmt: skip
        victim = servers[1]
        stop = threading.Event()
        done = [0] * CLIENTS
        failures: list[tuple[str | None, str]] = []
        wrong: list[list[int]] = []
        lock = threading.Lock()

        def load(i: int) -> None:
            with httpclient.InferenceServerClient(p.url, network_timeout=30) as c:
                while not stop.is_set():
                    try:
                        out = _infer(c)
                    except InferenceServerException as exc:
                        with lock:
                            failures.append((exc.status(), exc.message()))
                        continue
                    if out != SUM:
                        wrong.append(out)
                    done[i] += 1

        def wait_done(more: int, timeout: float = 60.0) -> None:
            target = sum(done) + more
            deadline = time.monotonic() + timeout
            while sum(done) < target:
                assert time.monotonic() < deadline, (done, failures)
                time.sleep(0.01)

        threads = [threading.Thread(target=load, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        try:
            wait_done(60)
            assert victim.served() > 0
            victim.kill()
            # a few seconds of load with it dead: its back-offs (0.5, 1, 2 s ...) have the
            # proxy try it again several times, each attempt finding no connection
            end = time.monotonic() + 4.0
            while time.monotonic() < end:
                wait_done(1)
            # readiness while one (two) of three answer
            assert _http_status(f"{p.base_url}/v2/health/ready") == 200
            lost = len(failures)
            victim.start()  # the same address again
            before = victim.served()
            deadline = time.monotonic() + 30
            while victim.served() == before:  # back in rotation after its back-off
                assert time.monotonic() < deadline, "the restarted backend got no request"
                wait_done(5)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        assert wrong == []
        # only requests that may have reached the killed server failed: at most those in
        # flight then (one per client); each a 502/503 naming the backend, never a resend
        assert lost == len(failures) <= CLIENTS, failures
        for status, message in failures:
            assert status in ("502", "503"), (status, message)
            assert "backend" in message, message
        calls = _endpoint_calls(p)
        port = victim.port if kind == "http" else victim.grpc_port
        unreachable = calls.get((f"{victim.host}:{port}", "unreachable"), 0.0)
        # the proxy found it dead more often than requests failed: those went elsewhere
        assert unreachable > len(failures), (unreachable, failures)
