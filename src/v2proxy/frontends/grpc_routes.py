"""The method table of the gRPC port: every RPC the gRPC frontend serves, with the ``operation``
label of its metrics, its API group of ``--restricted-api`` (:mod:`v2proxy.core.restricted`; the
groups Triton's gRPC server gives its RPCs) and the request field that names its model. It is
the gRPC side of what the REST route table (:mod:`v2proxy.frontends.routes`) is to the HTTP port:
the gRPC frontend builds each method's call envelope from its row, and the group of every call
is read from it.

Contract:

- :data:`RPCS` holds one :class:`Rpc` per method: every RPC of
  ``inference.GRPCInferenceService`` (the unary ones of
  :data:`v2proxy._proto.service.UNARY_RPCS`, and ``ModelStreamInfer``) and of
  ``grpc.health.v1.Health`` (``Check``, ``Watch``).
- :attr:`Rpc.group` (one of :data:`v2proxy.core.restricted.GROUPS`, as Triton groups its RPCs)
  is checked once per call, as the frontend admits it: for a unary call by its
  call envelope (:func:`v2proxy.frontends.grpc_call.guard`), once the request message is parsed
  and before the handler runs, so before any field of it is judged; a refusal is the policy's
  error (``PERMISSION_DENIED``, ``This API is restricted, ...``).
- A ``ModelStreamInfer`` stream is checked once, as it opens (as Triton's stream handler checks
  its precondition once per stream, not per message: a call's metadata cannot change while it
  is open). Triton then ends a refused stream at once; v2proxy answers each message of it with
  the refusal, as it answers any message's error (in band in ``error_message``, or as the
  stream's status when the client sent ``triton_grpc_error: true``), and records each.
- The health service checks its own calls (:class:`v2proxy.frontends.grpc_health.Health`):
  ``Check`` once per call, ``Watch`` once per stream; a refused one is told ``NOT_SERVING``,
  which is what a probe reads, rather than an error.
- :attr:`Rpc.operation` is the ``operation`` label of the call's metrics and log lines (each
  message of a ``ModelStreamInfer`` is recorded under it; ``Watch`` streams are not recorded);
  :attr:`Rpc.model_field` the request field whose value is the ``model`` label (None: the call
  names no model).

Pure data: no grpc, no handler.
"""

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
