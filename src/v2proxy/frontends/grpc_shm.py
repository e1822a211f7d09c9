"""The shared-memory RPCs of the gRPC frontend (docs/protocol.md, shared memory), each one call of
the pipeline (group ``shared-memory``): ``SystemSharedMemoryStatus/Register/Unregister`` and the
CUDA three (the raw handle's bytes as sent; without a CUDA adapter register is Triton's CPU-build
error).

The client's address for ``--client-shm local`` comes from ``context.peer()`` (:func:`peer_host`:
``ipv4:127.0.0.1:5000`` -> ``127.0.0.1``, ``ipv6:[::1]:5000`` -> ``::1``, ``unix:...`` -> None).
The functions take ``(frontend, request, context)`` and are bound as methods of
:class:`~v2proxy.frontends.grpc.GrpcFrontend`, so its call envelope applies to them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.frontends.grpc_call import Context, forwarded_headers

if TYPE_CHECKING:
    from v2proxy.frontends.grpc import GrpcFrontend


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


async def SystemSharedMemoryStatus(
    fe: GrpcFrontend, r: pb.SystemSharedMemoryStatusRequest, c: Context
) -> pb.SystemSharedMemoryStatusResponse:
    regions = await fe.pipeline.shm_status("system", r.name, peer_of(c), forwarded_headers(c))
    resp = pb.SystemSharedMemoryStatusResponse()
    for reg in regions:
        status = resp.regions[reg["name"]]
        status.name, status.key = reg["name"], reg["key"]
        status.offset, status.byte_size = reg["offset"], reg["byte_size"]
    return resp


async def SystemSharedMemoryRegister(
    fe: GrpcFrontend, r: pb.SystemSharedMemoryRegisterRequest, c: Context
) -> pb.SystemSharedMemoryRegisterResponse:
    await fe.pipeline.shm_register(
        r.name, r.key, r.offset, r.byte_size, peer_of(c), forwarded_headers(c)
    )
    return pb.SystemSharedMemoryRegisterResponse()


async def SystemSharedMemoryUnregister(
    fe: GrpcFrontend, r: pb.SystemSharedMemoryUnregisterRequest, c: Context
) -> pb.SystemSharedMemoryUnregisterResponse:
    await fe.pipeline.shm_unregister("system", r.name, peer_of(c), forwarded_headers(c))
    return pb.SystemSharedMemoryUnregisterResponse()


async def CudaSharedMemoryStatus(
    fe: GrpcFrontend, r: pb.CudaSharedMemoryStatusRequest, c: Context
) -> pb.CudaSharedMemoryStatusResponse:
    regions: list[dict[str, Any]]
    regions = await fe.pipeline.shm_status("cuda", r.name, peer_of(c), forwarded_headers(c))
    resp = pb.CudaSharedMemoryStatusResponse()
    for reg in regions:
        status = resp.regions[reg["name"]]
        status.name, status.device_id = reg["name"], reg["device_id"]
        status.byte_size = reg["byte_size"]
    return resp


async def CudaSharedMemoryRegister(
    fe: GrpcFrontend, r: pb.CudaSharedMemoryRegisterRequest, c: Context
) -> pb.CudaSharedMemoryRegisterResponse:
    await fe.pipeline.cuda_shm_register(
        r.name, r.raw_handle, r.device_id, r.byte_size, peer_of(c), forwarded_headers(c)
    )
    return pb.CudaSharedMemoryRegisterResponse()


async def CudaSharedMemoryUnregister(
    fe: GrpcFrontend, r: pb.CudaSharedMemoryUnregisterRequest, c: Context
) -> pb.CudaSharedMemoryUnregisterResponse:
    await fe.pipeline.shm_unregister("cuda", r.name, peer_of(c), forwarded_headers(c))
    return pb.CudaSharedMemoryUnregisterResponse()
