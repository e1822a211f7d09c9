"""``--backend-shm`` staging without a backend: the pool (sizes, reuse, bound, unlink) and the
stager against a fake port that reads the staged inputs from /dev/shm as a backend would."""

from __future__ import annotations

import asyncio
import mmap
import os
from typing import Any

import posix_ipc
import pytest

from v2proxy.backends.staging import Stager
from v2proxy.core.errors import BackendError, ProxyError
from v2proxy.core.model import Datatype, InferRequest, InferResponse, RequestedOutput, Tensor
from v2proxy.shm.staging import MIN_REGION, StagingPool, region_size


def _exists(key: str) -> bool:
    return os.path.exists("/dev/shm/" + key.lstrip("/"))


def test_pool_sizes_reuse_bound_and_unlink() -> None:
    assert region_size(1) == MIN_REGION and region_size(MIN_REGION + 1) == 2 * MIN_REGION
    pool = StagingPool(4 * MIN_REGION, f"v2proxy-{os.getpid()}-unit")
    a, dropped = pool.acquire(100)
    assert a is not None and a.size == MIN_REGION and not dropped and _exists(a.key)
    pool.release(a)
    b, _ = pool.acquire(MIN_REGION)
    assert b is a  # reused
    c, _ = pool.acquire(2 * MIN_REGION + 1)  # 4 * MIN: does not fit beside a lent one
    assert c is None
    pool.release(b)
    c, dropped = pool.acquire(2 * MIN_REGION + 1)  # the free one dropped to make room
    assert c is not None and dropped == [a] and not _exists(a.key)
    c.registered = True
    assert pool.close() == [c] and not _exists(c.key) and pool.total == 0


class FakePort:
    def __init__(
        self, extensions: list[str], refuse: bool = False, out_shape: list[int] | None = None
    ) -> None:
        self.extensions = extensions
        self.refuse = refuse
        self.out_shape = [1, 32768] if out_shape is None else out_shape
        self.regions: dict[str, str] = {}
        self.sent: list[InferRequest] = []

    async def server_metadata(self) -> dict[str, Any]:
        return {"extensions": self.extensions}

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        return {"outputs": [{"name": "OUT", "datatype": "FP32", "shape": self.out_shape}]}

    async def register_staging(self, name: str, key: str, byte_size: int) -> None:
        self.regions[name] = key

    async def unregister_staging(self, name: str) -> None:
        del self.regions[name]

    async def send(self, request: InferRequest) -> InferResponse:
        """Echo INPUT as OUT, through the staging region when asked (as Triton does)."""
        self.sent.append(request)
        t = request.inputs[0]
        if "shared_memory_region" in t.parameters:
            if self.refuse:
                raise BackendError("Unable to find shared memory region: 'x'", 400)
            mem = posix_ipc.SharedMemory(self.regions[t.parameters["shared_memory_region"]])
            with mmap.mmap(mem.fd, 0) as m:
                mem.close_fd()
                off = t.parameters["shared_memory_offset"]
                data = bytes(m[off : off + t.parameters["shared_memory_byte_size"]])
                out = request.outputs[0] if request.outputs else None
                if out is not None and "shared_memory_region" in out.parameters:
                    o = out.parameters["shared_memory_offset"]
                    room = out.parameters["shared_memory_byte_size"]
                    if room < len(data):  # Triton's text, with its request-id prefix
                        raise BackendError(
                            "[request id: <id_unknown>] shared memory size specified with the"
                            f" request for output 'OUT' ({room} bytes) should be at least"
                            f" {len(data)} bytes to hold the results",
                            400,
                        )
                    m[o : o + len(data)] = data
                    data = b""
        else:
            data = bytes(t.data)
        return InferResponse("m", [Tensor("OUT", Datatype.FP32, (1, 32768), data)])


def _request() -> InferRequest:
    data = bytes(range(256)) * 512  # 128 KiB = FP32 [1, 32768]
    return InferRequest("m", [Tensor("INPUT", Datatype.FP32, (1, 32768), data)])


@pytest.mark.parametrize("mode", ["auto", "system"])
def test_stager_stages_inputs_and_fixed_outputs(mode: str) -> None:
    async def run() -> None:
        port = FakePort(["system_shared_memory"] if mode == "auto" else [])
        stager = Stager(mode, 64 * 1024)
        for _ in range(2):
            resp = await stager.infer(port, _request(), port.send)
            assert bytes(resp.outputs[0].data) == bytes(_request().inputs[0].data)
        staged = port.sent[-1]
        assert staged.inputs[0].data == b""
        assert staged.outputs == [
            RequestedOutput(
                "OUT",
                {
                    "shared_memory_region": staged.inputs[0].parameters["shared_memory_region"],
                    "shared_memory_offset": 128 * 1024,
                    "shared_memory_byte_size": 128 * 1024,
                },
            )
        ]
        assert len(port.regions) == 2  # the probe's region and one of 256 KiB, reused
        keys = list(port.regions.values())
        await stager.close(port)
        assert port.regions == {} and not any(_exists(k) for k in keys)

    asyncio.run(run())


def test_stager_auto_without_extension_and_refusal() -> None:
    async def run() -> None:
        port = FakePort([])
        stager = Stager("auto", 64 * 1024)
        await stager.infer(port, _request(), port.send)
        assert (
            stager.usable is False
            and "shared_memory_region" not in port.sent[0].inputs[0].parameters
        )

        port = FakePort(["system_shared_memory"], refuse=True)
        stager = Stager("auto", 64 * 1024)
        resp = await stager.infer(port, _request(), port.send)  # refused, then sent with data
        assert bytes(resp.outputs[0].data) == bytes(_request().inputs[0].data)
        assert stager.usable is False and port.regions == {} and len(port.sent) == 2
        await stager.infer(port, _request(), port.send)
        assert len(port.sent) == 3 and port.sent[2].inputs[0].data

    asyncio.run(run())


def test_stager_off_and_small() -> None:
    async def run() -> None:
        port = FakePort(["system_shared_memory"])
        await Stager("off", 64 * 1024).infer(port, _request(), port.send)
        await Stager("auto", 1024 * 1024).infer(port, _request(), port.send)
        assert port.regions == {} and all(r.inputs[0].data for r in port.sent)

    asyncio.run(run())


class Sink:
    """The client's region as the shm stage hands it over
    (:class:`v2proxy.core.model.OutputSink`)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.written: list[bytes] = []

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))


@pytest.mark.parametrize("room", [128 * 1024, 256 * 1024])
def test_open_shape_output_staged_into_client_sink(room: int) -> None:
    """An output of open shape is staged when the client asked it into its own region, whose
    size bounds it; the answer is copied once, from the staging region into that sink."""

    async def run() -> None:
        port = FakePort(["system_shared_memory"], out_shape=[-1, -1])
        stager = Stager("auto", 64 * 1024)
        sink = Sink(room)
        req = _request()
        req.outputs = [RequestedOutput("OUT", {}, sink)]
        resp = await stager.infer(port, req, port.send)
        sent = port.sent[-1].outputs
        assert sent is not None and sent[0].parameters["shared_memory_byte_size"] == room
        assert sent[0].parameters["shared_memory_offset"] == 128 * 1024
        out = resp.outputs[0]
        assert out.in_shm and out.data == b"" and out.parameters == {}
        assert sink.written == [bytes(_request().inputs[0].data)]
        # without a sink the open shape is not staged: the output crosses the socket
        req = _request()
        req.outputs = [RequestedOutput("OUT")]
        resp = await stager.infer(port, req, port.send)
        assert "shared_memory_region" not in port.sent[-1].outputs[0].parameters  # type: ignore[index]
        assert bytes(resp.outputs[0].data) == bytes(_request().inputs[0].data)
        await stager.close(port)

    asyncio.run(run())


def test_open_shape_sink_too_small_is_the_clients_error() -> None:
    async def run() -> None:
        port = FakePort(["system_shared_memory"], out_shape=[-1])
        stager = Stager("auto", 64 * 1024)
        req = _request()
        req.outputs = [RequestedOutput("OUT", {}, Sink(64 * 1024))]
        with pytest.raises(ProxyError) as caught:
            await stager.infer(port, req, port.send)
        assert type(caught.value) is ProxyError
        assert caught.value.message == (
            "shared memory size specified with the request for output 'OUT' (65536 bytes)"
            " should be at least 131072 bytes to hold the results"
        )
        assert stager.usable is True  # not taken for a refusal of staging
        await stager.close(port)

    asyncio.run(run())
