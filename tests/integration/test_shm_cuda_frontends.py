"""CUDA shared memory through the REST and gRPC frontends in process, in front of the builtin
models, with the fake adapter of tests/unit/test_shm_cuda.py (host bytearrays as device
memory): register (base64 over REST, raw bytes over gRPC), status, inference with inputs and
outputs in a CUDA region, unregister; and a proxy without an adapter (Triton's CPU-build text,
status and unregister still work)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest

from tests.integration.conftest import Factory, grpc_frontend, settings
from tests.unit.test_shm_cuda import H1, FakeAdapter
from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.app import build_rest
from v2proxy.app_core import build_pipeline
from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.shm.cuda import CudaAdapter

SVC = "/inference.GRPCInferenceService/"


def _device(fake: FakeAdapter) -> bytearray:
    dev = fake.devices[H1]
    dev[0:64] = np.arange(16, dtype=np.int32).tobytes()
    dev[64:128] = np.full(16, 2, dtype=np.int32).tobytes()
    return dev


def _shm(offset: int) -> dict[str, Any]:
    return {
        "shared_memory_region": "gpu",
        "shared_memory_offset": offset,
        "shared_memory_byte_size": 64,
    }


async def test_rest_register_infer_status_unregister(make_client: Factory) -> None:
    fake = FakeAdapter()
    dev = _device(fake)
    s = settings(restricted_api="none")
    proxy = await make_client(build_rest(s, build_pipeline(s, BuiltinBackend(), cuda_adapter=fake)))
    body = {"raw_handle": {"b64": base64.b64encode(H1).decode()}, "device_id": 0, "byte_size": 256}
    resp = await proxy.post("/v2/cudasharedmemory/region/gpu/register", json=body)
    assert resp.status == 200, await resp.text()
    assert await resp.read() == b""
    resp = await proxy.get("/v2/cudasharedmemory/status")
    assert await resp.json() == [{"name": "gpu", "device_id": 0, "byte_size": 256}]
    resp = await proxy.get("/v2/systemsharedmemory/region/gpu/status")
    assert resp.status == 404
    assert (await resp.json())["error"] == (
        "The region named 'gpu' is registered as CUDA shared memory, not system shared memory"
    )
    infer = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": _shm(0)},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": _shm(64)},
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": _shm(128)},
            {"name": "OUTPUT1", "parameters": _shm(192)},
        ],
    }
    resp = await proxy.post("/v2/models/simple/infer", json=infer)
    assert resp.status == 200, await resp.text()
    outputs = (await resp.json())["outputs"]
    assert outputs == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16]},
    ]
    assert np.frombuffer(bytes(dev[128:192]), np.int32).tolist() == [i + 2 for i in range(16)]
    assert np.frombuffer(bytes(dev[192:256]), np.int32).tolist() == [i - 2 for i in range(16)]
    resp = await proxy.post("/v2/cudasharedmemory/region/gpu/register", json=body)
    assert resp.status == 400
    assert (await resp.json())["error"] == "shared memory region 'gpu' already in manager"
    bad = {**body, "raw_handle": {"b64": "AAAA"}}
    resp = await proxy.post("/v2/cudasharedmemory/region/x/register", json=bad)
    assert (await resp.json())["error"] == (
        "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"
    )
    assert (await proxy.post("/v2/systemsharedmemory/unregister")).status == 200
    assert len(await (await proxy.get("/v2/cudasharedmemory/status")).json()) == 1
    assert (await proxy.post("/v2/cudasharedmemory/unregister")).status == 200
    assert await (await proxy.get("/v2/cudasharedmemory/status")).json() == []
    assert fake.closed == 1


async def test_rest_without_an_adapter(make_client: Factory) -> None:
    s = settings(restricted_api="none")
    proxy = await make_client(build_rest(s, build_pipeline(s, BuiltinBackend(), cuda_adapter=None)))
    body = {"raw_handle": {"b64": base64.b64encode(H1).decode()}, "device_id": 0, "byte_size": 8}
    resp = await proxy.post("/v2/cudasharedmemory/region/gpu/register", json=body)
    assert resp.status == 400
    assert (await resp.json())["error"] == (
        "failed to register CUDA shared memory region: 'gpu', GPUs not supported"
    )
    assert await (await proxy.get("/v2/cudasharedmemory/status")).json() == []
    assert (await proxy.post("/v2/cudasharedmemory/unregister")).status == 200
    assert (await proxy.post("/v2/cudasharedmemory/region/gpu/unregister")).status == 200
    resp = await proxy.get("/v2/cudasharedmemory/region/gpu/status")
    assert resp.status == 404
    assert (await resp.json())["error"] == "Unable to find cuda shared memory region: 'gpu'"


@pytest.fixture
async def grpc_proxy(request: pytest.FixtureRequest) -> AsyncIterator[grpc.aio.Channel]:
    adapter: CudaAdapter | None = request.param
    s = settings(restricted_api="none")
    backend = BuiltinBackend()
    await backend.start()
    try:
        async with grpc_frontend(s, build_pipeline(s, backend, cuda_adapter=adapter)) as channel:
            yield channel
    finally:
        await backend.close()


async def _call(channel: grpc.aio.Channel, method: str, req: Any) -> Any:
    resp_type = getattr(pb, type(req).__name__.replace("Request", "Response"))
    call = channel.unary_unary(
        SVC + method,
        request_serializer=type(req).SerializeToString,
        response_deserializer=resp_type.FromString,
    )
    return await call(req, timeout=30)


def _grpc_params(offset: int) -> dict[str, pb.InferParameter]:
    return {
        "shared_memory_region": pb.InferParameter(string_param="gpu"),
        "shared_memory_offset": pb.InferParameter(int64_param=offset),
        "shared_memory_byte_size": pb.InferParameter(int64_param=64),
    }


FAKE = FakeAdapter()


@pytest.mark.parametrize("grpc_proxy", [FAKE], indirect=True)
async def test_grpc_register_infer_status_unregister(grpc_proxy: grpc.aio.Channel) -> None:
    FAKE.closed = 0
    dev = _device(FAKE)
    dev[128:] = bytes(128)
    reg = pb.CudaSharedMemoryRegisterRequest(name="gpu", raw_handle=H1, device_id=0, byte_size=256)
    await _call(grpc_proxy, "CudaSharedMemoryRegister", reg)
    status = await _call(grpc_proxy, "CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest())
    assert list(status.regions) == ["gpu"]
    assert (status.regions["gpu"].device_id, status.regions["gpu"].byte_size) == (0, 256)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _call(grpc_proxy, "CudaSharedMemoryRegister", reg)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    t = pb.ModelInferRequest.InferInputTensor
    o = pb.ModelInferRequest.InferRequestedOutputTensor
    infer = pb.ModelInferRequest(
        model_name="simple",
        inputs=[
            t(name="INPUT0", datatype="INT32", shape=[1, 16], parameters=_grpc_params(0)),
            t(name="INPUT1", datatype="INT32", shape=[1, 16], parameters=_grpc_params(64)),
        ],
        outputs=[o(name="OUTPUT0", parameters=_grpc_params(128))],
    )
    resp = await _call(grpc_proxy, "ModelInfer", infer)
    assert [x.name for x in resp.outputs] == ["OUTPUT0"]
    assert list(resp.raw_output_contents) == [b""]
    assert np.frombuffer(bytes(dev[128:192]), np.int32).tolist() == [i + 2 for i in range(16)]
    unreg = pb.CudaSharedMemoryUnregisterRequest(name="gpu")
    await _call(grpc_proxy, "CudaSharedMemoryUnregister", unreg)
    status = await _call(grpc_proxy, "CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest())
    assert list(status.regions) == [] and FAKE.closed == 1


@pytest.mark.parametrize("grpc_proxy", [None], indirect=True)
async def test_grpc_without_an_adapter(grpc_proxy: grpc.aio.Channel) -> None:
    reg = pb.CudaSharedMemoryRegisterRequest(name="gpu", raw_handle=H1, device_id=0, byte_size=8)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _call(grpc_proxy, "CudaSharedMemoryRegister", reg)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == (
        "failed to register CUDA shared memory region: 'gpu', GPUs not supported"
    )
    status = await _call(grpc_proxy, "CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest())
    assert list(status.regions) == []
    await _call(grpc_proxy, "CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest())
