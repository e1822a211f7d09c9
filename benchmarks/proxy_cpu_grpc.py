"""CPU per call of v2proxy on the small gRPC path: a repeatable measure for tuning it.

The gRPC twin of :mod:`proxy_cpu`. Starts a backend (``v2proxy reference-server``, or a real
Triton from the interop peers with ``--backend triton``) and ``v2proxy serve --backend
grpc://...`` in front of it as subprocesses, then drives N small ``ModelInfer`` calls through
the proxy's gRPC port, one at a time on one channel (one HTTP/2 connection): ``identity_fp32``
with FP32[``--elements``] (default 1 K) in ``raw_input_contents``, OUTPUT0 asked for, the
message serialized once and sent as bytes by a lean client (grpcio's synchronous stub with no
serializer), so the client costs little and the same for every tree. Each answer is checked
to carry OUTPUT0's bytes, the first one in full. Reported per round: the proxy's CPU per call
(user + sys, from ``/proc/<pid>/stat``: every thread, grpcio's included, around the measured
phase, after a warm-up), the backend's, the proxy's context switches per call (every thread's,
voluntary and not: each hand-off between grpcio's threads and the event loop is one), and the
median latency of the calls.

``--stream`` sends the same messages on one ``ModelStreamInfer`` call instead, one at a time
(each sent once the answer to the one before has come), the proxy's CPU per message.

``--src DIR`` runs the proxy from another source tree (a copy of ``src/`` made before a change)
so that two versions are measured in alternating rounds on this noisy machine (``--rounds``;
``--src`` may be given twice: ``--src /tmp/before --src src``); ``--direct`` adds the backend
without a proxy as a row of its own (latency only). ``--callgrind`` runs the proxy under
valgrind and reports instructions per call (deterministic; slow: use a small ``--n``).

    .venv/bin/python benchmarks/proxy_cpu_grpc.py --n 3000 --rounds 3 --src /tmp/before --src src
    .venv/bin/python benchmarks/proxy_cpu_grpc.py --stream --n 3000 --rounds 3 --src src
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import proxy_cpu
from proxy_cpu import HOST, REPO, cpu_s, free_port, process

sys.path.insert(0, str(REPO / "src"))
from v2proxy._proto import grpc_service_pb2 as pb

_METHOD = "/inference.GRPCInferenceService/ModelInfer"
_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


#: no message size limit on the client's channel (a 16 M FP32 answer is 64 MiB)
_UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def switches(pid: int) -> int:
    """Context switches so far of every thread of process ``pid``."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        with contextlib.suppress(OSError):
            for line in status.read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[-1])
    return total


def request_message(elements: int) -> tuple[bytes, bytes]:
    """(the serialized ModelInferRequest, the input's bytes the answer must carry back)."""
    data = np.arange(elements, dtype="<f4").tobytes()
    msg = pb.ModelInferRequest(model_name="identity_fp32")
    tensor = msg.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.append(elements)
    msg.outputs.add(name="OUTPUT0")
    msg.raw_input_contents.append(data)
    return msg.SerializeToString(), data


def check(answer: bytes, data: bytes) -> None:
    """The first answer in full: OUTPUT0 with the input's bytes."""
    resp = pb.ModelInferResponse.FromString(answer)
    if [o.name for o in resp.outputs] != ["OUTPUT0"] or list(resp.raw_output_contents) != [data]:
        raise RuntimeError(f"answer: {resp!r:.300}")


def drive(port: int, message: bytes, data: bytes, n: int) -> tuple[float, list[float]]:
    """``n`` calls, one at a time on one channel; (seconds, latencies)."""
    with grpc.insecure_channel(f"{HOST}:{port}", options=_UNLIMITED) as channel:
        call: Any = channel.unary_unary(_METHOD)  # bytes in, bytes out
        check(call(message, timeout=30), data)
        need = len(data)
        lat: list[float] = []
        t0 = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            answer = call(message, timeout=30)
            lat.append(time.perf_counter() - t)
            if len(answer) < need or b"OUTPUT0" not in answer:
                raise RuntimeError(f"answer: {answer[:300]!r}")
        return time.perf_counter() - t0, lat


def drive_stream(port: int, message: bytes, data: bytes, n: int) -> tuple[float, list[float]]:
    """``n`` messages on one ModelStreamInfer call, each sent once the answer to the one before
    has come; (seconds, latencies)."""
    with grpc.insecure_channel(f"{HOST}:{port}", options=_UNLIMITED) as channel:
        outbox: queue.Queue[bytes | None] = queue.Queue()
        call: Any = channel.stream_stream(_STREAM)(iter(outbox.get, None))  # bytes both ways
        try:
            outbox.put(message)
            first = pb.ModelStreamInferResponse.FromString(next(call))
            if first.error_message:
                raise RuntimeError(f"answer: {first.error_message}")
            check(first.infer_response.SerializeToString(), data)
            need = len(data)
            lat: list[float] = []
            t0 = time.perf_counter()
            for _ in range(n):
                t = time.perf_counter()
                outbox.put(message)
                answer = next(call)
                lat.append(time.perf_counter() - t)
                if len(answer) < need or b"OUTPUT0" not in answer:
                    raise RuntimeError(f"answer: {answer[:300]!r}")
            return time.perf_counter() - t0, lat
        finally:
            outbox.put(None)  # the stream's end: the call finishes
            for _ in call:
                pass


Driver = Callable[[int, bytes, bytes, int], tuple[float, list[float]]]


def driver(args: argparse.Namespace) -> Driver:
    """The calls measured: unary ModelInfer, or messages on one stream (``--stream``)."""
    return drive_stream if args.stream else drive


@contextlib.contextmanager
def backend(kind: str) -> Iterator[tuple[int, int]]:
    """(gRPC port, pid) of the backend."""
    if kind == "triton":
        sys.path.insert(0, str(REPO / "tests" / "interop" / "peers"))
        import launch  # type: ignore[import-not-found]

        with launch.triton_server(launch.peers_dir()) as peer:
            yield peer.grpc_port, peer.pid
        return
    port = free_port()
    cmd = [sys.executable, "-m", "v2proxy", "reference-server", "--host", HOST]
    cmd += ["--http-port", str(free_port()), "--grpc-port", str(port), "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    with process(cmd, port, env, 60) as pid:
        yield port, pid


@contextlib.contextmanager
def proxy(
    src: str, backend_port: int, callgrind: Path | None, extra: list[str]
) -> Iterator[tuple[int, int]]:
    """(gRPC port, pid) of ``v2proxy serve --backend grpc://`` run from source tree ``src``."""
    url = f"grpc://{HOST}:{backend_port}"
    with proxy_cpu.proxy(src, url, callgrind, extra, listen="grpc") as found:
        yield found


def measure(
    src: str, backend_port: int, backend_pid: int, args: argparse.Namespace, extra: list[str]
) -> dict[str, float]:
    message, data = request_message(args.elements)
    drive_n = driver(args)
    with proxy(src, backend_port, None, extra) as (port, pid):
        drive_n(port, message, data, args.warmup)
        u0, s0 = cpu_s(pid)
        bu0, bs0 = cpu_s(backend_pid)
        cs0 = switches(pid)
        wall, lat = drive_n(port, message, data, args.n)
        cs1 = switches(pid)
        u1, s1 = cpu_s(pid)
        bu1, bs1 = cpu_s(backend_pid)
    n = args.n
    return {
        "user": (u1 - u0) / n * 1e6,
        "sys": (s1 - s0) / n * 1e6,
        "cpu": (u1 - u0 + s1 - s0) / n * 1e6,
        "backend": (bu1 - bu0 + bs1 - bs0) / n * 1e6,
        "switches": (cs1 - cs0) / n,
        "rps": n / wall,
        "p50": statistics.median(lat) * 1e6,
    }


def callgrind_run(src: str, backend_port: int, args: argparse.Namespace, extra: list[str]) -> float:
    """Instructions per call of the proxy (valgrind callgrind)."""
    if shutil.which("callgrind_control") is None:
        raise SystemExit("callgrind_control not found")
    folder = Path(tempfile.mkdtemp(prefix="proxy_cpu_grpc_"))
    out = folder / "callgrind.out"
    message, data = request_message(args.elements)
    drive_n = driver(args)
    with proxy(src, backend_port, out, extra) as (port, pid):
        drive_n(port, message, data, min(args.warmup, 200))
        subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)
        drive_n(port, message, data, args.n)
        subprocess.run(
            ["callgrind_control", "-i", "off", str(pid)], check=True, capture_output=True
        )
    text = "".join(p.read_text(errors="replace") for p in folder.glob("callgrind.out*"))
    totals = [int(m) for m in re.findall(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)]
    print(f"callgrind output in {folder}", file=sys.stderr)
    # the measured drive() has n calls plus the channel's first check call
    return max(totals) / (args.n + 1) if totals else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="reference", help="reference or triton")
    ap.add_argument("--src", action="append", help="source tree(s) of the proxy (default src)")
    ap.add_argument("--n", type=int, default=3000, help="calls per measured phase")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--elements", type=int, default=1024, help="FP32 elements of the tensor")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--direct", action="store_true", help="also the backend without a proxy")
    ap.add_argument(
        "--stream", action="store_true", help="messages on one ModelStreamInfer call instead"
    )
    ap.add_argument("--callgrind", action="store_true", help="instructions per call instead")
    ap.add_argument("--serve-args", default="", help="extra `v2proxy serve` arguments")
    args = ap.parse_args()
    extra = shlex.split(args.serve_args)
    srcs = args.src or [str(REPO / "src")]
    results: dict[str, list[dict[str, float]]] = {s: [] for s in srcs}
    direct: list[float] = []
    with backend(args.backend) as (backend_port, backend_pid):
        if args.callgrind:
            for _ in range(args.rounds):
                for s in srcs:
                    ir = callgrind_run(s, backend_port, args, extra)
                    print(f"{s}: {ir:,.0f} instructions/call", flush=True)
            return 0
        message, data = request_message(args.elements)
        for r in range(args.rounds):
            if args.direct:
                driver(args)(backend_port, message, data, args.warmup)
                _, lat = driver(args)(backend_port, message, data, args.n)
                direct.append(statistics.median(lat) * 1e6)
                print(f"round {r} direct: p50 {direct[-1]:.0f} µs", flush=True)
            for s in srcs:
                m = measure(s, backend_port, backend_pid, args, extra)
                results[s].append(m)
                print(
                    f"round {r} {s}: proxy {m['cpu']:.1f} µs/call (user {m['user']:.1f}"
                    f" sys {m['sys']:.1f}), {m['switches']:.1f} switches/call, backend"
                    f" {m['backend']:.1f}, {m['rps']:.0f} calls/s,"
                    f" p50 {m['p50']:.0f} µs",
                    flush=True,
                )
    print("median over rounds:")
    if direct:
        print(f"  direct: p50 {statistics.median(direct):.0f} µs")
    for s in srcs:
        cpu = statistics.median(r["cpu"] for r in results[s])
        user = statistics.median(r["user"] for r in results[s])
        p50 = statistics.median(r["p50"] for r in results[s])
        cs = statistics.median(r["switches"] for r in results[s])
        print(
            f"  {s}: proxy {cpu:.1f} µs/call (user {user:.1f}), {cs:.1f} switches/call,"
            f" p50 {p50:.0f} µs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
