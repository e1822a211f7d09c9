"""CUDA shared memory with a real GPU (marker ``gpu``; skipped without cupy, cuda-python or a
CUDA device, see tests/conftest.py): Triton's ``simple_{http,grpc}_cudashm_client.py`` flow with
``tritonclient.utils.cuda_shared_memory`` through a v2proxy process in front of the builtin
models. The client process exports the IPC handles, v2proxy (another process) opens them with
cupy, copies the inputs device -> host and the outputs host -> device.

Not run in this project: its machines have no GPU (docs/guides/shared-memory.md, CUDA shared
memory)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from procs import Proc, v2proxy

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_proxy() -> Iterator[Proc]:
    with v2proxy("serve", "--backend", "builtin", "--restricted-api", "none") as p:
        yield p


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_simple_cudashm_client(gpu_proxy: Proc, protocol: str) -> None:
    import tritonclient.utils.cuda_shared_memory as cudashm

    client: Any = (
        httpclient.InferenceServerClient(gpu_proxy.url)
        if protocol == "http"
        else grpcclient.InferenceServerClient(gpu_proxy.grpc_url)
    )
    with client:
        mod: Any = httpclient if protocol == "http" else grpcclient
        client.unregister_cuda_shared_memory()
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.ones((1, 16), dtype=np.int32)
        handles = {
            name: cudashm.create_shared_memory_region(name, size, 0)
            for name, size in [("input_data", 128), ("output0_data", 64), ("output1_data", 64)]
        }
        try:
            cudashm.set_shared_memory_region(handles["input_data"], [a, b])
            for name, handle in handles.items():
                size = 128 if name == "input_data" else 64
                client.register_cuda_shared_memory(name, cudashm.get_raw_handle(handle), 0, size)
            status = client.get_cuda_shared_memory_status()
            names = (
                sorted(r["name"] for r in status) if protocol == "http" else sorted(status.regions)
            )
            assert names == ["input_data", "output0_data", "output1_data"]
            inputs = [mod.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_shared_memory("input_data", 64, offset=0)
            inputs[1].set_shared_memory("input_data", 64, offset=64)
            outputs = [mod.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
            outputs[0].set_shared_memory("output0_data", 64)
            outputs[1].set_shared_memory("output1_data", 64)
            result = client.infer("simple", inputs, outputs=outputs)
            assert result.get_output("OUTPUT0") is not None
            out0 = cudashm.get_contents_as_numpy(handles["output0_data"], np.int32, [1, 16])
            out1 = cudashm.get_contents_as_numpy(handles["output1_data"], np.int32, [1, 16])
            np.testing.assert_array_equal(out0, a + b)
            np.testing.assert_array_equal(out1, a - b)
            client.unregister_cuda_shared_memory()
            status = client.get_cuda_shared_memory_status()
            assert (len(status) if protocol == "http" else len(status.regions)) == 0
        finally:
            client.unregister_cuda_shared_memory()
            for handle in handles.values():
                cudashm.destroy_shared_memory_region(handle)
