"""Start v2proxy processes (``v2proxy serve`` / ``reference-server``) for interop tests, the way
a user does: as a separate process on loopback, stopped by its pid afterwards."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from peers.launch import _free_ports, _http_status, _stop


@dataclass
class Proc:
    name: str
    port: int
    grpc_port: int
    pid: int
    log: Path

    @property
    def url(self) -> str:
        """tritonclient style: host:port without scheme."""
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def https_status(url: str, ctx: ssl.SSLContext) -> int | None:
    """The status of a GET of ``url`` over TLS with the client context ``ctx`` (never through
    a proxy of the environment); None when nothing answers."""
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    try:
        with opener.open(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


@contextlib.contextmanager
def v2proxy(
    *args: str, name: str = "v2proxy", timeout: float = 30.0, tls: ssl.SSLContext | None = None
) -> Iterator[Proc]:
    """Run ``python -m v2proxy ARGS --host 127.0.0.1 --http-port P --grpc-port G`` (free ports)
    until the block ends; ready once its liveness answers 200. ``tls``: ARGS make it serve
    HTTPS, and its liveness is asked at https://localhost:P with this client context."""
    port, grpc_port = _free_ports(2)
    log = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
    cmd = [
        sys.executable,
        "-m",
        "v2proxy",
        *args,
        "--host",
        "127.0.0.1",
        "--http-port",
        str(port),
        "--grpc-port",
        str(grpc_port),
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while _live(port, tls) != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start ({cmd}):\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        yield Proc(name, port, grpc_port, proc.pid, log)
    finally:
        _stop(proc)
        assert proc.poll() is not None
        log.unlink(missing_ok=True)


def _live(port: int, tls: ssl.SSLContext | None) -> int | None:
    if tls is None:
        return _http_status(f"http://127.0.0.1:{port}/v2/health/live")
    return https_status(f"https://localhost:{port}/v2/health/live", tls)


def listening(port: int) -> int:
    """How many sockets listen on TCP ``port`` (each worker of ``--workers N`` binds its own with
    SO_REUSEPORT; the kernel spreads new connections only over those already bound)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    count += 1
    return count


def wait_listening(port: int, n: int, timeout: float = 30.0) -> None:
    """Wait until ``n`` sockets listen on ``port`` (every worker is up); AssertionError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while listening(port) < n:
        assert time.monotonic() < deadline, f"{listening(port)} of {n} workers listen on {port}"
        time.sleep(0.05)
