"""CUDA shared memory through the adapter (v2proxy.shm.cuda) with a fake: each raw handle names
a host bytearray standing in for device memory. Registration, Triton's status shapes and texts,
the shared namespace with system regions, bounds, inputs copied out and outputs copied in,
deferred unregister, gauges, the workers' shared registry, and a proxy without an adapter."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from v2proxy.codecs.side import cuda_register_body
from v2proxy.core.errors import AlreadyExists, CodecError, InvalidRequest, NotFound, ProxyError
from v2proxy.core.model import (
    Buffer,
    Datatype,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
)
from v2proxy.core.stages.shm import resolve
from v2proxy.ops.metrics import Counter
from v2proxy.shm.cuda import CudaError
from v2proxy.shm.registry import Registry
from v2proxy.shm.shared import SharedRegistry

H1, H2 = b"\x01" * 64, b"\x02" * 64


class FakeMemory:
    def __init__(self, adapter: FakeAdapter, buf: bytearray, device_id: int) -> None:
        self.adapter, self.buf, self.device_id = adapter, buf, device_id
        self.size: int | None = len(buf)

    def to_host(self, offset: int, size: int) -> bytearray:
        self.adapter.copies.append(("d2h", offset, size))
        return bytearray(self.buf[offset : offset + size])

    def from_host(self, offset: int, data: Buffer) -> None:
        src = memoryview(data).cast("B")
        self.adapter.copies.append(("h2d", offset, src.nbytes))
        self.buf[offset : offset + src.nbytes] = src

    def close(self) -> None:
        self.adapter.closed += 1


class FakeAdapter:
    """Handles -> host bytearrays ("device memory"); counts opens, closes and copies."""

    def __init__(self) -> None:
        self.devices: dict[bytes, bytearray] = {H1: bytearray(256), H2: bytearray(64)}
        self.opened = 0
        self.closed = 0
        self.copies: list[tuple[str, int, int]] = []

    def open(self, raw_handle: bytes, device_id: int) -> FakeMemory:
        if raw_handle not in self.devices or device_id != 0:
            raise CudaError("invalid resource handle")
        self.opened += 1
        return FakeMemory(self, self.devices[raw_handle], device_id)


class FakeSystem:
    """A system region without POSIX shared memory."""

    def __init__(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size
        self.buf = bytearray(byte_size)

    def check(self) -> None: ...

    def view(self, offset: int, size: int) -> memoryview:
        return memoryview(self.buf)[offset : offset + size]

    def write(self, offset: int, data: Buffer) -> None:
        self.buf[offset : offset + len(bytes(data))] = bytes(data)

    def close(self) -> None: ...


def _message(exc: pytest.ExceptionInfo[Any]) -> str:
    return str(exc.value.message)


def registry(adapter: FakeAdapter | None, **kw: Any) -> Registry:
    return Registry(opener=FakeSystem, cuda_adapter=adapter, **kw)


def test_register_status_unregister_and_the_shared_namespace() -> None:
    fake = FakeAdapter()
    reg = registry(fake)
    reg.register_cuda("c", H1, 0, 128)
    reg.register("s", "/k", 0, 64)
    assert reg.status("", "cuda") == [{"name": "c", "device_id": 0, "byte_size": 128}]
    assert reg.status("c", "cuda") == [{"name": "c", "device_id": 0, "byte_size": 128}]
    assert reg.status("", "system") == [{"name": "s", "key": "/k", "offset": 0, "byte_size": 64}]
    with pytest.raises(NotFound) as err:
        reg.status("s", "cuda")
    assert _message(err) == (
        "The region named 's' is registered as system shared memory, not CUDA shared memory"
    )
    with pytest.raises(NotFound) as err:
        reg.status("c", "system")
    assert _message(err) == (
        "The region named 'c' is registered as CUDA shared memory, not system shared memory"
    )
    with pytest.raises(NotFound) as err:
        reg.status("nope", "cuda")
    assert _message(err) == "Unable to find cuda shared memory region: 'nope'"
    for again in (lambda: reg.register_cuda("s", H2, 0, 8), lambda: reg.register("c", "/k", 0, 8)):
        with pytest.raises(AlreadyExists) as err:
            again()
        assert err.value.message.endswith("already in manager")
    reg.unregister("c", "system")  # the other kind: a no-op success
    reg.unregister("", "system")  # all system regions, not the CUDA one
    assert reg.status("", "system") == []
    assert [r["name"] for r in reg.status("", "cuda")] == ["c"]
    reg.unregister("c", "cuda")
    assert reg.status("", "cuda") == [] and fake.closed == 1
    reg.unregister("c", "cuda")  # unknown: a no-op success


def test_register_refusals_with_tritons_texts() -> None:
    reg = registry(FakeAdapter())
    with pytest.raises(InvalidRequest) as err:
        reg.register_cuda("c", b"\x09" * 64, 0, 8)
    assert _message(err) == "failed to register shared memory region: invalid args"
    with pytest.raises(InvalidRequest) as err:
        reg.register_cuda("c", H1, 3, 8)  # a device the handle is not on
    assert _message(err) == "failed to register shared memory region: invalid args"
    with pytest.raises(InvalidRequest) as err:
        reg.register_cuda("c", H2, 0, 65)  # above the allocation
    assert _message(err) == "failed to register shared memory region 'c': invalid args"
    reg.register_cuda("c", H2, 0, 64)


def test_without_an_adapter_register_is_the_cpu_build_text() -> None:
    reg = registry(None)
    with pytest.raises(InvalidRequest) as err:
        reg.register_cuda("c", H1, 0, 8)
    assert _message(err) == "failed to register CUDA shared memory region: 'c', GPUs not supported"
    assert err.value.http_status == 400
    assert reg.status("", "cuda") == []
    reg.unregister("", "cuda")
    reg.unregister("c", "cuda")
    with pytest.raises(NotFound):
        reg.status("c", "cuda")


def _simple(offsets: tuple[int, int, int] = (0, 64, 128)) -> InferRequest:
    shm = [
        {"shared_memory_region": "c", "shared_memory_offset": o, "shared_memory_byte_size": 64}
        for o in offsets
    ]
    return InferRequest(
        model_name="simple",
        inputs=[
            Tensor("INPUT0", Datatype.INT32, (1, 16), b"", parameters=shm[0]),
            Tensor("INPUT1", Datatype.INT32, (1, 16), b"", parameters=shm[1]),
        ],
        outputs=[RequestedOutput("OUTPUT0", parameters=shm[2])],
    )


def test_inputs_copied_out_outputs_copied_in_and_gauges() -> None:
    fake = FakeAdapter()
    regions, size = Counter(), Counter()
    reg = registry(fake, cuda_gauges=(regions, size))
    fake.devices[H1][0:64] = np.arange(16, dtype=np.int32).tobytes()
    fake.devices[H1][64:128] = np.ones(16, dtype=np.int32).tobytes()
    reg.register_cuda("c", H1, 0, 256)
    assert (regions.value, size.value) == (1, 256)
    request = _simple()
    use = resolve(request, reg, peer=None)
    assert use is not None
    fake.devices[H1][0:4] = b"\xff" * 4  # a copy: later device writes do not reach the tensor
    a = np.frombuffer(request.inputs[0].data, np.int32)
    assert a.tolist() == list(range(16))
    assert request.inputs[0].parameters == {}
    assert fake.copies == [("d2h", 0, 64), ("d2h", 64, 64)]
    total = a + np.frombuffer(request.inputs[1].data, np.int32)
    response = InferResponse(
        model_name="simple", outputs=[Tensor("OUTPUT0", Datatype.INT32, (1, 16), total.tobytes())]
    )
    use.write_outputs(response)
    use.release()
    assert response.outputs[0].in_shm and response.outputs[0].data == b""
    assert np.frombuffer(bytes(fake.devices[H1][128:192]), np.int32).tolist() == list(range(1, 17))
    assert fake.copies[-1] == ("h2d", 128, 64)
    reg.unregister("", "cuda")
    assert (regions.value, size.value) == (0, 0)


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ((256, 0, 128), "Invalid offset for shared memory region: 'c'"),
        ((200, 0, 128), "Invalid offset + byte size for shared memory region: 'c'"),
        ((0, 0, 2**64 - 32), "Invalid offset for shared memory region: 'c'"),
    ],
)
def test_bounds_checked_before_any_copy(offsets: tuple[int, int, int], message: str) -> None:
    fake = FakeAdapter()
    reg = registry(fake)
    reg.register_cuda("c", H1, 0, 256)
    with pytest.raises(InvalidRequest) as err:
        resolve(_simple(offsets), reg, peer=None)
    assert _message(err) == message
    assert reg.users("c") == 0
    assert all(kind != "d2h" or off + n <= 256 for kind, off, n in fake.copies)


def test_output_too_small_and_copy_failures() -> None:
    fake = FakeAdapter()
    reg = registry(fake)
    reg.register_cuda("c", H1, 0, 256)
    request = _simple()
    use = resolve(request, reg, peer=None)
    assert use is not None
    big = Tensor("OUTPUT0", Datatype.INT32, (1, 32), bytes(128))
    with pytest.raises(ProxyError) as err:
        use.write_outputs(InferResponse(model_name="simple", outputs=[big]))
    assert err.value.http_status == 500 and "should be at least 128 bytes" in err.value.message
    use.release()

    def broken(offset: int, size: int) -> bytearray:
        raise CudaError("an illegal memory access was encountered")

    region: Any = reg.acquire("c")
    region._mem.to_host = broken
    with pytest.raises(ProxyError, match="failed to copy from CUDA shared memory region 'c'"):
        resolve(_simple(), reg, peer=None)
    reg.release(region)
    assert reg.users("c") == 0


def test_unregister_is_deferred_while_a_request_holds_the_region() -> None:
    fake = FakeAdapter()
    reg = registry(fake)
    reg.register_cuda("c", H1, 0, 256)
    use = resolve(_simple(), reg, peer=None)
    assert use is not None and reg.users("c") == 1
    reg.unregister("", "cuda")
    assert [r["name"] for r in reg.status("", "cuda")] == ["c"]  # still listed
    assert fake.closed == 0
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'c'"):
        resolve(_simple(), reg, peer=None)
    use.write_outputs(
        InferResponse(
            model_name="simple", outputs=[Tensor("OUTPUT0", Datatype.INT32, (1, 16), bytes(64))]
        )
    )
    use.release()
    assert reg.status("", "cuda") == [] and fake.closed == 1


def test_workers_share_cuda_records_and_open_handles_lazily(tmp_path: Any) -> None:
    a_fake, b_fake = FakeAdapter(), FakeAdapter()
    b_fake.devices = a_fake.devices  # one "device" two processes open
    a = SharedRegistry(str(tmp_path), opener=FakeSystem, cuda_adapter=a_fake)
    b = SharedRegistry(str(tmp_path), opener=FakeSystem, cuda_adapter=b_fake)
    a.register_cuda("c", H1, 0, 256)
    a.register("s", "/k", 0, 8)
    for reg in (a, b):
        assert reg.status("", "cuda") == [{"name": "c", "device_id": 0, "byte_size": 256}]
        assert [r["name"] for r in reg.status("", "system")] == ["s"]
        with pytest.raises(NotFound, match="registered as CUDA shared memory"):
            reg.status("c", "system")
    with pytest.raises(AlreadyExists):
        b.register_cuda("c", H2, 0, 8)
    assert b_fake.opened == 0
    a_fake.devices[H1][0:64] = np.arange(16, dtype=np.int32).tobytes()
    request = _simple()
    use = resolve(request, b, peer=None)  # b opens the handle on first use
    assert use is not None and b_fake.opened == 1
    assert np.frombuffer(request.inputs[0].data, np.int32).tolist() == list(range(16))
    b.unregister("", "cuda")  # deferred: b holds it
    assert [r["name"] for r in a.status("", "cuda")] == ["c"]
    use.release()
    assert a.status("", "cuda") == [] and b_fake.closed == 1
    assert [r["name"] for r in a.status("", "system")] == ["s"]
    a.sweep()
    assert a_fake.closed == 1  # a's own opening goes when the record does
    a.close()
    b.close()


def test_workers_without_an_adapter() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        reg = SharedRegistry(folder, opener=FakeSystem)
        with pytest.raises(InvalidRequest, match="GPUs not supported"):
            reg.register_cuda("c", H1, 0, 8)
        assert reg.status("", "cuda") == []
        reg.unregister("", "cuda")


B64 = base64.b64encode(H1).decode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"raw_handle": {"b64": B64}, "device_id": 0, "byte_size": 8}, (H1, 0, 8)),
        ({"raw_handle": {"b64": B64.rstrip("=")}, "device_id": 1, "byte_size": 0}, (H1, 1, 0)),
        ({"device_id": 0, "byte_size": 8}, "has no 'raw_handle' field"),
        ({"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8}, "valid base64"),
        ({"raw_handle": {"b64": "!!"}, "device_id": 0, "byte_size": 8}, "valid base64"),
        ({"raw_handle": B64, "device_id": 0, "byte_size": 8}, "raw_handle.b64"),
        ({"raw_handle": {"b64": B64}, "byte_size": 8}, "has no 'device_id' field"),
        ({"raw_handle": {"b64": B64}, "device_id": 0}, "has no 'byte_size' field"),
        ({"raw_handle": {"b64": B64}, "device_id": -1, "byte_size": 8}, "'device_id'"),
        ({"raw_handle": {"b64": B64}, "device_id": 0, "byte_size": "8"}, "'byte_size'"),
    ],
)
def test_rest_register_body(body: dict[str, Any], expected: Any) -> None:
    import json

    raw = json.dumps(body).encode()
    if isinstance(expected, tuple):
        assert cuda_register_body(raw) == expected
        return
    with pytest.raises(CodecError) as err:
        cuda_register_body(raw)
    assert expected in err.value.message
