"""Standalone (not in make test): a 64 MiB FP32 identity infer through v2proxy in front of
Triton 2.51 (REST backend), --backend-shm auto vs off, sent by tritonclient gRPC and by
tritonclient HTTP with the input in client shared memory. Prints the median seconds and ratios.

    V2PROXY_PEERS_DIR=.cache/peers .venv/bin/python benchmarks/shm_staging.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "interop"))
from peers import launch
from procs import v2proxy

N = 5
DATA = np.random.default_rng(0).standard_normal(16 * 1024 * 1024).astype(np.float32)  # 64 MiB


def _grpc(url: str) -> float:
    c = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("INPUT0", [DATA.size], "FP32")
    inp.set_data_from_numpy(DATA)
    times = []
    for _ in range(N + 1):
        t0 = time.perf_counter()
        r = c.infer("identity_fp32", [inp])
        times.append(time.perf_counter() - t0)
        assert np.array_equal(r.as_numpy("OUTPUT0"), DATA)
    c.close()
    return statistics.median(times[1:])


def _client_shm(url: str) -> float:
    key = f"/v2proxy_bench_{os.getpid()}"
    h = shm.create_shared_memory_region("bench_in", key, DATA.nbytes)
    shm.set_shared_memory_region(h, [DATA])
    c = httpclient.InferenceServerClient(url)
    c.register_system_shared_memory("bench_in", key, DATA.nbytes)
    inp = httpclient.InferInput("INPUT0", [DATA.size], "FP32")
    inp.set_shared_memory("bench_in", DATA.nbytes)
    out = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    times = []
    try:
        for _ in range(N + 1):
            t0 = time.perf_counter()
            r = c.infer("identity_fp32", [inp], outputs=out)
            times.append(time.perf_counter() - t0)
            assert np.array_equal(r.as_numpy("OUTPUT0"), DATA)
    finally:
        c.unregister_system_shared_memory("bench_in")
        c.close()
        shm.destroy_shared_memory_region(h)
    return statistics.median(times[1:])


def main() -> None:
    peers = Path(os.environ.get("V2PROXY_PEERS_DIR") or launch.peers_dir())
    with launch.triton_server(peers) as triton:
        res = {}
        for mode in ("off", "auto"):
            args = ("serve", "--backend", triton.base_url, "--backend-shm", mode)
            with v2proxy(*args, "--restricted-api", "none", name="bench") as p:
                res[("grpc", mode)] = _grpc(p.grpc_url)
                res[("client-shm", mode)] = _client_shm(p.url)
        for (how, mode), s in sorted(res.items()):
            print(f"{how:10} --backend-shm {mode:4}: {s * 1000:8.1f} ms")
        for how in ("grpc", "client-shm"):
            print(f"{how}: staging/off = {res[(how, 'auto')] / res[(how, 'off')]:.2f}")


if __name__ == "__main__":
    main()
