"""CPU per request of v2proxy on the small relayed path: a repeatable measure for tuning it.

Starts a backend (``v2proxy reference-server``, or a real Triton from the interop peers with
``--backend triton``) and ``v2proxy serve`` in front of it as subprocesses, then drives N small
JSON infers (the ``simple`` model's body of :mod:`benchmarks.bodies`: 2 x INT32[1,16]) through
it with a lean keep-alive client (raw sockets, one pre-built request, answers framed by their
Content-Length only) at each concurrency asked for. Reported per concurrency: the proxy's CPU
per request (user + sys, from ``/proc/<pid>/stat`` around the measured phase, after a warm-up),
the backend's, requests per second and (c=1) the median latency.

``--src DIR`` runs the proxy from another source tree (a copy of ``src/`` made before a change)
so two versions can be measured in alternating rounds on this noisy machine (``--rounds``,
``--src`` may be given twice: ``--src /tmp/before --src src``). Every answer is checked to be a
200 carrying OUTPUT0. ``--callgrind`` runs the proxy under valgrind and reports instructions per
request (deterministic; slow: use a small ``--n``).

    .venv/bin/python benchmarks/proxy_cpu.py --n 4000 --concurrency 1,16 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import selectors
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
TICK = os.sysconf("SC_CLK_TCK")


def simple_body() -> bytes:
    """The benchmark's ``simple_json`` body (benchmarks/bodies.py), byte for byte."""
    in0 = np.arange(16, dtype=np.int32)
    in1 = np.full(16, 3, dtype=np.int32)
    obj = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": in0},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": in1},
        ]
    }
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def request_bytes(port: int, model: str = "simple") -> bytes:
    body = simple_body()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"port {port} did not open in {timeout} s")


def cpu_s(pid: int) -> tuple[float, float]:
    """(user, sys) CPU seconds of process ``pid`` (all its threads)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


class _Conn:
    __slots__ = ("buf", "need", "sent_at", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.need = -1
        self.sent_at = 0.0


_CL = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)


def drive(port: int, request: bytes, n: int, concurrency: int) -> tuple[float, list[float]]:
    """Send ``n`` requests on ``concurrency`` keep-alive connections; (seconds, latencies)."""
    sel = selectors.DefaultSelector()
    conns = []
    for _ in range(concurrency):
        s = socket.create_connection((HOST, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        c = _Conn(s)
        conns.append(c)
        sel.register(s, selectors.EVENT_READ, c)
    sent = done = 0
    lat: list[float] = []
    t0 = time.perf_counter()
    for c in conns:
        if sent < n:
            c.sent_at = time.perf_counter()
            c.sock.sendall(request)
            sent += 1
    while done < n:
        for key, _ in sel.select(30.0):
            c = key.data
            chunk = c.sock.recv(65536)
            if not chunk:
                raise RuntimeError("the proxy closed a connection")
            c.buf += chunk
            while True:
                if c.need < 0:
                    i = c.buf.find(b"\r\n\r\n")
                    if i < 0:
                        break
                    head = c.buf[:i]
                    if not head.startswith(b"HTTP/1.1 200"):
                        raise RuntimeError(f"answer: {c.buf[:300]!r}")
                    m = _CL.search(head)
                    if m is None:
                        raise RuntimeError(f"answer without Content-Length: {head!r}")
                    c.need = i + 4 + int(m.group(1))
                if len(c.buf) < c.need:
                    break
                if b"OUTPUT0" not in c.buf[: c.need]:
                    raise RuntimeError(f"answer: {c.buf[: c.need]!r}")
                c.buf = c.buf[c.need :]
                c.need = -1
                now = time.perf_counter()
                lat.append(now - c.sent_at)
                done += 1
                if sent < n:
                    c.sent_at = now
                    c.sock.sendall(request)
                    sent += 1
    wall = time.perf_counter() - t0
    for c in conns:
        c.sock.close()
    sel.close()
    return wall, lat


@contextlib.contextmanager
def process(cmd: list[str], port: int, env: dict[str, str], timeout: float) -> Iterator[int]:
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_port(port, timeout, proc)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def backend(kind: str) -> Iterator[tuple[str, int]]:
    """(base URL, pid) of the backend."""
    if kind == "triton":
        sys.path.insert(0, str(REPO / "tests" / "interop" / "peers"))
        import launch  # type: ignore[import-not-found]

        with launch.triton_server(launch.peers_dir()) as peer:
            yield peer.base_url, peer.pid  # http_url is host:port, no scheme
        return
    port = free_port()
    cmd = [sys.executable, "-m", "v2proxy", "reference-server", "--host", HOST]
    cmd += ["--http-port", str(port), "--grpc-port", str(free_port()), "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    with process(cmd, port, env, 60) as pid:
        yield f"http://{HOST}:{port}", pid


@contextlib.contextmanager
def proxy(
    src: str,
    url: str,
    callgrind: Path | None,
    extra: list[str] | None = None,
    listen: str = "http",
) -> Iterator[tuple[int, int]]:
    """(port, pid) of ``v2proxy serve`` run from source tree ``src`` (``extra``: more
    ``serve`` arguments; ``listen``: the port returned, ``http`` or ``grpc``)."""
    port, other = free_port(), free_port()
    http, grpc = (port, other) if listen == "http" else (other, port)
    cmd = [sys.executable, "-m", "v2proxy", "serve", "--backend", url, "--host", HOST]
    cmd += ["--http-port", str(http), "--grpc-port", str(grpc)]
    cmd += ["--event-loop", "uvloop", "--log-level", "warning", *(extra or [])]
    if callgrind is not None:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={callgrind}",
            *cmd,
        ]
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    with process(cmd, port, env, 300 if callgrind else 30) as pid:
        yield port, pid


def measure(
    src: str,
    url: str,
    backend_pid: int,
    n: int,
    concurrencies: list[int],
    warmup: int,
    extra: list[str] | None = None,
) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    with proxy(src, url, None, extra) as (port, pid):
        req = request_bytes(port)
        drive(port, req, warmup, max(concurrencies))
        for c in concurrencies:
            u0, s0 = cpu_s(pid)
            bu0, bs0 = cpu_s(backend_pid)
            wall, lat = drive(port, req, n, c)
            u1, s1 = cpu_s(pid)
            bu1, bs1 = cpu_s(backend_pid)
            out[c] = {
                "user": (u1 - u0) / n * 1e6,
                "sys": (s1 - s0) / n * 1e6,
                "cpu": (u1 - u0 + s1 - s0) / n * 1e6,
                "backend": (bu1 - bu0 + bs1 - bs0) / n * 1e6,
                "rps": n / wall,
                "p50": statistics.median(lat) * 1e6,
            }
    return out


def callgrind_run(src: str, url: str, n: int, warmup: int, extra: list[str] | None = None) -> float:
    """Instructions per request of the proxy (valgrind callgrind, c=1)."""
    if shutil.which("callgrind_control") is None:
        raise SystemExit("callgrind_control not found")
    folder = Path(tempfile.mkdtemp(prefix="proxy_cpu_"))
    out = folder / "callgrind.out"
    with proxy(src, url, out, extra) as (port, pid):
        req = request_bytes(port)
        drive(port, req, warmup, 1)
        subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)
        drive(port, req, n, 1)
        subprocess.run(
            ["callgrind_control", "-i", "off", str(pid)], check=True, capture_output=True
        )
    text = "".join(p.read_text(errors="replace") for p in folder.glob("callgrind.out*"))
    totals = [int(m) for m in re.findall(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)]
    print(f"callgrind output in {folder}", file=sys.stderr)
    return max(totals) / n if totals else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="reference", help="reference, triton or a URL")
    ap.add_argument("--src", action="append", help="source tree(s) of the proxy (default src)")
    ap.add_argument("--n", type=int, default=4000, help="requests per measured phase")
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--callgrind", action="store_true", help="instructions per request instead")
    ap.add_argument(
        "--serve-args",
        default="",
        help="extra `v2proxy serve` arguments, e.g. '--metrics off'",
    )
    args = ap.parse_args()
    extra = shlex.split(args.serve_args)
    srcs = args.src or [str(REPO / "src")]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    results: dict[str, list[dict[int, dict[str, float]]]] = {s: [] for s in srcs}
    with contextlib.ExitStack() as stack:
        if args.backend.startswith("http"):
            url, backend_pid = args.backend, os.getpid()
        else:
            url, backend_pid = stack.enter_context(backend(args.backend))
        if args.callgrind:
            for _ in range(args.rounds):
                for s in srcs:
                    ir = callgrind_run(s, url, args.n, min(args.warmup, 200), extra)
                    print(f"{s}: {ir:,.0f} instructions/request (c=1)", flush=True)
            return 0
        for r in range(args.rounds):
            for s in srcs:
                res = measure(s, url, backend_pid, args.n, concurrencies, args.warmup, extra)
                results[s].append(res)
                for c, m in res.items():
                    print(
                        f"round {r} {s} c={c}: proxy {m['cpu']:.1f} µs/req (user {m['user']:.1f}"
                        f" sys {m['sys']:.1f}), backend {m['backend']:.1f}, {m['rps']:.0f} req/s,"
                        f" p50 {m['p50']:.0f} µs",
                        flush=True,
                    )
    print("median over rounds:")
    for s in srcs:
        for c in concurrencies:
            cpu = statistics.median(r[c]["cpu"] for r in results[s])
            rps = statistics.median(r[c]["rps"] for r in results[s])
            p50 = statistics.median(r[c]["p50"] for r in results[s])
            print(f"  {s} c={c}: proxy {cpu:.1f} µs/req, {rps:.0f} req/s, p50 {p50:.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
