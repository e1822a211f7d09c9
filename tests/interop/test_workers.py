"""`v2proxy serve --workers N`: N processes share the REST and gRPC ports, a worker that dies
is replaced, and SIGTERM to the parent stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from procs import v2proxy


def _children(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True, text=True, check=False
    )
    return [int(x) for x in out.stdout.split()]


def _simple_ok(http_url: str, grpc_url: str) -> None:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    h = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    h.set_data_from_numpy(data)
    h1 = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    h1.set_data_from_numpy(data)
    with httpclient.InferenceServerClient(http_url) as hc:
        out = hc.infer("simple", [h, h1])
    assert out.as_numpy("OUTPUT0").tolist() == (2 * data).tolist()
    g = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    g.set_data_from_numpy(data)
    g1 = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
    g1.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(grpc_url) as gc:
        out = gc.infer("simple", [g, g1])
    assert out.as_numpy("OUTPUT1").tolist() == [[0] * 16]


def test_workers_share_ports_and_are_supervised() -> None:
    with v2proxy("serve", "--workers", "2", name="workers") as proxy:
        deadline = time.monotonic() + 20
        while len(_children(proxy.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = _children(proxy.pid)
        assert len(workers) == 2
        for _ in range(20):  # connections land on both workers; every one answers
            _simple_ok(proxy.url, proxy.grpc_url)
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = _children(proxy.pid)
            if len(now) == 2 and workers[0] not in now:
                break
            time.sleep(0.1)
        replaced = _children(proxy.pid)
        assert len(replaced) == 2 and workers[0] not in replaced
        time.sleep(1.0)  # the new worker binds its ports
        for _ in range(10):
            _simple_ok(proxy.url, proxy.grpc_url)
        # SIGTERM to the parent alone: it stops its workers, then exits
        os.kill(proxy.pid, signal.SIGTERM)
        deadline = time.monotonic() + 40
        while _children(proxy.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _children(proxy.pid) == []
        assert all(not os.path.exists(f"/proc/{pid}") for pid in replaced)
