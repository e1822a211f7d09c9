"""Scenario (g): a 64 MiB input through system shared memory against the binary HTTP body.

``probe`` tells whether the proxy accepts a system shared-memory registration (HTTP 200 from
``/v2/systemsharedmemory/region/NAME/register``) and why not. When it does, ``measure`` times the
same ``identity_fp32`` request (64 MiB FP32 in, the same out) two ways against one v2proxy (run.py
calls it for v2proxy in front of the builtin models, MLServer and Triton), so that only the
client-proxy hop differs: input and output in registered POSIX shared-memory regions (the request
body is a few hundred bytes of JSON) versus the binary-tensor HTTP body both ways. Both loops run
in this Python process with ``http.client``, one request at a time; the figure is the mean time
per request. Regions are created with ``multiprocessing.shared_memory`` and always unregistered
and unlinked again.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import secrets
import time
from collections.abc import Iterator
from multiprocessing import shared_memory

import numpy as np
from bodies import Body, post

SIZE = 64 * 1024 * 1024


def _request(port: int, method: str, path: str, obj: object | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = None if obj is None else json.dumps(obj).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@contextlib.contextmanager
def _region(port: int, size: int) -> Iterator[tuple[str, shared_memory.SharedMemory]]:
    """A fresh POSIX shared-memory segment registered with the server under its own name."""
    name = f"v2proxy_bench_{secrets.token_hex(4)}"
    seg = shared_memory.SharedMemory(name=name, create=True, size=size)
    registered = False
    try:
        status, answer = _request(
            port,
            "POST",
            f"/v2/systemsharedmemory/region/{name}/register",
            {"key": f"/{name}", "offset": 0, "byte_size": size},
        )
        if status != 200:
            text = answer[:200].decode("utf-8", "replace").strip()
            raise RuntimeError(f"register answered HTTP {status}: {text}")
        registered = True
        yield name, seg
    finally:
        if registered:
            with contextlib.suppress(OSError, http.client.HTTPException):
                _request(port, "POST", f"/v2/systemsharedmemory/region/{name}/unregister")
        seg.close()
        with contextlib.suppress(FileNotFoundError):
            seg.unlink()


def probe(port: int) -> str | None:
    """None when the server at ``port`` registers system shared memory, else why not."""
    try:
        with _region(port, 4096):
            return None
    except (RuntimeError, OSError, http.client.HTTPException) as exc:
        return str(exc)


def _timed_loop(send: object, seconds: float, min_runs: int = 3) -> list[float]:
    assert callable(send)
    times: list[float] = []
    deadline = time.monotonic() + seconds
    while len(times) < min_runs or time.monotonic() < deadline:
        times.append(send())
    return times


def measure(port: int, binary_body: Body, seconds: float, min_runs: int = 3) -> dict[str, object]:
    """Mean seconds per 64 MiB request through shared memory and through the binary body
    (each way: one untimed request, then at least ``min_runs`` for at least ``seconds``)."""
    count = SIZE // 4
    values = np.random.default_rng(5).random(count, dtype=np.float32)
    with _region(port, SIZE) as (in_name, in_seg), _region(port, SIZE) as (out_name, out_seg):
        in_seg.buf[:SIZE] = values.tobytes()
        req = {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [count],
                    "parameters": {
                        "shared_memory_region": in_name,
                        "shared_memory_byte_size": SIZE,
                    },
                }
            ],
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "parameters": {
                        "shared_memory_region": out_name,
                        "shared_memory_byte_size": SIZE,
                    },
                }
            ],
        }
        path = "/v2/models/identity_fp32/infer"

        def via_shm() -> float:
            start = time.perf_counter()
            status, answer = _request(port, "POST", path, req)
            elapsed = time.perf_counter() - start
            if status != 200:
                raise RuntimeError(f"shared-memory infer answered HTTP {status}: {answer[:200]!r}")
            return elapsed

        via_shm()
        if bytes(out_seg.buf[:SIZE]) != values.tobytes():
            raise RuntimeError("the output region does not hold the input after the request")
        shm_times = _timed_loop(via_shm, seconds, min_runs)

    payload = binary_body.path.read_bytes()

    def via_body() -> float:
        status, headers, answer, elapsed = post(port, binary_body, data=payload)
        problem = binary_body.check(status, headers, answer)
        if problem:
            raise RuntimeError(f"binary-body request: {problem}")
        return elapsed

    via_body()
    body_times = _timed_loop(via_body, seconds, min_runs)
    shm_mean, body_mean = float(np.mean(shm_times)), float(np.mean(body_times))
    return {
        "shm_mean_ms": shm_mean * 1000,
        "body_mean_ms": body_mean * 1000,
        "shm_requests": len(shm_times),
        "body_requests": len(body_times),
        "speedup": body_mean / shm_mean if shm_mean else None,
    }
