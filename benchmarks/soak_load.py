"""The soak's fixed mixed load: the schedule of request kinds and the paced clients.

:data:`SCHEDULE` is one cycle of the mix (20 operations of :mod:`soak_ops`); the clients take
operations from it in turn, each paced to ``rate / clients`` operations per second (a client
that falls behind does not burst to catch up) and opening new connections every
``reconnect_every`` operations. Every operation is recorded as (kind, seconds,
problem) in a :class:`Recorder`, which the sampler empties every interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from soak_ops import (
    Conn,
    binary_infer,
    err_bad_shape,
    err_malformed_json,
    err_unknown_model,
    grpc_infer,
    grpc_llm,
    grpc_stream,
    grpc_unknown_model,
    json_infer,
    rest_stream,
    shm_cycle,
)

Op = Callable[[Conn], Awaitable[str | None]]

#: one cycle of the mix, 20 operations
SCHEDULE: list[Op] = [
    json_infer,
    grpc_infer,
    binary_infer,
    json_infer,
    grpc_stream,
    grpc_infer,
    err_unknown_model,
    json_infer,
    binary_infer,
    rest_stream,
    grpc_infer,
    err_malformed_json,
    json_infer,
    shm_cycle,
    grpc_infer,
    binary_infer,
    err_bad_shape,
    json_infer,
    grpc_unknown_model,
    grpc_infer,
]


@dataclass
class Recorder:
    """Operations completed since the last :meth:`take`: latencies by kind, problems."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)

    def add(self, kind: str, seconds: float, problem: str | None) -> None:
        self.latencies.setdefault(kind, []).append(seconds)
        if problem is not None:
            self.problems.append((kind, problem))

    def take(self) -> Recorder:
        out = Recorder(self.latencies, self.problems)
        self.latencies, self.problems = {}, []
        return out


def schedule_for(backend: str) -> list[Op]:
    """The schedule in front of ``backend`` (builtin, rest or grpc): behind a v2 REST backend
    the gRPC stream of the decoupled llm becomes a unary llm call (REST has no streaming infer;
    REST generate_stream is passed through to the backend's own)."""
    if backend != "rest":
        return list(SCHEDULE)
    return [grpc_llm if op is grpc_stream else op for op in SCHEDULE]


async def run_clients(
    http_port: int,
    grpc_port: int,
    clients: int,
    rate: float,
    stop: asyncio.Event,
    rec: Recorder,
    ops: list[Op],
    reconnect_every: int = 0,
) -> None:
    """``clients`` paced clients taking operations from the schedule ``ops`` until ``stop``;
    each one closes its connections and opens new ones every ``reconnect_every`` operations
    (0: never), so that connections come and go through the soak (per-connection state must be
    freed) and, with several workers, spread over them."""
    schedule = itertools.cycle(ops)
    period = clients / rate

    async def client(index: int) -> None:
        conn = Conn.open(http_port, grpc_port)
        due = time.monotonic() + index * period / clients
        done = 0
        try:
            while not stop.is_set():
                if reconnect_every and done and done % reconnect_every == 0:
                    await conn.close()
                    conn = Conn.open(http_port, grpc_port)
                delay = due - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if stop.is_set():
                        break
                due = max(due + period, time.monotonic())
                op = next(schedule)
                start = time.perf_counter()
                try:
                    problem = await op(conn)
                except Exception as exc:  # every failure is a finding, not a crash of the soak
                    problem = f"{type(exc).__name__}: {exc}"[:300]
                rec.add(op.__name__, time.perf_counter() - start, problem)
                done += 1
        finally:
            await conn.close()

    await asyncio.gather(*(client(i) for i in range(clients)))
