"""Scenarios h-grpc and h-http: the latency of one request at a time, per tensor size.

``identity_fp32`` on Triton 2.51, the client sending FP32[n] (n = 1 K, 64 K, 1 M, 16 M
elements: 4 KiB to 64 MiB) and asking for OUTPUT0 back, through each compared system on one
connection: tritonclient's gRPC client (``h-grpc``: Triton's gRPC port, nginx ``grpc_pass``,
v2proxy with a gRPC backend) and tritonclient's HTTP client with binary tensors both ways
(``h-http``: Triton's HTTP port, nginx ``proxy_pass``, v2proxy with a binary REST backend).
run.py calls :func:`measure` once per scenario. For each size every system first sends one
checked request (the gate, untimed: it also opens the connection), then the systems take turns
in rounds, the first of each round rotating, each round sending ``per_round`` requests one after
the other. Every request is timed around ``client.infer`` (building the request, sending it,
receiving and splitting the answer), every answer checked bit for bit outside the timing; the
figures are the median and mean of all the timed requests of a (system, size). CPU per request:
the CPU time of the proxy's and of Triton's process groups over each batch, summed over the
rounds and divided by the requests; read from /proc/PID/task/TID/schedstat (nanoseconds, every
thread), since utime + stime (/proc/PID/stat, the rest of run.py) count 10 ms clock ticks, too
coarse for 100 requests of ~50 µs of nginx; /proc/PID/stat when schedstat is missing.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import procs

MODEL = "identity_fp32"
#: (label, elements)
SIZES = (("1K", 1 << 10), ("64K", 1 << 16), ("1M", 1 << 20), ("16M", 1 << 24))
#: requests per round, by size label, full and quick (times Durations.rounds: full 5, quick 2);
#: the small sizes get more so that the proxy's CPU per request is several clock ticks (10 ms)
PER_ROUND = {"1K": 20, "64K": 20, "1M": 8, "16M": 2}
PER_ROUND_QUICK = {"1K": 10, "64K": 10, "1M": 4, "16M": 1}
TIMEOUT_S = 300.0
_SCHEDSTAT = os.path.exists(f"/proc/{os.getpid()}/schedstat")


@dataclass
class Target:
    """One system of a scenario: its label, where it listens and which process groups are its
    proxy and its backend (for CPU per request)."""

    label: str
    port: int
    proxy_pgid: int | None
    backend_pgid: int | None


@dataclass
class Tally:
    times: list[float] = field(default_factory=list)
    proxy_s: float = 0.0
    backend_s: float = 0.0
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        if self.error is not None:
            return {"status": self.error, "requests": len(self.times)}
        n = len(self.times)
        ms = [t * 1000 for t in self.times]
        return {
            "status": "ok",
            "requests": n,
            "median_ms": statistics.median(ms),
            "mean_ms": statistics.fmean(ms),
            "min_ms": min(ms),
            "max_ms": max(ms),
            "proxy_us_per_req": 1e6 * self.proxy_s / n,
            "backend_us_per_req": 1e6 * self.backend_s / n,
        }


class _Client:
    """One tritonclient client on one connection, FP32[n] inputs prepared once per size."""

    def __init__(self, protocol: str, port: int):
        self.protocol = protocol
        url = f"127.0.0.1:{port}"
        if protocol == "grpc":
            import tritonclient.grpc as tc

            self.tc: Any = tc
            self.client: Any = tc.InferenceServerClient(url)  # one channel: one connection
        else:
            import tritonclient.http as tc

            self.tc = tc
            self.client = tc.InferenceServerClient(
                url, concurrency=1, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S
            )
        self.inputs: list[Any] = []
        self.outputs: list[Any] = []

    def prepare(self, values: np.ndarray) -> None:
        inp = self.tc.InferInput("INPUT0", [values.size], "FP32")
        if self.protocol == "grpc":
            inp.set_data_from_numpy(values)
            out = self.tc.InferRequestedOutput("OUTPUT0")
        else:
            inp.set_data_from_numpy(values, binary_data=True)
            out = self.tc.InferRequestedOutput("OUTPUT0", binary_data=True)
        self.inputs, self.outputs = [inp], [out]

    def infer(self) -> tuple[float, Any]:
        kwargs: dict[str, Any] = {"outputs": self.outputs}
        if self.protocol == "grpc":
            kwargs["client_timeout"] = TIMEOUT_S
        start = time.perf_counter()
        result = self.client.infer(MODEL, self.inputs, **kwargs)
        return time.perf_counter() - start, result

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


def _check(result: Any, values: np.ndarray) -> str | None:
    got = result.as_numpy("OUTPUT0")
    if got is None:
        return "the answer has no OUTPUT0"
    if got.dtype != np.float32 or got.shape != values.shape or not np.array_equal(got, values):
        return f"OUTPUT0 differs from INPUT0 ({got.dtype}, shape {list(got.shape)})"
    return None


def _why(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


@contextlib.contextmanager
def _clients(protocol: str, targets: list[Target]) -> Iterator[dict[str, _Client | str]]:
    made: dict[str, _Client | str] = {}
    try:
        for t in targets:
            try:
                made[t.label] = _Client(protocol, t.port)
            except Exception as exc:
                made[t.label] = f"error: client: {_why(exc)}"
        yield made
    finally:
        for c in made.values():
            if isinstance(c, _Client):
                c.close()


def measure(
    protocol: str,
    targets: list[Target],
    rounds: int,
    quick: bool,
    log: Callable[[str], None],
    scenario: str,
) -> dict[str, dict[str, dict[str, Any]]]:
    """size label -> system label -> Tally.summary() (with ``elements``, ``bytes``)."""
    per_round = PER_ROUND_QUICK if quick else PER_ROUND
    out: dict[str, dict[str, dict[str, Any]]] = {}
    rng = np.random.default_rng(7)
    with _clients(protocol, targets) as clients:
        for size, n in SIZES:
            values = rng.random(n, dtype=np.float32)
            tallies = {t.label: Tally() for t in targets}
            live: list[tuple[Target, _Client]] = []
            for t in targets:
                client = clients[t.label]
                tally = tallies[t.label]
                if isinstance(client, str):
                    tally.error = client
                    continue
                try:
                    client.prepare(values)
                    _, result = client.infer()
                    problem = _check(result, values)
                except Exception as exc:
                    problem = _why(exc)
                if problem is not None:
                    tally.error = f"error: correctness gate: {problem}"
                    log(f"({scenario}) {t.label} {size}: {tally.error}")
                    continue
                live.append((t, client))
            for r in range(rounds):
                shift = r % len(live) if live else 0
                for t, client in live[shift:] + live[:shift]:
                    tally = tallies[t.label]
                    if tally.error is not None:
                        continue
                    before = _cpu(t)
                    try:
                        for _ in range(per_round[size]):
                            elapsed, result = client.infer()
                            problem = _check(result, values)
                            if problem is not None:
                                raise RuntimeError(problem)
                            tally.times.append(elapsed)
                    except Exception as exc:
                        tally.error = f"error: {_why(exc)}"
                        log(f"({scenario}) {t.label} {size} round {r + 1}: {tally.error}")
                        continue
                    after = _cpu(t)
                    tally.proxy_s += after[0] - before[0]
                    tally.backend_s += after[1] - before[1]
            out[size] = {}
            for t in targets:
                summary = tallies[t.label].summary()
                summary.update(elements=n, bytes=4 * n)
                if t.proxy_pgid is None:  # straight to Triton: no proxy
                    summary["proxy_us_per_req"] = None
                out[size][t.label] = summary
                if summary["status"] == "ok":
                    log(
                        f"({scenario}) {t.label} {size}: median {summary['median_ms']:.2f} ms"
                        f" of {summary['requests']}, proxy CPU"
                        f" {summary['proxy_us_per_req'] or 0:.0f} µs/req"
                    )
            del values
    return out


def _cpu(t: Target) -> tuple[float, float]:
    return (
        group_cpu_seconds(t.proxy_pgid) if t.proxy_pgid else 0.0,
        group_cpu_seconds(t.backend_pgid) if t.backend_pgid else 0.0,
    )


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds of every live thread of process group ``pgid``: the first field of
    /proc/PID/task/TID/schedstat (time on a CPU, ns); procs.group_cpu_seconds (clock ticks) when
    this kernel has no schedstat."""
    if not _SCHEDSTAT:
        return procs.group_cpu_seconds(pgid)
    total = 0
    for pid, _ in procs.group_stats(pgid):
        try:
            for task in os.scandir(f"/proc/{pid}/task"):
                with open(f"{task.path}/schedstat", "rb") as f:
                    total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the process or thread ended meanwhile
    return total / 1e9
