"""The processes of the fault-injection matrix: ``v2proxy reference-server``, a
:class:`~tests.faults.fault_relay.Relay` in front of each of its ports (REST, gRPC) and a
``v2proxy serve`` behind each relay (--backend-timeout per transport, no backend shared
memory: every byte through the relay), on loopback, each stopped by its pid.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.faults.fault_relay import Relay
from tests.faults.fault_requests import KINDS, TIMEOUTS, TRANSPORTS, Outcome, request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _live(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@dataclass
class Server:
    name: str
    http_port: int
    grpc_port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def wait_live(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not _live(self.http_port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM by its pid, SIGKILL after 5 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.unlink(missing_ok=True)


def spawn(*args: str, name: str) -> Server:
    """``python -m v2proxy ARGS`` on loopback (free ports), not yet waited for."""
    http_port, grpc_port = _free_port(), _free_port()
    log = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "v2proxy", *args, "--host", "127.0.0.1"]
    cmd += ["--http-port", str(http_port), "--grpc-port", str(grpc_port), "--drain-timeout", "1"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    return Server(name, http_port, grpc_port, proc, log)


@dataclass
class Stack:
    """The reference server, a relay in front of each of its ports, a proxy behind each relay."""

    relays: dict[str, Relay]
    proxies: dict[str, Server]
    reference: Server

    def run(self, transport: str, kind: str) -> Outcome:
        """One request of ``kind`` through the proxy in front of ``transport``, classified."""
        proxy = self.proxies[transport]
        return request(transport, kind, proxy.http_port, proxy.grpc_port)


@contextlib.contextmanager
def stack(loop: str = "uvloop") -> Iterator[Stack]:
    """The processes start together (the proxies reach the backend only when asked), then the
    stack is warmed up: each kind once through each proxy (the first requests also ask the
    backend's metadata)."""
    with contextlib.ExitStack() as es:
        ref = spawn("reference-server", name="fault-reference")
        es.callback(ref.stop)
        relays = {
            "rest": Relay("127.0.0.1", ref.http_port),
            "grpc": Relay("127.0.0.1", ref.grpc_port),
        }
        proxies = {}
        for transport, relay in relays.items():
            es.callback(relay.close)
            relay.start()
            scheme = "http" if transport == "rest" else "grpc"
            proxies[transport] = spawn(
                "serve",
                "--backend",
                f"{scheme}://{relay.address}",
                "--backend-timeout",
                str(TIMEOUTS[transport]),
                "--backend-connect-timeout",
                str(TIMEOUTS[transport]),
                "--backend-shm",
                "off",  # every byte through the relay
                "--event-loop",
                loop,
                name=f"fault-proxy-{transport}",
            )
            es.callback(proxies[transport].stop)
        for server in (ref, *proxies.values()):
            server.wait_live()
        st = Stack(relays, proxies, ref)
        for transport in TRANSPORTS:
            for kind in KINDS:
                for _ in range(10):  # a loaded machine may make one late; the gRPC channel
                    out = st.run(transport, kind)  # may wait out its reconnect backoff
                    if out.cls == "ok":
                        break
                    time.sleep(0.3)
                else:
                    raise RuntimeError(f"{transport} {kind} fails without a fault: {out}")
        yield st
