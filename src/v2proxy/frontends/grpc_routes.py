"""The method table of the gRPC port: every RPC the gRPC frontend serves, with the ``operation``
label of its metrics, its ``--restricted-api`` group and the request field that names its model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from v2proxy._proto.service import SERVICE

HEALTH_SERVICE = "grpc.health.v1.Health"


@dataclass(frozen=True, slots=True)
class Rpc:
    """One row: a method, the operation label of its calls, its API group, the request field
    that names the model and the service it belongs to."""

    name: str
    operation: str
    group: str
    model_field: str | None = None
    service: str = SERVICE

    @property
    def path(self) -> str:
        """The method's path, ``/service/method``."""
        return f"/{self.service}/{self.name}"


_SHM = "shared-memory"
_REPO = "model-repository"

#: method name -> its row
RPCS: Mapping[str, Rpc] = {
    row.name: row
    for row in (
        Rpc("ServerLive", "health", "health"),
        Rpc("ServerReady", "health", "health"),
        Rpc("ModelReady", "health", "health", "name"),
        Rpc("ServerMetadata", "metadata", "metadata"),
        Rpc("ModelMetadata", "metadata", "metadata", "name"),
        Rpc("ModelConfig", "metadata", "model-config", "name"),
        Rpc("ModelInfer", "infer", "inference", "model_name"),
        # checked once per stream; each message names its model
        Rpc("ModelStreamInfer", "stream_infer", "inference"),
        Rpc("ModelStatistics", "side", "statistics", "name"),
        Rpc("RepositoryIndex", "side", _REPO),
        Rpc("RepositoryModelLoad", "side", _REPO, "model_name"),
        Rpc("RepositoryModelUnload", "side", _REPO, "model_name"),
        Rpc("SystemSharedMemoryStatus", "side", _SHM),
        Rpc("SystemSharedMemoryRegister", "side", _SHM),
        Rpc("SystemSharedMemoryUnregister", "side", _SHM),
        Rpc("CudaSharedMemoryStatus", "side", _SHM),
        Rpc("CudaSharedMemoryRegister", "side", _SHM),
        Rpc("CudaSharedMemoryUnregister", "side", _SHM),
        Rpc("TraceSetting", "side", "trace", "model_name"),
        Rpc("LogSettings", "side", "logging"),
        Rpc("Check", "health", "health", service=HEALTH_SERVICE),
        Rpc("Watch", "health", "health", service=HEALTH_SERVICE),
    )
}
