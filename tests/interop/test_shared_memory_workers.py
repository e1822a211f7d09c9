"""System shared memory with ``v2proxy serve --workers 2``: a region registered through one
worker is usable from every worker and listed identically by each (the workers share one
registry, v2proxy.shm.shared). Every call goes through a fresh connection, so the kernel's
SO_REUSEPORT spreads them over both workers: each region is registered through its own
connection, then status, inference and unregister through many others. Every shared-memory
object the test creates is unlinked."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from procs import Proc, v2proxy, wait_listening
from test_metrics_workers import _scrape, _sum
from test_workers import _children

CLIENTS = {"http": httpclient, "grpc": grpcclient}
REGIONS = 8  # input regions, each registered through its own connection
CALLS = 16  # fresh connections for each status / inference round


def _key(name: str) -> str:
    return f"/v2proxy_test_workers_{os.getpid()}_{name}"


@pytest.fixture(scope="module")
def workers() -> Iterator[Proc]:
    with v2proxy("serve", "--workers", "2", "--restricted-api", "none", name="shm-workers") as p:
        deadline = time.monotonic() + 20
        while len(_children(p.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_children(p.pid)) == 2
        wait_listening(p.port, 2)  # both workers listening
        yield p


@contextlib.contextmanager
def fresh(kind: str, p: Proc) -> Iterator[Any]:
    """A client on a connection of its own (gRPC: no subchannel shared with other channels)."""
    if kind == "http":
        c = httpclient.InferenceServerClient(p.url)
    else:
        c = grpcclient.InferenceServerClient(
            p.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
        )
    try:
        yield c
    finally:
        c.close()


def _status(kind: str, p: Proc) -> list[tuple[str, str, int, int]]:
    with fresh(kind, p) as c:
        got = c.get_system_shared_memory_status()
    if kind == "http":
        return sorted((r["name"], r["key"], int(r["offset"]), int(r["byte_size"])) for r in got)
    return sorted((r.name, r.key, r.offset, r.byte_size) for r in got.regions.values())


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_regions_shared_by_workers(workers: Proc, kind: str) -> None:
    mod = CLIENTS[kind]
    made: list[Any] = []
    time.sleep(1.5)  # the workers flushed their counters of any earlier test
    before = _scrape(workers.port)
    try:
        inputs = []
        for i in range(REGIONS):
            h = shm.create_shared_memory_region(f"in{i}", _key(f"in{i}"), 128)
            made.append(h)
            a = np.full((1, 16), i, dtype=np.int32)
            b = np.arange(16, dtype=np.int32).reshape(1, 16)
            shm.set_shared_memory_region(h, [a])
            shm.set_shared_memory_region(h, [b], offset=64)
            inputs.append((a, b))
        out = shm.create_shared_memory_region("out", _key("out"), 128)
        made.append(out)
        names = [f"{kind}_in{i}" for i in range(REGIONS)]
        for i, name in enumerate(names):
            with fresh(kind, workers) as c:
                c.register_system_shared_memory(name, _key(f"in{i}"), 128)
        with fresh(kind, workers) as c:
            c.register_system_shared_memory(f"{kind}_out", _key("out"), 128)
        expected = sorted(
            [(n, _key(f"in{i}"), 0, 128) for i, n in enumerate(names)]
            + [(f"{kind}_out", _key("out"), 0, 128)]
        )
        for _ in range(CALLS):
            assert _status(kind, workers) == expected
        for j in range(CALLS):
            i = j % REGIONS
            i0 = mod.InferInput("INPUT0", [1, 16], "INT32")
            i0.set_shared_memory(names[i], 64)
            i1 = mod.InferInput("INPUT1", [1, 16], "INT32")
            i1.set_shared_memory(names[i], 64, offset=64)
            o0 = mod.InferRequestedOutput("OUTPUT0")
            o0.set_shared_memory(f"{kind}_out", 64)
            o1 = mod.InferRequestedOutput("OUTPUT1")
            o1.set_shared_memory(f"{kind}_out", 64, offset=64)
            with fresh(kind, workers) as c:
                c.infer("simple", [i0, i1], outputs=[o0, o1])
            a, b = inputs[i]
            np.testing.assert_array_equal(shm.get_contents_as_numpy(out, np.int32, [1, 16]), a + b)
            got1 = shm.get_contents_as_numpy(out, np.int32, [1, 16], offset=64)
            np.testing.assert_array_equal(got1, a - b)
        _tensors_counted(workers, before, 2 * CALLS, 2 * CALLS)
        for name in names[: REGIONS // 2]:  # one by one, through fresh connections
            with fresh(kind, workers) as c:
                c.unregister_system_shared_memory(name)
        for _ in range(CALLS // 2):
            assert _status(kind, workers) == expected[REGIONS // 2 :]
        with fresh(kind, workers) as c:
            c.unregister_system_shared_memory()  # all the others
        for _ in range(CALLS):
            assert _status(kind, workers) == []
        i0 = mod.InferInput("INPUT0", [1, 16], "INT32")
        i0.set_shared_memory(names[0], 64)
        i1 = mod.InferInput("INPUT1", [1, 16], "INT32")
        i1.set_shared_memory(names[0], 64, offset=64)
        for _ in range(CALLS // 2):  # no worker uses an unregistered region
            with fresh(kind, workers) as c, pytest.raises(Exception, match="Unable to find"):
                c.infer("simple", [i0, i1])
    finally:
        with contextlib.suppress(Exception), fresh(kind, workers) as c:
            c.unregister_system_shared_memory()
        for h in made:
            with contextlib.suppress(Exception):
                shm.destroy_shared_memory_region(h)


def _tensors_counted(p: Proc, before: Any, inputs: int, outputs: int) -> None:
    """``v2proxy_shm_tensors_total`` on /metrics (summed over the workers) grew by exactly
    ``inputs`` / ``outputs``."""
    name = "v2proxy_shm_tensors_total"
    want = {"input": inputs, "output": outputs}
    deadline = time.monotonic() + 10  # workers flush every second
    while True:
        now = _scrape(p.port)
        got = {d: _sum(now, name, direction=d) - _sum(before, name, direction=d) for d in want}
        if all(got[d] >= want[d] for d in want) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert got == want
