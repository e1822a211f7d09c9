"""Scenario (d) under the microscope: a 1 M FP32 JSON body (19 MB) relayed to MLServer.

Modes (run with the project venv from the repository root):

``stages``
    Times, in this process, what v2proxy does with the body: the full decode that builds the
    tensor bytes (``codecs.binary.decode_request``, the path of a body read whole), simdjson's
    parse alone, the streamed check (``codecs.json_stream.StreamCheck`` fed 64 KiB pieces) and
    ``Pipeline.relay_json`` end to end in front of a backend that takes the bytes and answers
    at once (check, kept copy, hold-back: everything but the sockets). Medians.

``e2e``
    Starts MLServer (as the interop tests do), nginx (``--nginx``) and one ``v2proxy serve
    --backend http://MLSERVER --backend-encoding auto`` per ``--variant NAME=SRC`` (SRC goes
    first on PYTHONPATH, so that two source trees are compared in the same run) and checks one
    answer from each. ``--tool wrk`` (default) then runs wrk (one connection, ``--seconds``
    each) over the systems in turn, ``--rounds`` times, and prints each round's mean, the
    medians and the proxy's CPU per request; ``--tool phases`` sends ``--rounds`` requests to
    each system in turn from one raw-socket client and prints the medians of three phases: the
    upload (until the client's last byte is taken), until the answer's head, and the answer;
    ``--rate MB/s`` paces its uploads as a client's link would (125: 1 Gbit/s).

    .venv/bin/python benchmarks/bigjson.py e2e --variant before=/tmp/before/src \\
        --variant after=src --nginx --rounds 7 --seconds 4

Every process started here is stopped again (its process group).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import loadgen  # noqa: E402
import procs  # noqa: E402

MODEL = "identity_fp32"
N = 1_000_000


def make_body(n: int = N, seed: int = 0) -> bytes:
    """The body of scenario (d): FP32 numbers widened to doubles, as a Python client writes."""
    fp32 = np.random.default_rng(seed).random(n, dtype=np.float32)
    obj = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [n], "data": fp32.astype(np.float64)}
        ]
    }
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


# --------------------------------------------------------------------------- stages


def _median_ms(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def stages(repeat: int) -> None:
    import asyncio

    import simdjson

    from v2proxy.codecs import binary as binc
    from v2proxy.codecs import json_stream
    from v2proxy.codecs.json_data import DEFAULT_MAX_INPUT_SIZE
    from v2proxy.core.pipeline import Pipeline

    body = make_body()
    whole = bytearray(body)  # as the REST frontend reads a body
    pieces = [body[i : i + 65536] for i in range(0, len(body), 65536)]
    print(f"body: {len(body)} bytes in {len(pieces)} pieces of 64 KiB, median of {repeat}")
    parser = simdjson.Parser()

    def parse_only() -> None:
        doc = parser.parse(body)
        del doc

    def streamed_check() -> None:
        check = json_stream.StreamCheck(MODEL, "", DEFAULT_MAX_INPUT_SIZE)
        for piece in pieces:
            check.feed(piece)
        assert check.finish() is not None

    pipeline = Pipeline(_DropBackend(), DEFAULT_MAX_INPUT_SIZE)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()

    def relay_json() -> None:
        from v2proxy.core.ports import ForwardResponse, StreamedBody

        async def chunks() -> Any:
            for piece in pieces:
                yield piece

        out = loop.run_until_complete(
            pipeline.relay_json(MODEL, "", StreamedBody(len(body), chunks()), [])
        )
        assert isinstance(out, ForwardResponse)

    rows: list[tuple[str, Callable[[], Any]]] = [
        ("copy: bytearray(body)", lambda: bytearray(body)),
        ("simdjson parse alone", parse_only),
        ("decode_request (full: tensor bytes)", lambda: binc.decode_request(whole, None, MODEL)),
        ("StreamCheck, 64 KiB pieces", streamed_check),
        ("Pipeline.relay_json (no sockets)", relay_json),
    ]
    for name, fn in rows:
        fn()  # warm up
        print(f"  {name:40s} {_median_ms(fn, repeat):8.2f} ms")
    loop.close()


class _DropBackend:
    """Takes a relayed body and answers at once (the pipeline's own cost, without sockets)."""

    async def can_relay(self, binary: bool, size: int = 0) -> bool:
        return not binary

    async def relay_infer(
        self, model: str, version: str, body: Any, ihcl: int | None, headers: Any
    ) -> Any:
        from v2proxy.core.ports import ForwardResponse

        async for _ in body.chunks:
            pass

        async def nothing() -> Any:
            return
            yield b""

        return ForwardResponse(200, [], nothing(), content=b"{}")


# --------------------------------------------------------------------------- end to end


def _post(port: int, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=60) as resp:
        return int(resp.status), resp.read()


def _check_answer(port: int, body: bytes) -> str | None:
    status, answer = _post(port, body)
    if status != 200:
        return f"HTTP {status}"
    sent = orjson.loads(body)["inputs"][0]["data"]
    got = orjson.loads(answer)["outputs"][0]["data"]
    if len(got) != len(sent) or not np.array_equal(
        np.asarray(got, np.float32), np.asarray(sent, np.float32)
    ):
        return "answer differs from the input"
    return None


def e2e(args: argparse.Namespace) -> None:
    wrk = procs.tool_path("wrk")
    if wrk is None and args.tool == "wrk":
        raise SystemExit("wrk is not installed")
    launch = procs.import_peer_launch()
    body = make_body()
    systems: dict[str, int] = {}
    pids: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="v2proxy-bigjson-")))
        body_file = work / "fp32_1m.json"
        body_file.write_bytes(body)
        peer = stack.enter_context(launch.mlserver_server(launch.peers_dir()))
        systems["direct"] = peer.http_port
        pids["direct"] = peer.pid
        print(f"mlserver on {peer.http_port} (pid {peer.pid})", flush=True)
        if args.nginx:
            systems["nginx"] = _start_nginx(stack, work, peer.http_port)
        for spec in args.variant:
            name, _, src = spec.partition("=")
            port, grpc = procs.free_ports(2)
            env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
            cmd = [sys.executable, "-m", "v2proxy", "serve", "--backend", peer.base_url]
            cmd += ["--backend-encoding", "auto", "--http-port", str(port)]
            cmd += ["--grpc-port", str(grpc), "--host", procs.HOST, "--event-loop", "uvloop"]
            cmd += ["--log-level", "warning"]
            server = procs.Server(name, cmd, work / f"{name}.log", env=env)
            server.ready_urls.append(f"http://{procs.HOST}:{port}/v2/health/ready")
            pid = _started(stack, server, 60)
            print(f"{name} on {port} (pid {pid}, src {src})", flush=True)
            systems[name] = port
            pids[name] = server.proc.pid
        for name, port in systems.items():
            problem = _check_answer(port, body)
            if problem:
                raise SystemExit(f"{name}: {problem}")
        if args.tool == "phases":
            _phases(systems, body, args.rounds, args.rate)
            return
        assert wrk is not None
        means: dict[str, list[float]] = {name: [] for name in systems}
        cpu: dict[str, list[float]] = {name: [] for name in pids}
        for r in range(args.rounds):
            line = []
            for name, port in systems.items():
                before = _cpu_s(pids.get(name))
                m = loadgen.wrk(
                    wrk,
                    port,
                    f"/v2/models/{MODEL}/infer",
                    body_file,
                    {"Content-Type": "application/json"},
                    1,
                    args.seconds,
                )
                if m.error or m.mean_ms is None:
                    raise SystemExit(f"{name}: {m.error}")
                means[name].append(m.mean_ms)
                line.append(f"{name} {m.mean_ms:6.1f}")
                if name in pids and name != "direct" and m.requests:
                    cpu[name].append((_cpu_s(pids[name]) - before) / m.requests * 1e3)
                    line[-1] += f" (cpu {cpu[name][-1]:4.1f})"
            print(f"round {r + 1}: " + "  ".join(line), flush=True)
        direct = statistics.median(means["direct"])
        print("median of the per-round means (ms), ratio to direct, proxy CPU ms per request:")
        for name, values in means.items():
            med = statistics.median(values)
            used = f"{statistics.median(cpu[name]):6.1f}" if cpu.get(name) else ""
            print(f"  {name:12s} {med:7.1f}  {med / direct:5.2f}  {used}")


def _phases(systems: dict[str, int], body: bytes, rounds: int, rate: float) -> None:
    """One request to each system in turn (the first system shifting every round), from one
    raw-socket client; medians of the upload, the wait for the answer's head and the answer.
    ``rate`` (MB/s, 0: as fast as it goes) paces the upload, as a client's link would."""
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: bench\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    request = head + body
    buf = bytearray(64 << 20)
    view = memoryview(buf)
    conns = {name: socket.create_connection((procs.HOST, port)) for name, port in systems.items()}

    def one(sock: socket.socket) -> tuple[float, float, float]:
        t0 = time.perf_counter()
        if rate:
            step = 256 * 1024
            for i in range(0, len(request), step):
                time.sleep(max(0.0, t0 + i / (rate * 1e6) - time.perf_counter()))
                sock.sendall(request[i : i + step])
        else:
            sock.sendall(request)
        t1 = time.perf_counter()
        got, end = 0, -1
        while end < 0:
            n = sock.recv_into(view[got:], 1 << 20)
            if not n:
                raise SystemExit("connection closed")
            got += n
            end = buf.find(b"\r\n\r\n", 0, got)
        t2 = time.perf_counter()
        lines = bytes(buf[:end]).split(b"\r\n")
        if b" 200 " not in lines[0]:
            raise SystemExit(f"answer: {lines[0]!r}")
        length = next(
            int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length")
        )
        while got < end + 4 + length:
            got += sock.recv_into(view[got:], 1 << 20)
        t3 = time.perf_counter()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3

    names = list(systems)
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    try:
        for name in names:
            one(conns[name])  # warm up
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times[name].append(one(conns[name]))
    finally:
        for sock in conns.values():
            sock.close()
    print(f"medians of {rounds} requests each (ms): upload, to the answer's head, answer, total")
    base = 0.0
    for name in names:
        upload, to_head, answer = (statistics.median(t[k] for t in times[name]) for k in range(3))
        total = statistics.median(sum(t) for t in times[name])
        base = base or total
        print(
            f"  {name:12s} {upload:7.1f} {to_head:8.1f} {answer:7.1f} {total:8.1f}"
            f"  {total / base:5.2f}"
        )


def _cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) used so far by a process."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _started(stack: contextlib.ExitStack, server: procs.Server, timeout: float) -> int:
    """Start ``server``, to be stopped with ``stack``; its pid once it is ready."""
    server.start()
    assert server.proc is not None
    stack.callback(procs.stop_group, server.proc)
    if not server.wait_ready(timeout):
        raise SystemExit(f"{server.name} did not start: {server.error}")
    return server.proc.pid


def _start_nginx(stack: contextlib.ExitStack, work: Path, mlserver_port: int) -> int:
    nginx = procs.tool_path("nginx")
    if nginx is None:
        raise SystemExit("nginx is not installed")
    ngx = work / "nginx"
    ngx.mkdir()
    for d in (work, ngx):
        d.chmod(0o755)
    port, ref, grpc, dead = procs.free_ports(4)
    conf = (HERE / "nginx.conf.tmpl").read_text()
    for key, value in {
        "DIR": str(ngx),
        "WORKERS": "1",
        "REFERENCE_HTTP": str(dead),
        "REFERENCE_GRPC": str(dead),
        "MLSERVER_HTTP": str(mlserver_port),
        "NGINX_REFERENCE_HTTP": str(ref),
        "NGINX_REFERENCE_GRPC": str(grpc),
        "NGINX_MLSERVER_HTTP": str(port),
    }.items():
        conf = conf.replace(f"@@{key}@@", value)
    (ngx / "nginx.conf").write_text(conf)
    cmd = [nginx, "-e", str(ngx / "error.log"), "-p", str(ngx), "-c", str(ngx / "nginx.conf")]
    server = procs.Server("nginx", cmd, ngx / "stdout.log", ready_ports=[port])
    print(f"nginx on {port} (pid {_started(stack, server, 30)})", flush=True)
    return port


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("stages", help="in-process stage timings")
    s.add_argument("--repeat", type=int, default=15)
    e = sub.add_parser("e2e", help="MLServer, nginx and v2proxy variants under load")
    e.add_argument("--tool", choices=("wrk", "phases"), default="wrk")
    e.add_argument("--rate", type=float, default=0.0, help="phases: upload MB/s (0: unpaced)")
    e.add_argument("--variant", action="append", default=[], help="NAME=SRC (repeatable)")
    e.add_argument("--nginx", action="store_true")
    e.add_argument("--rounds", type=int, default=5)
    e.add_argument("--seconds", type=float, default=4.0)
    args = p.parse_args()
    if args.mode == "stages":
        stages(args.repeat)
    else:
        e2e(args)


if __name__ == "__main__":
    main()
