"""The shared-memory RPCs of the gRPC frontend (docs/protocol.md, shared memory): system and
CUDA register, unregister and status, each one call of the pipeline (group ``shared-memory``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.core.pipeline import Pipeline
from v2proxy.frontends.grpc_call import Context


def peer_host(peer: str | None) -> str | None:
    """The IP address in a gRPC peer string; None for a unix socket; "" when unknown."""
    if not peer:
        return ""
    scheme, _, rest = peer.partition(":")
    if scheme in ("unix", "unix-abstract"):
        return None
    if scheme == "ipv6":
        host = rest.rpartition(":")[0]
        return unquote(host).strip("[]")
    if scheme == "ipv4":
        return rest.rpartition(":")[0]
    return ""


def peer_of(c: Context) -> str | None:
    """The client's IP address for ``--client-shm`` (None: a unix socket; "" unknown)."""
    return peer_host(c.peer())


class SharedMemoryRpcs:
    """The six shared-memory RPCs on top of the pipeline (registered by the gRPC frontend)."""

    __slots__ = ("pipeline",)

    #: the RPCs of inference.GRPCInferenceService served here
    NAMES = frozenset(
        {
            "SystemSharedMemoryStatus",
            "SystemSharedMemoryRegister",
            "SystemSharedMemoryUnregister",
            "CudaSharedMemoryStatus",
            "CudaSharedMemoryRegister",
            "CudaSharedMemoryUnregister",
        }
    )

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def SystemSharedMemoryStatus(
        self, r: pb.SystemSharedMemoryStatusRequest, c: Context
    ) -> pb.SystemSharedMemoryStatusResponse:
        regions = await self.pipeline.shm_status("system", r.name, peer_of(c))
        resp = pb.SystemSharedMemoryStatusResponse()
        for reg in regions:
            status = resp.regions[reg["name"]]
            status.name, status.key = reg["name"], reg["key"]
            status.offset, status.byte_size = reg["offset"], reg["byte_size"]
        return resp

    async def SystemSharedMemoryRegister(
        self, r: pb.SystemSharedMemoryRegisterRequest, c: Context
    ) -> pb.SystemSharedMemoryRegisterResponse:
        await self.pipeline.shm_register(r.name, r.key, r.offset, r.byte_size, peer_of(c))
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, r: pb.SystemSharedMemoryUnregisterRequest, c: Context
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        await self.pipeline.shm_unregister("system", r.name, peer_of(c))
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self, r: pb.CudaSharedMemoryStatusRequest, c: Context
    ) -> pb.CudaSharedMemoryStatusResponse:
        regions: list[dict[str, Any]]
        regions = await self.pipeline.shm_status("cuda", r.name, peer_of(c))
        resp = pb.CudaSharedMemoryStatusResponse()
        for reg in regions:
            status = resp.regions[reg["name"]]
            status.name, status.device_id = reg["name"], reg["device_id"]
            status.byte_size = reg["byte_size"]
        return resp

    async def CudaSharedMemoryRegister(
        self, r: pb.CudaSharedMemoryRegisterRequest, c: Context
    ) -> pb.CudaSharedMemoryRegisterResponse:
        await self.pipeline.cuda_shm_register(
            r.name, r.raw_handle, r.device_id, r.byte_size, peer_of(c)
        )
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(
        self, r: pb.CudaSharedMemoryUnregisterRequest, c: Context
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        await self.pipeline.shm_unregister("cuda", r.name, peer_of(c))
        return pb.CudaSharedMemoryUnregisterResponse()
