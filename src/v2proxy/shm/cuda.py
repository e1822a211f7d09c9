"""CUDA shared memory behind a small adapter (docs/protocol.md, CUDA regions): a client's
``cudaIpcMemHandle_t`` opened on a device, inputs copied device -> host before the backend call and
outputs host -> device after it (every backend here takes host tensors)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
from typing import Any, Protocol

from v2proxy.core.errors import InvalidRequest, ProxyError
from v2proxy.core.model import Buffer

HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)


class CudaError(Exception):
    """A CUDA call failed (the adapter's only error)."""


class DeviceMemory(Protocol):
    """An opened IPC allocation: ``size`` is its byte size when the adapter can tell, else
    None."""

    size: int | None

    def to_host(self, offset: int, size: int) -> bytearray:
        """``size`` bytes from ``offset`` copied device -> host into a new buffer."""
        ...

    def from_host(self, offset: int, data: Buffer) -> None:
        """``data`` copied host -> device at ``offset``."""
        ...

    def close(self) -> None: ...


class CudaAdapter(Protocol):
    def open(self, raw_handle: bytes, device_id: int) -> DeviceMemory: ...


class CudaRegion:
    """One registered CUDA region (offsets relative to the allocation's start)."""

    __slots__ = ("_mem", "byte_size", "device_id", "name")

    def __init__(self, name: str, device_id: int, byte_size: int, mem: DeviceMemory) -> None:
        self.name = name
        self.device_id = device_id
        self.byte_size = byte_size
        self._mem: DeviceMemory | None = mem

    def _memory(self) -> DeviceMemory:
        if self._mem is None:
            raise ProxyError(f"CUDA shared memory region '{self.name}' is closed")
        return self._mem

    def check(self) -> None:
        self._memory()

    def read(self, offset: int, size: int) -> memoryview:
        try:
            return memoryview(self._memory().to_host(offset, size))
        except CudaError as exc:
            raise ProxyError(
                f"failed to copy from CUDA shared memory region '{self.name}': {exc}"
            ) from None

    def write(self, offset: int, data: Buffer) -> None:
        try:
            self._memory().from_host(offset, data)
        except CudaError as exc:
            raise ProxyError(
                f"failed to copy to CUDA shared memory region '{self.name}': {exc}"
            ) from None

    def close(self) -> None:
        mem, self._mem = self._mem, None
        if mem is not None:
            with contextlib.suppress(CudaError):  # nothing more to do if the driver refuses
                mem.close()

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


def open_region(
    adapter: CudaAdapter, name: str, raw_handle: bytes, device_id: int, byte_size: int
) -> CudaRegion:
    """Open a client's handle as Triton's ``OpenCudaIPCRegion`` does, with its texts."""
    try:
        mem = adapter.open(bytes(raw_handle), device_id)
    except CudaError:
        raise InvalidRequest("failed to register shared memory region: invalid args") from None
    if mem.size is not None and byte_size > mem.size:
        mem.close()
        raise InvalidRequest(f"failed to register shared memory region '{name}': invalid args")
    return CudaRegion(name, device_id, byte_size, mem)


def wrong_kind(name: str, registered: str, asked: str) -> str:
    """Triton's 404 text for a status of a region of the other kind."""
    words = {"system": "system", "cuda": "CUDA"}
    return (
        f"The region named '{name}' is registered as {words[registered]} shared memory, not"
        f" {words[asked]} shared memory"
    )


def _address(buf: Any) -> int:
    import numpy as np

    return int(np.frombuffer(buf, np.uint8).ctypes.data)


class _CupyMemory:
    """An IPC allocation opened with cupy (runtime API) on one device."""

    def __init__(self, cupy: Any, ptr: int, device_id: int, size: int | None) -> None:
        self._cupy = cupy
        self._ptr = ptr
        self._device = device_id
        self.size = size

    def _copy(self, dst: int, src: int, n: int, kind: int) -> None:
        rt = self._cupy.cuda.runtime
        try:
            with self._cupy.cuda.Device(self._device):
                rt.memcpy(dst, src, n, kind)
        except rt.CUDARuntimeError as exc:
            raise CudaError(str(exc)) from None

    def to_host(self, offset: int, size: int) -> bytearray:
        out = bytearray(size)
        if size:
            rt = self._cupy.cuda.runtime
            self._copy(_address(out), self._ptr + offset, size, rt.memcpyDeviceToHost)
        return out

    def from_host(self, offset: int, data: Buffer) -> None:
        src = memoryview(data).cast("B")
        if src.nbytes:
            rt = self._cupy.cuda.runtime
            self._copy(self._ptr + offset, _address(src), src.nbytes, rt.memcpyHostToDevice)

    def close(self) -> None:
        rt = self._cupy.cuda.runtime
        try:
            with self._cupy.cuda.Device(self._device):
                rt.ipcCloseMemHandle(self._ptr)
        except rt.CUDARuntimeError as exc:
            raise CudaError(str(exc)) from None


def _allocation_size(ptr: int) -> int | None:
    """The size of the allocation holding ``ptr`` (driver ``cuMemGetAddressRange``, in the
    context the runtime made current), or None when the driver cannot tell."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuMemGetAddressRange_v2
    except (OSError, AttributeError):
        return None
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    if fn(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)) != 0:
        return None
    return int(size.value) - (ptr - int(base.value))


class CupyAdapter:
    """:class:`CudaAdapter` with cupy (``cudaIpcOpenMemHandle`` with lazy peer access,
    ``cudaMemcpy``, ``cudaIpcCloseMemHandle``, each under ``cupy.cuda.Device(id)``)."""

    def __init__(self) -> None:
        import cupy

        self._cupy = cupy

    def open(self, raw_handle: bytes, device_id: int) -> DeviceMemory:
        if len(raw_handle) != HANDLE_SIZE:
            raise CudaError(f"a cudaIpcMemHandle_t has {HANDLE_SIZE} bytes")
        rt = self._cupy.cuda.runtime
        try:
            with self._cupy.cuda.Device(device_id):
                ptr = rt.ipcOpenMemHandle(raw_handle, rt.cudaIpcMemLazyEnablePeerAccess)
                size = _allocation_size(ptr)
        except (rt.CUDARuntimeError, ValueError) as exc:
            raise CudaError(str(exc)) from None
        return _CupyMemory(self._cupy, ptr, device_id, size)


def default_adapter() -> CudaAdapter | None:
    """A cupy adapter, or None without cupy or without a CUDA device (CPU-build answers)."""
    if importlib.util.find_spec("cupy") is None:
        return None
    try:
        adapter = CupyAdapter()
        if adapter._cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:  # cupy without a driver raises its own errors at first use
        return None
    return adapter
